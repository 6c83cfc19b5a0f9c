import type { ChainableCommander, Redis } from 'ioredis';
import { isoNow } from '../lib/clock.js';
import { derivedId, idTimeMs, isId } from '../lib/ids.js';
import { MAX_ATTEMPTS, MAX_REPLAYS, DISABLE_AFTER_MS } from '../lib/webhook-policy.js';
import type { Keys } from './keys.js';
import { callScript } from './lua-scripts.js';
import { SCORE_PER_MS, scoreAt } from './scored-index.js';

export const DELIVERY_STATUSES = ['pending', 'success', 'failed', 'exhausted'] as const;
export type DeliveryStatus = (typeof DELIVERY_STATUSES)[number];

/** One attempt as stored on its delivery (field `a:<n>`), and as the API shows it with its number. */
export type AttemptRecord = {
  /** `schedule`: one of the ten scheduled attempts; `replay`: an extra one asked for with replay */
  trigger: 'schedule' | 'replay';
  startedAt: string;
  /** the receiver's HTTP status, null when no answer came (timeout, network error, refused address) */
  statusCode: number | null;
  success: boolean;
  /** why it failed without a 2xx: timeout, connection error, refused address, redirect not followed */
  error: string | null;
  durationMs: number;
  /** the first 4 KB of the response body (UTF-8), null when there was no answer */
  response: string | null;
};

export type WebhookDelivery = {
  id: string;
  endpointId: string;
  eventId: string;
  eventType: string;
  status: DeliveryStatus;
  /** scheduled attempts made, out of ten */
  attemptCount: number;
  /** replays asked for */
  replayCount: number;
  nextAttemptAt: string | null;
  lastAttemptAt: string | null;
  lastStatusCode: number | null;
  createdAt: string;
  updatedAt: string;
};

export type WebhookDeliveryDetail = WebhookDelivery & { attempts: (AttemptRecord & { attempt: number })[]; event: Record<string, unknown> | null };

function toDelivery(h: Record<string, string>): WebhookDelivery | null {
  if (!h.id) return null;
  return {
    id: h.id,
    endpointId: h.endpointId!,
    eventId: h.eventId!,
    eventType: h.eventType!,
    status: h.status as DeliveryStatus,
    attemptCount: Number(h.attempts ?? 0),
    replayCount: Number(h.replays ?? 0),
    nextAttemptAt: h.nextAttemptAt ? isoNow(Number(h.nextAttemptAt)) : null,
    lastAttemptAt: h.lastAttemptAt || null,
    lastStatusCode: h.lastStatusCode ? Number(h.lastStatusCode) : null,
    createdAt: h.createdAt!,
    updatedAt: h.updatedAt!,
  };
}

/**
 * A delivery as its endpoint's state makes it: while the endpoint is disabled nothing is attempted
 * and a waiting delivery goes out on the re-enable, so its `nextAttemptAt` (a time already past, or
 * one that will pass unattempted) is null (probe A1: it showed a past time as the next attempt).
 */
export function asOfEndpoint<T extends WebhookDelivery>(delivery: T, endpoint: { enabled: boolean }): T {
  return endpoint.enabled || delivery.nextAttemptAt === null ? delivery : { ...delivery, nextAttemptAt: null };
}

function attemptsOf(h: Record<string, string>): (AttemptRecord & { attempt: number })[] {
  const out: (AttemptRecord & { attempt: number })[] = [];
  for (let n = 1; n <= Number(h.n ?? 0); n++) {
    const raw = h[`a:${n}`];
    if (raw) out.push({ attempt: n, ...(JSON.parse(raw) as AttemptRecord) });
  }
  return out;
}

/*
 * An endpoint's delivery indexes (all, and one per status) are scored by createdAt, ties in arrival
 * order (streams/scored-index.ts; the score is given by lua/enqueueWebhookDeliveries and kept when a
 * delivery changes status), so they list newest first by createdAt. Not by id: a delivery id is
 * derived from its event and endpoint (exactly-once), its time is the event's and its tail a hash.
 */

/**
 * Where a cursor taken from a delivery not yet scored continues (one issued while the lists were
 * ordered by id, or listing one still at score 0): after that delivery's score now in the
 * endpoint's index of all, or, once it has left it, after the time in its id. Null for anything
 * else (not a cursor this service issued).
 */
