import { createHash, randomUUID } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import type { Redis } from 'ioredis';
import { ApiError, lockTimeout } from '../lib/errors.js';
import type { Keys } from './keys.js';
import { callScript } from './lua-scripts.js';
import type { AuditTrail } from './subscriber-audit.js';
import { readSubscriber, SubscriberChanged, type TenantScope } from './subscriber-writes.js';
import { deleteSubscriber, getSubscriber, mergeAttributes } from './subscribers.js';
import { MAX_SUBSCRIPTIONS_PER_SUBSCRIBER, getSubscription, listSubscriptions, registerSubscription, removeSubscription, tokenOwner, type RegisterInput, type Subscription } from './subscriptions.js';
import { addTopicMembers, topicsOfSubscriber } from './topic-members.js';
import { moveWidgets } from './widgets.js';

/**
 * Merging the anonymous subscriber (the id an app used before sign-in) into the identified one:
 * its subscriptions, widgets, topics and missing attributes move, then it is deleted. The parts
 * live in different hash slots (the two partitions, the tenant), so a merge is a sequence of
 * atomic, idempotent steps that a retry of the request finishes: the anonymous subscriber is
 * deleted last, so until then the same request merges what is left.
 */

export type MergePlan = { anonymousId: string; externalId: string; subscriptions: Subscription[] };

/**
 * Reads what merging `anonymousId` into `externalId` takes and checks it fits, before any write:
 * the identified subscriber would hold at most MAX_SUBSCRIPTIONS_PER_SUBSCRIBER subscriptions (with
 * `registering`, the device the same request registers afterwards) and at most 50 widgets (the
 * check of lua/moveWidgets, writing nothing); 409 `conflict` otherwise. Null when there is nothing
 * to merge (the same id, or no such anonymous subscriber).
 */
export async function planMerge(redis: Redis, keys: Keys, scope: TenantScope, anonymousId: string, externalId: string, registering?: RegisterInput): Promise<MergePlan | null> {
  if (anonymousId === externalId) return null;
  const [anonymous, subscriptions, own, owner] = await Promise.all([
    readSubscriber(redis, keys, scope, anonymousId, { record: false }),
    listSubscriptions(redis, keys, scope, anonymousId),
    listSubscriptions(redis, keys, scope, externalId),
    registering ? tokenOwner(redis, keys, scope.tenantId, externalId, registering) : Promise.resolve(null),
  ]);
  if (!anonymous.exists) return null;
  // an address is one per subscriber: one both hold stays one (`tokenField`), and so does the one
  // registered here when either holds it already (a shared address counted twice was a false 409)
  const addresses = new Set(own.filter((s) => s.channel === 'email').map((s) => s.address));
  const moving = subscriptions.filter((s) => !(s.channel === 'email' && addresses.has(s.address))).length;
  for (const s of subscriptions) if (s.channel === 'email') addresses.add(s.address);
  const adds = registering && (registering.channel === 'email'
    ? !addresses.has(registering.address?.toLowerCase() ?? null)
    : owner !== externalId && owner !== anonymousId);
  const wouldHold = own.length + moving + (adds ? 1 : 0);
  if (wouldHold > MAX_SUBSCRIPTIONS_PER_SUBSCRIBER) {
    throw new ApiError(409, 'conflict', `A subscriber holds at most ${MAX_SUBSCRIPTIONS_PER_SUBSCRIBER} subscriptions; merging would give it ${wouldHold}`);
  }
  await moveWidgets(redis, keys, scope.tenantId, anonymousId, externalId, { check: true });
  return { anonymousId, externalId, subscriptions };
}

