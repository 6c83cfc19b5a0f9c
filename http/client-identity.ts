import type { Context } from 'koa';
import { ApiError } from '../lib/errors.js';
import { verifyIdentityHash } from '../lib/identity-hash.js';
import { tenantIdentity } from '../streams/identity.js';
import { upsertSubscriber } from '../streams/subscribers.js';
import type { AppDeps } from './deps.js';
import { tenantOf } from './middleware/auth.js';
import { scopeOf } from './routes/subscribers.js';

/**
 * Identity verification of a client call: a presented `identityHash` must be the hex HMAC-SHA256 of
 * the externalId under the tenant's identity secret (403 `invalid_identity_hash` otherwise); when the
 * tenant requires verification, a call without one is 403 `identity_verification_required`.
 * Returns whether the call is verified.
 */
export async function verifyClient(deps: AppDeps, ctx: Context, externalId: string, presented: string | undefined): Promise<boolean> {
  const settings = await tenantIdentity(deps.redis, deps.keys, tenantOf(ctx));
  if (presented === undefined) {
    if (settings.required) throw new ApiError(403, 'identity_verification_required', 'This tenant requires identityHash on client calls', { param: 'identityHash' });
    return false;
  }
  if (!verifyIdentityHash(settings.secret, externalId, presented)) throw new ApiError(403, 'invalid_identity_hash', 'identityHash does not match externalId', { param: 'identityHash' });
  return true;
}

/** Marks the subscriber verified after a verified call (creating it when the call creates subscribers). */
export async function markVerified(deps: AppDeps, ctx: Context, externalId: string, verified: boolean): Promise<void> {
  if (verified) await upsertSubscriber(deps.redis, deps.keys, scopeOf(ctx, deps), externalId, {}, { create: true, verified: true });
}
