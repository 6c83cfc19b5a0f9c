import type { Redis } from 'ioredis';
import { isoNow, now } from '../lib/clock.js';
import { setTimeout as sleep } from 'node:timers/promises';
import { ApiError, lockTimeout, notFound, validationError } from '../lib/errors.js';
import { isId, newId } from '../lib/ids.js';
import { partitionOf } from '../lib/partition.js';
import type { AuditDraft } from './audit-outbox.js';
import type { Keys } from './keys.js';
import { callScript } from './lua-scripts.js';
import { drafted, draftedAudit, type AuditTrail } from './subscriber-audit.js';
import { changeSubscriber, GuardFailed, writeSubscriber, type RecordOp, type TenantScope, type WriteGuard } from './subscriber-writes.js';
import { legacyEmailField, tokenField } from './subscribers.js';
import { apnsTokenForm } from '../lib/apns-token.js';
import type { Logger } from '../lib/log.js';
import { sweepAgedEntries, sweepHashes } from './hash-sweep.js';

export const MAX_SUBSCRIPTIONS_PER_SUBSCRIBER = 50;
const DEVICE_FIELDS = ['appVersion', 'appBuild', 'sdkVersion', 'osVersion', 'model', 'locale', 'installedAt'] as const;

export type Device = Partial<Record<(typeof DEVICE_FIELDS)[number], string>>;
export type RegisterInput = {
  channel: 'push' | 'email';
  token?: string;
  address?: string;
  platform?: 'ios' | 'android';
  environment?: 'production' | 'sandbox';
  authorizationStatus?: 'notDetermined' | 'denied' | 'authorized' | 'provisional' | 'ephemeral';
  device?: Device;
};
export type Subscription = {
  id: string; externalId: string; channel: 'push' | 'email'; token: string | null; address: string | null;
  platform: 'ios' | 'android' | null; environment: 'production' | 'sandbox' | null; authorizationStatus: RegisterInput['authorizationStatus'] | null;
  device: Device; enabled: boolean; invalidatedAt: string | null; createdAt: string; updatedAt: string;
};

export function toSubscription(externalId: string, h: Record<string, string>): Subscription {
  return {
    id: h.id!, externalId, channel: h.channel as Subscription['channel'], token: h.token || null, address: h.address || null,
    platform: (h.platform || null) as Subscription['platform'], environment: (h.environment || null) as Subscription['environment'],
    authorizationStatus: (h.authorizationStatus || null) as Subscription['authorizationStatus'], device: h.device ? JSON.parse(h.device) : {},
    enabled: h.enabled === '1', invalidatedAt: h.invalidatedAt || null, createdAt: h.createdAt!, updatedAt: h.updatedAt ?? h.createdAt!,
  };
}

/**
 * The `enabled` a subscription's user chose (internal field `userEnabled`, kept while the push
 * provider holds the token invalidated, whose `enabled` is then false whatever the user chose; an
 * invalidation recorded before this field existed says nothing of a mute: on).
 */
const userEnabledOf = (h: Record<string, string>): '1' | '0' => (h.enabled === '1' || (h.userEnabled || '1') === '1' ? '1' : '0');

/** The device fields of a registration, in DEVICE_FIELDS order (unknown ones dropped). */
function deviceOf(input: RegisterInput): Device {
  const device: Device = {};
  const given = input.device;
  if (given) for (const f of DEVICE_FIELDS) if (given[f] !== undefined) device[f] = given[f];
  return device;
}

/** What a registration stores (the handle normalised: email addresses lowercased). */
function fieldsOf(input: RegisterInput): Record<string, string> {
  const push = input.channel === 'push';
  return {
    channel: input.channel,
    token: push ? input.token ?? '' : '',
    address: push ? '' : (input.address ?? '').toLowerCase(),
    platform: input.platform ?? '',
    environment: push ? input.environment ?? 'production' : '',
    authorizationStatus: input.authorizationStatus ?? '',
    device: JSON.stringify(deviceOf(input)),
  };
}

/**
 * What a registration of a token already held by this subscriber changes: the fields it gives.
 * Those it leaves out (`platform`, `environment`, `authorizationStatus`, `device`) keep their stored
 * values, as an update in place does; a given `device` replaces the stored one whole. A new record
 * is written whole, with the defaults for what is left out; one moving from another subscriber keeps
 * the previous holder's values of those device fields instead (writeRegistration).
 */
function givenFieldsOf(input: RegisterInput, all: Record<string, string>): Record<string, string> {
  const left = new Set<string>();
  if (input.platform === undefined) left.add('platform');
  if (input.environment === undefined) left.add('environment');
  if (input.authorizationStatus === undefined) left.add('authorizationStatus');
  if (input.device === undefined) left.add('device');
  return Object.fromEntries(Object.entries(all).filter(([k]) => !left.has(k)));
}

/**
 * A registration as the client sent it, read: its `channel` filled in when left out (`push` for a
 * body with a `token` and no `address`, `email` for one with an `address` and no `token`: spec 4.4
 * requires only `externalId`; otherwise it stays out and checkRegistration refuses it), and an APNs
 * token in one form (`apnsTokenForm`), so the same device is one subscription however it was written.
 */
export function readRegistration(input: RegistrationBody): RegisterInput {
  // spaces and angle brackets are dropped from an APNs token (apnsTokenForm): a token of little else is
  // no device, and took one of the 50 places until its first push failed (probe Y1: 8 spaces, `<      >`).
  // Checked on what a client sends only: a merge moves the devices stored before this check as they are.
  if (input.token !== undefined && input.token.replace(/[\s<>]/g, '').length < 8) {
    throw validationError([{ param: 'token', message: 'must hold at least 8 characters besides spaces and angle brackets' }]);
  }
  const channel = input.channel
    ?? (input.token !== undefined && input.address === undefined ? 'push' : input.address !== undefined && input.token === undefined ? 'email' : undefined);
  const token = channel === 'push' && input.token !== undefined && input.platform !== 'android' ? apnsTokenForm(input.token) : input.token;
  return { ...input, channel, ...(token === undefined ? {} : { token }) } as RegisterInput;
}


/** A registration as a client may send it: `channel` optional (readRegistration fills it in). */
export type RegistrationBody = Omit<RegisterInput, 'channel'> & { channel?: RegisterInput['channel'] };

/** Longest email address (spec 4.4, 8), as sent and as stored (lowercased). */
const MAX_ADDRESS_LENGTH = 254;

/**
 * 400 unless the handle fits the channel: a push subscription has a `token`, an email one an
 * `address`, whose lowercased form (what is stored) still fits the bound: a few characters lowercase
 * to two (`İ` is `i` and U+0307).
 */
export function checkRegistration(input: RegisterInput): void {
  const wrong = (param: string, message: string) => new ApiError(400, 'validation', `${param}: ${message}`, { param, details: [{ param, message }] });
  if (!input.channel) throw wrong('channel', 'is required unless exactly one of token or address is given');
  if (input.channel === 'push' && !input.token) throw wrong('token', 'is required for the push channel');
  if (input.channel === 'email' && !input.address) throw wrong('address', 'is required for the email channel');
  if (input.channel === 'push' && input.address) throw wrong('address', 'is only for the email channel');
  // the APNs environment and the app's notification permission describe a push token, not an address
  // (authorizationStatus was stored on an email subscription while environment was refused: probe J)
  const pushOnly = (['token', 'environment', 'authorizationStatus'] as const).find((k) => input[k]);
  if (input.channel === 'email' && pushOnly) throw wrong(pushOnly, 'is only for the push channel');
  if (input.address && [...input.address.toLowerCase()].length > MAX_ADDRESS_LENGTH) throw wrong('address', `must be at most ${MAX_ADDRESS_LENGTH} characters once lowercased, as it is stored`);
}

/** The `subscription` of the `$subscription.*` stream events' data. */
export const publicOf = (s: Subscription) => ({ id: s.id, channel: s.channel, platform: s.platform, enabled: s.enabled });

/**
 * The subscription as `externalId` held it, from a record another subscriber of the partition took
 * over (the record's `left`, written by that take-over: [previous holder, enabled, platform]); the
 * record as it is when it names no such thing (written before session 62, or left by another).
 */
