import type { Redis } from 'ioredis';
import { isoNow, now } from '../lib/clock.js';
import { notFound, validationError } from '../lib/errors.js';
import { partitionOf } from '../lib/partition.js';
import { recordOf } from '../lib/field-list.js';
import { timeZoneAsNamed } from '../lib/time-zones.js';
import { MAX_EVENT_DATA_BYTES } from '../lib/track-events.js';
import type { AuditDraft } from './audit-outbox.js';
import type { Keys } from './keys.js';
import { diff, sameJson } from './ledger.js';
import { draftedAudit, drafted, type AuditTrail, type WriteAudit, type WriteReply } from './subscriber-audit.js';
import { cleanupOp, finishCleanup, type SubscriberCleanup } from './subscriber-cleanup.js';
import { heldBy, publicOf, toSubscription, type Subscription } from './subscriptions.js';
import { changeSubscriber, readSubscriber, type EngineEvent, type RecordOp, type SubscriberSnapshot, type TenantScope, type WriteGuard } from './subscriber-writes.js';

export const MAX_PROPERTIES_BYTES = 8 * 1024;
const ATTRIBUTE_FIELDS = ['email', 'phone', 'locale', 'timezone', 'properties'] as const;

export type Attributes = { email?: string | null; phone?: string | null; locale?: string | null; timezone?: string | null; properties?: Record<string, unknown> | null };
export type Subscriber = {
  id: string; externalId: string; email: string | null; phone: string | null; locale: string | null; timezone: string | null;
  properties: Record<string, unknown>; verified: boolean; createdAt: string; updatedAt: string;
  /** slugs of the segments the subscriber belongs to (kept by the workers) */
  segments: string[];
};

/** The public view of a stored subscriber record; `segments` from `segmentSlugs`. */
export function toSubscriber(externalId: string, h: Record<string, string>, segments: string[] = []): Subscriber {
  return {
    id: h.id!, externalId, email: h.email || null, phone: h.phone || null, locale: h.locale || null, timezone: h.timezone || null,
    properties: h.properties ? JSON.parse(h.properties) : {}, verified: h.verified === '1', createdAt: h.createdAt!, updatedAt: h.updatedAt ?? h.createdAt!,
    segments,
  };
}

/**
 * The sorted slugs of a subscriber's segments: `segs` is the `segs` field of its automation state
 * (JSON array of segment ids, kept by the workers), `slugs` the tenant's segment slug index
 * (HGETALL); ids of deleted segments are dropped.
 */
export function segmentSlugs(segs: string | null | undefined, slugs: Record<string, string>): string[] {
  const ids = new Set(segs ? (JSON.parse(segs) as string[]) : []);
  if (ids.size === 0) return [];
  return Object.entries(slugs).filter(([, id]) => ids.has(id)).map(([slug]) => slug).sort();
}

/** One subscriber's segment slugs (two reads sent at once: one round trip). */
export async function segmentsOf(redis: Redis, keys: Keys, scope: TenantScope, externalId: string): Promise<string[]> {
  const p = partitionOf(scope.tenantId, externalId, scope.partitions);
  const [segs, slugs] = await Promise.all([redis.hget(keys.automation(p, scope.tenantId, externalId), 'segs'), redis.hgetall(keys.segmentSlugs(scope.tenantId))]);
  return segmentSlugs(segs, slugs);
}

/** Subscribers by externalId with their segments, in one pipeline; null for one that does not exist. */
export async function loadSubscribers(redis: Redis, keys: Keys, scope: TenantScope, externalIds: string[]): Promise<(Subscriber | null)[]> {
  if (externalIds.length === 0) return [];
  const pipeline = redis.pipeline().hgetall(keys.segmentSlugs(scope.tenantId));
  for (const x of externalIds) {
    const p = partitionOf(scope.tenantId, x, scope.partitions);
    pipeline.hgetall(keys.subscriber(p, scope.tenantId, x)).hget(keys.automation(p, scope.tenantId, x), 'segs');
  }
  const replies = (await pipeline.exec()) ?? [];
  for (const [err] of replies) if (err) throw err;
  const slugs = replies[0]![1] as Record<string, string>;
  return externalIds.map((x, i) => {
    const h = replies[1 + i * 2]![1] as Record<string, string>;
    return h.id ? toSubscriber(x, h, segmentSlugs(replies[2 + i * 2]![1] as string | null, slugs)) : null;
  });
}

