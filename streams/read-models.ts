import type { Redis } from 'ioredis';
import { isoNow, now } from '../lib/clock.js';
import { EVENT_SOURCES, type EventSource } from '../lib/event-names.js';
import type { StoredEvent } from './ingest.js';
import type { Keys } from './keys.js';
import { recordOf } from '../lib/field-list.js';
import { firstInOrder } from '../lib/first-in-order.js';

/**
 * Reads of the read models the subscriber actors keep per partition. A subscriber lives in one
 * partition, so tenant-wide figures are sums over partitions (distinct-subscriber counts too).
 */
const HOUR = 3_600_000;
const DAY = 86_400_000;
/** Largest chunk a partition's tenant log is read in. */
const SCAN_CHUNK = 200;
/** The first chunk of a filtered page's read, per partition (doubled each round up to SCAN_CHUNK). */
const FIRST_FILTERED_CHUNK = 50;
/**
 * Log entries one page reads across partitions before it stops (plus at most one round's chunks):
 * reading and decoding them is ~20 µs each in the web process, so about 160 ms at most.
 */
const PAGE_SCAN_BUDGET = 8_000;
/**
 * Entries read to finish the millisecond a partition's read stopped in: more than a millisecond of
 * a tenant log holds (lua/applyEvents moves the 1,001st entry to the next millisecond; logs written
 * before session 57 may hold more, when a write stamped ahead piled entries onto one millisecond).
 */
const MS_FINISH_BUDGET = 2_000;
/** Rounds of one page's read: more than the budget lets happen (a chunk doubles up to SCAN_CHUNK). */
const MAX_PAGE_ROUNDS = 200;
/** HSCAN rounds (of COUNT 1,000) over one partition's catalog hash: 100 million fields */
const HSCAN_ROUNDS = 100_000;

export function eventFromLog(fields: string[]): StoredEvent {
  return eventOfRecord(recordOf(fields));
}

function eventOfRecord(f: Record<string, string>): StoredEvent {
  return {
    id: f.id!, sequence: Number(f.q), externalId: f.x!, name: f.n!, source: f.o as EventSource,
    timestamp: isoNow(Number(f.ts)), receivedAt: isoNow(Number(f.r)), data: JSON.parse(f.d || '{}'),
    provider: f.pv || null, runId: f.ru || null, messageId: f.m || null, step: f.st || null,
  };
}

export type LogFilter = { name?: string; source?: string; provider?: string; afterMs?: number };

/**
 * Where an event sits in the tenant's newest-first order: the millisecond of its log id
 * (receivedAt), then its `evt_` id. Ids are made in input order, so the events of one request,
 * spread over many partitions, list in reverse input order; the partition plays no part.
 */
export type LogPosition = { ms: number; id: string };
const msOf = (logId: string) => Number(logId.slice(0, logId.indexOf('-')));
/** True when `a` is older than `b`. */
const older = (a: LogPosition, b: LogPosition) => a.ms < b.ms || (a.ms === b.ms && a.id < b.id);

/**
 * One page of a tenant's newest events across partitions, by keyset `(ms, evt id)`, read in rounds
 * (a threshold merge): each round reads a chunk from every partition that can still hold an entry
 * of the page, doubling the chunk up to SCAN_CHUNK. A partition is read to the end of the
 * millisecond it stops in, so what it leaves unread is older than all it read; once `limit + 1`
 * matches are in hand, a partition whose unread part is older than the `limit + 1`-th newest of
 * them is done. So a page reads about what its items need, not `limit + 1` entries (or a scan
 * budget) from every partition: at 64 partitions an unfiltered page of 100 read 6,464 entries, a
 * filtered one up to 128,000, and one reader paging a filtered list held ingest on the same web
 * process up to 2.7 s (probe I2). A page reads at most about PAGE_SCAN_BUDGET entries (plus one
 * round's chunks); a filter that matches little may then leave it with fewer items than asked,
 * with `hasMore` and a cursor where the scan stopped (the newest millisecond a partition still had
 * unread, so nothing is skipped). `scanned`: the log entries it read.
 */
