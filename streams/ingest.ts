import type { Redis } from 'ioredis';
import { isoNow, now } from '../lib/clock.js';
import { ApiError, processingBehind } from '../lib/errors.js';
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
/**
 * `gone`: not stored, an engine event (source `system`) of an externalId that is no subscriber, or
 * another one than the engine read (`NewEvent.subscriberId`): it was deleted since, and perhaps
 * created again (the API's events are never `system`).
 */
export type IngestedEvent = StoredEvent & { status: 'accepted' | 'duplicate' | 'gone' };
/**
 * Where a group of events goes and the limits it is written under: `maxBacklog` the partition
 * inbox's (503), `tenantMaxBacklog` the tenant's own unprocessed events in one partition and
 * `subscriberMaxBacklog` one subscriber's (429; left out for the engine's own events, which are
 * never refused for them).
 */
export type Scope = { workspaceId: string; tenantId: string; partitions: number; maxBacklog: number; tenantMaxBacklog?: number; subscriberMaxBacklog?: number };

type ScriptItem = [1, number, string, number] | [2, string] | [3, number, number, ...(string | number)[]] | [4];

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

type Request = { scope: Scope; events: NewEvent[]; parts: number[]; done: (items: IngestedEvent[]) => void; fail: (err: unknown) => void };

/**
 * A backlog counted against a limit whose figure this process keeps while it is at least this share
 * of the limit; one not kept is taken to be just under it. So a process admits blind (without a
 * measure) at most the rest, 20 %, past what another process filled: at 0.5 two web processes let
 * 700 wait at tenant limit 500 (probe N). A flush with that many events for one key measures it.
 */
const KEEP_BACKLOG = 0.8;
/** A partition whose last known inbox length is past this share of `maxBacklog` is measured before a write. */
const NEAR_INBOX = 0.9;
const MAX_NEAR_KEPT = 10_000;

/**
 * One kind of backlog counted against a limit (a tenant's in a partition, or a subscriber's) as this
 * process knows it: `known` the figure the last script answer or measure gave, kept only while at
 * least KEEP_BACKLOG of the limit (at most MAX_NEAR_KEPT of them), and `sent` the events written
 * and not yet answered. A backlog grows only by writes (this process's are counted, another's are not
 * seen until measured) and shrinks as the worker applies it, so `bound` is the most it can hold.
 */
class Backlogs {
  readonly known = new Map<string, number>();
  readonly sent = new Map<string, number>();
  bound(key: string, limit: number): number {
    return (this.known.get(key) ?? Math.ceil(limit * KEEP_BACKLOG)) + (this.sent.get(key) ?? 0);
  }
  keep(key: string, backlog: number, limit: number): void {
    if (backlog < limit * KEEP_BACKLOG) {
      this.known.delete(key);
      return;
    }
    if (!this.known.has(key) && this.known.size >= MAX_NEAR_KEPT) this.known.clear();
    this.known.set(key, backlog);
  }
  /** `n` events sent for `key` (`n` negative once they are answered). */
  count(key: string, n: number): void {
    const left = (this.sent.get(key) ?? 0) + n;
    if (left > 0) this.sent.set(key, left);
    else this.sent.delete(key);
  }
}

/**
 * `lengths`: each partition inbox's length as the last script call on it answered (lua/ingestEvents).
 * `tenants`: `tenant|partition` → the tenant's unprocessed events there; `subscribers`:
 * `tenant|externalId` → the subscriber's. `turn`: settled once the previous flush's writes are sent,
 * so a flush measures after them (one connection answers in order) and counts them.
 */
type Queue = { keys: Keys; requests: Request[]; scheduled: boolean; lengths: Map<number, number>; tenants: Backlogs; subscribers: Backlogs; turn: Promise<void> };

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
 * span calls and fails midway is made safe to retry by the caller's `id`s, as before. The engine's
 * events (source `system`) never create a subscriber: one of an externalId that is none comes back
 * `gone`, not stored; a caller's events (the first overload) never do.
 */
