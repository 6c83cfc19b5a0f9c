import type { RoutesBySegment as Router } from '../routes-by-segment.js';
import { notFound } from '../../lib/errors.js';
import { publicKey, revokeApiKey } from '../../streams/identity.js';
import type { AppDeps } from '../deps.js';
import { respond } from '../envelope.js';
import { authorize, writerOf, type AuthState } from '../middleware/auth.js';

export function registerKeys(router: Router, deps: AppDeps): void {
  /**
   * @openapi
   * /v1/workspaces/{workspaceSlug}/keys/{id}:
   *   delete:
   *     operationId: revokeKey
   *     summary: Revoke an API key
   *     description: Requires the session-only scope `keys:write`, which no API key can hold, so every workspace
   *       key of the workspace is answered 403 `missing_permission` until dashboard sessions exist (a tenant or
   *       client key, or another workspace's key, is 403 `forbidden` first, as on every workspace route); operators revoke with
   *       `npx herald key revoke`. Revocation takes effect at once in every process.
   *     tags: [Keys]
   *     parameters:
   *       - $ref: '#/components/parameters/workspaceSlug'
   *       - { name: id, in: path, required: true, schema: { type: string } }
   *     responses:
   *       '200':
   *         description: The revoked key
   *         content: { application/json: { schema: { $ref: '#/components/schemas/ApiKeyResponse' } } }
   *       '401': { $ref: '#/components/responses/Unauthorized' }
   *       '403': { $ref: '#/components/responses/Error' }
   *       '404': { $ref: '#/components/responses/Error' }
   *       default: { $ref: '#/components/responses/Error' }
   */
  router.delete('/v1/workspaces/:workspaceSlug/keys/:id', authorize(deps, 'workspace', 'keys:write'), async (ctx) => {
    const { workspace } = ctx.state.auth as AuthState;
    const revoked = await revokeApiKey(deps.redis, deps.keys, workspace, ctx.params.id!, writerOf(ctx));
    if (!revoked) throw notFound('API key');
    respond(ctx, 200, publicKey(revoked));
  });
}
