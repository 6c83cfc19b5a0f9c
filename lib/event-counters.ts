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
 * counter. Conditions whose windows share a bucket width share the key, and the counter is pruned to
 * the longest of them that is kept: a longer window (a segment created later, an inline `to.where`,
 * a branch of an old version) must not be answered from it.
 */
export function initValue(withinMs: number | null): string {
  return withinMs === null ? 'all' : String(withinMs);
}

/** True when `key`'s counter was seeded and still keeps every bucket a window of `withinMs` counts. */
export function covers(fields: Record<string, string>, key: string, withinMs: number | null): boolean {
  const init = fields[initField(key)];
  if (!init) return false;
  return withinMs === null || Number(init) >= withinMs;
}

/** Every count field of `key` (its buckets, or `all`), not its `init` mark. */
export function countFields(fields: Record<string, string>, key: string): string[] {
  const prefix = `${key}|`;
  const init = initField(key);
  return Object.keys(fields).filter((field) => field.startsWith(prefix) && field !== init);
}

/**
 * Calls `fn(start, count)` for each bucket field of `key`. Iterates the hash once without
 * allocating; the hash holds every counter of one subscriber (a few hundred to a few thousand fields).
 */
function eachBucket(fields: Record<string, string>, key: string, fn: (start: number, count: number, field: string) => void): void {
  const prefix = `${key}|`;
  for (const field in fields) {
    if (!field.startsWith(prefix) || field.length === prefix.length) continue;
    const code = field.charCodeAt(prefix.length);
    // bucket starts are integers (a minus sign only before 1970); `init` and `all` are skipped
    if (!(code === 45 || (code >= 48 && code <= 57))) continue;
    const start = Number(field.slice(prefix.length));
    if (Number.isInteger(start)) fn(start, Number(fields[field]) || 0, field);
  }
}

/** The count of `key` in its window at `nowMs` (bucket precision, see the module comment). */
export function countInWindow(fields: Record<string, string>, key: string, withinMs: number | null, nowMs: number): number {
  if (withinMs === null) return Number(fields[`${key}|all`]) || 0;
  const width = bucketWidthMs(withinMs);
  const horizon = nowMs - withinMs;
  let n = 0;
  eachBucket(fields, key, (start, count) => {
    if (start + width > horizon) n += count;
  });
  return n;
}

/**
 * The earliest time after `nowMs` at which a counted, non-empty bucket of `key` leaves the window
 * (so the count may drop), or null when nothing can expire (all-time, or no counted bucket).
 * A bucket starting at `s` leaves at `s + width + within`.
 */
export function nextExpiry(fields: Record<string, string>, key: string, withinMs: number | null, nowMs: number): number | null {
  if (withinMs === null) return null;
  const width = bucketWidthMs(withinMs);
  const horizon = nowMs - withinMs;
  let next: number | null = null;
  eachBucket(fields, key, (start, count) => {
    if (count <= 0 || start + width <= horizon) return;
    const at = start + width + withinMs;
    if (next === null || at < next) next = at;
  });
  return next;
}

/**
 * The bucket fields of `key` that left the window at `nowMs`, to delete. Conditions whose windows
 * share a bucket width share a key: pass the longest of their windows so no field another one
 * still counts is deleted.
 */
export function expiredFields(fields: Record<string, string>, key: string, withinMs: number | null, nowMs: number): string[] {
  if (withinMs === null) return [];
  const width = bucketWidthMs(withinMs);
  const horizon = nowMs - withinMs;
  const out: string[] = [];
  eachBucket(fields, key, (start, _count, field) => {
    if (start + width <= horizon) out.push(field);
  });
  return out;
}
