import type { Redis } from 'ioredis';
import { isoNow, now } from '../lib/clock.js';
import { ApiError } from '../lib/errors.js';
import type { EventSource } from '../lib/event-names.js';
import { newId } from '../lib/ids.js';
import { partitionOf } from '../lib/partition.js';
import type { NewEvent } from '../lib/track-events.js';
import type { Keys } from './keys.js';
import { callScript } from './lua-scripts.js';

/** A stored event (spec 2.4). */
export type StoredEvent = {
  id: string;
  sequence: number;
  externalId: string;
  name: string;
  source: EventSource;
  timestamp: string;
  receivedAt: string;
  data: Record<string, unknown>;
  /** the other service a Source turned a webhook into this event from (source `webhook`); null for every other source */
  provider: string | null;
  runId: string | null;
  messageId: string | null;
  step: string | null;
};
export type IngestedEvent = StoredEvent & { status: 'accepted' | 'duplicate' };
/**
 * Where a group of events goes and the limits it is written under: `maxBacklog` the partition
 * inbox's (503), `tenantMaxBacklog` the tenant's own unprocessed events in one partition and
 * `subscriberMaxBacklog` one subscriber's (429; left out for the engine's own events, which are
 * never refused for them).
 */
export type Scope = { workspaceId: string; tenantId: string; partitions: number; maxBacklog: number; tenantMaxBacklog?: number; subscriberMaxBacklog?: number };

type ScriptItem = [1, number, string, number] | [2, string] | [3, number, number, ...(string | number)[]];

const orNull = (s: string | undefined) => (s ? s : null);

function fromOriginal(externalId: string, original: string): StoredEvent {
  const cut = original.indexOf('\n');
  const meta = JSON.parse(original.slice(0, cut)) as Record<string, string | number>;
  return {
    id: String(meta.id), sequence: Number(meta.q), externalId, name: String(meta.n), source: meta.o as EventSource,
    timestamp: isoNow(Number(meta.ts)), receivedAt: isoNow(Number(meta.r)), data: JSON.parse(original.slice(cut + 1)),
    provider: orNull(meta.pv as string), runId: orNull(meta.ru as string), messageId: orNull(meta.m as string), step: orNull(meta.st as string),
  };
}

/** Most events in one script call: a larger group is split, in order, over several calls of one pipeline. */
const MAX_EVENTS_PER_CALL = 500;

type Request = { scope: Scope; events: NewEvent[]; done: (items: IngestedEvent[]) => void; fail: (err: unknown) => void };
/**
 * `lengths`: each partition inbox's length as the last script call on it answered (lua/ingestEvents).
 * `pending`: `tenant|partition` → the tenant's unprocessed events there, and `hot`:
 * `tenant|externalId` → the subscriber's, as last answered or measured, kept only while near their
 * limit (at most MAX_NEAR_KEPT of each).
 */
type Queue = { keys: Keys; requests: Request[]; scheduled: boolean; lengths: Map<number, number>; pending: Map<string, number>; hot: Map<string, number> };

/** A partition whose last known inbox length (or a tenant's backlog in it) is past this share of the limit is measured before a write. */
const NEAR_BACKLOG = 0.9;
const MAX_NEAR_KEPT = 10_000;
const behind = () => new ApiError(503, 'unavailable', 'Event processing is behind; retry the request later');
const tenantBehind = (limit: number) => new ApiError(429, 'rate_limited',
  `This tenant has ${limit} or more events waiting to be processed in a partition this request writes to; retry the request later`);
const subscriberBehind = (limit: number, externalId: string) => new ApiError(429, 'rate_limited',
  `The subscriber ${JSON.stringify(externalId)} has ${limit} or more events waiting to be processed; retry the request later`);

// Requests waiting for the next flush, per client and key prefix.
const queues = new WeakMap<Redis, Map<string, Queue>>();