function leftState(externalId: string, h: Record<string, string>): Subscription {
  const subscription = toSubscription(externalId, h);
  const [holder, enabled, platform] = h.left ? (JSON.parse(h.left) as [string, string, string]) : [];
  if (holder !== externalId) return subscription;
  return { ...subscription, enabled: enabled === '1', platform: (platform || null) as Subscription['platform'] };
}

/**
 * A subscription record lives at one key per partition (`{pN}:scr:<tenant>:<id>`), so when a token
 * moves between two subscribers of one partition both sets name the same hash for a moment. The
 * record's `holder` says whose it is; a set entry whose record another subscriber holds is a stale
 * reference, not a subscription. Records written before `holder` existed belong to whoever's set
 * names them.
 */
export const heldBy = (h: Record<string, string>, externalId: string): boolean => Boolean(h.id) && (!h.holder || h.holder === externalId);

/** Subscription `id` as `externalId`'s set and the record have it (after the subscriber version, for changeSubscriber). */
type Held = { record: Record<string, string>; member: boolean };
const readHeld = (redis: Redis, keys: Keys, scope: TenantScope, externalId: string, id: string) => async (p: number): Promise<Held> => {
  const [record, member] = await Promise.all([redis.hgetall(keys.subscription(p, scope.tenantId, id)), redis.sismember(keys.subscriberSubscriptions(p, scope.tenantId, externalId), id)]);
  return { record, member: member === 1 };
};

/** The record of subscription `id` when `externalId` holds it, else `{}` (for changeSubscriber). */
const readRecord = (redis: Redis, keys: Keys, scope: TenantScope, externalId: string, id: string) => async (p: number): Promise<Record<string, string>> => {
  const { record, member } = await readHeld(redis, keys, scope, externalId, id)(p);
  return member && heldBy(record, externalId) ? record : {};
};

/**
 * How long the mark of a copy removed by a move (`keys.subscriptionMovedOut`) is kept: far longer
 * than a registration takes from its claim to its write (its compare-and-set is bounded).
 */
const MOVED_OUT_KEEP_MS = 3_600_000;

/** The claim number of the latest move of subscription `id` away from `externalId` (null: none known; `p` its partition). */
const movedOutClaim = (redis: Redis, keys: Keys, scope: TenantScope, p: number, externalId: string, id: string) => redis.hget(keys.subscriptionMovedOut(p, scope.tenantId, id), externalId);

/**
 * Marks `externalId`'s copy of subscription `id` moved out under claim number `claim`
 * (lua/markMovedOut), before the move reads that copy: a registration of `externalId` that claimed
 * before the move and has not written yet then writes nothing (`writeRegistration`, `createFresh`),
 * so the copy the move took over (or found missing) is the last one that subscriber writes under an
 * older claim. Without it a registration stalled past its lock, or killed and retried, wrote a copy
 * after the move: audited created, then removed again and audited moved again (probes BX, CA).
 */
async function markMovedOut(redis: Redis, keys: Keys, scope: TenantScope, externalId: string, id: string, claim: number): Promise<void> {
  await callScript(redis, 'markMovedOut', [movedOutKey(keys, scope, externalId, id)], [externalId, claim, now() + MOVED_OUT_KEEP_MS]);
}

/** Takes back the mark of a move whose registration was refused (lua/unmarkMovedOut), unless a later move's replaced it. */
async function unmarkMovedOut(redis: Redis, keys: Keys, scope: TenantScope, externalId: string, id: string, claim: number): Promise<void> {
  await callScript(redis, 'unmarkMovedOut', [movedOutKey(keys, scope, externalId, id)], [externalId, claim]);
}

const movedOutKey = (keys: Keys, scope: TenantScope, externalId: string, id: string) => keys.subscriptionMovedOut(partitionOf(scope.tenantId, externalId, scope.partitions), scope.tenantId, id);

/**
 * Removes subscription `id` from `externalId` with `$subscription.removed`; null when it is not
 * there. With `upTo`, only a record whose claim stamp is not newer than that claim number (a
 * record written by a later claim of the token stays; the move marked the copy moved out first,
 * `markMovedOut`). A reference to a record another subscriber
 * of the partition holds now is dropped without touching the record (guarded: the holder is checked
 * again in the write), with reason `moved`, and answers null: the subscription is not this
 * subscriber's any more (its GET is 404 too).
 * With `audit` (a removal someone asked for), a removal records `subscription.deleted`, unless the
 * device was taken over by another app user: the token index names another subscriber as the
 * subscription's owner (read with the record). That one's registration audits the move
 * (`subscription.updated`, the new `externalId`) whether or not it finds this copy; this copy is a
 * leftover of the move, removed with reason `moved` and not audited, so the ledger's last word on
 * the subscription is not a deletion while it lives on.
 * With `lost` (a registration whose copy lost the token to another app user's claim, confirmToken),
 * the copy's removal records the owner change to the subscriber the token names, when that one's
 * copy is written: this registration's write audited its own copy (created or taken over), and
 * after it the ledger must say where the subscription went. When the owner has not written yet, its
 * write audits the change itself.
 */
async function detach(redis: Redis, keys: Keys, scope: TenantScope, externalId: string, id: string, reason: string, upTo = Infinity, audit?: AuditTrail, lost = false): Promise<{ subscription: Subscription; claim: number; release: ReleaseRef } | null> {
  type Read = Held & { owner: string | null; theirs: Record<string, string> };
  return changeSubscriber<{ subscription: Subscription; claim: number; release: ReleaseRef } | null, Read>(redis, keys, scope, externalId, (snapshot, { record: h, member, owner, theirs }) => {
    if (!snapshot.exists || !member) return { skip: null };
    const recordKey = keys.subscription(snapshot.partition, scope.tenantId, id);
    const set = keys.subscriberSubscriptions(snapshot.partition, scope.tenantId, externalId);
    const guards: WriteGuard[] = [['fieldIs', recordKey, 'holder', h.holder ?? '']];
    // a reference to no record at all is invisible (lists skip it): dropped silently
    if (!h.id) return { create: false, events: [], ops: [['srem', set, id]], guards: [['absent', recordKey]], result: null };
    const subscription = toSubscription(externalId, h);
    const removed = (why: string) => ({ name: '$subscription.removed', data: { subscription: publicOf(subscription), reason: why } });
    if (!heldBy(h, externalId)) {
      const gone = { name: '$subscription.removed', data: { subscription: publicOf(leftState(externalId, h)), reason: 'moved' } };
      return { create: false, events: [gone], ops: [['srem', set, id]], guards, result: null };
    }
    const claim = Number(h.claim ?? 0);
    if (claim > upTo) return { skip: null };
    // the token names another subscriber who holds its copy: this copy is what that one's move leaves
    // behind, and its write audited the owner change. One whose mover has not written (refused 409,
    // or killed) may leave the device with nobody: its removal is audited (probe AI)
    const movedAway = owner !== null && owner !== externalId;
    const ownerWrote = movedAway && heldBy(theirs, owner);
    const entry = !audit ? null
      : lost ? (ownerWrote && theirs.movedFrom !== `${externalId}#${claim}` ? movedAudit(audit, externalId, h, owner!, theirs) : null)
        : ownerWrote ? null : draftedAudit(audit, 'subscription.delete', [{ type: 'subscription.deleted', target: { type: 'subscription', id: subscription.id }, object: subscription }]);
    // a removal (not a move: the token is the mover's) owes the release of its token index entry,
    // recorded here so that a process killed before lua/releaseToken leaves it to the sweeper
    // (probe DV: an anonymous subscriber's address, its merge killed between the two, stayed for good)
    const release: ReleaseRef = { partition: snapshot.partition, field: `${scope.tenantId}|${id}|${claim}` };
    const owed: TokenRelease = { at: now(), workspaceId: scope.workspaceId, tenantId: scope.tenantId, externalId, id, channel: subscription.channel, token: subscription.token, address: subscription.address, claim };
    const ops: RecordOp[] = [['del', recordKey], ['srem', set, id]];
    if (reason === 'removed') ops.push(['hset', keys.tokenReleases(snapshot.partition), release.field, JSON.stringify(owed)]);
    return { create: false, events: [removed(ownerWrote ? 'moved' : reason)], ops, guards, audit: entry, result: { subscription, claim, release } };
  }, async (p) => {
    const [held, owner] = await Promise.all([readHeld(redis, keys, scope, externalId, id)(p), audit ? redis.hget(keys.subscriptionOwners(scope.tenantId), id) : null]);
    if (owner === null || owner === externalId) return { ...held, owner, theirs: {} };
    const theirs = await redis.hgetall(keys.subscription(partitionOf(scope.tenantId, owner, scope.partitions), scope.tenantId, id));
    return { ...held, owner, theirs };
  });
}