/** Serialized size of a `properties` object, the measure of its 8 KB bound. */
export const propertiesBytes = (properties: Record<string, unknown>): number => Buffer.byteLength(JSON.stringify(properties));

const tooLarge = (base: string) => ({ param: `${base}properties`, message: `must be at most ${MAX_PROPERTIES_BYTES} bytes serialized, merged with the stored properties` });

/** Checks what a schema cannot: the size of `properties` in the request (a time zone is checked by the schema, `x-timeZone`). */
export function checkAttributes(attributes: Attributes, base = ''): void {
  if (attributes.properties && propertiesBytes(attributes.properties) > MAX_PROPERTIES_BYTES) throw validationError([tooLarge(base)]);
}

/** The attribute values after applying `input` (properties merge key by key; null removes). */
function nextAttributes(current: Subscriber | null, input: Attributes): Omit<Subscriber, 'id' | 'externalId' | 'verified' | 'createdAt' | 'updatedAt' | 'segments'> {
  const base = current ?? { email: null, phone: null, locale: null, timezone: null, properties: {} };
  const properties: Record<string, unknown> = { ...base.properties };
  if (input.properties === null) for (const k of Object.keys(properties)) delete properties[k];
  else for (const [k, v] of Object.entries(input.properties ?? {})) if (v === null) delete properties[k]; else properties[k] = v;
  return {
    email: input.email === undefined ? base.email : input.email,
    phone: input.phone === undefined ? base.phone : input.phone,
    // BCP 47 separates subtags with `-`; iOS's Locale.identifier writes `en_US`: one spelling stored
    locale: input.locale === undefined ? base.locale : input.locale === null ? null : input.locale.replaceAll('_', '-'),
    timezone: input.timezone === undefined ? base.timezone : input.timezone === null ? null : timeZoneAsNamed(input.timezone),
    properties,
  };
}

/**
 * The data of a `$subscriber.updated` event, `{ changes, previousAttributes }`, within the 8 KB of
 * event data (spec 2.4). Properties are bounded at 8 KB each side, so replacing them whole made
 * 16 KB of data (probe D1). Over the bound, values give way, largest first, previous values before
 * new ones (property keys one by one, then whole fields), each named in `truncated` by its path
 * (`previousAttributes.properties.bio`): the subscriber's record and the audit `subscriber.updated`
 * keep every value.
 */
export function boundedUpdateData(changes: Record<string, unknown>, previous: Record<string, unknown>, maxBytes = MAX_EVENT_DATA_BYTES): Record<string, unknown> {
  const data = { changes: { ...changes }, previousAttributes: { ...previous } } as Record<string, Record<string, unknown>>;
  const size = (value: unknown) => Buffer.byteLength(JSON.stringify(value) ?? '', 'utf8');
  if (size(data) <= maxBytes) return data;
  const truncated: string[] = [];
  for (const side of ['previousAttributes', 'changes'] as const) {
    const part = data[side]!;
    if (part.properties && typeof part.properties === 'object') part.properties = { ...(part.properties as Record<string, unknown>) };
    // the largest first: property values one by one, then whole fields
    const cuts = [
      ...Object.entries((part.properties ?? {}) as Record<string, unknown>).map(([key, value]) => ({ path: `${side}.properties.${key}`, bytes: size(value), cut: () => delete (part.properties as Record<string, unknown>)[key] })),
      ...Object.entries(part).filter(([field]) => field !== 'properties').map(([field, value]) => ({ path: `${side}.${field}`, bytes: size(value), cut: () => delete part[field] })),
    ].sort((a, b) => b.bytes - a.bytes);
    for (const c of cuts) {
      if (size({ ...data, truncated }) <= maxBytes) return { ...data, truncated };
      c.cut();
      truncated.push(c.path);
    }
  }
  return { ...data, truncated };
}

