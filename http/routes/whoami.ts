import type { RoutesBySegment as Router } from '../routes-by-segment.js';
import type { AppDeps } from '../deps.js';
import { respond } from '../envelope.js';
import { authorize, type AuthState } from '../middleware/auth.js';

export function registerWhoami(router: Router, deps: AppDeps): void {
  /**
   * @openapi
   * /v1/whoami:
   *   get:
   *     operationId: whoami
   *     summary: The calling credential
   *     description: Any valid API key or events token, no scope needed. Says what the credential is, its scopes,
   *       and the workspace and tenant it works in (for workspace keys, the tenant `Service-Tenant` selects).
   *       As on every route, a tenant or client key (or an events token) whose `Service-Tenant` names another tenant,
   *       and a workspace key naming a tenant its workspace does not have, is 403 `forbidden`.
   *       Useful to check a key after rotation.
   *     tags: [Keys]
   *     parameters: [{ $ref: '#/components/parameters/serviceTenant' }]
   *     responses:
   *       '200':
   *         description: The caller
   *         content: { application/json: { schema: { $ref: '#/components/schemas/CallerResponse' } } }
   *       default: { $ref: '#/components/responses/Error' }
   */
  router.get('/v1/whoami', authorize(deps, 'any', null, { eventsToken: true }), (ctx) => {
    const { principal, workspace, tenant, tokenExpiresAt } = ctx.state.auth as AuthState;
    respond(ctx, 200, {
      kind: principal ? principal.key.kind : 'events_token',
      keyId: principal?.key.id ?? null,
      scopes: principal ? principal.key.scopes : ['events:read'],
      workspace: { id: workspace.id, slug: workspace.slug },
      tenant: tenant ? { id: tenant.id, slug: tenant.slug } : null,
      expiresAt: principal ? principal.key.expiresAt : tokenExpiresAt ?? null,
    });
  });
}
