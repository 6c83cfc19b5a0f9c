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
   *     description: Any valid workspace or tenant key, no scope needed. Says what the key is, its scopes, and the workspace and
   *       tenant it works in (for workspace keys, the tenant `Service-Tenant` selects). As on every route outside `/v1/client`,
   *       a client key is 403 `forbidden`, and so is an events token (it reads only the event routes); a tenant key whose
   *       `Service-Tenant` names another tenant, and a workspace key naming a tenant its workspace does not have, is 403 `forbidden`.
   *       Useful to check a key after rotation.
   *     tags: [Keys]
   *     parameters: [{ $ref: '#/components/parameters/serviceTenant' }]
   *     responses:
   *       '200':
   *         description: The caller
   *         content: { application/json: { schema: { $ref: '#/components/schemas/CallerResponse' } } }
   *       default: { $ref: '#/components/responses/Error' }
   */
  router.get('/v1/whoami', authorize(deps, 'tenant', null), (ctx) => {
    const { principal, workspace, tenant } = ctx.state.auth as AuthState;
    const { key } = principal!;
    respond(ctx, 200, {
      kind: key.kind, keyId: key.id, scopes: key.scopes,
      workspace: { id: workspace.id, slug: workspace.slug },
      tenant: { id: tenant!.id, slug: tenant!.slug },
      expiresAt: key.expiresAt,
    });
  });
}