/**
 * Record operations and the `$subscriber.updated` event for an attribute change (none when nothing
 * changes). `properties` of the event carry only the changed keys. Throws 400 `validation` on
 * `<base>properties` when the merged `properties` would go over 8 KB and grow: computed from the
 * snapshot the compare-and-set write applies to, so the bound holds for what is stored.
 */
export function attributeChange(keys: Keys, scope: TenantScope, snapshot: SubscriberSnapshot, externalId: string, input: Attributes, extra: { at: number; verified?: boolean; base?: string }) {
  const current = snapshot.exists ? toSubscriber(externalId, snapshot.record) : null;
  const next = nextAttributes(current, input);
  const changes: Record<string, unknown> = {};
  const previous: Record<string, unknown> = {};
  const ops: RecordOp[] = [];
  const record = keys.subscriber(snapshot.partition, scope.tenantId, externalId);
  const before = current ?? { email: null, phone: null, locale: null, timezone: null, properties: {} };
  // an object stored over the bound before the bound covered the merged result may still shrink
  const nextBytes = propertiesBytes(next.properties);
  if (nextBytes > MAX_PROPERTIES_BYTES && nextBytes > propertiesBytes(before.properties)) throw validationError([tooLarge(extra.base ?? '')]);
  for (const field of ATTRIBUTE_FIELDS) {
    if (sameJson(before[field], next[field])) continue;
    if (field === 'properties') {
      // only the keys that differ (null for a key absent on that side): ledger's one key-by-key diff
      const changed = diff(before.properties, next.properties);
      changes.properties = changed?.changes ?? {};
      previous.properties = changed?.previousAttributes ?? {};
    } else {
      changes[field] = next[field];
      previous[field] = before[field];
    }
    const value = next[field];
    if (value === null || (field === 'properties' && Object.keys(value as object).length === 0)) ops.push(['hdel', record, field]);
    else ops.push(['hset', record, field, field === 'properties' ? JSON.stringify(value) : String(value)]);
  }
  const member = `$SUB|${externalId}`; // lua/writeSubscriber puts the subscriber id in place of $SUB
  if (extra.verified && snapshot.record.verified !== '1') {
    ops.push(['hset', record, 'verified', '1'], ['zadd', keys.subscriberVerifiedIndex(snapshot.partition, scope.tenantId), 0, member]);
    if (current) { changes.verified = true; previous.verified = false; }
  }
  // the tenant's email index follows the attribute
  if ('email' in changes || !current) {
    if (before.email) ops.push(['zrem', keys.subscriberEmailIndex(snapshot.partition, scope.tenantId, before.email.toLowerCase()), member]);
    if (next.email) ops.push(['zadd', keys.subscriberEmailIndex(snapshot.partition, scope.tenantId, next.email.toLowerCase()), 0, member]);
  }
  const events: EngineEvent[] = current && Object.keys(changes).length ? [{ name: '$subscriber.updated', data: boundedUpdateData(changes, previous) }] : [];
  if (ops.length) ops.push(['hset', record, 'updatedAt', isoNow(extra.at)]);
  return { ops, events, changes, previous };
}

/**
 * Creates or updates a subscriber by externalId. An update writes `$subscriber.updated` with the
 * changed fields only when something changed; a creation writes `$subscriber.created` (once).
 * `options.base` is where the attributes sit in the request body (`attributes.` on identify), for
 * the `param` of a validation error. With `options.audit`, the write records `subscriber.created`
 * or `subscriber.updated` (streams/subscriber-audit.ts).
 */
