import type { Redis } from 'ioredis';
import { now } from '../lib/clock.js';
import type { Logger } from '../lib/log.js';

/** Fields read per HSCAN page. */
const PAGE = 100;

/**
 * Where the last call of this process stopped in each hash it left before its end (HSCAN cursors):
 * the next call goes on from there, so entries a sweep leaves in place (too young, or waiting for
 * something else) do not hide those behind them for good (probe AJ: 3,000 such token moves kept the
 * sweep from ever reaching 337 of 459 finishable ones). One per hash cut short, dropped once its
 * walk ends; a restarted process starts at the top again.
 */
const resumeAt = new Map<string, string>();

/**
 * Walks the fields of the non-empty hashes among `hashKeys` a page at a time, for the sweepers of
 * leftovers (audit intents, subscriber cleanups, topic mirrors, token moves): one pipelined HLEN
 * over all of them first, so an empty hash costs nothing more, then HSCAN pages of about PAGE
 * fields, at most `perKey` fields of each hash per call (the rest wait for the next sweep, which
 * goes on where this one stopped). `visit` gets each page as HSCAN's flat field/value list.
 */
export async function sweepHashes(redis: Redis, hashKeys: readonly string[], perKey: number, visit: (key: string, flat: string[]) => Promise<void>): Promise<void> {
  const lengths = redis.pipeline();
  for (const key of hashKeys) lengths.hlen(key);
  const counts = (await lengths.exec()) ?? [];
  for (let i = 0; i < hashKeys.length; i++) {
    if (!counts[i]?.[1]) {
      resumeAt.delete(hashKeys[i]!);
      continue;
    }
    const key = hashKeys[i]!;
    let cursor = resumeAt.get(key) ?? '0';
    let seen = 0;
    do {
      const [next, flat] = await redis.hscan(key, cursor, 'COUNT', PAGE);
      cursor = next;
      seen += flat.length / 2;
      await visit(key, flat);
    } while (cursor !== '0' && seen < perKey);
    if (cursor === '0') resumeAt.delete(key);
    else resumeAt.set(key, cursor);
  }
}

/**
 * Finishes the entries (JSON with their time `at`, ms) that a writer left in `hashKeys` when it died:
 * those older than `minAgeMs`, which a live writer has long finished (`sweepHashes`, `perKey` a
 * hash per call). `finish` does the rest of the writer's work (and removes the entry); one that
 * fails is kept for the next sweep and reported as `what` kept.
 */
export async function sweepAgedEntries<T extends { at: number }>(
  redis: Redis, hashKeys: readonly string[], perKey: number, minAgeMs: number, log: Pick<Logger, 'warn'>, what: string,
  finish: (entry: T, key: string, field: string) => Promise<void>,
): Promise<{ finished: number; kept: number }> {
  let finished = 0;
  let kept = 0;
  await sweepHashes(redis, hashKeys, perKey, async (key, flat) => {
    for (let f = 0; f + 1 < flat.length; f += 2) {
      try {
        const entry = JSON.parse(flat[f + 1]!) as T;
        if (now() - entry.at < minAgeMs) continue;
        await finish(entry, key, flat[f]!);
        finished++;
      } catch (err) {
        kept++;
        log.warn(`${what} kept for the next sweep`, { key, field: flat[f], err: (err as Error).message });
      }
    }
  });
  return { finished, kept };
}