export async function unscoredCursorScore(redis: Redis, keys: Keys, workspaceId: string, endpointId: string, id: string): Promise<string | null> {
  const ms = idTimeMs('webhookDelivery', id);
  if (ms === null) return null;
  return (await redis.zscore(keys.webhookDeliveries(workspaceId, endpointId), id)) ?? String(scoreAt(ms));
}

/**
 * Scores what the endpoints' delivery indexes hold at score 0: deliveries stored before the
 * indexes were scored, and those a dispatcher of that earlier version makes or moves during a
 * rolling upgrade. Each gets the score of its record's createdAt, in their old order (by id) within
 * a millisecond; an id whose record expired leaves the indexes (lua/rescoreWebhookDeliveries). Run
 * by the dispatchers' housekeeping; once nothing is at 0 it costs one round trip per workspace.
 */
export async function rescoreLegacyDeliveries(redis: Redis, keys: Keys, workspaceId: string, endpointIds: string[]): Promise<number> {
  const statuses = [undefined, ...DELIVERY_STATUSES];
  let changed = 0;
  let left = endpointIds;
  while (left.length) {
    const found = redis.pipeline();
    for (const e of left) for (const status of statuses) found.zrange(keys.webhookDeliveries(workspaceId, e, status), 0, 0, 'BYSCORE', 'LIMIT', 0, 500);
    const lists = ((await found.exec()) ?? []).map(([err, list]) => {
      if (err) throw err;
      return list as string[];
    });
    const next: string[] = [];
    for (const [i, endpointId] of left.entries()) {
      const ids = [...new Set(lists.slice(i * statuses.length, (i + 1) * statuses.length).flat())].sort();
      if (ids.length === 0) continue;
      const done = await rescore(redis, keys, workspaceId, endpointId, ids);
      changed += done;
      if (done > 0) next.push(endpointId); // look again: there may be more than one page at 0
    }
    left = next;
  }
  return changed;
}

/** One page of `rescoreLegacyDeliveries` for one endpoint: how many ids changed. */
async function rescore(redis: Redis, keys: Keys, workspaceId: string, endpointId: string, ids: string[]): Promise<number> {
  const pipeline = redis.pipeline();
  for (const id of ids) pipeline.hget(keys.webhookDelivery(workspaceId, id), 'createdAt');
  const replies = (await pipeline.exec()) ?? [];
  const inMs = new Map<number, number>();
  const args: string[] = [];
  ids.forEach((id, i) => {
    const [err, createdAt] = replies[i]!;
    if (err) throw err;
    const ms = typeof createdAt === 'string' ? Date.parse(createdAt) : NaN;
    if (!(ms > 0)) {
      args.push(id, '');
      return;
    }
    const n = inMs.get(ms) ?? 0;
    inMs.set(ms, n + 1);
    args.push(id, String(scoreAt(ms, n)));
  });
  return callScript<number>(redis, 'rescoreWebhookDeliveries', [keys.webhookDeliveries(workspaceId, endpointId)], args);
}

/** Deliveries of a deleted endpoint removed per batch (one script call) by `purgeDeletedEndpoint`. */
export const PURGE_BATCH = 500;
/** Tries of a batch whose endpoints changed between its reads and its script (lua/purgeWebhookDeliveries answers -1). */
const PURGE_TRIES = 3;

/** `walked`: purge index entries taken (records already expired included), out of the budget */
export type PurgeResult = { walked: number; records: number; payloads: number; finished: boolean };

/**
 * The ids the deliveries of a delivery's event to `endpoints` have or would have (ids derive from the
 * event and the endpoint, lua/enqueueWebhookDeliveries; the time in a delivery id is its event's),
 * leaving out endpoints made after the event, which never get it.
 */
function siblingDeliveries(deliveryId: string, eventId: string, endpoints: string[]): string[] {
  const eventMs = idTimeMs('webhookDelivery', deliveryId);
  if (!eventId || eventMs === null) return [];
  return endpoints.filter((e) => (idTimeMs('webhookEndpoint', e) ?? 0) <= eventMs).map((e) => derivedId('webhookDelivery', eventMs, `${eventId}|${e}`));
}

