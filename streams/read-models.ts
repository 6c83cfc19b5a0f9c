import type { Redis } from 'ioredis';
import { isoNow, now } from '../lib/clock.js';
import type { EventSource } from '../lib/event-names.js';
import type { StoredEvent } from './ingest.js';
import type { Keys } from './keys.js';

/**
 * Reads of the read models the subscriber actors keep per partition. A subscriber lives in one
 * partition, so tenant-wide figures are sums over partitions (distinct-subscriber counts too).
 */
const HOUR = 3_600_000;
const DAY = 86_400_000;
const SCAN_CHUNK = 200;
const SCAN_BUDGET = 2_000;

export function eventFromLog(fields: string[]): StoredEvent {
  const f: Record<string, string> = {};
  for (let i = 0; i < fields.length; i += 2) f[fields[i]!] = fields[i + 1]!;
  return {
    id: f.id!, sequence: Number(f.q), externalId: f.x!, name: f.n!, source: f.o as EventSource,
    timestamp: isoNow(Number(f.ts)), receivedAt: isoNow(Number(f.r)), data: JSON.parse(f.d || '{}'),
    runId: f.ru || null, messageId: f.m || null, step: f.st || null,
  };
}

type Position = { id: string; p: number };
export type LogFilter = { name?: string; source?: string; provider?: string; afterMs?: number };

/** Compares two stream ids (`ms-seq`). */
function compareIds(a: string, b: string): number {
  const [am, as] = a.split('-').map(Number) as [number, number];
  const [bm, bs] = b.split('-').map(Number) as [number, number];
  return am - bm || as - bs;
}
const before = (a: Position, b: Position) => compareIds(a.id, b.id) < 0 || (a.id === b.id && a.p < b.p);

/**
 * One page of a tenant's newest events across partitions, by keyset `(log id, partition)`.
 * Filters scan at most SCAN_BUDGET entries per partition per page: a page may then hold fewer
 * items than asked, with `hasMore` and a cursor where the scan stopped.
 */
export async function tenantEventsPage(
  redis: Redis, keys: Keys, partitions: number, tenantId: string, limit: number, after: Position | null, filter: LogFilter,
): Promise<{ items: StoredEvent[]; next: Position | null }> {
  const matches = (e: StoredEvent) => (!filter.name || e.name === filter.name) && (!filter.source || e.source === filter.source) && !filter.provider;
  const minId = filter.afterMs !== undefined ? `${filter.afterMs + 1}-0` : '-';
  const found: { pos: Position; event: StoredEvent }[] = [];
  let floor: Position | null = null; // where an unfinished scan stopped: nothing below it is known
  await Promise.all(Array.from({ length: partitions }, async (_, p) => {
    const key = keys.tenantLog(p, tenantId);
    let upper = after ? (p < after.p ? after.id : `(${after.id}`) : '+';
    let scanned = 0;
    let kept = 0;
    for (;;) {
      const chunk = (await redis.xrevrange(key, upper, minId, 'COUNT', SCAN_CHUNK)) as [string, string[]][];
      for (const [id, fields] of chunk) {
        const event = eventFromLog(fields);
        if (matches(event)) {
          found.push({ pos: { id, p }, event });
          kept++;
        }
      }
      scanned += chunk.length;
      if (chunk.length < SCAN_CHUNK || kept > limit) return;
      upper = `(${chunk[chunk.length - 1]![0]}`;
      if (scanned >= SCAN_BUDGET) {
        const stop = { id: chunk[chunk.length - 1]![0], p };
        if (!floor || before(floor, stop)) floor = stop;
        return;
      }
    }
  }));
  found.sort((a, b) => (before(a.pos, b.pos) ? 1 : before(b.pos, a.pos) ? -1 : 0));
  const visible = floor ? found.filter((f) => !before(f.pos, floor!)) : found;
  const page = visible.slice(0, limit);
  const more = visible.length > limit || floor !== null;
  const last = page[page.length - 1];
  return { items: page.map((f) => f.event), next: more ? (last && visible.length > limit ? last.pos : (floor ?? last?.pos ?? null)) : null };
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
  replies.forEach(([err, reply]) => {
    const entries = reply as [string, string[]][] | undefined;
    if (!err && entries?.[0]) items.push(eventFromLog(entries[0][1]));
  });
  return { items, next: ids.length > limit ? pageIds[pageIds.length - 1]!.seq : null };
}

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

const hourStart = (ms: number) => ms - (ms % HOUR);
const dayStart = (ms: number) => ms - (ms % DAY);

/** Hour buckets of the last 24 hours (this hour included), oldest first. */
function lastHours(count: number): number[] {
  const h = hourStart(now());
  return Array.from({ length: count }, (_, i) => h - (count - 1 - i) * HOUR);
}
/** Day buckets of the last `count` days (today included), oldest first. */
function lastDays(count: number): number[] {
  const d = dayStart(now());
  return Array.from({ length: count }, (_, i) => d - (count - 1 - i) * DAY);
}

/**
 * The tenant's catalog: one entry per event name seen, with counts over 24 hours (hourly buckets)
 * and 7 and 30 days (daily buckets, today included), all time, distinct subscribers over 7 days,
 * sources, providers, first and last timestamps. `only` restricts it to one name.
 */
