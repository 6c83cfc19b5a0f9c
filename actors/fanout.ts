import type { Redis } from 'ioredis';
import { pause } from '../lib/abortable.js';
import { isoNow, now } from '../lib/clock.js';
import { derivedId, idTimeMs } from '../lib/ids.js';
import type { Logger } from '../lib/log.js';
import { partitionOf } from '../lib/partition.js';
import { ingestEvents } from '../streams/ingest.js';
import type { Keys } from '../streams/keys.js';
import { callScript } from '../streams/lua-scripts.js';
import { recordOf } from '../lib/field-list.js';
import { moveMessage, toMessage, type DeliveryStatus, type Message, type Target } from '../streams/messages.js';
import { DefinitionsCache, needsOf } from '../streams/automation-definitions.js';
import { selectWhere } from '../streams/subject-state.js';
import type { Expression } from '../lib/expressions.js';
import { allows, readPreferences } from '../streams/preferences.js';
import type { TenantScope } from '../streams/subscriber-writes.js';
import { invalidateSubscription, toSubscription, type Subscription } from '../streams/subscriptions.js';
import { topicMemberPage, type MemberPosition } from '../streams/topic-members.js';
import { findTopic, findTopicById } from '../streams/topics.js';
import type { Backfill } from '../streams/segments.js';
import { indexedExternalId } from '../streams/subscriber-list.js';
import { writeScope } from '../streams/audit-outbox.js';
import { SYSTEM_WRITER, type IdentityRefs } from '../streams/identity.js';
import { AuditTrail } from '../streams/subscriber-audit.js';
import { retryWhileUnavailable } from '../streams/redis.js';

/** What the fan-out needs from a push provider client (actors/push-sender.ts implements it). */
type PushAnswer = { outcome: 'sent' | 'failed'; httpStatus: number | null; apnsId: string | null; reason: string | null; timestamp: number | null; tokenInvalid: boolean; attempts: number };
export type Pusher = {
  /** results in the order of `jobs`; `onResult` hears each as soon as it is final; none (undefined) for a push not sent because `signal` aborted */
  sendAll(jobs: { tenantId: string; token: string; environment: 'production' | 'sandbox'; content: Message['content']; messageId: string; deliveryId: string }[], onResult?: (index: number, result: PushAnswer) => void, signal?: AbortSignal): Promise<(PushAnswer | undefined)[]>;
};

export type FanoutContext = {
  redis: Redis; keys: Keys; partitions: number; maxBacklog: number; pusher: Pusher; log: Logger; chunkSize: number;
  /** the workspace and tenant refs of Herald's own audit entries (a token APNs declared dead) */
  refs: IdentityRefs;
  /**
   * Aborts when another dispatcher took the queue entry over (this one stalled past the claim's
   * idle limit; the consumer runtime keeps the claim fresh otherwise), or when this dispatcher stops
   * (the entry is then given back): no push is sent and no cursor stored after that, so two
   * dispatchers never walk one message side by side; the pushes already out are answered and recorded.
   */
  signal?: AbortSignal;
};

/** A delivery planned; one to send names its subscription and the claim number of the registration read (`PushedTo`). */
type Planned = {
  id: string; status: 'pending' | 'skipped'; fields: Record<string, string>; subscription: Subscription | null; claim?: number;
  /** skipped for an invalidated token that this very delivery's push invalidated: what it records of that answer (`invalidatedBy`) */
  answered?: Record<string, string>;
};

/** A planned delivery of a subscriber deleted before its push went: skipped, `subscriber_not_found`. */
function goneDelivery(d: Planned): Planned {
  if (d.status === 'skipped') return d;
  return { id: d.id, status: 'skipped', fields: { ...d.fields, reason: 'subscriber_not_found' }, subscription: null };
}

/** Why a subscription does not get a push of this message, or null when it does. */
function skipReason(s: Subscription, optOut: string | null): string | null {
  if (s.channel !== 'push') return 'channel_not_supported';
  if (s.platform === 'android') return 'platform_not_supported';
  if (s.invalidatedAt) return 'token_invalidated';
  if (!s.enabled) return 'subscription_disabled';
  // the user said no to notifications on that device: iOS would show nothing (the app reports a
  // change of mind on its next registration)
  if (s.authorizationStatus === 'denied') return 'notifications_denied';
  return optOut;
}

/**
 * Why the subscriber's preferences refuse a push of `category`, or null when they allow it. A
 * category that says push overrides the channel either way (docs/subscribers.md); one that does
 * not follows the channel.
 */
