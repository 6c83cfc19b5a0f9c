/**
 * Time-bucketed per-subscriber event counters, as pure helpers over the fields of one Redis hash.
 *
 * A counter of condition key `k` (see `conditionKey` in `lib/expressions.ts`) is a set of fields:
 * `k|<bucketStartMs>` → count for a windowed condition, `k|all` → count for an all-time one, and
 * `k|init` once the counter was seeded from the subscriber's timeline. An event at `ts` lands in
 * the bucket starting at `floor(ts / width) * width`. A bucket counts toward a window of `within`
 * at `now` while `bucketStart + width > now - within`: a bucket is counted whole while any part of
 * it is inside the window, so an event leaves the count at most one bucket width after its exact
 * expiry (never before it). Events dated after `now` count too, in their own bucket.
 */

/** The bucket widths a window may get, smallest first: 1m, 5m, 15m, 1h, 6h, 1d. */
export const BUCKET_WIDTHS_MS = [60_000, 300_000, 900_000, 3_600_000, 21_600_000, 86_400_000] as const;

/** A window is covered by at least this many buckets (except windows under 48 minutes, which get 1m buckets). */
export const MIN_BUCKETS_PER_WINDOW = 48;

/**
 * The bucket width of a window: the largest of `BUCKET_WIDTHS_MS` that is at most a 48th of it,
 * at least 1m. 0 for an all-time counter (`withinMs` null).
 */
export function bucketWidthMs(withinMs: number | null): number {
  if (withinMs === null) return 0;
  let width: number = BUCKET_WIDTHS_MS[0];
  for (const w of BUCKET_WIDTHS_MS) if (w * MIN_BUCKETS_PER_WINDOW <= withinMs) width = w;
  return width;
}

/** The field an event at `tsMs` increments: `<key>|<bucketStartMs>`, or `<key>|all` without a window. */
export function counterField(key: string, withinMs: number | null, tsMs: number): string {
  const width = bucketWidthMs(withinMs);
  return width === 0 ? `${key}|all` : `${key}|${Math.floor(tsMs / width) * width}`;
}

/** The field marking that `key`'s counter was seeded: `<key>|init`. */
export function initField(key: string): string {
  return `${key}|init`;
}

/**
 * The value of `<key>|init`: the window (ms) whose buckets the counter keeps, `all` for an all-time
 * counter, then `@` and the definitions version it was seeded under. Conditions whose windows share a
 * bucket width share the key, and the counter is pruned to the longest of them that is kept: a
 * longer window (a segment created later, an inline `to.where`, a branch of an old version) must not
 * be answered from it. A condition that stopped being kept and is kept again must not be answered
 * from a counter seeded before the break (no event was counted meanwhile): the version tells.
 * A mark written before versions were recorded has none (read as 0).
 */
export function initValue(withinMs: number | null, seededVersion: number): string {
  return `${withinMs === null ? 'all' : String(withinMs)}@${seededVersion}`;
}

/** An `<key>|init` value read back: its window (null: all time) and the version it was seeded under. */
export function parseInit(value: string): { withinMs: number | null; seededVersion: number } {
  const at = value.indexOf('@');
  const window = at < 0 ? value : value.slice(0, at);
  return { withinMs: window === 'all' ? null : Number(window), seededVersion: at < 0 ? 0 : Number(value.slice(at + 1)) || 0 };
}

type Bucket = { start: number; count: number };
type Counter = { init: string | undefined; all: string | undefined; buckets: Map<string, Bucket>; other: string[] };

/**
 * One subscriber's counters (the `<key>|…` fields of its automation hash), indexed by condition key
 * once when loaded, so each question about a key looks at that key's buckets only, not at every
 * field of the hash. Changes made through it (`increment`, `setInit`, `remove`) keep the index true;
 * the caller writes the same changes to Redis.
 */
export class Counters {
  private readonly byKey = new Map<string, Counter>();

  constructor(fields: Record<string, string> = {}) {
    for (const field in fields) this.put(field, fields[field]!);
  }

  private counter(key: string): Counter {
    let c = this.byKey.get(key);
    if (!c) this.byKey.set(key, (c = { init: undefined, all: undefined, buckets: new Map(), other: [] }));
    return c;
  }

  private put(field: string, value: string): void {
    const bar = field.indexOf('|');
    if (bar <= 0) return;
    const c = this.counter(field.slice(0, bar));
    const rest = field.slice(bar + 1);
    if (rest === 'init') c.init = value;
    else if (rest === 'all') c.all = value;
    else {
      const code = rest.charCodeAt(0);
      // bucket starts are integers (a minus sign only before 1970)
      const start = code === 45 || (code >= 48 && code <= 57) ? Number(rest) : NaN;
      if (Number.isInteger(start)) c.buckets.set(field, { start, count: Number(value) || 0 });
      else c.other.push(field);
    }
  }