/**
 * Removes a deleted endpoint's delivery records and payloads (probes BW, EG: they stayed until their
 * keep, ~15 MB per 30 s of endpoint churn), at most `budget` deliveries, `PURGE_BATCH` per script call
 * (lua/purgeWebhookDeliveries), from the purge index lua/deleteWebhookEndpoint renamed its index to.
 * Entries past the keep go first without a look (`floor`, as the sweep prunes live indexes: their
 * records and payloads have expired; score 0, an earlier version's, is looked at). A payload is
 * shared by the event's deliveries to every endpoint, so it stays while another endpoint's delivery
 * of the event exists (`siblingDeliveries`, from the endpoints at the version the script checks).
 * Idempotent: a sweep stopped between batches leaves the rest listed for the next one.
 */
export async function purgeDeletedEndpoint(redis: Redis, keys: Keys, workspaceId: string, endpointId: string, floor: string, budget: number): Promise<PurgeResult> {
  const index = keys.webhookPurge(workspaceId, endpointId);
  const out: PurgeResult = { walked: 0, records: 0, payloads: 0, finished: false };
  await redis.zremrangebyscore(index, '(0', floor);
  for (let tries = 0; budget > 0 && !out.finished && tries < PURGE_TRIES;) {
    const ids = await redis.zrange(index, 0, Math.min(budget, PURGE_BATCH) - 1);
    const read = redis.pipeline().get(keys.webhookVersion(workspaceId)).zrange(keys.webhookEndpoints(workspaceId), 0, -1);
    for (const id of ids) read.hget(keys.webhookDelivery(workspaceId, id), 'eventId');
    const replies = ((await read.exec()) ?? []).map(([err, value]) => {
      if (err) throw err;
      return value;
    });
    const [version, endpoints] = replies as [string | null, string[]];
    const args: (string | number)[] = [keys.webhookBase(workspaceId), endpointId, version ?? '', ids.length];
    ids.forEach((id, i) => {
      const eventId = (replies[i + 2] as string | null) ?? '';
      const siblings = siblingDeliveries(id, eventId, endpoints);
      args.push(id, eventId, siblings.length, ...siblings);
    });
    const reply = await callScript<[number, number, number] | -1>(redis, 'purgeWebhookDeliveries',
      [index, keys.webhookPurges(workspaceId), keys.webhookVersion(workspaceId)], args);
    if (reply === -1) {
      tries++;
      continue;
    }
    out.walked += ids.length;
    out.records += reply[0];
    out.payloads += reply[1];
    out.finished = reply[2] === 1 || ids.length === 0;
    budget -= ids.length;
  }
  return out;
}

/** Deliveries by id, for a page of an index (those expired are null). */
export async function loadDeliveries(redis: Redis, keys: Keys, workspaceId: string, ids: string[]): Promise<(WebhookDelivery | null)[]> {
  if (ids.length === 0) return [];
  const pipeline = redis.pipeline();
  for (const id of ids) pipeline.hgetall(keys.webhookDelivery(workspaceId, id));
  const replies = (await pipeline.exec()) ?? [];
  return replies.map(([err, h]) => {
    if (err) throw err;
    return toDelivery(h as Record<string, string>);
  });
}

/** One delivery of an endpoint with every attempt and the event it carries; null when not found. */
export async function findDelivery(redis: Redis, keys: Keys, workspaceId: string, endpointId: string, id: string): Promise<WebhookDeliveryDetail | null> {
  if (!isId('webhookDelivery', id)) return null;
  const h = await redis.hgetall(keys.webhookDelivery(workspaceId, id));
  const delivery = toDelivery(h);
  if (!delivery || delivery.endpointId !== endpointId) return null;
  const event = await readWebhookEvent(redis, keys, workspaceId, delivery.eventId);
  return { ...delivery, attempts: attemptsOf(h), event };
}

/** A delivered event's stored payload (spec 2.6), or null (never delivered, expired, malformed id). */
export async function readWebhookEvent(redis: Redis, keys: Keys, workspaceId: string, id: string): Promise<Record<string, unknown> | null> {
  if (!isId('webhookEvent', id)) return null;
  const raw = await redis.get(keys.webhookEvent(workspaceId, id));
  return raw ? (JSON.parse(raw) as Record<string, unknown>) : null;
}