function pushOptOut(prefs: ReturnType<typeof readPreferences>, category: string | null): string | null {
  if (allows(prefs, 'push', category)) return null;
  return category !== null && prefs.categories[category]?.push === false ? 'category_opt_out' : 'channel_opt_out';
}

/**
 * One message and the part of its audience a chunk covers: a page of a long audience, or a
 * one-subscriber message's whole audience; `subscriberId`, the only subscriber of that externalId it
 * goes to (a workflow send's: its run's, not one created again under the externalId since).
 */
type ChunkItem = { message: Message; externalIds: string[]; subscriberId?: string };

/**
 * One delivery per subscription of each subscriber of each item (or one skipped delivery when there
 * is none to send to), and the subscribers of each item that exist.
 */
async function plan(ctx: FanoutContext, scope: TenantScope, items: ChunkItem[]): Promise<{ planned: Planned[]; existing: Map<string, string> }[]> {
  const { redis, keys } = ctx;
  const at = isoNow();
  // One script call per partition the chunk touches (lua/readAudience: existence, preferences and
  // subscription records), then one HMGET of the owners for the whole chunk; a subscriber named by
  // several items is read once.
  const byPartition = new Map<number, Set<string>>();
  for (const { externalIds } of items) {
    for (const externalId of externalIds) {
      const p = partitionOf(scope.tenantId, externalId, scope.partitions);
      const set = byPartition.get(p);
      if (set) set.add(externalId);
      else byPartition.set(p, new Set([externalId]));
    }
  }
  type Row = [0] | [1, string | null, string[][], string];
  const found = new Map<string, { id: string; preferences: string | null; records: Record<string, string>[] }>();
  await Promise.all([...byPartition].map(async ([p, set]) => {
    const ids = [...set];
    const rows = await callScript<Row[]>(redis, 'readAudience', [keys.subscribers(p)], [keys.partitionBase(p), scope.tenantId, ...ids]);
    rows.forEach((row, i) => {
      if (row[0] !== 1) return;
      found.set(ids[i]!, { id: row[3], preferences: row[1], records: row[2].map((h) => recordOf(h)) });
    });
  }));
  // a record whose owner index names another subscriber is a stale copy of a moved token: not sent
  const subscriptionIds = [...new Set([...found.values()].flatMap((f) => f.records.map((h) => h.id!)))];
  const owners = subscriptionIds.length ? await redis.hmget(keys.subscriptionOwners(scope.tenantId), ...subscriptionIds) : [];
  const ownerOf = new Map(subscriptionIds.map((id, i) => [id, owners[i]]));
  return items.map(({ message, externalIds, subscriberId }) => {
    // a delivery's channel is its subscription's (an email subscription's is skipped, channel_not_supported); a
    // subscriber without one gets a push delivery, what the message is
    const base = (externalId: string, subscriptionId: string | null, channel = 'push') => ({
      id: derivedId('delivery', Date.parse(message.createdAt), `${message.id}|${subscriptionId ?? `subscriber:${externalId}`}`),
      fields: { id: '', messageId: message.id, externalId, subscriptionId: subscriptionId ?? '', channel, createdAt: at, updatedAt: at, attempts: '0' },
    });
    const planned: Planned[] = [];
    const existing = new Map<string, string>();
    for (const externalId of externalIds) {
      const skip = (subscriptionId: string | null, reason: string, channel?: string) => {
        const d = base(externalId, subscriptionId, channel);
        planned.push({ id: d.id, status: 'skipped', fields: { ...d.fields, id: d.id, reason }, subscription: null });
      };
      const subscriber = found.get(externalId);
      if (!subscriber || (subscriberId !== undefined && subscriber.id !== subscriberId)) {
        skip(null, 'subscriber_not_found');
        continue;
      }
      existing.set(externalId, subscriber.id);
      const optOut = pushOptOut(readPreferences(subscriber.preferences ?? undefined), message.content.category ?? null);
      const records = subscriber.records.filter((h) => ownerOf.get(h.id!) === externalId);
      if (records.length === 0) {
        skip(null, 'no_subscription');
        continue;
      }
      for (const h of records) {
        const s = toSubscription(externalId, h);
        const reason = skipReason(s, optOut);
        if (reason === 'token_invalidated' && h.invalidatedBy) {
          // the token went dead at this very delivery's push: a dispatcher killed between the
          // invalidation and the record of the answer left it pending, and it is that answer's
          // (failed, APNs's status and reason), not a push never sent (probe DG)
          const by = JSON.parse(h.invalidatedBy) as { deliveryId: string; fields: Record<string, string> };
          const d = base(externalId, s.id, s.channel);
          if (by.deliveryId === d.id) {
            planned.push({ id: d.id, status: 'skipped', fields: { ...d.fields, id: d.id, reason }, subscription: null, answered: by.fields });
            continue;
          }
        }
        if (reason) skip(s.id, reason, s.channel);
        else {
          const d = base(externalId, s.id, s.channel);
          planned.push({ id: d.id, status: 'pending', fields: { ...d.fields, id: d.id }, subscription: s, claim: Number(h.claim ?? 0) });
        }
      }
    }
    return { planned, existing };
  });
}