  /** The condition keys with any field. */
  keys(): string[] {
    return [...this.byKey.keys()];
  }

  /** What `<key>|init` says (`parseInit`), when seeded. */
  initOf(key: string): ReturnType<typeof parseInit> | undefined {
    const init = this.byKey.get(key)?.init;
    return init ? parseInit(init) : undefined;
  }

  /**
   * True when `key`'s counter was seeded, still keeps every bucket a window of `withinMs` counts, and
   * was seeded at or after `keptSince`, the definitions version from which its condition has been
   * kept without a break (`KeptCondition.since`).
   */
  covers(key: string, withinMs: number | null, keptSince: number): boolean {
    const init = this.initOf(key);
    if (!init || init.seededVersion < keptSince) return false;
    return withinMs === null || (init.withinMs !== null && init.withinMs >= withinMs);
  }

  /** Every count field of `key` (its buckets, or `all`), not its `init` mark. */
  countFields(key: string): string[] {
    const c = this.byKey.get(key);
    if (!c) return [];
    const out = [...c.buckets.keys(), ...c.other];
    if (c.all !== undefined) out.push(`${key}|all`);
    return out;
  }

  /** Every field of `key`, its `init` mark included. */
  fieldsOf(key: string): string[] {
    const out = this.countFields(key);
    if (this.byKey.get(key)?.init !== undefined) out.push(initField(key));
    return out;
  }

  /** Adds `by` to the field an event at `tsMs` counts in (`counterField`); returns that field. */
  increment(key: string, withinMs: number | null, tsMs: number, by = 1): string {
    const field = counterField(key, withinMs, tsMs);
    const c = this.counter(key);
    if (withinMs === null) c.all = String((Number(c.all) || 0) + by);
    else {
      const bucket = c.buckets.get(field);
      if (bucket) bucket.count += by;
      else c.buckets.set(field, { start: Number(field.slice(key.length + 1)), count: by });
    }
    return field;
  }

  /** Marks `key` seeded for `withinMs` under definitions version `seededVersion` (`<key>|init`); returns the field and its value. */
  setInit(key: string, withinMs: number | null, seededVersion: number): [string, string] {
    const value = initValue(withinMs, seededVersion);
    this.counter(key).init = value;
    return [initField(key), value];
  }

  /** Forgets one field (deleted from Redis by the caller). */
  remove(field: string): void {
    const bar = field.indexOf('|');
    const c = this.byKey.get(field.slice(0, bar));
    if (!c) return;
    const rest = field.slice(bar + 1);
    if (rest === 'init') c.init = undefined;
    else if (rest === 'all') c.all = undefined;
    else if (!c.buckets.delete(field)) c.other = c.other.filter((f) => f !== field);
    if (c.init === undefined && c.all === undefined && c.buckets.size === 0 && c.other.length === 0) this.byKey.delete(field.slice(0, bar));
  }

  /** The count of `key` in its window at `nowMs` (bucket precision, see the module comment). */
  countInWindow(key: string, withinMs: number | null, nowMs: number): number {
    const c = this.byKey.get(key);
    if (!c) return 0;
    if (withinMs === null) return Number(c.all) || 0;
    const width = bucketWidthMs(withinMs);
    const horizon = nowMs - withinMs;
    let n = 0;
    for (const b of c.buckets.values()) if (b.start + width > horizon) n += b.count;
    return n;
  }

  /**
   * The earliest time after `nowMs` at which a counted, non-empty bucket of `key` leaves the window
   * (so the count may drop), or null when nothing can expire (all-time, or no counted bucket).
   * A bucket starting at `s` leaves at `s + width + within`.
   */
  nextExpiry(key: string, withinMs: number | null, nowMs: number): number | null {
    const c = this.byKey.get(key);
    if (withinMs === null || !c) return null;
    const width = bucketWidthMs(withinMs);
    const horizon = nowMs - withinMs;
    let next: number | null = null;
    for (const b of c.buckets.values()) {
      if (b.count <= 0 || b.start + width <= horizon) continue;
      const at = b.start + width + withinMs;
      if (next === null || at < next) next = at;
    }
    return next;
  }

  /**
   * The bucket fields of `key` that left the window at `nowMs`, to delete. Conditions whose windows
   * share a bucket width share a key: pass the longest of their windows so no field another one
   * still counts is deleted.
   */
  expiredFields(key: string, withinMs: number | null, nowMs: number): string[] {
    const c = this.byKey.get(key);
    if (withinMs === null || !c) return [];
    const width = bucketWidthMs(withinMs);
    const horizon = nowMs - withinMs;
    const out: string[] = [];
    for (const [field, b] of c.buckets) if (b.start + width <= horizon) out.push(field);
    return out;
  }
}
