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

test('a cursor whose member left continues right after where it sorted, by score then member bytes (mixed case, non-ASCII), as the set would have it', async () => {
  const redis = connectRedis({ url: await testRedisUrl() });
  const key = `${uniquePrefix('scored-index-left')}set`;
  const alphabet = ['a', 'B', 'z', '_', 'é', 'Z', '0', 'ü', '~'];
  let seed = 7;
  const random = (n: number) => {
    seed = (seed * 1_103_515_245 + 12_345) % 2 ** 31;
    return seed % n;
  };
  const word = () => Array.from({ length: 1 + random(6) }, () => alphabet[random(alphabet.length)]).join('');
  try {
    const members = new Map<string, number>();
    while (members.size < 600) members.set(word(), random(4) * 1_000);
    await redis.zadd(key, ...[...members].flatMap(([m, score]) => [score, m]));
    // newest first: score descending, then member bytes descending (Redis's order of equal scores)
    const order = [...members].sort(([a, x], [b, y]) => y - x || Buffer.compare(Buffer.from(b), Buffer.from(a)));
    for (let round = 0; round < 60; round++) {
      const at = random(order.length);
      const [member, score] = order[at]!;
      const count = 1 + random(40);
      if (round % 2 === 0) {
        await redis.zrem(key, member);
        order.splice(at, 1);
        const expected = order.slice(at, at + count).map(([m]) => m);
        assert.equal((await entriesAfter(redis, key, { score: String(score), member }, count)).map(([m]) => m), expected, `left: ${member}@${score}`);
      } else {
        const expected = order.slice(at + 1, at + 1 + count).map(([m]) => m);
        assert.equal((await entriesAfter(redis, key, { score: String(score), member }, count)).map(([m]) => m), expected, `there: ${member}@${score}`);
      }
    }
  } finally {
    await redis.del(key);
    redis.disconnect();
  }
});

test.run();
