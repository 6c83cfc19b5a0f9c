import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { entriesAfter, type ScoredPosition } from '../../streams/scored-index.js';
import { connectRedis } from '../../streams/redis.js';
import { testRedisUrl, uniquePrefix } from '../helpers/redis.js';

test('pages of a scored set with a large group sharing one score (deliveries made before they were scored: all 0) list every member once, newest first, and a cursor whose member left continues in place (probe CG)', async () => {
  const redis = connectRedis({ url: await testRedisUrl() });
  const key = `${uniquePrefix('scored-index')}set`;
  const tied = Array.from({ length: 3_000 }, (_, i) => `dlv_${String(i).padStart(5, '0')}`);
  const scored = Array.from({ length: 50 }, (_, i) => [1_796_071_624_980_000 + i * 1000, `dlv_s${String(i).padStart(3, '0')}`] as const);
  try {
    for (let i = 0; i < tied.length; i += 1_000) await redis.zadd(key, ...tied.slice(i, i + 1_000).flatMap((m) => [0, m]));
    await redis.zadd(key, ...scored.flatMap(([s, m]) => [s, m]));
    const expected: string[] = [...scored].reverse().map(([, m]): string => m).concat([...tied].reverse());
    const seen: string[] = [];
    let after: ScoredPosition | null = null;
    for (let page = 0; page < 100; page++) {
      const entries = await entriesAfter(redis, key, after, 77);
      if (entries.length === 0) break;
      seen.push(...entries.map(([m]) => m));
      const [member, score] = entries.at(-1)!;
      after = { score, member };
    }
    assert.equal(seen, expected, 'every member once, by score then member, newest first');
    // a cursor whose member left the set (expired) continues after where it was, in the tied group and above it
    await redis.zrem(key, 'dlv_01500', 'dlv_s010');
    assert.equal((await entriesAfter(redis, key, { score: '0', member: 'dlv_01500' }, 3)).map(([m]) => m), ['dlv_01499', 'dlv_01498', 'dlv_01497']);
    assert.equal((await entriesAfter(redis, key, { score: String(scored[10]![0]), member: 'dlv_s010' }, 2)).map(([m]) => m), ['dlv_s009', 'dlv_s008']);
    assert.equal((await entriesAfter(redis, key, { score: String(scored[0]![0]), member: 'dlv_s000' }, 2)).map(([m]) => m), ['dlv_02999', 'dlv_02998'], 'from the scored members into the tied ones');
  } finally {
    await redis.del(key);
    redis.disconnect();
  }
});

test.run();