export async function tenantEventsPage(
  redis: Redis, keys: Keys, partitions: number, tenantId: string, limit: number, after: LogPosition | null, filter: LogFilter,
): Promise<{ items: StoredEvent[]; next: LogPosition | null; scanned: number }> {
  // `after` is on receivedAt: log ids never go below their stream's last id, so one written by another
  // web process a few ms later in the same partition can carry a later millisecond than its receivedAt
  const afterMs = filter.afterMs;
  // on the log entry's fields: an entry is decoded whole (its data parsed) only when it is on the page
  const matches = (f: Record<string, string>) => (!filter.name || f.n === filter.name) && (!filter.source || f.o === filter.source) && (!filter.provider || (f.pv || null) === filter.provider)
    && (afterMs === undefined || Number(f.r) > afterMs);
  const filtered = filter.name !== undefined || filter.source !== undefined || filter.provider !== undefined || afterMs !== undefined;
  // a time before 1970 (a negative millisecond, which is no stream id) keeps every event
  const minId = filter.afterMs !== undefined && filter.afterMs >= 0 ? `${filter.afterMs + 1}-0` : '-';
  const want = limit + 1;
  /** the matches read so far; at each round's start, the newest `want` of them, newest first */
  const found: { pos: LogPosition; record: Record<string, string> }[] = [];
  let scanned = 0;
  const take = (chunk: [string, string[]][]) => {
    for (const [logId, fields] of chunk) {
      const record = recordOf(fields);
      const pos = { ms: msOf(logId), id: record.id! };
      if (after && !older(pos, after)) continue;
      if (matches(record)) found.push({ pos, record });
    }
    scanned += chunk.length;
  };
  // per partition: the next read's upper bound, and the millisecond its reads stopped at (all it left unread is older)
  const parts = Array.from({ length: partitions }, (_, p) => ({
    key: keys.tenantLog(p, tenantId), upper: after ? String(after.ms) : '+', lastMs: Infinity, done: false,
  }));
  const readChunk = async (part: (typeof parts)[number], count: number) => {
    const chunk = (await redis.xrevrange(part.key, part.upper, minId, 'COUNT', count)) as [string, string[]][];
    take(chunk);
    if (chunk.length < count) {
      part.done = true;
      return;
    }
    const ms = msOf(chunk[chunk.length - 1]![0]);
    part.upper = `(${chunk[chunk.length - 1]![0]}`;
    // the rest of that millisecond (bounded by what one millisecond holds)
    for (let rest = MS_FINISH_BUDGET; rest > 0; rest -= SCAN_CHUNK) {
      const more = (await redis.xrevrange(part.key, part.upper, `${ms}-0`, 'COUNT', SCAN_CHUNK)) as [string, string[]][];
      take(more);
      if (more.length) part.upper = `(${more[more.length - 1]![0]}`;
      if (more.length < SCAN_CHUNK) break;
    }
    part.lastMs = ms;
  };
  const newestFirst = (a: { pos: LogPosition }, b: { pos: LogPosition }) => (older(a.pos, b.pos) ? 1 : older(b.pos, a.pos) ? -1 : 0);
  // without a filter every entry read is kept: a first chunk of about twice a partition's share of the page
  let count = filtered ? FIRST_FILTERED_CHUNK : Math.min(SCAN_CHUNK, Math.ceil((2 * want) / partitions) + 2);
  let floor: LogPosition | null = null; // where an unfinished scan stopped: nothing older is known
  for (let round = 0; round < MAX_PAGE_ROUNDS; round++) {
    found.sort(newestFirst);
    if (found.length > want) found.length = want;
    const threshold = found.length === want ? found[want - 1]!.pos : null;
    // a partition whose unread entries (all older than its lastMs) could still beat the threshold
    const open = parts.filter((part) => !part.done && (threshold === null || part.lastMs > threshold.ms));
    if (open.length === 0) break;
    if (scanned >= PAGE_SCAN_BUDGET || round === MAX_PAGE_ROUNDS - 1) {
      const stop = Math.max(...open.map((part) => part.lastMs));
      floor = { ms: stop, id: '' };
      break;
    }
    await Promise.all(open.map((part) => readChunk(part, count)));
    count = Math.min(SCAN_CHUNK, count * 2);
  }
  found.sort(newestFirst);
  const visible = floor ? found.filter((f) => !older(f.pos, floor!)) : found;
  const page = visible.slice(0, limit);
  const more = visible.length > limit || floor !== null;
  const last = page[page.length - 1];
  return { items: page.map((f) => eventOfRecord(f.record)), next: more ? (last && visible.length > limit ? last.pos : (floor ?? last?.pos ?? null)) : null, scanned };
}