/**
 * Carries out a plan: widgets (one script, which checks the limit again), each subscription (moved
 * by registering it for the identified subscriber: the same subscription id, muted ones stay muted),
 * topics, the missing attributes (`mergeAttributes`: the identified subscriber's own win), then
 * deletes the anonymous subscriber (`$subscriber.deleted`) once it holds no subscription and no
 * topic the identified subscriber is not in: a device registered for it (or a topic it joined) since
 * its parts were read moves in one more round instead of going with the delete. A registration racing the merge may fill
 * the identified subscriber after the check: the move that no longer fits is refused with nothing
 * changed (409), the merge stops there, and what has not moved stays with the anonymous subscriber.
 * With `audit` (held by the caller), each subscription moved is `subscription.updated` naming the owner
 * change (as any move of a device between subscribers: `registerSubscription`), the attributes filled
 * in are `subscriber.updated` (one entry with the attributes the same request changed before) and the
 * delete `subscriber.deleted`, each recorded by its write.
 * True when this call deleted the anonymous subscriber (the merge is its doing); false when a
 * concurrent merge of the same anonymous id deleted it first (probe B1: ten identify calls at once
 * each wrote `$identify` with `merged: true` for one merge).
 * With `intoId` (identify: the subscriber its upsert wrote), the merge goes into that subscriber
 * only: once it is deleted (or deleted and made anew) the merge stops, false, and what has not moved
 * stays with the anonymous subscriber. Each write of the identified one is limited to that id
 * (`TenantScope.only`), so none creates it again; before, a merge racing a delete of the identified
 * user made it anew and moved the devices and topics into the new one, or lost them (probe X).
 */
export async function mergeSubscriber(redis: Redis, keys: Keys, scope: TenantScope, plan: MergePlan, audit?: AuditTrail, intoId?: string): Promise<boolean> {
  const release = await holdMergeLock(redis, keys, scope.tenantId, plan.anonymousId);
  try {
    return await mergeRounds(redis, keys, intoId === undefined ? scope : { ...scope, only: { externalId: plan.externalId, id: intoId } }, plan, audit);
  } catch (err) {
    if (err instanceof SubscriberChanged) return false;
    throw err;
  } finally {
    await release();
  }
}

/**
 * How long a merge holds its anonymous subscriber unrenewed (one that died lets the next go on after
 * it); a live merge renews it every third of that (`lockMs`: tests shorten it).
 */
export const mergeLockTiming = { lockMs: 30_000 };
/** How long a merge waits for another merge of the same anonymous subscriber before answering 429 `lock_timeout`. */
const MERGE_LOCK_WAIT_MS = 5_000;
const MERGE_LOCK_POLL_MS = 25;

/**
 * One merge of an anonymous subscriber at a time, in the whole deployment: two identify calls
 * merging it into two users at once each moved its devices (a device taken from the one that had
 * it), topics and attributes, so both users got them (probe BX: 13 of 15 rounds of two calls). The
 * second waits for the first (at most MERGE_LOCK_WAIT_MS, else 429 `lock_timeout`, retried), then
 * finds it deleted and merges nothing. Resolves with the release.
 */
async function holdMergeLock(redis: Redis, keys: Keys, tenantId: string, anonymousId: string): Promise<() => Promise<void>> {
  const lock = keys.lock(`merge:${tenantId}:${createHash('sha256').update(anonymousId).digest('hex')}`);
  const owner = randomUUID();
  const giveUpAt = Date.now() + MERGE_LOCK_WAIT_MS;
  const lockMs = mergeLockTiming.lockMs;
  while ((await redis.set(lock, owner, 'PX', lockMs, 'NX')) !== 'OK') {
    if (Date.now() >= giveUpAt) throw lockTimeout('The anonymous subscriber (another merge of it is in progress)');
    await sleep(MERGE_LOCK_POLL_MS);
  }
  // renewed while the merge runs: one of an anonymous subscriber in tens of thousands of topics takes
  // longer than the lock, and a second identify merged it into another user too, topics and all (probe T)
  const renewal = setInterval(() => void callScript(redis, 'renewLease', [lock], [owner, lockMs]).catch(() => 0), Math.max(10, Math.floor(lockMs / 3)));
  return async () => {
    clearInterval(renewal);
    await callScript(redis, 'releaseLease', [lock], [owner]).catch(() => 0); // else it expires
  };
}

