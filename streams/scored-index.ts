import type { Redis } from 'ioredis';
import { callScript } from './lua-scripts.js';

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
 * (as Redis orders equal scores) by member bytes descending, in one script call (lua/entriesAfter:
 * a cursor whose member is still there continues from its rank, however many members share its
 * score). One round trip.
 */
export async function entriesAfter(redis: Redis, key: string, after: ScoredPosition | null, count: number): Promise<[string, string][]> {
  return pairs(await callScript<string[]>(redis, 'entriesAfter', [key], [after?.score ?? '', after?.member ?? '', count]));
}