/** The tenant keys of token ownership, in the order lua/claimToken, releaseToken and unclaimToken take them. */
const tokenKeys = (keys: Keys, tenantId: string) => [keys.tokens(tenantId), keys.subscriptionOwners(tenantId), keys.tokenMoves(tenantId), keys.subscriptionClaims(tenantId)];

/**
 * Registers a device token or an email address for `externalId`. A token that already exists is
 * updated instead of duplicated, and moved (`$subscription.registered` on the new subscriber, then
 * `$subscription.removed` on the previous one) when the app's user changed. An unknown externalId
 * is created. Safe under concurrency and to retry: the token's owner is decided in one script
 * (lua/claimToken), the record is written by compare-and-set stamped with the claim's number, and
 * an unsettled move is finished by the next registration of that token (or, once the mover's copy
 * is written, by the worker's sweeper: `sweepTokenMoves`). A registration refused
 * because the subscriber holds MAX_SUBSCRIPTIONS_PER_SUBSCRIBER already (409, decided atomically
 * with the write) changes nothing: the previous subscriber loses its copy only after the new one's
 * write, and the claim is given back (lua/unclaimToken). `options.enabled` is the `enabled` of a
 * record this call creates (an anonymous subscriber's muted device stays muted when it moves).
 * With `options.audit`, the write that creates the record here records `subscription.created`, one
 * that changes a public field `subscription.updated` (registering what is stored audits nothing), and
 * the write that takes the subscription over from the previous subscriber's copy records one
 * `subscription.updated` naming the owner change (`externalId`) and any other public field the
 * registration changed (see `writeRegistration`); the removal of the previous copy audits nothing.
 */
export async function registerSubscription(
  redis: Redis, keys: Keys, scope: TenantScope, externalId: string, input: RegisterInput,
  options: {
    enabled?: boolean; audit?: AuditTrail;
    /** a merge's move of an anonymous subscriber's device: an invalidation of it stays (the app did not register that token now) */
    merging?: boolean;
    /** tests: runs between the claim and the write */ afterClaim?: () => Promise<void>;
  } = {},
): Promise<Registered> {
  try {
    return await registerOnce(redis, keys, scope, externalId, input, options);
  } catch (err) {
    // At the limit, a device APNs has declared gone (410, BadDeviceToken: `invalidatedAt`) makes room,
    // the longest gone first; live devices never do. Reinstalls and token changes otherwise filled the
    // 50 with dead tokens, and the user's next device was refused for good (probe B1).
    // Registrations at the limit at once each pick the same longest-gone device: one of them gets the
    // room it makes, and the others go on to the next gone device while one is left (probe Y1: 4 at
    // once with 4 gone devices got two 409s). Each room taken took a gone device, so this ends.
    let refusal: unknown = err;
    for (let attempt = 0; attempt < MAX_SUBSCRIPTIONS_PER_SUBSCRIBER; attempt++) {
      if (!(refusal instanceof ApiError && limitRefusals.has(refusal))) throw refusal;
      const dead = (await listSubscriptions(redis, keys, scope, externalId))
        .filter((s) => s.invalidatedAt !== null)
        .sort((a, b) => a.invalidatedAt!.localeCompare(b.invalidatedAt!))[0];
      if (!dead) throw refusal;
      await removeSubscription(redis, keys, scope, externalId, dead.id, options.audit).catch((gone: unknown) => {
        if (!(gone instanceof ApiError && gone.status === 404)) throw gone; // removed meanwhile: room all the same
      });
      try {
        return await registerOnce(redis, keys, scope, externalId, input, options);
      } catch (again) {
        refusal = again;
      }
    }
    throw refusal;
  }
}

/** How long a registration holds its token's lock (lua/claimToken) unless it gives it up sooner: far longer than one takes; one that died holds it this long at most. */
const TOKEN_LOCK_MS = 2_000;
/** How long a registration waits for another registration of the same token before answering 429 `lock_timeout`. */
const TOKEN_LOCK_WAIT_MS = 5_000;
/** The longest pause between two claims of a held lock: with waits of at most 5 ms, 300 registrations of one device at once made ~190 script calls each, slowing the holder (probe DA). */
const TOKEN_LOCK_POLL_MAX_MS = 20;

/** A registration's lock on its token: the key, the owner (the registration's new subscription id), and whether it may still hold it. */
type TokenLock = { key: string; owner: string; held: boolean };

/**
 * Claims the token (lua/claimToken) under its registration lock: while another registration of the
 * same token holds it (in any process), waits (about 1 ms, doubling to about 20 ms, each wait spread
 * by ±50 %, at most TOKEN_LOCK_WAIT_MS,
 * then 429 `lock_timeout`). Two app users registering one device at once each saw the other's
 * copy half-moved: a copy created again (createdAt reset), the owner change audited twice and the
 * ledger's last entry naming the one that lost (probe BX).
 */
async function claimUnderLock(redis: Redis, keys: Keys, scope: TenantScope, field: string, legacy: string, externalId: string, lock: TokenLock): Promise<[string, string, number, string?, string?]> {
  const tokens = [...tokenKeys(keys, scope.tenantId), lock.key];
  const giveUpAt = Date.now() + TOKEN_LOCK_WAIT_MS;
  for (let wait = 1; ; wait = Math.min(wait * 2, TOKEN_LOCK_POLL_MAX_MS)) {
    const reply = await callScript<[string, string, number, string?, string?]>(redis, 'claimToken', tokens, [field, lock.owner, externalId, lock.owner, TOKEN_LOCK_MS, legacy]);
    if (reply[0] !== 'busy') return reply;
    if (Date.now() >= giveUpAt) throw lockTimeout('The device (another registration of it is in progress)');
    // spread: waiters that started together do not all claim again at once
    await sleep(wait * (0.5 + Math.random()));
  }
}

/** Gives up the registration's lock on its token unless lua/confirmToken did (else it expires). */
async function releaseTokenLock(redis: Redis, lock: TokenLock): Promise<void> {
  if (!lock.held) return;
  lock.held = false;
  await callScript(redis, 'releaseLease', [lock.key], [lock.owner]).catch(() => 0);
}

async function registerOnce(
  redis: Redis, keys: Keys, scope: TenantScope, externalId: string, input: RegisterInput,
  options: { enabled?: boolean; audit?: AuditTrail; merging?: boolean; afterClaim?: () => Promise<void> },
): Promise<Registered> {
  checkRegistration(input);
  const field = tokenField(input.channel, input.channel === 'push' ? input.token! : input.address!, externalId);
  const legacy = input.channel === 'email' ? legacyEmailField(input.address!) : '';
  // an overtaken registration whose overtaking move was given back (refused) claims again, a few times
  for (let attempt = 1; ; attempt++) {
    const lock: TokenLock = { key: keys.tokenLock(scope.tenantId, field), owner: newId('subscription'), held: true };
    const [claim, id, claimNumber, previous, unsettled] = await claimUnderLock(redis, keys, scope, field, legacy, externalId, lock);
    try {
      const done = await registerClaimed(redis, keys, scope, externalId, input, options, { field, lock, claim, id, stamp: Number(claimNumber), previous, unsettled }, attempt < OVERTAKEN_ATTEMPTS);
      if (done) return done;
    } finally {
      await releaseTokenLock(redis, lock);
    }
    await sleep(attempt * 10);
  }
}