async function mergeRounds(redis: Redis, keys: Keys, scope: TenantScope, plan: MergePlan, audit?: AuditTrail): Promise<boolean> {
  const { anonymousId, externalId } = plan;
  // read again under the lock: a merge that held it before may have moved them, or deleted the
  // anonymous subscriber, since the plan was made (moving the plan's devices took them back from
  // the user that merge gave them to)
  let subscriptions = await listSubscriptions(redis, keys, scope, anonymousId);
  if (!(await readSubscriber(redis, keys, scope, anonymousId, { record: false })).exists) return false;
  for (let round = 0; round < MERGE_ROUNDS; round++) {
    // moved widgets are tagged with the identified subscriber's sub_ id (the cleanup of a delete checks it)
    const into = await readSubscriber(redis, keys, scope, externalId);
    if (scope.only && into.id !== scope.only.id) throw new SubscriberChanged();
    await moveWidgets(redis, keys, scope.tenantId, anonymousId, externalId, { toId: into.record.id ?? '' });
    // the addresses the identified user holds already (stored lowercased): its own subscription of one
    // stays as it is (registering the anonymous copy over it took that copy's platform and device: probe DV)
    const held = new Set((await listSubscriptions(redis, keys, scope, externalId)).filter((x) => x.channel === 'email').map((x) => x.address));
    for (const s of subscriptions) {
      if (s.channel !== 'email' || !held.has(s.address)) {
        // (an address stored with an authorizationStatus before session 62 refused it is registered without it)
        const push = s.channel === 'push';
        const input: RegisterInput = {
          channel: s.channel, token: s.token ?? undefined, address: s.address ?? undefined, platform: s.platform ?? undefined,
          environment: push ? s.environment ?? undefined : undefined, authorizationStatus: push ? s.authorizationStatus ?? undefined : undefined, device: s.device,
        };
        // an address is not moved but registered anew for the identified user: its `enabled` is read
        // again right before (a push device's is read in its move's write), so a mute made while the
        // merge ran holds (probe P: 36 of 60 raced mutes of an anonymous user's email were lost)
        const enabled = s.channel === 'email' ? await getSubscription(redis, keys, scope, anonymousId, s.id).then((now) => now.enabled, () => s.enabled) : s.enabled;
        await registerSubscription(redis, keys, scope, externalId, input, { enabled, merging: true, audit });
      }
      // an address is one per subscriber (it never moves: `tokenField`): the identified user now has
      // its own, and the anonymous one's goes (after, so a crash between leaves it with both, never neither)
      if (s.channel === 'email') {
        await removeSubscription(redis, keys, scope, anonymousId, s.id, audit).catch((err: unknown) => {
          if (!(err instanceof ApiError && err.status === 404)) throw err; // removed meanwhile
        });
      }
    }
    for (const topic of await topicsOfSubscriber(redis, keys, scope, anonymousId)) {
      // a topic deleted since it was read is skipped: its 404 left the merge half done, the anonymous
      // subscriber kept and the call answered 404 (probe FC); the user deleted meanwhile still stops the merge
      await addTopicMembers(redis, keys, scope, topic, [externalId]).catch((err: unknown) => {
        if (err instanceof SubscriberChanged || !(err instanceof ApiError && err.status === 404)) throw err;
      });
    }
    const from = await getSubscriber(redis, keys, scope, anonymousId).catch(() => null);
    if (!from) return false; // deleted meanwhile (a concurrent merge of the same anonymous id finished first)
    // a later round's write takes the held entry of the earlier ones in: one subscriber.updated, with the values before the first
    await mergeAttributes(redis, keys, scope, externalId, from, audit);
    const deleted = await deleteSubscriber(redis, keys, scope, anonymousId, { mergedInto: externalId, audit }).catch((err: unknown) => {
      if (!(err instanceof ApiError && err.status === 404)) throw err;
      return 'gone' as const;
    });
    if (deleted) return deleted !== 'gone';
    subscriptions = await listSubscriptions(redis, keys, scope, anonymousId);
  }
  throw lockTimeout('The anonymous subscriber');
}

/** Rounds of a merge before it gives up (409) on an anonymous subscriber that keeps gaining devices. */
const MERGE_ROUNDS = 10;