/**
 * Appends `events` of one tenant and answers them in input order. Calls made in the same turn of
 * the event loop (the requests whose bodies arrived together) are written together: their events
 * are grouped by tenant and partition, one `ingestEvents` script call per group, all in one
 * pipeline. A 100-event request touches ~50 of 64 partitions, so alone it makes ~50 calls of two
 * events; 32 concurrent requests make 64 calls of ~50 instead of 1,600, and Redis spends ~8 µs per
 * event instead of ~15 (`npm run bench -- scripts`). Each call is atomic; a request whose events
 * span calls and fails midway is made safe to retry by the caller's `id`s, as before.
 */
export function ingestEvents(redis: Redis, keys: Keys, scope: Scope, events: NewEvent[]): Promise<IngestedEvent[]> {
  if (events.length === 0) return Promise.resolve([]);
  let byPrefix = queues.get(redis);
  if (!byPrefix) queues.set(redis, (byPrefix = new Map()));
  let queue = byPrefix.get(keys.prefix);
  if (!queue) byPrefix.set(keys.prefix, (queue = { keys, requests: [], scheduled: false, lengths: new Map(), pending: new Map(), hot: new Map() }));
  const q = queue;
  return new Promise<IngestedEvent[]>((done, fail) => {
    q.requests.push({ scope, events, done, fail });
    if (q.scheduled) return;
    q.scheduled = true;
    setImmediate(() => {
      const requests = q.requests;
      q.requests = [];
      q.scheduled = false;
      refuseOverLimits(redis, q, requests)
        .then((kept) => flush(redis, q, kept))
        .catch((err) => requests.forEach((r) => r.fail(err)));
    });
  });
}

type Slot = { request: number; index: number };

/**
 * The limits' refusals of a whole request, before anything of it is written: 503 when a partition
 * it touches holds more than `maxBacklog` entries, 429 `rate_limited` when its tenant holds more than
 * `tenantMaxBacklog` unprocessed events in one of them (one tenant's flood, or one hot subscriber,
 * then waits for itself while the other tenants' events go on). Each script call is atomic per
 * partition only, so a request spanning partitions would otherwise be stored in part when one of them
 * is over (probe X: 18 of 20 events of a refused batch stored; a retry without `id`s then stores them
 * twice). What the last answers said is known per partition and per tenant near its limit: only
 * those near a limit are measured, in one pipeline, and only then. The inbox limit is also checked by
 * the script, for what another web process filled meanwhile; the tenant limit only here (another
 * process's writes can pass it by one flush each, which is all a fairness limit needs). Returns the
 * requests to write.
 */