/** Queues a replay of a delivery: its number, or `disabled` / `not_found` / `exhausted` (MAX_REPLAYS made). */
export async function replayDelivery(redis: Redis, keys: Keys, workspaceId: string, endpointId: string, id: string, atMs: number): Promise<number | 'disabled' | 'not_found' | 'exhausted'> {
  if (!isId('webhookDelivery', id)) return 'not_found';
  const n = await callScript<number>(redis, 'replayWebhookDelivery',
    [keys.webhookEndpoint(workspaceId, endpointId), keys.webhookDelivery(workspaceId, id), keys.webhookDue(workspaceId, endpointId)], [endpointId, id, atMs, MAX_REPLAYS]);
  return n === -1 ? 'disabled' : n === -2 ? 'not_found' : n === -3 ? 'exhausted' : n;
}

/**
 * Makes every pending or failed delivery of a re-enabled endpoint due at the re-enable (spec 3.3),
 * 500 at a time, then clears the note the re-enable left (`keys.webhookRequeues`, lua/updateWebhookEndpoint).
 * Run by the re-enabling request, which answers after `REQUEUE_IN_REQUEST_MS` and lets the rest go
 * on; a process killed first leaves the note, which the dispatchers' sweep finds after
 * REQUEUE_GRACE_MS and runs this again (the same writes: idempotent). Answers how many were queued.
 */
export async function requeueOwed(redis: Redis, keys: Keys, workspaceId: string, endpointId: string, atMs: number): Promise<number> {
  const call = (ids: string[], last: boolean) => callScript<number>(redis, 'requeueWebhookDeliveries',
    [keys.webhookInflight(workspaceId), keys.webhookDue(workspaceId, endpointId), keys.webhookRequeues(workspaceId)],
    [keys.webhookBase(workspaceId), atMs, endpointId, last ? '1' : '0', ...ids]);
  let queued = 0;
  for (const status of ['pending', 'failed'] as const) {
    // ZSCAN yields every id present throughout the walk; one seen twice is queued twice, harmlessly
    let cursor = '0';
    do {
      const [next, flat] = await redis.zscan(keys.webhookDeliveries(workspaceId, endpointId, status), cursor, 'COUNT', REQUEUE_PAGE);
      cursor = next;
      const ids = flat.filter((_, i) => i % 2 === 0);
      if (ids.length === 0) continue;
      const n = await call(ids, false);
      if (n < 0) return queued; // the endpoint is gone, and so is the note
      queued += n;
    } while (cursor !== '0');
  }
  await call([], true);
  return queued;
}

/** Deliveries re-queued per script call. */
const REQUEUE_PAGE = 500;
/** How long a re-enabling request waits for its re-queue before it answers (the rest goes on). */
export const REQUEUE_IN_REQUEST_MS = 1_000;
/** How old a re-queue note is before the dispatchers' sweep takes it over from the request that wrote it. */
export const REQUEUE_GRACE_MS = 60_000;

// --- the dispatcher's three steps: enqueue, claim, record ---

/** One attempt a dispatcher holds the lease of. */
export type ClaimedAttempt = {
  /** `<delivery id>` or `<delivery id>#<replay n>` */
  member: string;
  token: string;
  deliveryId: string;
  eventId: string;
  /** the scheduled attempt's number (1 to 10), 0 for a replay */
  attempt: number;
  /** lease expiry (ms) */
  leaseUntil: number;
};

export type EnqueueEvent = { eventId: string; eventMs: number; eventType: string; body: string; targets: { endpointId: string; deliveryId: string }[] };

export type LeaseOptions = { atMs: number; leaseMs: number; token: string };

/**
 * Creates the deliveries of a batch of events (lua/enqueueWebhookDeliveries) and claims first
 * attempts up to `capacity` per endpoint. Returns the claims and the stored payload of events
 * that had one already (a re-forward), which the caller must send instead of its own.
 */
export async function enqueueDeliveries(
  redis: Redis, keys: Keys, workspaceId: string, events: EnqueueEvent[], capacity: Map<string, number>, lease: LeaseOptions & { retentionMs: number },
): Promise<{ claimed: (ClaimedAttempt & { endpointId: string })[]; stored: Map<string, string> }> {
  const args: (string | number)[] = [keys.webhookBase(workspaceId), lease.atMs, isoNow(lease.atMs), lease.retentionMs, lease.leaseMs, lease.token, SCORE_PER_MS, capacity.size];
  for (const [id, free] of capacity) args.push(id, free);
  args.push(events.length);
  for (const e of events) {
    args.push(e.eventId, e.eventMs, e.eventType, e.body, e.targets.length);
    for (const t of e.targets) args.push(t.endpointId, t.deliveryId);
  }
  const [claimed, existing] = await callScript<[[string, string, string, string, string, number][], string[]]>(redis, 'enqueueWebhookDeliveries',
    [keys.webhookInflight(workspaceId), keys.webhookLeases(workspaceId)], args);
  const stored = new Map<string, string>();
  for (let i = 0; i < existing.length; i += 2) stored.set(existing[i]!, existing[i + 1]!);
  return {
    claimed: claimed.map(([member, token, endpointId, deliveryId, eventId, attempt]) => ({ member, token, endpointId, deliveryId, eventId, attempt, leaseUntil: lease.atMs + lease.leaseMs })),
    stored,
  };
}