export function ingestEvents(redis: Redis, keys: Keys, scope: Scope, events: (NewEvent & { source: Exclude<EventSource, 'system'> })[]): Promise<(IngestedEvent & { status: 'accepted' | 'duplicate' })[]>;
export function ingestEvents(redis: Redis, keys: Keys, scope: Scope, events: NewEvent[]): Promise<IngestedEvent[]>;
export function ingestEvents(redis: Redis, keys: Keys, scope: Scope, events: NewEvent[]): Promise<IngestedEvent[]> {
  if (events.length === 0) return Promise.resolve([]);
  let byPrefix = queues.get(redis);
  if (!byPrefix) queues.set(redis, (byPrefix = new Map()));
  let queue = byPrefix.get(keys.prefix);
  if (!queue) {
    queue = { keys, requests: [], scheduled: false, lengths: new Map(), tenants: new Backlogs(), subscribers: new Backlogs(), turn: Promise.resolve() };
    byPrefix.set(keys.prefix, queue);
  }
  const q = queue;
  const parts = events.map((e) => partitionOf(scope.tenantId, e.externalId, scope.partitions));
  return new Promise<IngestedEvent[]>((done, fail) => {
    q.requests.push({ scope, events, parts, done, fail });
    if (q.scheduled) return;
    q.scheduled = true;
    setImmediate(() => {
      const requests = q.requests;
      q.requests = [];
      q.scheduled = false;
      const previous = q.turn;
      let sent = () => {};
      q.turn = new Promise<void>((settle) => (sent = settle));
      previous
        .then(() => refuseOverLimits(redis, q, requests))
        .then((kept) => flush(redis, q, kept, sent))
        .catch((err) => requests.forEach((r) => r.fail(err)))
        .finally(() => sent());
    });
  });
}

type Slot = { request: number; index: number };
/** What one flush writes against a backlog limit: a tenant's in partition `p`, or (with `externalId`) a subscriber's; its events in the flush. */
type Share = { key: string; tenantId: string; p: number; externalId?: string; limit: number; events: number };

/**
 * The limits' refusals of a whole request, before anything of it is written: 503 when a partition
 * it touches holds more than `maxBacklog` entries, 429 `rate_limited` when its tenant holds
 * `tenantMaxBacklog` or more unprocessed events in one of them, or a subscriber it names
 * `subscriberMaxBacklog` or more (one tenant's flood, or one hot subscriber, then waits for itself
 * while the other tenants' events go on). Each script call is atomic per partition only, so a
 * request spanning partitions would otherwise be stored in part when one of them is over (probe X:
 * 18 of 20 events of a refused batch stored; a retry without `id`s then stores them twice).
 *
 * What the last answers said, and what this process sent since, bounds each backlog; only a key
 * whose bound plus this flush's events for it reaches its limit is measured (one pipeline), and the
 * flush's requests are then admitted in arrival order while the key's measured backlog plus the
 * events admitted before them is under the limit: a burst of requests arriving together is counted
 * against itself (probe L1: 16 concurrent 100-event batches for one new subscriber were all admitted
 * at limit 250 before this), so a limit is passed by at most one request's events. The inbox limit
 * is also checked by the script, for what another web process filled meanwhile; the backlog limits
 * only here (another process's writes are not seen until measured, which a fairness limit can
 * afford). Returns the requests to write.
 */
