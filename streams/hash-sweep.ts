import type { Redis } from 'ioredis';

/** Fields read per HSCAN page. */
const PAGE = 100;

/**
 * Walks the fields of the non-empty hashes among `hashKeys` a page at a time, for the sweepers of
 * leftovers (audit intents, subscriber cleanups): one pipelined HLEN over all of them first, so an
 * empty hash costs nothing more, then HSCAN pages of about PAGE fields, at most `perKey` fields of
 * each hash per call (the rest wait for the next sweep). `visit` gets each page as HSCAN's flat
 * field/value list.
 */
export async function sweepHashes(redis: Redis, hashKeys: readonly string[], perKey: number, visit: (key: string, flat: string[]) => Promise<void>): Promise<void> {
  const lengths = redis.pipeline();
  for (const key of hashKeys) lengths.hlen(key);
  const counts = (await lengths.exec()) ?? [];
  for (let i = 0; i < hashKeys.length; i++) {
    if (!counts[i]?.[1]) continue;
    const key = hashKeys[i]!;
    let cursor = '0';
    let seen = 0;
    do {
      const [next, flat] = await redis.hscan(key, cursor, 'COUNT', PAGE);
      cursor = next;
      seen += flat.length / 2;
      await visit(key, flat);
    } while (cursor !== '0' && seen < perKey);
  }
}