/** Records many deliveries' outcomes, of one or more messages, in one script call (lua/settleDeliveries). */
async function settle(ctx: FanoutContext, tenantId: string, outcomes: Outcome[]): Promise<void> {
  if (outcomes.length === 0) return;
  const byMessage = new Map<string, Outcome[]>();
  for (const o of outcomes) {
    const list = byMessage.get(o.messageId);
    if (list) list.push(o);
    else byMessage.set(o.messageId, [o]);
  }
  const args: (string | number)[] = [ctx.keys.tenantBase(tenantId), isoNow(), byMessage.size];
  for (const [messageId, list] of byMessage) {
    args.push(messageId, list.length);
    for (const o of list) {
      const flat = Object.entries(o.fields).flat();
      args.push(o.id, o.status, flat.length / 2, ...flat);
    }
  }
  // the answers are APNs's: a brief refusal is waited out rather than the pushes sent again
  await retryWhileUnavailable(() => callScript(ctx.redis, 'settleDeliveries', [ctx.keys.message(tenantId, outcomes[0]!.messageId)], args), RECORD_ANSWERS_WITHIN_MS);
}

/** The audit trail of Herald's own changes in the tenant (actor `system`), or none when the tenant is gone. */
async function systemAudit(ctx: FanoutContext, scope: TenantScope): Promise<AuditTrail | undefined> {
  const refs = await ctx.refs.scope(scope.workspaceId, scope.tenantId);
  return refs ? new AuditTrail(ctx.redis, ctx.keys, writeScope(refs, SYSTEM_WRITER), ctx.log) : undefined;
}

/**
 * Writes `$send` on each subscriber's stream once per message, creates a chunk's deliveries (each
 * once), and sends the pending ones. A chunk is one page of a message's longer audience, or
 * (`whole`) a batch of one-subscriber messages, each item its message's whole audience: their
 * fan-outs are then marked done with the deliveries' creation (no `finishFanout` call after). One
 * script call creates the deliveries of every item, one ingest writes every `$send`, and the
 * answers are settled together.
 */