/** One page of a subscriber's timeline, newest first, keyset by sequence. */
export async function timelinePage(redis: Redis, keys: Keys, p: number, tenantId: string, externalId: string, limit: number, beforeSequence: number | null): Promise<{ items: StoredEvent[]; next: number | null }> {
  const max = beforeSequence === null ? '+inf' : `(${beforeSequence}`;
  const raw = (await redis.zrevrangebyscore(keys.timeline(p, tenantId, externalId), max, '-inf', 'WITHSCORES', 'LIMIT', 0, limit + 1)) as string[];
  const ids: { logId: string; seq: number }[] = [];
  for (let i = 0; i < raw.length; i += 2) ids.push({ logId: raw[i]!, seq: Number(raw[i + 1]) });
  const pageIds = ids.slice(0, limit);
  const pipeline = redis.pipeline();
  for (const { logId } of pageIds) pipeline.xrange(keys.tenantLog(p, tenantId), logId, logId);
  const replies = (await pipeline.exec()) ?? [];
  const items: StoredEvent[] = [];
  // A member whose log entry is gone was trimmed by retention, and so was every older one (log ids
  // rise with sequence): the timeline ends there. Paging on walked members the write side had not
  // yet trimmed, page after empty page with hasMore (probe BK: 8 of them).
  let trimmed = false;
  // a failed read is the request's error (503 when Redis is unreachable), never a shorter page (probe DP)
  for (const [err] of replies) if (err) throw err;
  for (const [, reply] of replies) {
    const entries = reply as [string, string[]][] | undefined;
    if (!entries?.[0]) {
      trimmed = true;
      break;
    }
    items.push(eventFromLog(entries[0][1]));
  }
  return { items, next: !trimmed && ids.length > limit ? pageIds[pageIds.length - 1]!.seq : null };
}

/** What the catalog's order needs of an entry, and what a catalog cursor holds: a page is picked from entries of this shape. */
export type CatalogOrdered = { name: string; counts: { last7d: number; allTime: number } };
export type CatalogCounts = { last24h: number; last7d: number; last30d: number; allTime: number };
export type CatalogEntry = {
  name: string;
  counts: CatalogCounts;
  subscribers7d: number;
  sources: string[];
  providers: string[];
  firstAt: string;
  lastAt: string;
};

const dayStart = (ms: number) => ms - (ms % DAY);
/** Timestamps may be up to an hour ahead (spec Part 8): every window reaches to the bucket of now + 1 hour. */
const AHEAD = HOUR;

/** Starts of the `size` buckets from the one holding `fromMs` to the one holding now + 1 hour, oldest first. */
function bucketsSince(fromMs: number, size: number): number[] {
  const first = fromMs - (fromMs % size);
  const last = now() + AHEAD;
  const starts: number[] = [];
  for (let b = first; b <= last; b += size) starts.push(b);
  return starts;
}

/**
 * A rolling window of `days` days as buckets: the hours of its oldest, partial day (from the hour
 * holding now − `days`), then whole days up to tomorrow's when now + 1 hour reaches it.
 */
function windowOf(days: number): { hours: number[]; days: number[] } {
  const from = now() - days * DAY;
  const firstWholeDay = dayStart(from) + DAY;
  return { hours: bucketsSince(from, HOUR).filter((h) => h < firstWholeDay), days: bucketsSince(firstWholeDay, DAY) };
}