/** Claims an overtaken registration makes when the move that overtook it was given back (`overtakenReply`). */
const OVERTAKEN_ATTEMPTS = 3;

/**
 * A registration after its claim: writes its copy, removes the previous subscriber's on a move,
 * then checks the token still names its copy (which gives the lock up).
 */
async function registerClaimed(
  redis: Redis, keys: Keys, scope: TenantScope, externalId: string, input: RegisterInput,
  options: { enabled?: boolean; audit?: AuditTrail; merging?: boolean; afterClaim?: () => Promise<void> },
  { field, lock, claim, id, stamp, previous, unsettled }: { field: string; lock: TokenLock; claim: string; id: string; stamp: number; previous?: string; unsettled?: string },
  mayRetry = false,
): Promise<Registered | null> {
  const tokens = tokenKeys(keys, scope.tenantId);
  if (options.afterClaim) {
    // tests: what runs here happens as if the lock had expired (its holder stalled that long)
    await releaseTokenLock(redis, lock);
    await options.afterClaim();
  }
  const enabled = options.enabled ?? true;
  const make: Make = { enabled, merging: options.merging, stamp, audit: options.audit, from: claim === 'moved' && previous !== undefined && previous !== externalId ? previous : undefined, unsettled };
  // a move: the copies it takes from are marked before they are read (`markMovedOut`)
  if (make.from !== undefined) await markMovedOut(redis, keys, scope, make.from, id, stamp);
  if (unsettled !== undefined) await markMovedOut(redis, keys, scope, unsettled, id, stamp);
  let outcome: Written;
  try {
    if (claim === 'new') {
      // The id was made for this call: no record of it can exist unless a concurrent registration of the
      // same token by the same externalId (claim 'same') wrote it first; then the general path below updates it.
      const fresh = await createFresh(redis, keys, scope, externalId, id, input, make);
      if (fresh === 'overtaken') return overtakenReply(redis, keys, scope, externalId, field, id, make, fieldsOf(input), mayRetry);
      if (fresh) {
        await confirmToken(redis, keys, scope, field, externalId, id, stamp, lock, options.audit);
        return { subscription: fresh, created: true, changes: {}, previousAttributes: {} };
      }
    }
    const wanted = fieldsOf(input);
    outcome = await writeRegistration(redis, keys, scope, externalId, id, wanted, givenFieldsOf(input, wanted), make);
  } catch (err) {
    // refused (the limit, or a subscriber changing too fast): this call wrote no record, so its claim goes back
    if (err instanceof ApiError && claim !== 'same') {
      await callScript(redis, 'unclaimToken', tokens, [field, id, externalId, claim === 'moved' ? previous ?? '' : '', unsettled ?? '']);
      // and so do its marks: the previous subscriber's registrations under that same claim number (a
      // dead mover's retry) are not overtaken by a move that never happened
      for (const from of [make.from, unsettled]) if (from !== undefined) await unmarkMovedOut(redis, keys, scope, from, id, stamp);
    }
    throw err;
  }
  // only once this subscriber holds the record does the previous one lose its copy (unless a later
  // claim of the previous subscriber wrote it anew), and so does the one an unsettled move of that
  // one left; then the move is settled. A copy removed that this write did not take over (written
  // meanwhile by a registration that claimed before this one) is audited as the owner change here.
  if (claim === 'moved' && previous !== undefined) {
    await detach(redis, keys, scope, previous, id, 'moved', stamp, options.audit, true);
    if (unsettled !== undefined) await detach(redis, keys, scope, unsettled, id, 'moved', stamp, options.audit, true);
    await settleMove(redis, keys, scope.tenantId, field, previous, `${id}|${externalId}`);
  }
  if (outcome.overtaken === 'moved-out') return overtakenReply(redis, keys, scope, externalId, field, id, make, fieldsOf(input), mayRetry);
  await confirmToken(redis, keys, scope, field, externalId, id, stamp, lock, options.audit);
  if (outcome.overtaken) return overtakenReply(redis, keys, scope, externalId, field, id, make, fieldsOf(input));
  // the record as written (no second read)
  const subscription = toSubscription(externalId, outcome.record);
  return { subscription, created: outcome.created, ...(outcome.created ? { changes: {}, previousAttributes: {} } : diffOf(toSubscription(externalId, outcome.before), subscription)) };
}

/**
 * The answer of a registration overtaken before its write (it wrote nothing): the device was this
 * subscriber's when it claimed it, and another's right after. It answers, not created, the
 * subscription as this registration gave it (its own fields, never the holder's: another app user's
 * device details, mute and permission status are not the caller's to read, probe CA), with the
 * subscription's `createdAt` when its holder's copy is found.
 */
async function overtakenReply(redis: Redis, keys: Keys, scope: TenantScope, externalId: string, field: string, id: string, make: Make, wanted: Record<string, string>, mayRetry = false): Promise<Registered | null> {
  const named = await redis.hget(keys.tokens(scope.tenantId), field);
  // the move that overtook this registration was refused (409) and gave the token back to it: this
  // one claims again (the refused move takes its mark back too); else it answered 200 and wrote
  // nothing, and the token named a copy that did not exist until the next registration (probe CD)
  if (mayRetry && named === `${id}|${externalId}`) return null;
  const owner = named?.startsWith(`${id}|`) ? named.slice(id.length + 1) : null;
  const theirs = owner === null ? {} : await redis.hgetall(keys.subscription(partitionOf(scope.tenantId, owner, scope.partitions), scope.tenantId, id));
  const record = newRecord(id, wanted, isoNow(now()), { ...make, holder: externalId });
  if (owner !== null && heldBy(theirs, owner)) record.createdAt = theirs.createdAt!;
  return { subscription: toSubscription(externalId, record), created: false, changes: {}, previousAttributes: {} };
}

/**
 * A registration's outcome: `created` for a new record on this subscriber (registered or moved
 * here), else the public fields it changed (`changes`, `previousAttributes`; both empty when the
 * app registered what was stored, as it does on every launch).
 */
export type Registered = { subscription: Subscription; created: boolean; changes: Record<string, unknown>; previousAttributes: Record<string, unknown> };

/**
 * How a registration writes: the `enabled` of a record it creates, the claim number it stamps, the
 * audit of its write, and, for a claim that moved the token, the subscriber it moved `from`
 * (`merging`: a merge's move, which takes `enabled`, the registration time and an invalidation from
 * the copy it moves, read in its write).
 */
type Make = { enabled: boolean; merging?: boolean; stamp: number; audit?: AuditTrail; from?: string; unsettled?: string };

function diffOf(before: Subscription, after: Subscription): { changes: Record<string, unknown>; previousAttributes: Record<string, unknown> } {
  const changes: Record<string, unknown> = {};
  const previousAttributes: Record<string, unknown> = {};
  for (const k of Object.keys(after) as (keyof Subscription)[]) {
    if (k === 'updatedAt' || JSON.stringify(before[k]) === JSON.stringify(after[k])) continue;
    changes[k] = after[k];
    previousAttributes[k] = before[k];
  }
  return { changes, previousAttributes };
}

/**
 * What `writeRegistration` did: `created` a copy here, or updated (or found as it is) `before`;
 * `overtaken` when it wrote nothing because a later claim had won: another subscriber of the
 * partition holds the record under it (`later-claim`), or its move removed this subscriber's copy
 * (`moved-out`); `record` is then not this subscriber's.
 */
type Written = { created: boolean; record: Record<string, string>; before: Record<string, string>; overtaken?: 'later-claim' | 'moved-out' };