async function refuseOverLimits(redis: Redis, q: Queue, requests: Request[]): Promise<Request[]> {
  // the usual case, nothing near a limit, costs a look at the known lengths (one per partition)
  const least = Math.min(...requests.map(({ scope }) => scope.maxBacklog)) * NEAR_BACKLOG;
  let anyNear = q.pending.size > 0 || q.hot.size > 0;
  if (!anyNear) for (const length of q.lengths.values()) if (length >= least) { anyNear = true; break; }
  if (!anyNear) return requests;
  const touched = requests.map(({ scope, events }) => new Set(events.map((e) => partitionOf(scope.tenantId, e.externalId, scope.partitions))));
  const near = new Set<number>();
  const nearTenant = new Map<string, { tenantId: string; p: number; limit: number }>();
  const nearSubscriber = new Map<string, { tenantId: string; externalId: string; p: number; limit: number }>();
  requests.forEach(({ scope, events }, i) => {
    for (const p of touched[i]!) {
      if ((q.lengths.get(p) ?? 0) >= scope.maxBacklog * NEAR_BACKLOG) near.add(p);
      const key = `${scope.tenantId}|${p}`;
      if (scope.tenantMaxBacklog !== undefined && q.pending.has(key)) nearTenant.set(key, { tenantId: scope.tenantId, p, limit: scope.tenantMaxBacklog });
    }
    if (scope.subscriberMaxBacklog === undefined || q.hot.size === 0) return;
    for (const { externalId } of events) {
      const key = `${scope.tenantId}|${externalId}`;
      if (q.hot.has(key)) nearSubscriber.set(key, { tenantId: scope.tenantId, externalId, p: partitionOf(scope.tenantId, externalId, scope.partitions), limit: scope.subscriberMaxBacklog });
    }
  });
  if (near.size === 0 && nearTenant.size === 0 && nearSubscriber.size === 0) return requests;
  const measured = [...near];
  const tenants = [...nearTenant.entries()];
  const subscribers = [...nearSubscriber.entries()];
  const pipeline = redis.pipeline();
  for (const p of measured) pipeline.xlen(q.keys.inbox(p));
  for (const [, { tenantId, p }] of tenants) pipeline.xlen(q.keys.inbox(p)).hmget(q.keys.tenantBacklog(p), `i|${tenantId}`, `d|${tenantId}`);
  for (const [key, { p }] of subscribers) pipeline.hget(q.keys.sequences(p), key).hget(q.keys.applied(p), key);
  const replies = (await pipeline.exec()) ?? [];
  const reply = (k: number) => {
    const [err, value] = replies[k] ?? [new Error('no reply from Redis'), null];
    if (err) throw err;
    return value;
  };
  measured.forEach((p, k) => q.lengths.set(p, Number(reply(k))));
  let k = measured.length;
  for (const [key, { limit }] of tenants) {
    const length = Number(reply(k++));
    const [appended, done] = reply(k++) as [string | null, string | null];
    keepNear(q.pending, key, Math.min(length, Math.max(0, Number(appended ?? 0) - Number(done ?? 0))), limit);
  }
  for (const [key, { limit }] of subscribers) {
    const sequence = Number(reply(k++) ?? 0);
    keepNear(q.hot, key, Math.max(0, sequence - Number(reply(k++) ?? 0)), limit);
  }
  return requests.filter((request, i) => {
    const { scope, events } = request;
    const over = [...touched[i]!].some((p) => (q.lengths.get(p) ?? 0) > scope.maxBacklog);
    if (over) {
      request.fail(behind());
      return false;
    }
    const tenantLimit = scope.tenantMaxBacklog;
    if (tenantLimit !== undefined && [...touched[i]!].some((p) => (q.pending.get(`${scope.tenantId}|${p}`) ?? 0) >= tenantLimit)) {
      request.fail(tenantBehind(tenantLimit));
      return false;
    }
    const subscriberLimit = scope.subscriberMaxBacklog;
    const hot = subscriberLimit === undefined ? undefined : events.find((e) => (q.hot.get(`${scope.tenantId}|${e.externalId}`) ?? 0) >= subscriberLimit);
    if (hot) {
      request.fail(subscriberBehind(subscriberLimit!, hot.externalId));
      return false;
    }
    return true;
  });
}

/** Keeps a backlog (a tenant's in a partition, or a subscriber's) while it is near `limit`, the only ones measured before a write, and forgets it below. */
function keepNear(map: Map<string, number>, key: string, pending: number, limit: number): void {
  if (pending < limit * NEAR_BACKLOG) {
    map.delete(key);
    return;
  }
  if (!map.has(key) && map.size >= MAX_NEAR_KEPT) map.clear();
  map.set(key, pending);
}