/**
 * The tenant's catalog: one entry per event name seen, with counts over rolling windows of 24
 * hours, 7 and 30 days (by the event's timestamp; each window starts at the hour holding its
 * start, so it is exact to the hour and reaches the future hour timestamps may name), all time,
 * distinct subscribers over 7 days (by day: the window's oldest day is counted whole), sources,
 * providers, first and last timestamps. `only` restricts it to those names (the ones seen).
 *
 * `page` asks for the `limit` entries that follow `after` in catalog order (all of them without
 * it), and `hasMore` says whether others follow. The order needs only the 7-day and all-time
 * counts, so every name gets just those: the `|all` fields of
 * the catalog hashes (HSCAN MATCH, so the other fields stay in Redis) and the week's volume buckets
 * read whole (a bucket holds only the names counted in it, so the reply is as large as the week's
 * data, not names × buckets). The 24-hour and 30-day counts, `subscribers7d` (one PFCOUNT per name
 * and partition), first and last times, sources and providers are read for the page's entries
 * only, and only the page is sorted (`firstInOrder`). A page of 50 of 60,000 names over 64
 * partitions, each name counted once this week, took ~3 s of the web's event loop when every name
 * was read with HMGET from every bucket, the catalog hashes whole, and every entry sorted
 * (docs/events.md gives the figure since).
 *
 * `page.keepOrder`: when the entries from the page on (the page included) are at most that many
 * and more than the page, all of them are sorted and the names after the page come back as `rest`,
 * in order (what streams/catalog-order.ts keeps for the next pages of the walk).
 */