export async function upsertSubscriber(redis: Redis, keys: Keys, scope: TenantScope, externalId: string, input: Attributes, options: { create: boolean; verified?: boolean; base?: string; audit?: AuditTrail } = { create: true }): Promise<{ subscriber: Subscriber; created: boolean; changes: Record<string, unknown>; previous: Record<string, unknown> }> {
  checkAttributes(input, options.base);
  type Outcome = { created: boolean; changes: Record<string, unknown>; previous: Record<string, unknown> };
  // the record as this call left it (or found it, when nothing changed): read again afterwards, a
  // concurrent delete made an applied upsert answer 404 (probe W)
  const seen: { record: Record<string, string> } = { record: {} };
  const outcome = await changeSubscriber<Outcome, string[]>(redis, keys, scope, externalId, (snapshot, segments, at) => {
    if (!snapshot.exists && !options.create) throw notFound('Subscriber');
    const change = attributeChange(keys, scope, snapshot, externalId, input, { at, verified: options.verified, base: options.base });
    if (snapshot.exists && change.ops.length === 0) {
      seen.record = snapshot.record;
      return { skip: { created: false, changes: {}, previous: {} } };
    }
    const result = { created: !snapshot.exists, changes: change.changes, previous: change.previous };
    return {
      create: true, events: change.events, ops: change.ops, result, written: (record) => void (seen.record = record),
      audit: options.audit && attributesAudit(options.audit, { externalId, segments, ...result }),
    };
  }, auditedSegments(redis, keys, scope, externalId, options.audit));
  return { subscriber: toSubscriber(externalId, seen.record, await segmentsOf(redis, keys, scope, externalId)), ...outcome };
}

/** The read hook of an audited write whose entry carries the subscriber: its segments, read with its version (none without audit). */
export function auditedSegments(redis: Redis, keys: Keys, scope: TenantScope, externalId: string, audit: AuditTrail | undefined): ((p: number) => Promise<string[]>) | undefined {
  return audit ? () => segmentsOf(redis, keys, scope, externalId) : undefined;
}

/**
 * The properties of `from` that `into` may take in a merge: `into`'s own keys win, and each of
 * `from`'s other keys is added in `from`'s order when the result stays within MAX_PROPERTIES_BYTES
 * (one that would take it over is left out, and the next ones are still tried).
 */
export function fittingProperties(into: Record<string, unknown>, from: Record<string, unknown>): Record<string, unknown> {
  const merged: Record<string, unknown> = { ...into };
  const added: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(from)) {
    if (Object.hasOwn(merged, k)) continue;
    merged[k] = v;
    if (propertiesBytes(merged) > MAX_PROPERTIES_BYTES) delete merged[k];
    else added[k] = v;
  }
  return added;
}

/**
 * Gives `externalId` the attributes of `from` (a merged anonymous subscriber) that it lacks:
 * email, phone, locale and timezone when unset, and the properties `fittingProperties` allows
 * (its own win; the result stays within 8 KB). Decided on the snapshot the compare-and-set write
 * applies to, with `$subscriber.updated` when something changes (and, with `audit`, the entry
 * `subscriber.updated`, absorbing a held one of the same request: see streams/subscriber-audit.ts).
 */
export async function mergeAttributes(redis: Redis, keys: Keys, scope: TenantScope, externalId: string, from: Subscriber, audit?: AuditTrail): Promise<AttributeOutcome> {
  return changeSubscriber<AttributeOutcome, string[]>(redis, keys, scope, externalId, (snapshot, segments, at) => {
    const current = snapshot.exists ? toSubscriber(externalId, snapshot.record) : null;
    const input: Attributes = {};
    for (const field of ['email', 'phone', 'locale', 'timezone'] as const) if (from[field] && !current?.[field]) input[field] = from[field];
    const properties = fittingProperties(current?.properties ?? {}, from.properties);
    if (Object.keys(properties).length) input.properties = properties;
    const change = attributeChange(keys, scope, snapshot, externalId, input, { at });
    if (change.ops.length === 0) return { skip: { changes: {}, previous: {} } };
    const result = { changes: change.changes, previous: change.previous };
    return { create: true, events: change.events, ops: change.ops, result, audit: audit && attributesAudit(audit, { externalId, segments, created: false, ...result }) };
  }, auditedSegments(redis, keys, scope, externalId, audit));
}

/** What an attribute write changed: the new values and the ones they replaced. */
export type AttributeOutcome = { changes: Record<string, unknown>; previous: Record<string, unknown> };