export async function readCatalog(redis: Redis, keys: Keys, partitions: number, tenantId: string, only?: string): Promise<CatalogEntry[]> {
  const hours = lastHours(24);
  const days = lastDays(30);
  const entries = new Map<string, CatalogEntry & { first: number; last: number }>();
  const entry = (name: string) => {
    let e = entries.get(name);
    if (!e) {
      e = { name, counts: { last24h: 0, last7d: 0, last30d: 0, allTime: 0 }, subscribers7d: 0, sources: [], providers: [], firstAt: '', lastAt: '', first: Infinity, last: 0 };
      entries.set(name, e);
    }
    return e;
  };
  await Promise.all(Array.from({ length: partitions }, async (_, p) => {
    const cat = await redis.hgetall(keys.catalog(p, tenantId));
    const names = new Set<string>();
    for (const [field, value] of Object.entries(cat)) {
      const bar = field.indexOf('|');
      const name = field.slice(0, bar);
      if (only !== undefined && name !== only) continue;
      const what = field.slice(bar + 1);
      const e = entry(name);
      names.add(name);
      if (what === 'all') e.counts.allTime += Number(value);
      else if (what === 'first') e.first = Math.min(e.first, Number(value));
      else if (what === 'last') e.last = Math.max(e.last, Number(value));
      else if (what.startsWith('src:') && !e.sources.includes(what.slice(4))) e.sources.push(what.slice(4));
      else if (what.startsWith('prv:') && !e.providers.includes(what.slice(4))) e.providers.push(what.slice(4));
    }
    if (names.size === 0) return;
    const list = [...names];
    const pipeline = redis.pipeline();
    for (const h of hours) pipeline.hmget(keys.volume(p, tenantId, 'h', h), ...list);
    for (const d of days) pipeline.hmget(keys.volume(p, tenantId, 'd', d), ...list);
    for (const name of list) pipeline.pfcount(...days.slice(-7).map((d) => keys.uniques(p, tenantId, 'd', d, name)));
    const replies = (await pipeline.exec()) ?? [];
    let r = 0;
    for (let i = 0; i < hours.length; i++, r++) {
      (replies[r]![1] as (string | null)[]).forEach((v, k) => (entry(list[k]!).counts.last24h += Number(v ?? 0)));
    }
    for (let i = 0; i < days.length; i++, r++) {
      (replies[r]![1] as (string | null)[]).forEach((v, k) => {
        const e = entry(list[k]!);
        e.counts.last30d += Number(v ?? 0);
        if (i >= days.length - 7) e.counts.last7d += Number(v ?? 0);
      });
    }
    for (const name of list) entry(name).subscribers7d += Number(replies[r++]![1]);
  }));
  return [...entries.values()]
    .map(({ first, last, ...e }) => ({ ...e, sources: e.sources.sort(), providers: e.providers.sort(), firstAt: isoNow(first), lastAt: isoNow(last) }))
    .sort((a, b) => b.counts.last7d - a.counts.last7d || b.counts.allTime - a.counts.allTime || (a.name < b.name ? -1 : 1));
}

export type VolumeBucket = { start: string; count: number; subscribers: number };
export type VolumeRange = '24h' | '7d' | '30d';

/** Event counts and distinct subscribers per hour (`24h`) or per day (`7d`, `30d`), oldest first, empty buckets omitted. */
export async function readVolume(redis: Redis, keys: Keys, partitions: number, tenantId: string, range: VolumeRange, name?: string): Promise<{ unit: 'hour' | 'day'; buckets: VolumeBucket[] }> {
  const unit = range === '24h' ? 'h' : 'd';
  const starts = range === '24h' ? lastHours(24) : lastDays(range === '7d' ? 7 : 30);
  const field = name ?? '*';
  const counts = starts.map(() => 0);
  const uniques = starts.map(() => 0);
  await Promise.all(Array.from({ length: partitions }, async (_, p) => {
    const pipeline = redis.pipeline();
    for (const s of starts) pipeline.hget(keys.volume(p, tenantId, unit, s), field);
    for (const s of starts) pipeline.pfcount(keys.uniques(p, tenantId, unit, s, field));
    const replies = (await pipeline.exec()) ?? [];
    starts.forEach((_, i) => {
      counts[i]! += Number(replies[i]![1] ?? 0);
      uniques[i]! += Number(replies[starts.length + i]![1] ?? 0);
    });
  }));
  const buckets = starts.map((s, i) => ({ start: isoNow(s), count: counts[i]!, subscribers: uniques[i]! })).filter((b) => b.count > 0);
  return { unit: unit === 'h' ? 'hour' : 'day', buckets };
}

/** The newest `limit` events of a name, across partitions. */
export async function readSamples(redis: Redis, keys: Keys, partitions: number, tenantId: string, name: string, limit = 20): Promise<StoredEvent[]> {
  const all: { id: string; event: StoredEvent }[] = [];
  await Promise.all(Array.from({ length: partitions }, async (_, p) => {
    const ids = await redis.lrange(keys.samples(p, tenantId, name), 0, limit - 1);
    if (!ids.length) return;
    const pipeline = redis.pipeline();
    for (const id of ids) pipeline.xrange(keys.tenantLog(p, tenantId), id, id);
    for (const [err, reply] of (await pipeline.exec()) ?? []) {
      const entries = reply as [string, string[]][] | undefined;
      if (!err && entries?.[0]) all.push({ id: entries[0][0], event: eventFromLog(entries[0][1]) });
    }
  }));
  return all.sort((a, b) => compareIds(b.id, a.id)).slice(0, limit).map((a) => a.event);
}