/**
 * Writes subscription `id` into `externalId` by compare-and-set, stamped with the claim number
 * `stamp`: creates it (409 when the subscriber holds MAX_SUBSCRIPTIONS_PER_SUBSCRIBER already,
 * decided on the state the write applies to), takes over the record another subscriber of the
 * partition holds (the same check; the record is written whole; not when that record was written
 * under a later claim, which has won already), or updates the fields that differ
 * (a token the provider had invalidated is revived; an older stamp is raised, without touching
 * `updatedAt`). The holder read is guarded in the write, and so is the claim stamp of a record the write
 * replaces (a later claim by the same holder bumps that holder's version, not this subscriber's).
 *
 * The audit of a move (`make.from`): the subscription keeps its id, so the write that first takes it
 * over from the previous subscriber's copy (read before the write; it is removed only after) records
 * one `subscription.updated`, the owner change (`externalId`) with the other public fields that differ,
 * and the record keeps that copy's `createdAt`. A write that took that copy over already (a retry
 * finishing a move a crash left unsettled: the record names the copy in `movedFrom`) records no second one. Without a
 * previous copy (gone, or never written: the move marked it moved out before this read, so none comes
 * later, `markMovedOut`) the record is new: `subscription.created`. A registration of this subscriber
 * whose claim is not newer than the latest move of its copy (`movedOut`) writes nothing (`overtaken`).
 */
async function writeRegistration(redis: Redis, keys: Keys, scope: TenantScope, externalId: string, id: string, wanted: Record<string, string>, given: Record<string, string>, make: Make) {
  type Read = Held & { count: number; prior: Record<string, string>; priorFrom?: string; out: string | null };
  return changeSubscriber<Written, Read>(redis, keys, scope, externalId, (snapshot, { record: current, member, count, prior, priorFrom, out }, atMs) => {
    const p = snapshot.partition;
    const recordKey = keys.subscription(p, scope.tenantId, id);
    // a later claim's move of this subscriber's copy marked it (`markMovedOut`): this claim is over
    const outKey = keys.subscriptionMovedOut(p, scope.tenantId, id);
    const guards: WriteGuard[] = [['fieldIs', recordKey, 'holder', current.holder ?? ''], ['fieldIs', outKey, externalId, out ?? '']];
    const at = isoNow(atMs);
    const movedOut = Number(out ?? 0) >= make.stamp;
    if (!member || !heldBy(current, externalId)) {
      // the record is replaced on the strength of its claim stamp too: a later claim of the same holder
      // (which bumps that holder's version, not this subscriber's) must make this write recompute
      guards.push(['fieldIs', recordKey, 'claim', current.claim ?? '']);
      // another subscriber of the partition wrote the record under a later claim: this claim is over
      // already (the check after the write drops this subscriber's reference)
      if (current.id && Number(current.claim ?? 0) > make.stamp) return { skip: { created: false, record: {}, before: {}, overtaken: 'later-claim' } };
      // a copy written now would be one nobody claims (the check after the write removed it again)
      if (movedOut) return { skip: { created: false, record: {}, before: {}, overtaken: 'moved-out' } };
      if (!member && count >= MAX_SUBSCRIPTIONS_PER_SUBSCRIBER) throw tooMany();
      // a move keeps what describes the device itself (platform, environment, authorizationStatus,
      // device) where the registration leaves it out: a sandbox token stays a sandbox token
      const carried = prior.id ? Object.fromEntries(Object.keys(wanted).filter((k) => !(k in given) && prior[k] !== undefined).map((k) => [k, prior[k]!])) : {};
      // a merge moves the anonymous user's devices as they are, read here, in the write (probe O: the
      // `enabled` the merge listed before lost a mute made meanwhile, and kept an invalidation's false
      // after the app had registered the token again): muted or not, when the app last registered the
      // token (a provider's 410 is weighed against that, and a merge is no registration: probe O, the
      // device was never invalidated again), and one the push provider invalidated stays so, with its
      // user's flag, until the app registers its token again (moved as a new record, it was pushed to
      // again, and its mute, `enabled: false` from the invalidation, held for good)
      const merged = make.merging && prior.id
        ? { enabled: prior.enabled === '1' ? '1' : '0', ...(prior.registeredAt ? { registeredAt: prior.registeredAt } : {}) } : {};
      const invalidation = make.merging && prior.invalidatedAt
        ? { invalidatedAt: prior.invalidatedAt, userEnabled: userEnabledOf(prior), ...(prior.invalidatedBy ? { invalidatedBy: prior.invalidatedBy } : {}) } : {};
      // a copy taken over names the one it came from (holder and claim stamp), so that one's own check
      // after its write knows this write audited the move (confirmToken)
      // a record another subscriber of this partition holds is replaced here, before that one's removal
      // of its reference: what it held is kept (`left`), so its `$subscription.removed` shows the
      // device as it had it (muted, say), not as this registration leaves it (`leftState`)
      const left: Record<string, string> = current.id && current.holder && current.holder !== externalId ? { left: JSON.stringify([current.holder, current.enabled ?? '', current.platform ?? '']) } : {};
      const record = { ...newRecord(id, { ...wanted, ...carried }, at, { ...make, holder: externalId }), ...merged, ...invalidation, ...left, ...(prior.id ? { createdAt: prior.createdAt!, movedFrom: `${priorFrom}#${prior.claim ?? 0}` } : {}) };
      // a copy taken from another subscriber is the owner change; without one (gone, or never written:
      // marked moved out before the read) the copy written here is the subscription's: created
      const audit = make.audit && (prior.id ? movedAudit(make.audit, priorFrom!, prior, externalId, record) : createdAudit(make.audit, toSubscription(externalId, record)));
      // this subscriber still names a record another one took over (whose move has not removed this
      // reference yet, and now will not: this claim is later): its stream says the device went
      // before it says it came back, so `registered` never follows `registered`
      const lost = member && current.id ? [{ name: '$subscription.removed', data: { subscription: publicOf(toSubscription(externalId, current)), reason: 'moved' } }] : [];
      return {
        create: true,
        audit,
        events: [...lost, { name: '$subscription.registered', data: { subscription: publicOf(toSubscription(externalId, record)) } }],
        // a record of another holder is replaced whole (no field of theirs, such as invalidatedAt, stays)
        ops: [...(current.id ? [['del', recordKey] as RecordOp] : []), ...Object.entries(record).map(([k, v]): RecordOp => ['hset', recordKey, k, v]), ['sadd', keys.subscriberSubscriptions(p, scope.tenantId, externalId), id]],
        guards,
        result: { created: true, record, before: {} },
      };
    }
    // the copy is going to the mover (its removal follows): changing it now would be audited, then removed
    if (movedOut) return { skip: { created: false, record: {}, before: {}, overtaken: 'moved-out' } };
    const changed = Object.entries(given).filter(([k, v]) => (current[k] ?? '') !== v);
    // a token the provider had invalidated is valid again once the app registers it anew, and the
    // device is as its user left it: muted if they muted it, before or after the invalidation
    // (`userEnabled`; probe J: the 410's `enabled: false` was read as no mute, and the device came back on)
    const revived = Boolean(current.invalidatedAt);
    if (revived) changed.push(['invalidatedAt', ''], ['enabled', userEnabledOf(current)], ['userEnabled', '']);
    if (changed.length) changed.push(['updatedAt', at]);
    // the time of the latest registration, which a provider's word on the token is weighed against
    // (invalidateSubscription); it is not public, so it moves no `updatedAt`
    if (Number(current.claim ?? 0) < make.stamp) changed.push(['claim', String(make.stamp)], ['registeredAt', String(Date.parse(at))]);
    // this subscriber's own copy, from before the token went to `priorFrom` (whose copy is still there),
    // taken back under a new claim: the owner changes again; the copy names the one it came back from,
    // as a copy taken over does, so the removal of that one audits nothing more (`detach`). A copy that
    // names that very one already took it over (a retry finishing a move a crash left unsettled): the
    // owner change was recorded with that write
    const from = `${priorFrom}#${prior.claim ?? 0}`;
    const takenBack = prior.id !== undefined && Number(current.claim ?? 0) < make.stamp && current.movedFrom !== from;
    if (takenBack) changed.push(['movedFrom', from]);
    if (!current.holder) changed.push(['holder', externalId]);
    if (changed.length === 0) return { skip: { created: false, record: current, before: current } };
    const record = { ...current, ...Object.fromEntries(changed) };
    // revived, or a field a segment or workflow condition reads (`subscription.platform`) changed in
    // place: the stream says so, and the actor decides membership again (probe Z: a device
    // re-registered as android stayed in the ios segment until the subscriber's next state event)
    const reread = revived || changed.some(([k]) => k === 'platform');
    const events = reread ? [{ name: '$subscription.registered', data: { subscription: publicOf(toSubscription(externalId, record)) } }] : [];
    const audit = make.audit && (takenBack ? movedAudit(make.audit, priorFrom!, prior, externalId, record) : updatedAudit(make.audit, externalId, current, record));
    return { create: true, events, ops: changed.map(([k, v]): RecordOp => ['hset', recordKey, k, v]), guards, audit, result: { created: false, record, before: current } };
  }, async (p) => {
    // the previous subscriber's copy of a move (in its own partition, perhaps this one), read before
    // this write; when it wrote none, the copy an unsettled move of it left (its mover was killed)
    const copyOf = (who: string | undefined): Promise<Record<string, string>> => who === undefined ? Promise.resolve({}) : readRecord(redis, keys, scope, who, id)(partitionOf(scope.tenantId, who, scope.partitions));
    const [held, count, fromCopy, unsettledCopy, out] = await Promise.all([
      readHeld(redis, keys, scope, externalId, id)(p),
      redis.scard(keys.subscriberSubscriptions(p, scope.tenantId, externalId)),
      copyOf(make.from),
      copyOf(make.unsettled),
      movedOutClaim(redis, keys, scope, p, externalId, id),
    ]);
    const [prior, priorFrom] = fromCopy.id || !unsettledCopy.id ? [fromCopy, make.from] : [unsettledCopy, make.unsettled];
    return { ...held, count, prior, priorFrom, out };
  }, { record: false });
}