export async function readCatalog(
  redis: Redis, keys: Keys, partitions: number, tenantId: string,
  options: { only?: readonly string[]; page?: { after: CatalogOrdered | null; limit: number; keepOrder?: number } } = {},
): Promise<{ items: CatalogEntry[]; hasMore: boolean; rest?: string[] }> {
  const { only, page } = options;
  const day = bucketsSince(now() - DAY, HOUR);
  const week = windowOf(7);
  const month = windowOf(30);
  const weekUniques = bucketsSince(now() - 7 * DAY, DAY);
  // the week's buckets (for the order), then the day's and the month's (for the picked entries)
  const weekBuckets: Bucket[] = [...week.hours.map((h) => ({ unit: 'h' as const, start: h, windows: ['last7d' as const] })), ...week.days.map((d) => ({ unit: 'd' as const, start: d, windows: ['last7d' as const] }))];
  const otherBuckets: Bucket[] = [
    ...[...new Set([...day, ...month.hours])].map((h) => ({
      unit: 'h' as const, start: h,
      windows: [...(day.includes(h) ? ['last24h' as const] : []), ...(month.hours.includes(h) ? ['last30d' as const] : [])],
    })),
    ...month.days.map((d) => ({ unit: 'd' as const, start: d, windows: ['last30d' as const] })),
  ];
  /** per name: its counts, and the partitions its catalog fields are in (where its other counts are read) */
  const entries = new Map<string, CatalogOrdered & { counts: CatalogCounts; partitions: Set<number> }>();
  /**
   * Adds the counts of `buckets` in partition `p` to the entries of `names`, or, without `names`,
   * of every name of the partition: then each bucket is read whole (its fields are the names
   * counted in it, and `*`, which is no name).
   */
  const addCounts = async (p: number, buckets: Bucket[], names?: string[]) => {
    const pipeline = redis.pipeline();
    for (const { unit, start } of buckets) {
      if (names) pipeline.hmget(keys.volume(p, tenantId, unit, start), ...names);
      else pipeline.hgetall(keys.volume(p, tenantId, unit, start));
    }
    const replies = (await pipeline.exec()) ?? [];
    const add = (windows: Bucket['windows'], name: string, value: string | null) => {
      const e = value === null ? undefined : entries.get(name);
      if (e?.partitions.has(p)) for (const w of windows) e.counts[w] += Number(value);
    };
    buckets.forEach(({ windows }, b) => {
      const [err, reply] = replies[b]!;
      if (err) throw err;
      if (names) (reply as (string | null)[]).forEach((v, k) => add(windows, names[k]!, v));
      else for (const [name, v] of Object.entries(reply as Record<string, string>)) add(windows, name, v);
    });
  };
  await Promise.all(Array.from({ length: partitions }, async (_, p) => {
    const key = keys.catalog(p, tenantId);
    const all = only === undefined ? await scanFields(redis, key, '*|all') : await allTimeOf(redis, key, only);
    let seen = 0;
    for (let i = 0; i < all.length; i += 2) {
      if (all[i + 1] === null) continue;
      const name = all[i]!.slice(0, -'|all'.length);
      let e = entries.get(name);
      if (!e) {
        e = { name, counts: { last24h: 0, last7d: 0, last30d: 0, allTime: 0 }, partitions: new Set() };
        entries.set(name, e);
      }
      if (e.partitions.has(p)) continue; // HSCAN may return a field twice
      e.partitions.add(p);
      e.counts.allTime += Number(all[i + 1]);
      seen++;
    }
    if (seen) await addCounts(p, weekBuckets, only === undefined ? undefined : [...only]);
  }));
  const after = page?.after;
  const rest = after ? [...entries.values()].filter((e) => catalogOrder(after, e) < 0) : [...entries.values()];
  const sortAll = !page || (rest.length > page.limit && rest.length <= (page.keepOrder ?? 0));
  const picked = sortAll ? rest.sort(catalogOrder).slice(0, page?.limit ?? rest.length) : firstInOrder(rest, page.limit, catalogOrder);
  // the picked entries' other counts and fields, per partition they were seen in; a subscriber
  // lives in one partition, so the partitions' distinct counts add up
  const byPartition = new Map<number, string[]>();
  for (const e of picked) {
    for (const p of e.partitions) {
      const names = byPartition.get(p);
      if (names) names.push(e.name);
      else byPartition.set(p, [e.name]);
    }
  }
  const details = new Map(picked.map((e) => [e.name, { subscribers7d: 0, sources: new Set<string>(), providers: new Set<string>(), first: Infinity, last: 0 }]));
  await Promise.all([...byPartition].map(async ([p, names]) => {
    const key = keys.catalog(p, tenantId);
    const reads = redis.pipeline();
    for (const name of names) {
      reads.pfcount(...weekUniques.map((d) => keys.uniques(p, tenantId, 'd', d, name)));
      reads.hmget(key, `${name}|first`, `${name}|last`, ...EVENT_SOURCES.map((o) => `${name}|src:${o}`));
    }
    const [, replies] = await Promise.all([addCounts(p, otherBuckets, names), reads.exec()]);
    await Promise.all(names.map(async (name, i) => {
      const d = details.get(name)!;
      const [[e1, uniques], [e2, fields]] = [replies![2 * i]!, replies![2 * i + 1]!];
      if (e1 || e2) throw e1 ?? e2;
      d.subscribers7d += Number(uniques);
      const [first, last, ...sources] = fields as (string | null)[];
      if (first !== null) d.first = Math.min(d.first, Number(first));
      if (last !== null) d.last = Math.max(d.last, Number(last));
      sources.forEach((v, k) => v !== null && d.sources.add(EVENT_SOURCES[k]!));
      // only events from sources (source `webhook`) name a provider
      if (sources[EVENT_SOURCES.indexOf('webhook')] === null) return;
      const prefix = `${name}|prv:`;
      const found = await scanFields(redis, key, `${globEscape(prefix)}*`);
      for (let k = 0; k < found.length; k += 2) d.providers.add(found[k]!.slice(prefix.length));
    }));
  }));
  const items = picked.map((e) => {
    const d = details.get(e.name)!;
    return {
      // HyperLogLog estimates, summed over partitions, can come out above the events counted (probe
      // EZ: 30,016 subscribers of 30,000 events): never more than there were events at all
      name: e.name, counts: e.counts, subscribers7d: Math.min(d.subscribers7d, e.counts.allTime),
      sources: [...d.sources].sort(), providers: [...d.providers].sort(), firstAt: isoNow(d.first), lastAt: isoNow(d.last),
    };
  });
  return { items, hasMore: rest.length > picked.length, ...(page && sortAll ? { rest: rest.slice(picked.length).map((e) => e.name) } : {}) };
}

/** The all-time counts of `names` in one partition's catalog hash, flat as HSCAN gives them (null for a name not there). */
async function allTimeOf(redis: Redis, key: string, names: readonly string[]): Promise<(string | null)[]> {
  if (names.length === 0) return [];
  const fields = names.map((name) => `${name}|all`);
  const values = await redis.hmget(key, ...fields);
  return fields.flatMap((field, i) => [field, values[i] ?? null]);
}

const globEscape = (text: string) => text.replace(/[*?[\]\\]/g, '\\$&');