/** What a claim returns per endpoint: its attempts (where and how they are sent is read when each starts). */
export type ClaimedEndpoint = {
  endpointId: string;
  /** due attempts left in its queue after this claim */
  dueLeft: number;
  attempts: (ClaimedAttempt & { body: string })[];
};

type ClaimReply = [number, [string, number, [string, string, string, string, number, string][]][]];

/**
 * Gives back a claimed attempt that will not be sent (lua/releaseWebhookAttempt): its lease expires
 * now, so the next claim re-queues it. Only while `token` still holds the lease.
 */
export async function releaseAttempt(redis: Redis, keys: Keys, workspaceId: string, member: string, token: string, atMs: number): Promise<boolean> {
  return (await callScript<number>(redis, 'releaseWebhookAttempt', [keys.webhookInflight(workspaceId), keys.webhookLeases(workspaceId)], [member, token, atMs])) === 1;
}

/** Adds a claim of a workspace's due attempts (lua/claimWebhookAttempts) to `pipeline`. */
export function claimAttempts(pipeline: ChainableCommander, keys: Keys, workspaceId: string, capacity: Map<string, number>, defaultCapacity: number, lease: LeaseOptions): ChainableCommander {
  const args: (string | number)[] = [keys.webhookBase(workspaceId), lease.atMs, lease.leaseMs, lease.token, defaultCapacity, capacity.size];
  for (const [id, free] of capacity) args.push(id, free);
  return callScript(pipeline, 'claimWebhookAttempts', [keys.webhookEndpoints(workspaceId), keys.webhookInflight(workspaceId), keys.webhookLeases(workspaceId)], args);
}

/**
 * Reads the reply of `claimAttempts`: the claimed attempts per endpoint, and when something of the
 * workspace is next due (a queued attempt or a lease expiry; null when nothing waits).
 */
export function parseClaim(reply: unknown, lease: LeaseOptions): { nextDueMs: number | null; endpoints: ClaimedEndpoint[] } {
  const [next, endpoints] = reply as ClaimReply;
  return { nextDueMs: Number(next) < 0 ? null : Number(next), endpoints: endpoints.map(([endpointId, dueLeft, attempts]) => ({
    endpointId,
    dueLeft: Number(dueLeft),
    attempts: attempts.map(([member, token, deliveryId, eventId, attempt, body]) => ({ member, token, deliveryId, eventId, attempt: Number(attempt), body, leaseUntil: lease.atMs + lease.leaseMs })),
  })) };
}

export type AttemptResult = { member: string; token: string; record: AttemptRecord };
export type RecordOutcome = { recorded: boolean; status: DeliveryStatus | ''; disabledEndpointId: string | null };

/** Records a batch of attempt results of one workspace (lua/recordWebhookAttempts), each at most once. */
export async function recordAttempts(redis: Redis, keys: Keys, workspaceId: string, results: AttemptResult[], options: { atMs: number; retryScheduleMs: number[] }): Promise<RecordOutcome[]> {
  const args: (string | number)[] = [keys.webhookBase(workspaceId), options.atMs, isoNow(options.atMs), MAX_ATTEMPTS, DISABLE_AFTER_MS, options.retryScheduleMs.length, ...options.retryScheduleMs, results.length];
  for (const r of results) args.push(r.member, r.token, r.record.success ? 1 : 0, r.record.statusCode ?? '', JSON.stringify(r.record));
  const reply = await callScript<[number, string, string][]>(redis, 'recordWebhookAttempts', [keys.webhookInflight(workspaceId), keys.webhookLeases(workspaceId)], args);
  return reply.map(([recorded, status, disabled]) => ({ recorded: recorded === 1, status: status as DeliveryStatus | '', disabledEndpointId: disabled || null }));
}