/**
 * After the write, the token must still name this record (lua/confirmToken):
 * - another subscriber may have claimed it between this call's claim and its write (two app users
 *   registering one device at once). While that move is unsettled from this subscriber and its
 *   write has not happened, this copy is left to it: the mover takes it over (auditing the owner
 *   change) and removes it after its write, and a mover refused with 409 gives the token back to
 *   this copy. Otherwise (the mover wrote already, and its removal found no copy here, or the token
 *   went on elsewhere) the writer removes its own copy (`$subscription.removed`, reason `moved`), so
 *   the device stays with one subscriber, and, with `audit`, records the owner change when the
 *   holder's copy did not come from this one (`detach`);
 * - a removal of the subscription may have forgotten the token meanwhile (it removed the record
 *   another registration of this subscriber had written after this call's claim, and that one's
 *   claim was the latest): this record, written after the removal, is given the token back, or
 *   the next registration of the device would make a second subscription (probe R: 2 of 250 rounds
 *   of removals racing re-registrations). Should a removal take this record away right after, the
 *   token entry is left naming nothing, which the next registration of the device fills again.
 * A crash between the write and this check can leave such a copy; the fan-out never sends to a
 * subscription whose owner is another subscriber (actors/fanout.ts).
 */
async function confirmToken(redis: Redis, keys: Keys, scope: TenantScope, field: string, externalId: string, id: string, stamp: number, lock: TokenLock, audit?: AuditTrail): Promise<void> {
  const held = await callScript<string>(redis, 'confirmToken', [...tokenKeys(keys, scope.tenantId), lock.key], [field, id, externalId, stamp, lock.held ? lock.owner : '']);
  lock.held = false;
  if (held !== 'lost') return;
  if (await leftToMover(redis, keys, scope, field, externalId, id)) return;
  await detach(redis, keys, scope, externalId, id, 'moved', stamp, audit, true);
}

/**
 * True when the token of subscription `id` has moved from `externalId` to a subscriber that has not
 * written its copy yet, and that move is still to remove `externalId`'s copy (the unsettled move
 * names it): the mover's write will take the copy over, and its removal follow.
 */
async function leftToMover(redis: Redis, keys: Keys, scope: TenantScope, field: string, externalId: string, id: string): Promise<boolean> {
  const [named, movingFrom] = await Promise.all([redis.hget(keys.tokens(scope.tenantId), field), redis.hget(keys.tokenMoves(scope.tenantId), field)]);
  if (named === null || movingFrom !== externalId) return false;
  const bar = named.indexOf('|');
  const owner = named.slice(bar + 1);
  if (named.slice(0, bar) !== id || owner === externalId) return false;
  const theirs = await redis.hget(keys.subscription(partitionOf(scope.tenantId, owner, scope.partitions), scope.tenantId, id), 'holder');
  return theirs !== owner;
}

/**
 * Forgets the unsettled move of `field` from `previous` once its copy is removed, unless a later claim
 * recorded another move there meanwhile (lua/settleTokenMove; a bare HDEL forgot that one too).
 */
async function settleMove(redis: Redis, keys: Keys, tenantId: string, field: string, previous: string, mover: string): Promise<void> {
  await callScript(redis, 'settleTokenMove', [keys.tokens(tenantId), keys.tokenMoves(tenantId)], [field, previous, mover]);
}

/** Most unsettled moves looked at per tenant and sweep; the rest wait for the next sweep. */
const MOVES_PER_TENANT = 1_000;

/**
 * Finishes the moves whose mover died after its write and before removing the previous subscriber's
 * copy (the device listed under both, with one scr_ id, until the token's next registration, which
 * may never come; deleting the previous subscriber then looked like deleting the device): for each
 * unsettled move (`{t}:token-moves`) whose mover's copy, the one the token names, was written more
 * than `minAgeMs` ago (its `registeredAt`: a live mover finishes within moments of its write), the
 * previous copy is removed as the mover's own step removes it (`detach`, reason `moved`, fenced by the
 * mover's claim stamp, not audited: the mover's write audited the owner change), then the move is
 * settled. A move whose mover has not written its copy is left to the device's next registration
 * (docs/subscribers.md). One that fails is kept for the next sweep and reported.
 */
export async function sweepTokenMoves(redis: Redis, keys: Keys, partitions: number, tenants: { workspaceId: string; tenantId: string }[], minAgeMs: number, log: Logger): Promise<{ finished: number; kept: number }> {
  let finished = 0;
  let kept = 0;
  const byKey = new Map(tenants.map((t) => [keys.tokenMoves(t.tenantId), t]));
  await sweepHashes(redis, [...byKey.keys()], MOVES_PER_TENANT, async (key, flat) => {
    const { workspaceId, tenantId } = byKey.get(key)!;
    const scope: TenantScope = { workspaceId, tenantId, partitions };
    for (let f = 0; f + 1 < flat.length; f += 2) {
      const field = flat[f]!;
      const previous = flat[f + 1]!;
      try {
        const named = await redis.hget(keys.tokens(tenantId), field);
        if (named === null) continue;
        const bar = named.indexOf('|');
        const id = named.slice(0, bar);
        const mover = named.slice(bar + 1);
        if (mover === previous) continue;
        const p = partitionOf(tenantId, mover, partitions);
        const [theirs, member] = await Promise.all([redis.hgetall(keys.subscription(p, tenantId, id)), redis.sismember(keys.subscriberSubscriptions(p, tenantId, mover), id)]);
        // not written yet (left to the next registration), or written moments ago by a live mover
        if (member !== 1 || !heldBy(theirs, mover) || now() - Number(theirs.registeredAt ?? 0) < minAgeMs) continue;
        await detach(redis, keys, scope, previous, id, 'moved', Number(theirs.claim ?? 0));
        await settleMove(redis, keys, tenantId, field, previous, named);
        finished++;
      } catch (err) {
        kept++;
        log.warn('token move kept for the next sweep', { key, field, err: (err as Error).message });
      }
    }
  });
  return { finished, kept };
}

/** The refusals of the per-subscriber limit (a registration then makes room by removing a dead device, `registerSubscription`). */
const limitRefusals = new WeakSet<ApiError>();
const tooMany = () => {
  const err = new ApiError(409, 'conflict', `A subscriber holds at most ${MAX_SUBSCRIPTIONS_PER_SUBSCRIBER} subscriptions; remove one first`);
  limitRefusals.add(err);
  return err;
};