async function processChunk(ctx: FanoutContext, scope: TenantScope, items: ChunkItem[], whole = false, only?: Set<string>): Promise<Set<string>> {
  const { redis, keys, pusher } = ctx;
  const plans = await plan(ctx, scope, items);
  const existing = new Set(plans.flatMap((p) => [...p.existing.keys()]));
  // deliveries already made, looked at again (`settleLeftPending`): none is made anew
  if (only) for (const p of plans) p.planned = p.planned.filter((d) => only.has(d.id));
  if (plans.every((p) => p.planned.length === 0)) return existing;
  const createdAt = plans.find((p) => p.planned.length > 0)!.planned[0]!.fields.createdAt;
  const args: (string | number)[] = [keys.tenantBase(scope.tenantId), whole ? isoNow() : '', String(Date.parse(createdAt)), items.length];
  items.forEach(({ message }, i) => {
    args.push(message.id, plans[i]!.planned.length);
    for (const d of plans[i]!.planned) args.push(d.id, d.status, JSON.stringify(d.fields));
  });
  // `$send` once per subscriber and message: the caller id makes a resumed chunk's second write a
  // duplicate. Written before the deliveries: creating a `whole` chunk's deliveries marks its
  // messages' fan-outs done (a message whose deliveries are all skipped completes there), and a
  // dispatcher killed after that would leave no resumable trace of the `$send` still to write.
  const sends = items.flatMap(({ message }, i) => [...plans[i]!.existing].map(([externalId, subscriberId]) => ({
    externalId, subscriberId, name: '$send', source: 'system' as const, timestampMs: now(),
    data: JSON.stringify({ messageId: message.id, category: message.content.category ?? null, ...(message.run ? { workflowId: message.run.workflowId, workflow: message.run.workflow, versionId: message.run.versionId } : {}) }),
    callerId: `$send:${message.id}`, provider: null, runId: message.run?.runId ?? null, messageId: message.id, step: message.run?.step ?? null,
  })));
  if (sends.length) {
    const written = await ingestEvents(redis, keys, { ...scope, maxBacklog: ctx.maxBacklog }, sends);
    // deleted since the plan read them, perhaps created again under their externalId (their `$send`
    // is not stored: it would make them again, or be the new one's): their deliveries are skipped, not
    // pushed to the devices of a user who is gone (probes EG, EN)
    const gone = new Set(sends.filter((_, i) => written[i]!.status === 'gone').map((s) => s.externalId));
    if (gone.size) for (const p of plans) p.planned = p.planned.map((d) => (gone.has(d.fields.externalId!) ? goneDelivery(d) : d));
  }
  const states = await callScript<[string, string][][]>(redis, 'createDeliveries', [keys.message(scope.tenantId, items[0]!.message.id)], args);
  // A push in flight when a dispatcher dies is sent again on resume, with the same apns-id and
  // collapse id, so the device shows it once: the message id is the default collapse id.
  const toSend = items.flatMap(({ message }, i) => {
    const content = { ...message.content, collapseId: message.content.collapseId ?? message.id };
    return plans[i]!.planned.filter((d, j) => states[i]![j]![1] === 'pending' && d.subscription).map((d) => ({ d, message, content }));
  });
  // A delivery a killed dispatcher made pending whose push is now skipped (its device muted, its
  // token invalidated, its subscriber opted out meanwhile) is settled skipped with today's reason:
  // left pending, nothing sent or settled it and the message stayed `sending` for good (probe AF).
  const nowSkipped: Outcome[] = items.flatMap(({ message }, i) => plans[i]!.planned
    .filter((d, j) => states[i]![j]![1] === 'pending' && d.status === 'skipped')
    .map((d): Outcome => d.answered
      ? { messageId: message.id, id: d.id, status: 'failed', fields: d.answered }
      : { messageId: message.id, id: d.id, status: 'skipped', fields: { reason: d.fields.reason! } }));
  // taken over meanwhile: the deliveries are made, and their pushes are the new owner's to send
  if (ctx.signal?.aborted) return existing;
  if (nowSkipped.length) await settle(ctx, scope.tenantId, nowSkipped);
  // Each push is recorded soon after APNs answers it (SETTLE_EVERY answers or SETTLE_WITHIN_MS,
  // whichever comes first), not when the chunk's last answer is in: a dispatcher killed mid-chunk
  // leaves pending, to be sent again, only the pushes in flight and the few answers not yet recorded.
  const outcomes: Outcome[] = [];
  const writes: Promise<void>[] = [];
  let failure: unknown = null;
  let timer: NodeJS.Timeout | null = null;
  const flush = () => {
    if (timer) clearTimeout(timer);
    timer = null;
    if (outcomes.length === 0) return;
    writes.push(settle(ctx, scope.tenantId, outcomes.splice(0)).catch((err: unknown) => void (failure ??= err)));
  };
  const record = (outcome: Outcome) => {
    outcomes.push(outcome);
    if (outcomes.length >= SETTLE_EVERY) flush();
    else timer ??= setTimeout(flush, SETTLE_WITHIN_MS);
  };
  // A dead token (410, BadDeviceToken) disables its subscription as soon as APNs says so, and before
  // its delivery is recorded: a dispatcher killed in between never leaves the token enabled, and on
  // resume the delivery is settled failed with that answer, which the invalidation kept on the
  // subscription (`invalidatedBy`; it was settled skipped, token_invalidated, as if never sent: probe
  // DG); and later messages skip it from then on, not from the chunk's end (probe V: both, with one slow push).
  const invalidations: Promise<void>[] = [];
  await pusher.sendAll(toSend.map(({ d, message, content }) => ({
    tenantId: scope.tenantId, token: d.subscription!.token!, environment: d.subscription!.environment ?? 'production', content, messageId: message.id, deliveryId: d.id,
  })), (i, result) => {
    const outcome = outcomeOf(toSend[i]!.message.id, toSend[i]!.d.id, result);
    if (!result.tokenInvalid) return record(outcome);
    const { subscription: s, claim } = toSend[i]!.d;
    const by = { deliveryId: outcome.id, fields: outcome.fields };
    invalidations.push(systemAudit(ctx, scope)
      .then((audit) => invalidateSubscription(redis, keys, scope, s!.externalId, s!.id, result.reason ?? 'invalid_token', { claim: claim ?? 0, unregisteredAt: result.timestamp, by }, audit))
      .then(() => record(outcome), (err: unknown) => void (failure ??= err)));
  }, ctx.signal);
  await Promise.all(invalidations);
  flush();
  await Promise.all(writes);
  if (failure) throw failure;
  return existing;
}

