import type { Context } from 'koa';
import { ApiError } from '../lib/errors.js';
import { verifyIdentityHash } from '../lib/identity-hash.js';
import { readSubscriber } from '../streams/subscriber-writes.js';
import { upsertSubscriber } from '../streams/subscribers.js';
import type { AppDeps } from './deps.js';
import { tenantOf } from './middleware/auth.js';
import { scopeOf } from './routes/subscribers.js';

/**
 * Identity verification of a client call (spec 5.10: "a valid hash marks the subscriber as
 * verified"). A presented `identityHash` that is the hex HMAC-SHA256 of the externalId under the
 * tenant's identity secret verifies the call. When the tenant requires verification, a call without
 * a valid one is 403 `forbidden` (`param` names the field; the message says whether it was missing
 * or did not match). When verification is optional, a missing or wrong hash leaves the call
 * unverified, as if none were sent: it proceeds and marks nothing (docs/client.md).
 * Returns whether the call is verified. `names` are the fields checked (the anonymous id of a merge
 * is checked alike: `anonymousIdentityHash` of `anonymousId`). The settings come from the key cache (no Redis read per
 * call; a rotation or a change of `identityRequired` invalidates them in every process at once); a
 * hash that does not match the cached secret is checked once more against the stored one before
 * it counts as wrong, so a hash made right after a rotation never waits for the invalidation.
 */
export async function verifyClient(deps: AppDeps, ctx: Context, externalId: string, presented: string | undefined, names: { hash: string; id: string } = { hash: 'identityHash', id: 'externalId' }): Promise<boolean> {
  const tenant = tenantOf(ctx);
  const settings = await deps.keyCache.identity(tenant);
  if (presented === undefined) {
    if (settings.required) throw unproven(presented, names);
    return false;
  }
  if (verifyIdentityHash(settings.secret, externalId, presented)) return true;
  const stored = await deps.keyCache.identity(tenant, { fresh: true });
  if (stored.secret !== settings.secret && verifyIdentityHash(stored.secret, externalId, presented)) return true;
  if (stored.required) throw unproven(presented, names);
  return false;
}

function unproven(presented: string | undefined, names: { hash: string; id: string }): ApiError {
  const why = presented === undefined ? `${names.hash} of ${names.id} is missing` : `${names.hash} does not match ${names.id}`;
  return new ApiError(403, 'forbidden', `This tenant requires identity verification: ${why}`, { param: names.hash });
}

/**
 * A client call naming a record by its id alone (a subscription) when no subscriber holds that id.
 * A tenant that requires verification answers it as it answers an unproven call on an id that
 * exists (403 `forbidden`, the same message), so the answers never tell which ids exist (probe B1:
 * 403 for a real id against 404 for an unknown one); otherwise it is `notFound`.
 */
export async function unknownHolder(deps: AppDeps, ctx: Context, presented: string | undefined, notFound: ApiError): Promise<never> {
  if ((await deps.keyCache.identity(tenantOf(ctx))).required) throw unproven(presented, { hash: 'identityHash', id: 'externalId' });
  throw notFound;
}

/**
 * Whether the caller may merge the subscriber `anonymousId` into the one it identifies (identify
 * and registration with `anonymousId`), decided before anything is written. `anonymousIdentityHash`
 * proves it, checked by `verifyClient` as `identityHash` is. Without a valid one: a tenant that
 * requires verification refuses (403 `forbidden` on `anonymousIdentityHash`); otherwise only a
 * subscriber that was never verified may be merged (403 `forbidden` on `anonymousId` for a verified
 * one), so a client key cannot take over, read or delete a verified user.
 */
export async function verifyMerge(deps: AppDeps, ctx: Context, anonymousId: string, presented: string | undefined): Promise<void> {
  if (await verifyClient(deps, ctx, anonymousId, presented, { hash: 'anonymousIdentityHash', id: 'anonymousId' })) return;
  const anonymous = await readSubscriber(deps.redis, deps.keys, scopeOf(ctx, deps), anonymousId);
  if (anonymous.exists && anonymous.record.verified === '1') {
    throw new ApiError(403, 'forbidden', 'anonymousId is a verified subscriber: it is only merged with anonymousIdentityHash', { param: 'anonymousId' });
  }
}

/**
 * `verifyClient` for a call that reads or acts on a subscriber without creating one: a valid hash
 * marks it verified when it exists (spec 5.10: any client call).
 */
export async function verifyExisting(deps: AppDeps, ctx: Context, externalId: string, presented: string | undefined): Promise<void> {
  await markVerified(deps, ctx, externalId, await verifyClient(deps, ctx, externalId, presented), { create: false });
}

/**
 * Marks the subscriber verified after a verified call (spec 5.10: any client call carrying a valid
 * hash): creating it when the call creates subscribers (`create`, the default); a call that only
 * reads or acts on one marks it when it exists.
 */
export async function markVerified(deps: AppDeps, ctx: Context, externalId: string, verified: boolean, options: { create: boolean } = { create: true }): Promise<void> {
  if (!verified) return;
  try {
    // not refused over INBOX_MAX_BACKLOG as the call's own writes are: a read carrying a valid hash
    // answered 503 (probe EC), and the mark is written once, so no flood can repeat it
    await upsertSubscriber(deps.redis, deps.keys, { ...scopeOf(ctx, deps), maxInboxBacklog: undefined }, externalId, {}, { create: options.create, verified: true });
  } catch (err) {
    if (options.create || !(err instanceof ApiError && err.status === 404)) throw err;
  }
}