/** The stored record of a new subscription: its holder, stamped with the number of the claim that wrote it. */
const newRecord = (id: string, fields: Record<string, string>, at: string, make: { enabled: boolean; stamp: number; holder: string }) => ({
  id, ...fields, enabled: make.enabled ? '1' : '0', createdAt: at, updatedAt: at, claim: String(make.stamp), registeredAt: String(Date.parse(at)), holder: make.holder,
});

/**
 * Writes the subscription record of a token claimed as new in one script call, without reading the
 * subscriber first: the change depends on nothing but two conditions the script checks atomically
 * (guards) before writing: the record does not exist yet and the subscriber holds fewer than
 * MAX_SUBSCRIPTIONS_PER_SUBSCRIBER subscriptions (409 otherwise). The write bumps the subscriber's
 * version, so concurrent compare-and-set writers of the subscriber still see a conflict and recompute.
 * Null when the record exists already (written by a concurrent registration of the same token);
 * `overtaken` when a later claim's move marked this copy moved out already (lua/markMovedOut: this
 * registration stalled past its lock, and another app user took the device meanwhile).
 */
async function createFresh(redis: Redis, keys: Keys, scope: TenantScope, externalId: string, id: string, input: RegisterInput, make: Make): Promise<Subscription | null | 'overtaken'> {
  const p = partitionOf(scope.tenantId, externalId, scope.partitions);
  const recordKey = keys.subscription(p, scope.tenantId, id);
  const setKey = keys.subscriberSubscriptions(p, scope.tenantId, externalId);
  const atMs = now();
  const record = newRecord(id, fieldsOf(input), isoNow(atMs), { ...make, holder: externalId });
  const subscription = toSubscription(externalId, record);
  try {
    await writeSubscriber(redis, keys, scope, externalId, {
      create: true, expected: null, at: atMs,
      events: [{ name: '$subscription.registered', data: { subscription: publicOf(subscription) } }],
      ops: [...Object.entries(record).map(([k, v]): RecordOp => ['hset', recordKey, k, v]), ['sadd', setKey, id]],
      guards: [['absent', recordKey], ['scardBelow', setKey, MAX_SUBSCRIPTIONS_PER_SUBSCRIBER], ['fieldIs', keys.subscriptionMovedOut(p, scope.tenantId, id), externalId, '']],
      audit: make.audit && createdAudit(make.audit, subscription),
    });
  } catch (err) {
    if (!(err instanceof GuardFailed)) throw err;
    if (err.index === 0) return null;
    if (err.index === 2) return 'overtaken';
    throw tooMany();
  }
  return subscription;
}

/** The externalId a registration of `externalId`'s token or address belongs to in the tenant (for an address, `externalId` or nobody), or null when it is new. */
export async function tokenOwner(redis: Redis, keys: Keys, tenantId: string, externalId: string, input: RegisterInput): Promise<string | null> {
  const handle = input.channel === 'push' ? input.token : input.address;
  if (!handle) return null;
  const current = await redis.hget(keys.tokens(tenantId), tokenField(input.channel, handle, externalId));
  return current === null ? null : current.slice(current.indexOf('|') + 1);
}

/** The externalId owning subscription `id` in the tenant, or null (a malformed id too). */
export async function ownerOf(redis: Redis, keys: Keys, tenantId: string, id: string): Promise<string | null> {
  if (!isId('subscription', id)) return null;
  return redis.hget(keys.subscriptionOwners(tenantId), id);
}

/** A subscriber's subscription, or 404. */
export async function getSubscription(redis: Redis, keys: Keys, scope: TenantScope, externalId: string, id: string): Promise<Subscription> {
  if (!isId('subscription', id)) throw notFound('Subscription');
  const h = await readRecord(redis, keys, scope, externalId, id)(partitionOf(scope.tenantId, externalId, scope.partitions));
  if (!h.id) throw notFound('Subscription');
  return toSubscription(externalId, h);
}

/** A subscriber's subscriptions, oldest first (at most MAX_SUBSCRIPTIONS_PER_SUBSCRIBER). */
export async function listSubscriptions(redis: Redis, keys: Keys, scope: TenantScope, externalId: string): Promise<Subscription[]> {
  const p = partitionOf(scope.tenantId, externalId, scope.partitions);
  const ids = await redis.smembers(keys.subscriberSubscriptions(p, scope.tenantId, externalId));
  const pipeline = redis.pipeline();
  for (const id of ids) pipeline.hgetall(keys.subscription(p, scope.tenantId, id));
  const records = ((await pipeline.exec()) ?? []).map(([, h]) => h as Record<string, string>).filter((h) => h && heldBy(h, externalId));
  return records.map((h) => toSubscription(externalId, h)).sort((a, b) => (a.id < b.id ? -1 : 1));
}

/**
 * Sets `enabled` (spec 3.2b): `$subscription.muted` / `$subscription.unmuted` only when the value
 * really changes; concurrent identical updates write one event. `changed` says whether this call
 * made the change; with `audit`, that write records `subscription.updated`.
 */
export async function setSubscriptionEnabled(redis: Redis, keys: Keys, scope: TenantScope, externalId: string, id: string, enabled: boolean, audit?: AuditTrail): Promise<{ subscription: Subscription; changed: boolean }> {
  if (!isId('subscription', id)) throw notFound('Subscription');
  const changed = await changeSubscriber<boolean, Record<string, string>>(redis, keys, scope, externalId, (snapshot, h, atMs) => {
    if (!snapshot.exists || !h.id) throw notFound('Subscription');
    const recordKey = keys.subscription(snapshot.partition, scope.tenantId, id);
    // an invalidated device keeps its user's own flag apart (`userEnabled`): a mute of it, which
    // changes no `enabled` (false already) and so writes no event, still holds when the token comes
    // back; and so does an unmute of it: the device stays off (a push would go to a token APNs
    // declared gone) until the app registers the token again, then it is on (until session 62 the
    // unmute answered `enabled: true` beside `invalidatedAt`, and segments counted a dead device)
    const wish: RecordOp[] = h.invalidatedAt && userEnabledOf(h) !== (enabled ? '1' : '0') ? [['hset', recordKey, 'userEnabled', enabled ? '1' : '0']] : [];
    if ((h.enabled === '1') === enabled || (h.invalidatedAt && enabled)) return wish.length ? { create: false, events: [], ops: wish, audit: null, result: false } : { skip: false };
    const at = isoNow(atMs);
    const after = toSubscription(externalId, { ...h, enabled: enabled ? '1' : '0', updatedAt: at });
    const entry: AuditDraft = { type: 'subscription.updated', target: { type: 'subscription', id: after.id }, object: after, changes: { enabled }, previousAttributes: { enabled: !enabled } };
    return {
      create: false,
      events: [{ name: enabled ? '$subscription.unmuted' : '$subscription.muted', data: { subscription: publicOf(after) } }],
      ops: [['hset', recordKey, 'enabled', enabled ? '1' : '0'], ['hset', recordKey, 'updatedAt', at], ...wish],
      audit: audit && draftedAudit(audit, 'subscription.update', [entry]),
      result: true,
    };
  }, readRecord(redis, keys, scope, externalId, id));
  return { subscription: await getSubscription(redis, keys, scope, externalId, id), changed };
}

/**
 * Removes a subscription (`$subscription.removed`) and forgets its token; 404 when it is not the
 * subscriber's. With `audit`, the write records `subscription.deleted`.
 */
export async function removeSubscription(redis: Redis, keys: Keys, scope: TenantScope, externalId: string, id: string, audit?: AuditTrail, options: { /** tests: runs between the removal's write and its token release (a throw is a process killed there) */ afterDetach?: () => Promise<void> } = {}): Promise<Subscription> {
  if (!isId('subscription', id)) throw notFound('Subscription');
  const removed = await detach(redis, keys, scope, externalId, id, 'removed', Infinity, audit);
  if (!removed) throw notFound('Subscription');
  await options.afterDetach?.();
  await removeUnsettledCopy(redis, keys, scope, externalId, { ...removed.subscription, claim: removed.claim });
  await releaseToken(redis, keys, scope.tenantId, externalId, { ...removed.subscription, claim: removed.claim });
  await redis.hdel(keys.tokenReleases(removed.release.partition), removed.release.field);
  return removed.subscription;
}