/** Reads one subscriber, or throws 404. */
export async function getSubscriber(redis: Redis, keys: Keys, scope: TenantScope, externalId: string): Promise<Subscriber> {
  const [snapshot, segments] = await Promise.all([readSubscriber(redis, keys, scope, externalId), segmentsOf(redis, keys, scope, externalId)]);
  if (!snapshot.exists || !snapshot.record.id) throw notFound('Subscriber');
  return toSubscriber(externalId, snapshot.record, segments);
}

/** Of `topicIds`, those that still exist and `into` is not a member of (what a merge has yet to move). */
async function notMovedTopics(redis: Redis, keys: Keys, scope: TenantScope, topicIds: string[], into: string): Promise<string[]> {
  if (topicIds.length === 0) return [];
  const intoTopics = keys.subscriberTopics(partitionOf(scope.tenantId, into, scope.partitions), scope.tenantId, into);
  const [live, held] = await Promise.all([
    Promise.all(topicIds.map((id) => redis.exists(keys.topic(scope.tenantId, id)))),
    redis.smismember(intoTopics, ...topicIds),
  ]);
  return topicIds.filter((_, i) => live[i]! > 0 && !held[i]);
}

/**
 * Deletes a subscriber: writes `$subscriber.deleted`, removes its record, attributes, preferences,
 * subscriptions, topic memberships and widgets: its partition state in one compare-and-set write, which
 * also records the cleanup it owes in the tenant's slot (token index entries, widgets, topic member
 * entries), then finished here or, when this process dies first, by the worker's sweeper
 * (streams/subscriber-cleanup.ts). Its past events stay until retention ages them out; a later
 * event for the same externalId creates a new subscriber. With `options.audit`, the write records
 * one `subscription.deleted` for each subscription it held (oldest first), then `subscriber.deleted`:
 * decided on the state the compare-and-set applies to (the holder guards cover a device moving
 * away meanwhile), so the entries name exactly the subscriptions the write removed. A merge's delete
 * (`mergedInto`) only applies once the subscriber holds none (its devices moved: `subscription.updated`).
 */
