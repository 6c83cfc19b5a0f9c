import type { Redis } from 'ioredis';

/**
 * Sorted sets whose score is their order, newest first: `<ms> * 1000 + n`, n counting what the set
 * got in that millisecond in the order it came (topic members: the position in the call; webhook
 * deliveries: lua/enqueueWebhookDeliveries), so newest first by score is newest first by time with
 * ties in arrival order. Members sharing a score are ordered by Redis by member bytes.
 */
export const SCORE_PER_MS = 1000;

/** The score of the n-th arrival (from 0) of millisecond `ms`; past the last slot they share it. */
export function scoreAt(ms: number, n = 0): number {
  return ms * SCORE_PER_MS + Math.min(n, SCORE_PER_MS - 1);
}

/** A place in a scored set: the member's score (as Redis prints it) and the member. */
export type ScoredPosition = { score: string; member: string };

/** `[member, score, member, score, …]` as pairs. */
function pairs(flat: string[]): [string, string][] {
  const out: [string, string][] = [];
  for (let i = 0; i + 1 < flat.length; i += 2) out.push([flat[i]!, flat[i + 1]!]);
  return out;
}

/**
 * Up to `count` `[member, score]` after `after` in newest-first order: by score descending, then
 * (as Redis orders equal scores) by member bytes descending. Members sharing the cursor's score
 * are read whole and filtered here (only arrivals landing in the same slot share a score, so that
 * group is tiny); the rest is one bounded range. One round trip.
 */
export async function entriesAfter(redis: Redis, key: string, after: ScoredPosition | null, count: number): Promise<[string, string][]> {
  if (!after) return pairs(await redis.zrange(key, '+inf', '-inf', 'BYSCORE', 'REV', 'LIMIT', 0, count, 'WITHSCORES'));
  const [[tieErr, tie], [restErr, rest]] = ((await redis.pipeline()
    .zrange(key, after.score, after.score, 'BYSCORE', 'REV', 'WITHSCORES')
    .zrange(key, `(${after.score}`, '-inf', 'BYSCORE', 'REV', 'LIMIT', 0, count, 'WITHSCORES')
    .exec()) ?? []) as [Error | null, string[]][];
  if (tieErr || restErr) throw tieErr ?? restErr;
  const cursor = Buffer.from(after.member);
  const tied = pairs(tie ?? []).filter(([m]) => Buffer.compare(Buffer.from(m), cursor) < 0);
  return [...tied, ...pairs(rest ?? [])].slice(0, count);
}