/** Where a removal recorded the token release it owes (field of `keys.tokenReleases(partition)`). */
type ReleaseRef = { partition: number; field: string };
/** A token release a removal owes: `at` when the removal was computed (ms; the sweep leaves younger ones to their writer). */
export type TokenRelease = { at: number; workspaceId?: string; tenantId: string; externalId: string; id: string; channel: string; token: string | null; address: string | null; claim: number };
/** Owed releases one sweep finishes per partition; the rest wait for the next sweep. */
const RELEASES_PER_PARTITION = 1_000;

/**
 * Releases the token index entries that removals recorded and did not release, their process killed
 * between the removal's write and lua/releaseToken (entries older than `minAgeMs`; the sweeper of
 * actors/audit-outbox-sweeper.ts). The release is fenced as the removal's own (a later claim of the
 * subscription keeps its entry), so finishing it late, or twice, takes nothing from anyone.
 */
export async function sweepTokenReleases(redis: Redis, keys: Keys, partitions: number, minAgeMs: number, log: Logger): Promise<{ finished: number; kept: number }> {
  const hashes = Array.from({ length: partitions }, (_, p) => keys.tokenReleases(p));
  return sweepAgedEntries<TokenRelease>(redis, hashes, RELEASES_PER_PARTITION, minAgeMs, log, 'token release', async (owed, key, field) => {
    // recorded before the workspace was (session 58): such a removal's unsettled move is left as it was
    if (owed.workspaceId) await removeUnsettledCopy(redis, keys, { workspaceId: owed.workspaceId, tenantId: owed.tenantId, partitions }, owed.externalId, owed);
    await releaseToken(redis, keys, owed.tenantId, owed.externalId, owed);
    await redis.hdel(key, field);
  });
}

/**
 * Before a removed subscription's token is released: a move of the device to `externalId` left
 * unsettled (its mover killed after its write, before removing the previous subscriber's copy) still
 * has that copy, and the release forgets the move (lua/releaseToken), after which neither the next
 * registration nor the sweeper would remove it: the device then got a second subscription, and a merge
 * of that previous (anonymous) subscriber answered 429 on every retry (probe EM). So it is removed
 * first, as the move's own step removes it (`detach`, reason `moved`, fenced by the removed record's
 * claim stamp, not audited). Push tokens only: an address never moves.
 */
async function removeUnsettledCopy(redis: Redis, keys: Keys, scope: TenantScope, externalId: string, s: { id: string; channel: string; token: string | null; claim: number }): Promise<void> {
  if (s.channel !== 'push' || !s.token) return;
  const previous = await redis.hget(keys.tokenMoves(scope.tenantId), tokenField('push', s.token, externalId));
  if (previous === null || previous === externalId) return;
  await detach(redis, keys, scope, previous, s.id, 'moved', s.claim);
}

/**
 * Forgets the token index entry of a subscription removed from `externalId` (if the token is still
 * that subscription's, and still `externalId`'s, and not claimed since the removed record's `claim`
 * stamp: a registration racing the removal keeps it).
 */
export async function releaseToken(redis: Redis, keys: Keys, tenantId: string, externalId: string, s: { id: string; channel: string; token: string | null; address: string | null; claim: number }): Promise<void> {
  const handle = s.channel === 'email' ? s.address : s.token;
  // an address registered before addresses were one per subscriber, and not registered since, is under its former field
  const former = s.channel === 'email' && s.address ? legacyEmailField(s.address) : '';
  await callScript(redis, 'releaseToken', tokenKeys(keys, tenantId), [handle ? tokenField(s.channel, handle, externalId) : '', s.id, externalId, s.claim, former]);
}

/**
 * What a push knew of the subscription it went to: the claim number of the registration it read
 * (lua/claimToken: every registration call gets a new one), and, from an APNs 410, the time (ms)
 * since which APNs holds the token unregistered.
 */
export type PushedTo = {
  claim: number; unregisteredAt: number | null;
  /** the delivery whose push got the answer, and what that delivery records of it: kept on the subscription (`invalidatedBy`) */
  by?: { deliveryId: string; fields: Record<string, string> };
};

/**
 * Disables a subscription whose token the push provider reports dead (BadDeviceToken,
 * Unregistered) and writes `$subscription.invalidated`, once, with its `subscription.updated`
 * (actor `system`: Herald's own change). Not when the app registered the token again after the push
 * read the subscription (a later claim number: the answer speaks of a registration that is over,
 * say a push in flight while the app re-registered), nor, for a 410, when the latest registration
 * is later than the time APNs gives (Apple: stop pushing "until the device registers a token with a
 * later timestamp").
 */
export async function invalidateSubscription(redis: Redis, keys: Keys, scope: TenantScope, externalId: string, id: string, reason: string, pushed: PushedTo, audit?: AuditTrail): Promise<void> {
  await changeSubscriber<null, Record<string, string>>(redis, keys, scope, externalId, (snapshot, h, atMs) => {
    if (!snapshot.exists || !h.id || h.invalidatedAt) return { skip: null };
    if (Number(h.claim ?? 0) > pushed.claim) return { skip: null };
    if (pushed.unregisteredAt !== null && Number(h.registeredAt ?? 0) > pushed.unregisteredAt) return { skip: null };
    const recordKey = keys.subscription(snapshot.partition, scope.tenantId, id);
    const at = isoNow(atMs);
    const after = { ...h, enabled: '0', invalidatedAt: at, updatedAt: at };
    return {
      create: false,
      events: [{ name: '$subscription.invalidated', data: { subscription: publicOf({ ...toSubscription(externalId, h), enabled: false }), reason } }],
      ops: [
        ['hset', recordKey, 'enabled', '0'], ['hset', recordKey, 'invalidatedAt', at], ['hset', recordKey, 'updatedAt', at],
        // the user's own flag, which `enabled: false` no longer tells, for when the token comes back
        ['hset', recordKey, 'userEnabled', h.enabled === '1' ? '1' : '0'],
        // which delivery's answer this was: a dispatcher killed before recording it settles that delivery from here on resume
        ...(pushed.by ? [['hset', recordKey, 'invalidatedBy', JSON.stringify(pushed.by)] as RecordOp] : []),
      ],
      audit: audit && updatedAudit(audit, externalId, h, after, 'subscription.update'),
      result: null,
    };
  }, readRecord(redis, keys, scope, externalId, id));
}

const createdAudit = (trail: AuditTrail, subscription: Subscription) =>
  draftedAudit(trail, 'subscription.register', [{ type: 'subscription.created', target: { type: 'subscription', id: subscription.id }, object: subscription }]);

/** `subscription.updated` of a write (a registration by default) that changed a public field of the record, else no audit. */
function updatedAudit(trail: AuditTrail, externalId: string, before: Record<string, string>, after: Record<string, string>, op = 'subscription.register') {
  const subscription = toSubscription(externalId, after);
  const { changes, previousAttributes } = diffOf(toSubscription(externalId, before), subscription);
  if (Object.keys(changes).length === 0) return null;
  return draftedAudit(trail, op, [{ type: 'subscription.updated', target: { type: 'subscription', id: subscription.id }, object: subscription, changes, previousAttributes }]);
}

/**
 * `subscription.updated` of a write taking subscription `id` over from `from`'s copy (`before`): the
 * owner change (`externalId`) and every other public field that differs.
 */
function movedAudit(trail: AuditTrail, from: string, before: Record<string, string>, externalId: string, after: Record<string, string>) {
  const subscription = toSubscription(externalId, after);
  const { changes, previousAttributes } = diffOf(toSubscription(from, before), subscription);
  return draftedAudit(trail, 'subscription.register', [{ type: 'subscription.updated', target: { type: 'subscription', id: subscription.id }, object: subscription, changes, previousAttributes }]);
}

/** The audit entries of subscription writes: decided with each change (streams/subscriber-audit.ts). */
export const SUBSCRIPTION_AUDITS = {
  'subscription.register': drafted,
  'subscription.update': drafted,
  'subscription.delete': drafted,
};
