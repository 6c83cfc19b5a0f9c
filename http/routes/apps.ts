import type { RoutesBySegment as Router } from '../routes-by-segment.js';
import type { Context } from 'koa';
import { notFound } from '../../lib/errors.js';
import { createSecretBox, type SecretBox } from '../../lib/secret-box.js';
import { checkBody } from '../../lib/validator.js';
import { deleteApnsCredentials, describeApnsCredentials, setApnsCredentials, type ApnsCredentialsInput } from '../../streams/apns-credentials.js';
import type { AppDeps } from '../deps.js';
import { respond } from '../envelope.js';
import { authorize, tenantOf, writerOf, type AuthState } from '../middleware/auth.js';

function workspaceOf(ctx: Context) {
  return (ctx.state.auth as AuthState).workspace;
}

export function registerApps(router: Router, deps: AppDeps): void {
  const { redis, keys } = deps;
  const box: SecretBox | null = deps.config.encryptionKey ? createSecretBox(deps.config.encryptionKey) : null;

  /**
   * @openapi
   * /v1/apps/apns:
   *   parameters:
   *     - $ref: '#/components/parameters/serviceTenant'
   *   put:
   *     operationId: setApnsCredentials
   *     summary: Store the tenant's APNs credentials
   *     description: Scope `apps:write`. Token-based APNs authentication for the tenant's iOS app; replaces any stored
   *       credentials (200) or stores the first ones (201). `privateKey` is checked (an unencrypted EC P-256 key in PEM,
   *       as in Apple's .p8 file), stored encrypted with the server's `HERALD_ENCRYPTION_KEY` and never returned. Without
   *       that key the server answers 503 `unavailable`. Audit event `apns.updated` (public, without key material);
   *       sending the stored credentials again changes nothing.
   *     tags: [Apps]
   *     requestBody: { required: true, content: { application/json: { schema: { $ref: '#/components/schemas/ApnsCredentialsUpdate' } } } }
   *     responses:
   *       '200': { description: Replaced (or unchanged), content: { application/json: { schema: { $ref: '#/components/schemas/ApnsCredentialsResponse' } } } }
   *       '201': { description: Stored, content: { application/json: { schema: { $ref: '#/components/schemas/ApnsCredentialsResponse' } } } }
   *       '400': { $ref: '#/components/responses/Error' }
   *       '503': { $ref: '#/components/responses/Unavailable' }
   *       default: { $ref: '#/components/responses/Error' }
   *   get:
   *     operationId: getApnsCredentials
   *     summary: The tenant's APNs credentials, without the private key
   *     description: Scope `apps:read`. 404 `not_found` when none are configured.
   *     tags: [Apps]
   *     responses:
   *       '200': { description: The credentials, content: { application/json: { schema: { $ref: '#/components/schemas/ApnsCredentialsResponse' } } } }
   *       '404': { $ref: '#/components/responses/Error' }
   *       default: { $ref: '#/components/responses/Error' }
   *   delete:
   *     operationId: deleteApnsCredentials
   *     summary: Remove the tenant's APNs credentials
   *     description: Scope `apps:write`. Pushes to the tenant's devices fail with `apns_not_configured` from then on
   *       (within `APNS_CREDENTIALS_CHECK_SECONDS` in running dispatchers). Audit event `apns.deleted`. 404 `not_found`
   *       when none are configured.
   *     tags: [Apps]
   *     responses:
   *       '200': { description: The removed credentials, content: { application/json: { schema: { $ref: '#/components/schemas/ApnsCredentialsResponse' } } } }
   *       '404': { $ref: '#/components/responses/Error' }
   *       default: { $ref: '#/components/responses/Error' }
   */
  router.put('/v1/apps/apns', authorize(deps, 'tenant', 'apps:write'), async (ctx) => {
    const input = checkBody<ApnsCredentialsInput>('ApnsCredentialsUpdate', ctx.request.body);
    const { credentials, created } = await setApnsCredentials(redis, keys, box, workspaceOf(ctx), tenantOf(ctx), input, writerOf(ctx));
    respond(ctx, created ? 201 : 200, credentials);
  });

  router.get('/v1/apps/apns', authorize(deps, 'tenant', 'apps:read'), async (ctx) => {
    const credentials = await describeApnsCredentials(redis, keys, tenantOf(ctx).id);
    if (!credentials) throw notFound('APNs credentials');
    respond(ctx, 200, credentials);
  });

  router.delete('/v1/apps/apns', authorize(deps, 'tenant', 'apps:write'), async (ctx) => {
    const removed = await deleteApnsCredentials(redis, keys, workspaceOf(ctx), tenantOf(ctx), writerOf(ctx));
    if (!removed) throw notFound('APNs credentials');
    respond(ctx, 200, removed);
  });
}