/** How long a settle of APNs answers is retried while Redis refuses it: well within the claim idle time (60 s by default), which the batch's claims are kept fresh through. */
const RECORD_ANSWERS_WITHIN_MS = 15_000;

/** Answers recorded together at most: one settleDeliveries call per this many, or per SETTLE_WITHIN_MS. */
const SETTLE_EVERY = 64;
const SETTLE_WITHIN_MS = 20;

type Outcome = { messageId: string; id: string; status: DeliveryStatus; fields: Record<string, string> };

/** What a delivery records of its push's final answer. */
function outcomeOf(messageId: string, id: string, result: PushAnswer): Outcome {
  const fields: Record<string, string> = { attempts: String(result.attempts) };
  if (result.httpStatus !== null) fields.providerStatus = String(result.httpStatus);
  if (result.apnsId) fields.apnsId = result.apnsId;
  if (result.reason) fields.providerReason = result.reason;
  if (result.timestamp) fields.providerTimestamp = isoNow(result.timestamp);
  if (result.outcome === 'sent') fields.sentAt = isoNow();
  else fields.reason = result.reason ?? 'failed';
  return { messageId, id, status: result.outcome as DeliveryStatus, fields };
}

type PartitionCursor = { p: number; after: string | null };
/** `id`: the segment's (none for `where`). */
type Selector = { id?: string; index: (p: number) => string; pick: (p: number, members: string[]) => Promise<string[]>; there: () => Promise<boolean> };

const definitionsCaches = new WeakMap<Redis, DefinitionsCache>();

/**
 * How a segment or `where` audience is walked: the index read per partition, how its members
 * become externalIds, and whether the audience is still there (the segment not deleted since).
 * Null when the segment is gone.
 */
async function audienceSelector(ctx: FanoutContext, scope: TenantScope, to: Target, segmentId: string | null): Promise<Selector | null> {
  const { redis, keys } = ctx;
  if ('segment' in to) {
    const id = await redis.hget(keys.segmentSlugs(scope.tenantId), to.segment);
    if (!id || (segmentId !== null && id !== segmentId)) return null;
    return {
      id,
      index: (p) => keys.segmentMembers(p, scope.tenantId, id),
      pick: async (_p, members) => members.map(indexedExternalId),
      there: async () => (await redis.hget(keys.segmentSlugs(scope.tenantId), to.segment)) === id,
    };
  }
  const where = (to as { where: Expression }).where;
  let cache = definitionsCaches.get(redis);
  if (!cache) definitionsCaches.set(redis, (cache = new DefinitionsCache(redis, keys)));
  const version = await redis.get(keys.automationVersion(scope.tenantId));
  const kept = version ? (await cache.get(scope.tenantId, version)).kept : new Map();
  const needs = needsOf([where]);
  return {
    index: (p) => keys.subscriberIndex(p, scope.tenantId),
    pick: (p, members) => selectWhere(redis, keys, p, scope.tenantId, members.map(indexedExternalId), where, kept, { subscriptions: needs.needs.subscriptions, topicSlugs: needs.topicSlugs }),
    there: async () => true,
  };
}

/** Longest a send to a segment waits for its backfill, and how often it looks. */
const BACKFILL_WAIT_MS = 60_000;
const BACKFILL_POLL_MS = 250;

/**
 * Waits until the segment's backfill has completed before its walk begins: a segment just created,
 * or whose `where` just changed, lists only the subscribers evaluated so far, and a message sent to
 * it at once reached part of its audience or nobody (probe BI: 0 of 666). At most BACKFILL_WAIT_MS,
 * then the walk takes the members there are. The wait holds its batch only: the tenant's queue is
 * read again beside it (actors/message-dispatcher.ts BATCHES_PER_TENANT). False when the signal aborted meanwhile (a stop, a
 * takeover): the walk has not begun, and whoever resumes the message waits in turn.
 */