export async function deleteSubscriber(redis: Redis, keys: Keys, scope: TenantScope, externalId: string, options?: { audit?: AuditTrail }): Promise<Subscriber>;
export async function deleteSubscriber(redis: Redis, keys: Keys, scope: TenantScope, externalId: string, options: { mergedInto: string; audit?: AuditTrail }): Promise<Subscriber | null>;
export async function deleteSubscriber(redis: Redis, keys: Keys, scope: TenantScope, externalId: string, options: { mergedInto?: string; audit?: AuditTrail } = {}): Promise<Subscriber | null> {
  const p = partitionOf(scope.tenantId, externalId, scope.partitions);
  type Owned = {
    /**
     * `held`: the subscription as it is, when this subscriber holds its record (else a stale
     * reference); `movedAway`: the token index names another subscriber as its owner, and that one holds its copy (a move whose
     * removal of this copy is still to come)
     */
    subscriptions: { id: string; token: string | null; address: string | null; channel: string; holder: string; held: Subscription | null; movedAway: boolean; claim: number }[];
    topicIds: string[]; /** live topics not moved yet (merge) */ liveTopics: number; segments: string[];
  };
  // What the subscriber owns is read after its version (changeSubscriber's read hook), so a
  // registration or topic join racing the delete makes the compare-and-set retry, not leak.
  // `mergedInto` (the end of a merge into that subscriber): only when this one holds no subscription
  // and no live topic that subscriber is not in yet, decided on the state the delete applies to;
  // null otherwise, with nothing changed
  const { subscriber, cleanup } = await changeSubscriber<{ subscriber: Subscriber | null; cleanup: SubscriberCleanup | null }, Owned>(redis, keys, scope, externalId, (snapshot, owned) => {
    if (!snapshot.exists) throw notFound('Subscriber');
    const holds = owned.subscriptions.some((s) => s.held) || owned.liveTopics > 0;
    if (options.mergedInto !== undefined && holds) return { skip: { subscriber: null, cleanup: null } };
    const subscriber = toSubscriber(externalId, snapshot.record, owned.segments);
    const member = `$SUB|${externalId}`;
    const ops: RecordOp[] = [
      ['del', keys.subscriber(p, scope.tenantId, externalId)],
      ['hdel', keys.subscribers(p), `${scope.tenantId}|${externalId}`],
      ['zrem', keys.subscriberIndex(p, scope.tenantId), member],
      ['zrem', keys.subscriberVerifiedIndex(p, scope.tenantId), member],
      ['del', keys.subscriberSubscriptions(p, scope.tenantId, externalId)],
      ['del', keys.subscriberTopics(p, scope.tenantId, externalId)],
      // a record another subscriber of the partition holds now (a token that moved) stays theirs
      ...owned.subscriptions.filter((s) => !s.holder || s.holder === externalId).map((s): RecordOp => ['del', keys.subscription(p, scope.tenantId, s.id)]),
    ];
    const guards = owned.subscriptions.map((s): WriteGuard => ['fieldIs', keys.subscription(p, scope.tenantId, s.id), 'holder', s.holder]);
    if (subscriber.email) ops.push(['zrem', keys.subscriberEmailIndex(p, scope.tenantId, subscriber.email.toLowerCase()), member]);
    // what the tenant's slot still refers to, recorded with the write (the two cannot part)
    const cleanup: SubscriberCleanup = {
      at: now(), workspaceId: scope.workspaceId, tenantId: scope.tenantId, externalId, subscriberId: subscriber.id,
      subscriptions: owned.subscriptions.map(({ id, channel, token, address, claim }) => ({ id, channel, token, address, claim })),
      topicIds: owned.topicIds,
    };
    ops.push(cleanupOp(keys, p, cleanup));
    // its sequences and automation state go once its events are through (the retention sweeper)
    ops.push(['zadd', keys.deletedSubscribers(p), cleanup.at, `${scope.tenantId}|${externalId}`]);
    // the subscriptions the write removes, then the subscriber: one intent, in this order in the ledger.
    // A copy whose token names another subscriber is what that one's move leaves behind (its write
    // audits, or audited, the owner change): removed with reason `moved` and not audited, as
    // removeSubscription does, so the ledger's last word on a device living on is not a deletion
    const removed = owned.subscriptions.flatMap((s) => (s.held ? [{ subscription: s.held, moved: s.movedAway }] : [])).sort((a, b) => (a.subscription.id < b.subscription.id ? -1 : 1));
    const audit = options.audit && draftedAudit(options.audit, 'subscriber.delete', [
      ...removed.filter((r) => !r.moved).map(({ subscription: object }): AuditDraft => ({ type: 'subscription.deleted', target: { type: 'subscription', id: object.id }, object })),
      { type: 'subscriber.deleted', target: { type: 'subscriber', id: subscriber.id }, object: subscriber },
    ]);
    // on the stream too: each subscription it held goes (`$subscription.removed`), then the subscriber
    const events: EngineEvent[] = [
      ...removed.map((r): EngineEvent => ({ name: '$subscription.removed', data: { subscription: publicOf(r.subscription), reason: r.moved ? 'moved' : 'subscriber_deleted' } })),
      { name: '$subscriber.deleted', data: {} },
    ];
    return { create: false, events, ops, guards, audit, result: { subscriber, cleanup } };
  }, async () => {
    const [ids, topicIds, segments] = await Promise.all([
      redis.smembers(keys.subscriberSubscriptions(p, scope.tenantId, externalId)),
      redis.smembers(keys.subscriberTopics(p, scope.tenantId, externalId)),
      segmentsOf(redis, keys, scope, externalId),
    ]);
    const [records, owners, live] = await Promise.all([
      Promise.all(ids.map((id) => redis.hgetall(keys.subscription(p, scope.tenantId, id)))),
      ids.length ? redis.hmget(keys.subscriptionOwners(scope.tenantId), ...ids) : Promise.resolve([]),
      options.mergedInto !== undefined ? notMovedTopics(redis, keys, scope, topicIds, options.mergedInto) : Promise.resolve([]),
    ]);
    // A copy is a move's leftover only once the subscriber the owner index names holds its own copy:
    // the index names the mover from its claim on, and a mover refused (409) or killed before its
    // write leaves the device with nobody else, so its deletion is audited (probe AI)
    const ownerWrote = await Promise.all(ids.map(async (id, i) => {
      const owner = owners[i] ?? null;
      if (owner === null || owner === externalId) return false;
      return heldBy(await redis.hgetall(keys.subscription(partitionOf(scope.tenantId, owner, scope.partitions), scope.tenantId, id)), owner);
    }));
    const subscriptions = ids.map((id, i) => {
      const h = records[i]!;
      return {
        id, token: h.token ?? null, address: h.address ?? null, channel: h.channel ?? 'push', holder: h.holder ?? '',
        held: heldBy(h, externalId) ? toSubscription(externalId, h) : null, movedAway: ownerWrote[i]!, claim: Number(h.claim ?? 0),
      };
    });
    return { subscriptions, topicIds, liveTopics: live.length, segments };
  });
  if (!subscriber || !cleanup) return null;
  // the tenant-wide references, after the partition change (a crash here leaves them to the sweeper)
  await finishCleanup(redis, keys, scope.partitions, cleanup);
  return subscriber;
}