async function refuseOverLimits(redis: Redis, q: Queue, requests: Request[]): Promise<Request[]> {
  const touched = requests.map(({ parts }) => new Set(parts));
  const near = new Set<number>();
  // tenants' shares under `tenant|p`, subscribers' under `tenant|externalId`
  const tenantShares = new Map<string, Share>();
  const subscriberShares = new Map<string, Share>();

  requests.forEach(({ scope, events, parts }, i) => {
    for (const p of touched[i]!) if ((q.lengths.get(p) ?? 0) >= scope.maxBacklog * NEAR_INBOX) near.add(p);
    const { tenantId, tenantMaxBacklog, subscriberMaxBacklog } = scope;
    events.forEach(({ externalId }, j) => {
      const p = parts[j]!;
      if (tenantMaxBacklog !== undefined) {
        const key = `${tenantId}|${p}`;
        const s = tenantShares.get(key);
        if (s) s.events++;
        else tenantShares.set(key, { key, tenantId, p, limit: tenantMaxBacklog, events: 1 });
      }
      if (subscriberMaxBacklog !== undefined) {
        const key = `${tenantId}|${externalId}`;
        const s = subscriberShares.get(key);
        if (s) s.events++;
        else subscriberShares.set(key, { key, tenantId, p, externalId, limit: subscriberMaxBacklog, events: 1 });
      }
    });
  });
  // the usual case: every key's bound and the flush's events for it stay under its limit
  const reaching = (shares: Map<string, Share>, known: Backlogs) => [...shares.values()].filter((s) => known.bound(s.key, s.limit) + s.events >= s.limit);
  const tenants = reaching(tenantShares, q.tenants);
  const subscribers = reaching(subscriberShares, q.subscribers);
  if (near.size === 0 && tenants.length === 0 && subscribers.length === 0) return requests;
  const lengths = [...near];
  const pipeline = redis.pipeline();
  for (const p of lengths) pipeline.xlen(q.keys.inbox(p));
  for (const { tenantId, p } of tenants) pipeline.xlen(q.keys.inbox(p)).hmget(q.keys.tenantBacklog(p), `i|${tenantId}`, `d|${tenantId}`);
  for (const { key, p } of subscribers) pipeline.hget(q.keys.sequences(p), key).hget(q.keys.applied(p), key);
  const replies = (await pipeline.exec()) ?? [];
  const reply = (k: number) => {
    const [err, value] = replies[k] ?? [new Error('no reply from Redis'), null];
    if (err) throw err;
    return value;
  };
  lengths.forEach((p, k) => q.lengths.set(p, Number(reply(k))));
  let k = lengths.length;
  // each measured key's backlog, raised by the events admitted as the requests are walked in order
  const backlog = new Map<Share, number>();
  for (const s of tenants) {
    const length = Number(reply(k++));
    const [appended, done] = reply(k++) as [string | null, string | null];
    backlog.set(s, Math.min(length, Math.max(0, Number(appended ?? 0) - Number(done ?? 0))));
    q.tenants.keep(s.key, backlog.get(s)!, s.limit);
  }
  for (const s of subscribers) {
    const sequence = Number(reply(k++) ?? 0);
    backlog.set(s, Math.max(0, sequence - Number(reply(k++) ?? 0)));
    q.subscribers.keep(s.key, backlog.get(s)!, s.limit);
  }
  const measuredTenants = new Map(tenants.map((s) => [s.key, s]));
  const measuredSubscribers = new Map(subscribers.map((s) => [s.key, s]));
  return requests.filter((request, i) => {
    const { scope, events, parts } = request;
    if ([...touched[i]!].some((p) => (q.lengths.get(p) ?? 0) > scope.maxBacklog)) {
      request.fail(processingBehind());
      return false;
    }
    // the request's events per measured key: refused if one is full, else they count for the next
    const own = new Map<Share, number>();
    events.forEach(({ externalId }, j) => {
      for (const s of [measuredTenants.get(`${scope.tenantId}|${parts[j]}`), measuredSubscribers.get(`${scope.tenantId}|${externalId}`)]) {
        if (s) own.set(s, (own.get(s) ?? 0) + 1);
      }
    });
    const full = [...own.keys()].filter((s) => backlog.get(s)! >= s.limit);
    const tenant = full.find((s) => s.externalId === undefined);
    if (full.length > 0) {
      request.fail(tenant ? tenantBehind(tenant.limit) : subscriberBehind(full[0]!.limit, full[0]!.externalId!));
      return false;
    }
    for (const [s, n] of own) backlog.set(s, backlog.get(s)! + n);
    return true;
  });
}