async function flush(redis: Redis, q: Queue, requests: Request[]): Promise<void> {
  if (requests.length === 0) return;
  const keys = q.keys;
  const receivedMs = now();
  const receivedIso = isoNow(receivedMs);
  // groups by tenant and partition, each request's events in input order, requests in arrival order
  const groups = new Map<string, { scope: Scope; p: number; slots: Slot[] }>();
  requests.forEach(({ scope, events }, request) => {
    events.forEach((event, index) => {
      const p = partitionOf(scope.tenantId, event.externalId, scope.partitions);
      const key = `${scope.tenantId}|${p}`;
      const group = groups.get(key);
      if (group) group.slots.push({ request, index });
      else groups.set(key, { scope, p, slots: [{ request, index }] });
    });
  });
  // ids in input order, each event's `$subscriber.created` id just before its own (that event is
  // written first when the subscriber is new): the tenant log lists by (ms, id) (read-models.ts)
  const ids = requests.map(({ events }) => events.map(() => ({ created: newId('event', receivedMs), event: newId('event', receivedMs) })));
  const calls: { p: number; scope: Scope; keys: string[]; args: (string | number)[]; slots: Slot[] }[] = [];
  for (const { scope, p, slots } of groups.values()) {
    for (let from = 0; from < slots.length; from += MAX_EVENTS_PER_CALL) {
      const part = slots.slice(from, from + MAX_EVENTS_PER_CALL);
      const report = scope.subscriberMaxBacklog === undefined ? 0 : Math.max(1, Math.ceil(scope.subscriberMaxBacklog * NEAR_BACKLOG));
      const args: (string | number)[] = [scope.tenantId, scope.workspaceId, receivedMs, scope.maxBacklog, keys.partitionBase(p), receivedIso, part.length, report];
      for (const { request, index } of part) {
        const e = requests[request]!.events[index]!;
        const { created, event } = ids[request]![index]!;
        args.push(event, created, newId('subscriber', receivedMs), e.externalId, e.name, e.source, e.timestampMs, e.data, e.callerId ?? '', e.runId ?? '', e.messageId ?? '', e.step ?? '', e.provider ?? '');
      }
      calls.push({ p, scope, keys: [keys.inbox(p), keys.sequences(p), keys.subscribers(p), keys.dedupe(p), keys.dedupeAge(p), keys.tenantBacklog(p)], args, slots: part });
    }
  }
  // One call (a single event, or one subscriber's batch): no pipeline; an ioredis pipeline costs
  // more to set up than it saves for one command.
  let replies: [Error | null, unknown][];
  if (calls.length === 1) {
    replies = [await callScript<unknown>(redis, 'ingestEvents', calls[0]!.keys, calls[0]!.args).then((r) => [null, r] as [null, unknown], (err: Error) => [err, null] as [Error, null])];
  } else {
    const pipeline = redis.pipeline();
    for (const call of calls) callScript(pipeline, 'ingestEvents', call.keys, call.args);
    replies = ((await pipeline.exec()) ?? []) as [Error | null, unknown][];
  }
  const out = requests.map(({ events }) => new Array<IngestedEvent>(events.length));
  const failed = new Map<number, unknown>();
  calls.forEach((call, c) => {
    const [err, reply] = replies[c] ?? [new Error('no reply from Redis'), null];
    const items = reply as ScriptItem[] | [-1, number];
    if (!err && items[0] === -1) q.lengths.set(call.p, items[1] as number);
    else if (!err) {
      const [, length, pending, ...hot] = items[items.length - 1] as [3, number, number, ...(string | number)[]];
      q.lengths.set(call.p, length);
      const { tenantId, tenantMaxBacklog, subscriberMaxBacklog } = call.scope;
      if (tenantMaxBacklog !== undefined) keepNear(q.pending, `${tenantId}|${call.p}`, pending, tenantMaxBacklog);
      if (subscriberMaxBacklog !== undefined) for (let h = 0; h < hot.length; h += 2) keepNear(q.hot, `${tenantId}|${hot[h]}`, Number(hot[h + 1]), subscriberMaxBacklog);
    }
    const problem = err ?? (items[0] === -1 ? behind() : null);
    if (problem) {
      for (const { request } of call.slots) if (!failed.has(request)) failed.set(request, problem);
      return;
    }
    call.slots.forEach(({ request, index }, k) => {
      const item = items[k] as ScriptItem;
      const e = requests[request]!.events[index]!;
      out[request]![index] = item[0] === 2
        ? { ...fromOriginal(e.externalId, item[1]), status: 'duplicate' }
        : {
          id: ids[request]![index]!.event, sequence: item[1], externalId: e.externalId, name: e.name, source: e.source,
          timestamp: isoNow(e.timestampMs), receivedAt: receivedIso, data: e.value ?? JSON.parse(e.data),
          provider: e.provider, runId: e.runId, messageId: e.messageId, step: e.step, status: 'accepted',
        };
    });
  });
  requests.forEach((r, i) => (failed.has(i) ? r.fail(failed.get(i)) : r.done(out[i]!)));
}