async function backfilled(ctx: FanoutContext, scope: TenantScope, segmentId: string): Promise<boolean> {
  const key = ctx.keys.segment(scope.tenantId, segmentId);
  for (const deadline = now() + BACKFILL_WAIT_MS; ;) {
    const raw = await ctx.redis.hget(key, 'backfill');
    if (!raw || (JSON.parse(raw) as Backfill).status === 'completed') return true;
    if (now() >= deadline) {
      ctx.log.warn('segment backfill still running after the wait: the message goes to the members there are', { tenantId: scope.tenantId, segmentId, waitedMs: BACKFILL_WAIT_MS });
      return true;
    }
    await pause(BACKFILL_POLL_MS, ctx.signal);
    if (ctx.signal?.aborted) return false;
  }
}

/** Chunks of one message in flight at once: while one chunk's pushes are out, the next is planned and created. */
export const CHUNKS_IN_FLIGHT = 3;

/** One page of an audience walk: the externalIds to process and the cursor that follows them (null: the walk ends). */
type Page = { audience: string[]; cursor: string | null };

/**
 * Runs the pages of an audience walk with up to CHUNKS_IN_FLIGHT chunks at once, and stores the
 * cursor past a chunk only once it and every chunk before it are settled, so a resumed fan-out never
 * skips an unsettled chunk. False when the message stopped being `sending` (canceled).
 */
async function walk(ctx: FanoutContext, scope: TenantScope, message: Message, recordKey: string, pages: AsyncGenerator<Page>): Promise<boolean> {
  const { redis } = ctx;
  const inFlight: { done: Promise<unknown>; cursor: string | null }[] = [];
  const failures: unknown[] = [];
  const settleHead = async (): Promise<boolean> => {
    const head = inFlight.shift()!;
    const err = await head.done;
    if (err !== undefined) failures.push(err);
    if (failures.length) return true;
    // taken over by another dispatcher: the walk and the cursor are its own now
    if (ctx.signal?.aborted) return false;
    if (head.cursor !== null) await redis.hset(recordKey, 'cursor', head.cursor);
    return (await redis.hget(recordKey, 'status')) === 'sending';
  };
  let sending = true;
  for await (const page of pages) {
    const done = page.audience.length ? processChunk(ctx, scope, [{ message, externalIds: page.audience }]).then(() => undefined, (err: unknown) => err ?? new Error('fan-out chunk failed')) : Promise.resolve(undefined);
    inFlight.push({ done, cursor: page.cursor });
    if (inFlight.length >= CHUNKS_IN_FLIGHT && !(sending = await settleHead())) break;
    if (failures.length) break;
  }
  while (inFlight.length) if (!(await settleHead())) sending = false;
  if (failures.length) throw failures[0];
  return sending;
}

/**
 * The pages of an audience walk while its topic or segment is still there (checked before each page
 * and once the pages end: one HGET a chunk); `gone.at` says the walk ended because it was deleted.
 */
async function* whileThere(pages: AsyncGenerator<Page>, there: () => Promise<boolean>, gone: { at: boolean }): AsyncGenerator<Page> {
  for await (const page of pages) {
    if (!(await there())) {
      gone.at = true;
      return;
    }
    yield page;
  }
  gone.at = !(await there());
}

async function* topicPages(ctx: FanoutContext, scope: TenantScope, topicId: string, cursor: string | undefined): AsyncGenerator<Page> {
  let after: MemberPosition | null = cursor ? JSON.parse(cursor) : null;
  for (let page = 0; page < 10_000_000; page++) {
    const { items, next } = await topicMemberPage(ctx.redis, ctx.keys, scope.tenantId, topicId, ctx.chunkSize, after);
    yield { audience: items.map((m) => m.externalId), cursor: next ? JSON.stringify(next) : null };
    if (!next) return;
    after = next;
  }
}

/**
 * A segment or `where` audience, partition by partition, a chunk of members (segment) or of
 * subscribers (where) at a time. A subscriber created after the message started sending is not
 * included (as a topic's members joining after it): one deleted and created again under its
 * externalId during the walk is a new subscriber, whose index entry sorts after the old one's, and
 * its device, the same, was pushed twice (probe AF: 12 to 18 of 400).
 */