async function flush(redis: Redis, q: Queue, requests: Request[], sent: () => void): Promise<void> {
  if (requests.length === 0) return;
  const keys = q.keys;
  const receivedMs = now();
  const receivedIso = isoNow(receivedMs);
  // groups by tenant and partition, each request's events in input order, requests in arrival order
  const groups = new Map<string, { scope: Scope; p: number; slots: Slot[] }>();
  requests.forEach(({ scope, parts }, request) => {
    parts.forEach((p, index) => {
      const key = `${scope.tenantId}|${p}`;
      const group = groups.get(key);
      if (group) group.slots.push({ request, index });
      else groups.set(key, { scope, p, slots: [{ request, index }] });
    });
  });
  // ids in input order, each event's `$subscriber.created` id just before its own (that event is
  // written first when the subscriber is new): the tenant log lists by (ms, id) (read-models.ts)
  const ids = requests.map(({ events }) => events.map(() => ({ created: newId('event', receivedMs), event: newId('event', receivedMs) })));
  type Call = { p: number; scope: Scope; keys: string[]; args: (string | number)[]; slots: Slot[]; subscribers: Map<string, number> };
  const calls: Call[] = [];
  for (const { scope, p, slots } of groups.values()) {
    for (let from = 0; from < slots.length; from += MAX_EVENTS_PER_CALL) {
      const part = slots.slice(from, from + MAX_EVENTS_PER_CALL);
      const report = scope.subscriberMaxBacklog === undefined ? 0 : Math.max(1, Math.ceil(scope.subscriberMaxBacklog * KEEP_BACKLOG));
      const args: (string | number)[] = [scope.tenantId, scope.workspaceId, receivedMs, scope.maxBacklog, keys.partitionBase(p), receivedIso, part.length, report];
      const subscribers = new Map<string, number>();
      for (const { request, index } of part) {
        const e = requests[request]!.events[index]!;
        const { created, event } = ids[request]![index]!;
        args.push(event, created, e.source === 'system' ? e.subscriberId ?? '' : newId('subscriber', receivedMs), e.externalId, e.name, e.source, e.timestampMs ?? receivedMs, e.data, e.callerId ?? '', e.runId ?? '', e.messageId ?? '', e.step ?? '', e.provider ?? '');
        if (scope.subscriberMaxBacklog !== undefined) subscribers.set(e.externalId, (subscribers.get(e.externalId) ?? 0) + 1);
      }
      calls.push({ p, scope, keys: [keys.inbox(p), keys.sequences(p), keys.subscribers(p), keys.dedupe(p), keys.dedupeAge(p), keys.tenantBacklog(p)], args, slots: part, subscribers });
    }
  }
  // the calls' events count against their backlogs until answered (a new subscriber's
  // `$subscriber.created` too: one more, counted for every call; a bound may be high, not low)
  const counted = (call: Call, sign: 1 | -1) => {
    if (call.scope.tenantMaxBacklog !== undefined) q.tenants.count(`${call.scope.tenantId}|${call.p}`, sign * call.slots.length);
    for (const [externalId, n] of call.subscribers) q.subscribers.count(`${call.scope.tenantId}|${externalId}`, sign * (n + 1));
  };
  calls.forEach((call) => counted(call, 1));
  // The writes must reach the connection before the next flush's measure (the turn passes once they
  // have), and a pipeline is written at once; so is a lone command on a connection without
  // auto-pipelining (the web role's, bin/service.ts `commandsOf`), which then needs no pipeline (an
  // ioredis pipeline costs more to set up than it saves for one command). With auto-pipelining (the
  // dispatcher's connection, whose fan-out writes `$send` events; tests) a lone command waits for the
  // previous batch's replies first.
  let replies: [Error | null, unknown][];
  try {
    if (calls.length === 1 && !redis.options.enableAutoPipelining) {
      const answer = callScript<unknown>(redis, 'ingestEvents', calls[0]!.keys, calls[0]!.args);
      sent();
      replies = [await answer.then((r) => [null, r] as [null, unknown], (err: Error) => [err, null] as [Error, null])];
    } else {
      const pipeline = redis.pipeline();
      for (const call of calls) callScript(pipeline, 'ingestEvents', call.keys, call.args);
      const answer = pipeline.exec();
      sent();
      replies = ((await answer) ?? []) as [Error | null, unknown][];
    }
  } finally {
    calls.forEach((call) => counted(call, -1));
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
      if (tenantMaxBacklog !== undefined) q.tenants.keep(`${tenantId}|${call.p}`, pending, tenantMaxBacklog);
      if (subscriberMaxBacklog !== undefined) {
        // a subscriber the call accepted an event of and does not name is under the report threshold
        // (KEEP_BACKLOG of the limit); one it only found duplicates of was not looked at
        const named = new Map<string, number>();
        for (let h = 0; h < hot.length; h += 2) named.set(String(hot[h]), Number(hot[h + 1]));
        call.slots.forEach(({ request, index }, k) => {
          const { externalId } = requests[request]!.events[index]!;
          if ((items[k] as ScriptItem)[0] === 1 || named.has(externalId)) q.subscribers.keep(`${tenantId}|${externalId}`, named.get(externalId) ?? 0, subscriberMaxBacklog);
        });
      }
    }
    const problem = err ?? (items[0] === -1 ? processingBehind() : null);
    if (problem) {
      for (const { request } of call.slots) if (!failed.has(request)) failed.set(request, problem);
      return;
    }
    call.slots.forEach(({ request, index }, k) => {
      const item = items[k] as ScriptItem;
      const e = requests[request]!.events[index]!;
      const stored = (sequence: number, status: 'accepted' | 'gone'): IngestedEvent => ({
        id: ids[request]![index]!.event, sequence, externalId: e.externalId, name: e.name, source: e.source,
        timestamp: e.timestampMs === null ? receivedIso : isoNow(e.timestampMs), receivedAt: receivedIso, data: e.value ?? JSON.parse(e.data),
        provider: e.provider, runId: e.runId, messageId: e.messageId, step: e.step, status,
      });
      out[request]![index] = item[0] === 2 ? { ...fromOriginal(e.externalId, item[1]), status: 'duplicate' } : item[0] === 4 ? stored(0, 'gone') : stored(item[1], 'accepted');
    });
  });
  requests.forEach((r, i) => (failed.has(i) ? r.fail(failed.get(i)) : r.done(out[i]!)));
}