/** The fields of hash `key` matching `pattern` and their values, flat (a field may come twice: HSCAN's rule). */
async function scanFields(redis: Redis, key: string, pattern: string): Promise<(string | null)[]> {
  const out: string[] = [];
  let cursor = '0';
  for (let round = 0; round < HSCAN_ROUNDS; round++) {
    const [next, flat] = await redis.hscan(key, cursor, 'MATCH', pattern, 'COUNT', 1_000);
    for (const item of flat) out.push(item);
    cursor = next;
    if (cursor === '0') return out;
  }
  throw new Error(`hash ${key} still unscanned after ${HSCAN_ROUNDS} rounds`);
}

type Bucket = { unit: 'h' | 'd'; start: number; windows: (keyof CatalogCounts)[] };

/** The catalog's order: 7-day count, then all-time count, descending, then name: < 0 when `a` comes before `b`. */
export function catalogOrder(a: CatalogOrdered, b: CatalogOrdered): number {
  return b.counts.last7d - a.counts.last7d || b.counts.allTime - a.counts.allTime || (a.name < b.name ? -1 : a.name > b.name ? 1 : 0);
}

export type VolumeBucket = { start: string; count: number; subscribers: number };
export type VolumeRange = '24h' | '7d' | '30d';

/**
 * Event counts and distinct subscribers per hour (`24h`) or per day (`7d`, `30d`), oldest first,
 * from the bucket holding the range's start to the one holding now + 1 hour (timestamps may be
 * that far ahead), empty buckets omitted.
 */
export async function readVolume(redis: Redis, keys: Keys, partitions: number, tenantId: string, range: VolumeRange, name?: string): Promise<{ unit: 'hour' | 'day'; buckets: VolumeBucket[] }> {
  const unit = range === '24h' ? 'h' : 'd';
  const starts = range === '24h' ? bucketsSince(now() - DAY, HOUR) : bucketsSince(now() - (range === '7d' ? 7 : 30) * DAY, DAY);
  const field = name ?? '*';
  const counts = starts.map(() => 0);
  const uniques = starts.map(() => 0);
  await Promise.all(Array.from({ length: partitions }, async (_, p) => {
    const pipeline = redis.pipeline();
    for (const s of starts) pipeline.hget(keys.volume(p, tenantId, unit, s), field);
    for (const s of starts) pipeline.pfcount(keys.uniques(p, tenantId, unit, s, field));
    const replies = (await pipeline.exec()) ?? [];
    for (const [err] of replies) if (err) throw err; // never a smaller count (probe DP)
    starts.forEach((_, i) => {
      counts[i]! += Number(replies[i]![1] ?? 0);
      uniques[i]! += Number(replies[starts.length + i]![1] ?? 0);
    });
  }));
  // an estimate above the bucket's events is one of the HyperLogLog's errors (probe EZ): never more subscribers than events
  const buckets = starts.map((s, i) => ({ start: isoNow(s), count: counts[i]!, subscribers: Math.min(uniques[i]!, counts[i]!) })).filter((b) => b.count > 0);
  return { unit: unit === 'h' ? 'hour' : 'day', buckets };
}

/** The newest `limit` events of a name, across partitions, in the order of `tenantEventsPage`. */
export async function readSamples(redis: Redis, keys: Keys, partitions: number, tenantId: string, name: string, limit = 20): Promise<StoredEvent[]> {
  const all: { pos: LogPosition; event: StoredEvent }[] = [];
  await Promise.all(Array.from({ length: partitions }, async (_, p) => {
    const ids = await redis.lrange(keys.samples(p, tenantId, name), 0, limit - 1);
    if (!ids.length) return;
    const pipeline = redis.pipeline();
    for (const id of ids) pipeline.xrange(keys.tenantLog(p, tenantId), id, id);
    const replies = (await pipeline.exec()) ?? [];
    for (const [err] of replies) if (err) throw err; // never fewer samples (probe DP)
    for (const [, reply] of replies) {
      const entries = reply as [string, string[]][] | undefined;
      if (entries?.[0]) {
        const event = eventFromLog(entries[0][1]);
        all.push({ pos: { ms: msOf(entries[0][0]), id: event.id }, event });
      }
    }
  }));
  return all.sort((a, b) => (older(a.pos, b.pos) ? 1 : older(b.pos, a.pos) ? -1 : 0)).slice(0, limit).map((a) => a.event);
}