async function* partitionPages(ctx: FanoutContext, scope: TenantScope, select: Selector, cursor: string | undefined, startedMs: number): AsyncGenerator<Page> {
  let at: PartitionCursor = cursor ? JSON.parse(cursor) : { p: 0, after: null };
  const before = (member: string) => (idTimeMs('subscriber', member.slice(0, member.indexOf('|'))) ?? 0) <= startedMs;
  for (let page = 0; page < 10_000_000 && at.p < scope.partitions; page++) {
    const members = await ctx.redis.zrange(select.index(at.p), at.after === null ? '-' : `(${at.after}`, '+', 'BYLEX', 'LIMIT', 0, ctx.chunkSize);
    const audience = await select.pick(at.p, members.filter(before));
    at = members.length < ctx.chunkSize ? { p: at.p + 1, after: null } : { p: at.p, after: members[members.length - 1]! };
    yield { audience, cursor: JSON.stringify(at) };
  }
}

/**
 * The deliveries of a message still pending once its walk ended (none, unless a dispatcher was killed
 * mid-walk: the deliveries its unsettled chunks had made), finished now, chunk by chunk. Each is
 * looked at again as its subscriber is now: sent when its push still goes, settled `skipped` with
 * the reason when it does not (muted, opted out), or `subscription_removed` (`subscriber_not_found`)
 * when its subscription (subscriber) is gone or moved. Before, nothing sent or settled those the
 * resumed walk did not send itself, and the message stayed `sending` for good: behind the stored
 * cursor when the topic or segment was deleted meanwhile (probe AB, 100 to 300 deliveries), or a
 * device muted or removed, or a subscriber gone from the audience, before the resume (probe AF).
 * They were made for the audience as it was when they were made, which the message's deliveries show.
 */
async function settleLeftPending(ctx: FanoutContext, scope: TenantScope, message: Message, subscriberId?: string): Promise<void> {
  const { redis, keys } = ctx;
  const pendingKey = keys.messageDeliveriesByStatus(scope.tenantId, message.id, 'pending');
  const ids: string[] = [];
  let cursor = '0';
  // bounded: the pending set holds at most the deliveries of the chunks in flight when the walk stopped
  for (let round = 0; round < 100_000; round++) {
    const [next, batch] = await redis.zscan(pendingKey, cursor, 'COUNT', 1000);
    for (let i = 0; i < batch.length; i += 2) ids.push(batch[i]!);
    cursor = next;
    if (cursor === '0') break;
  }
  for (let i = 0; i < ids.length; i += ctx.chunkSize) {
    const chunk = ids.slice(i, i + ctx.chunkSize);
    const read = redis.pipeline();
    for (const id of chunk) read.hget(keys.delivery(scope.tenantId, id), 'externalId');
    const owners = ((await read.exec()) ?? []).map(([err, x]) => {
      if (err) throw err;
      return typeof x === 'string' ? x : '';
    });
    const externalIds = [...new Set(owners.filter((x) => x !== ''))];
    const existing = externalIds.length ? await processChunk(ctx, scope, [{ message, externalIds, ...(subscriberId ? { subscriberId } : {}) }], false, new Set(chunk)) : new Set<string>();
    if (ctx.signal?.aborted) return;
    // those the plan no longer names: their subscription was removed or moved, or their subscriber deleted
    const check = redis.pipeline();
    for (const id of chunk) check.zscore(pendingKey, id);
    const states = (await check.exec()) ?? [];
    for (const [err] of states) if (err) throw err;
    const left = chunk.flatMap((id, j): Outcome[] => (states[j]?.[1] === null ? [] : [{
      messageId: message.id, id, status: 'skipped', fields: { reason: existing.has(owners[j]!) ? 'subscription_removed' : 'subscriber_not_found' },
    }]));
    await settle(ctx, scope.tenantId, left);
  }
}

/**
 * Fans queued messages of one tenant out to their audiences, resumably. One call starts them all
 * (`queued` → `sending`, reading their records). Messages to one subscriber go through one chunk
 * together (`whole`): their deliveries are created with their fan-outs marked done, and the last
 * settled completes each message; a dispatcher killed after that creation resumes here too: the
 * deliveries exist, and those still pending are sent (same apns-id and collapse id) and settled.
 * A longer audience is walked in chunks, message after message (`fanOutAudience`).
 */