/**
 * The field of the tenant's token index for a push token or an email address registered by
 * `externalId`. A push token is one per tenant (holding it proves the device: it moves between app
 * users); an email address is one per subscriber (knowing an address proves nothing: two users may
 * each register it, and it never moves from one to another; probe DD). The length prefix keeps any
 * externalId from running into the address.
 */
export function tokenField(channel: string, handle: string, externalId: string): string {
  return channel === 'email' ? `email:${externalId.length}:${externalId}:${handle.toLowerCase()}` : `push:${handle}`;
}

/** The field an email address had before it was one per subscriber (`tokenField`): read only to take it over or release it. */
export function legacyEmailField(address: string): string {
  return `email:${address.toLowerCase()}`;
}

/** What an attribute write's entry needs besides the reply (the record after the write). */
type AttributesInput = {
  externalId: string; segments: string[]; created: boolean; changes: Record<string, unknown>; previous: Record<string, unknown>;
  /** the entries of the held intent this write absorbs (streams/subscriber-audit.ts) */
  carried?: AuditDraft[];
};

const attributesAudit = (trail: AuditTrail, input: AttributesInput): WriteAudit =>
  ({ trail, op: 'subscriber.attributes', make: SUBSCRIBER_AUDITS['subscriber.attributes'], input, absorbs: input.externalId, needsRecord: true });

/** The audit entries of subscriber writes, from lua/writeSubscriber's reply (streams/audit-outbox.ts). */
export const SUBSCRIBER_AUDITS = {
  /**
   * `subscriber.created` (the subscriber as the write left it), or `subscriber.updated` with the
   * changed attributes; an absorbed intent's `subscriber.created` comes first, and its changes are
   * merged under this write's (its previous values win: they are older).
   */
  'subscriber.attributes': (input: AttributesInput, reply: WriteReply): AuditDraft[] => {
    if (reply[0] !== 1) return [];
    const object = toSubscriber(input.externalId, recordOf(reply[4] ?? []), input.segments);
    const target = { type: 'subscriber', id: object.id };
    const carried = reply[5] === 1 ? input.carried ?? [] : [];
    const drafts = carried.filter((d) => d.type === 'subscriber.created');
    if (input.created) return [...drafts, { type: 'subscriber.created', target, object }];
    const before = carried.find((d) => d.type === 'subscriber.updated');
    const changes = { ...before?.changes, ...input.changes };
    const previousAttributes = { ...input.previous, ...before?.previousAttributes };
    if (Object.keys(changes).length) drafts.push({ type: 'subscriber.updated', target, object, changes, previousAttributes });
    return drafts;
  },
  'subscriber.delete': drafted,
};