export async function fanOut(ctx: FanoutContext, scope: TenantScope, messageIds: string[]): Promise<void> {
  const { redis, keys } = ctx;
  if (messageIds.length === 0) return;
  // queued messages become sending in the same call that reads them
  const at = isoNow();
  const replies = await callScript<string[][]>(redis, 'startFanout', [keys.message(scope.tenantId, messageIds[0]!)], [keys.tenantBase(scope.tenantId), at, ...messageIds]);
  // the others are unknown, canceled, completed, failed, or still scheduled
  const records = replies.map((flat) => recordOf(flat)).filter((record) => record.status === 'sending');
  const ones: ChunkItem[] = [];
  const audiences: Record<string, string>[] = [];
  for (const record of records) {
    const message = toMessage(record);
    if ('externalId' in message.to) ones.push({ message, externalIds: [message.to.externalId], ...(record.sid ? { subscriberId: record.sid } : {}) });
    else audiences.push(record);
  }
  if (ones.length) {
    await processChunk(ctx, scope, ones, true);
    // one started by a dispatcher that died may hold deliveries this chunk did not send (a device
    // removed or its subscriber deleted meanwhile): finished here, or they stayed pending for good
    // a workflow send's resumed: still to its run's subscriber only (`subscriberId`)
    for (const { message, subscriberId } of ones) if (message.startedAt !== at && !ctx.signal?.aborted) await settleLeftPending(ctx, scope, message, subscriberId);
  }
  for (const record of audiences) await fanOutAudience(ctx, scope, record);
}

/**
 * Fans a `sending` message out to its longer audience: walked in chunks (a topic page by page, a
 * segment or `where` audience partition by partition; never loaded whole), each chunk's deliveries
 * are created once (ids derived from the message and subscription), sent, and settled before the
 * cursor moves past it (a few chunks overlap; the cursor only moves past settled ones). A
 * dispatcher killed mid-chunk leaves the queue entry unacked; the next one resumes at the stored
 * cursor, finds those chunks' deliveries already made and sends only those still pending.
 */
async function fanOutAudience(ctx: FanoutContext, scope: TenantScope, record: Record<string, string>): Promise<void> {
  const { redis, keys } = ctx;
  const message = toMessage(record);
  const messageId = message.id;
  const recordKey = keys.message(scope.tenantId, messageId);
  if (record.fanout !== 'done' && record.cursor !== 'done') {
    const cursor = record.cursor || undefined;
    const what = 'topic' in message.to ? 'topic' : 'segment';
    const gone = { at: false };
    // The topic or segment is the one the slug named when the message was accepted (a message sent
    // now) or when its walk began (a scheduled one, whose slug is read when it is due), kept on the
    // record: a resumed walk of one deleted and created again under the slug meanwhile walked the new
    // one from the old one's cursor (probe AF), and a queued message went to the new one (probe DW).
    const audienceId = record.audienceId || null;
    const keep = async (id: string) => {
      if (id !== audienceId) await redis.hset(recordKey, 'audienceId', id);
    };
    const startedMs = Date.parse(message.startedAt ?? message.createdAt);
    if ('topic' in message.to) {
      const topic = audienceId ? await findTopicById(redis, keys, scope.tenantId, audienceId) : await findTopic(redis, keys, scope.tenantId, message.to.topic);
      if (!topic) gone.at = true;
      else {
        await keep(topic.id);
        if (!(await walk(ctx, scope, message, recordKey, whileThere(topicPages(ctx, scope, topic.id, cursor), async () => (await findTopicById(redis, keys, scope.tenantId, topic.id)) !== null, gone)))) return;
      }
    } else {
      const select = await audienceSelector(ctx, scope, message.to, audienceId);
      if (!select) gone.at = true;
      else {
        if (select.id) await keep(select.id);
        if (select.id && !cursor && !(await backfilled(ctx, scope, select.id))) return;
        if (!(await walk(ctx, scope, message, recordKey, whileThere(partitionPages(ctx, scope, select, cursor, startedMs), select.there, gone)))) return;
      }
    }
    await settleLeftPending(ctx, scope, message);
    if (ctx.signal?.aborted) return;
    // the topic or segment was deleted before or while the audience was walked: a message that
    // reached nobody yet fails, one that reached part of it completes with that part and says why
    if (gone.at) {
      if (Number((await redis.hget(recordKey, 'n:total')) ?? 0) === 0) {
        await moveMessage(redis, keys, scope.tenantId, messageId, ['sending'], 'failed', { error: `${what}_not_found`, completedAt: isoNow() });
        return;
      }
      await redis.hset(recordKey, 'error', `${what}_deleted`);
    }
  }
  // also sets the cursor to `done`: a dispatcher killed before this call walks the last pages again
  // (their deliveries exist; only pending ones are sent)
  await callScript(redis, 'finishFanout', [recordKey], [keys.tenantBase(scope.tenantId), messageId, isoNow()]);
}
