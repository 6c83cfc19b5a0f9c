import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { sweepHashes } from '../../streams/hash-sweep.js';
import { connectRedis } from '../../streams/redis.js';
import { testRedisUrl, uniquePrefix } from '../helpers/redis.js';

test('a sweep cut short by its per-hash limit goes on where it stopped: entries left in place never hide those behind them (probe AJ)', async () => {
  const redis = connectRedis({ url: await testRedisUrl() });
  const key = `${uniquePrefix('hash-sweep')}moves`;
  const fields = Array.from({ length: 2_500 }, (_, i) => `f${i}`);
  try {
    for (let i = 0; i < fields.length; i += 500) await redis.hset(key, Object.fromEntries(fields.slice(i, i + 500).map((f) => [f, 'left in place'])));
    const seen = new Set<string>();
    let calls = 0;
    // every sweep leaves each entry where it is (too young, waiting for something else)
    for (; calls < 10 && seen.size < fields.length; calls++) {
      await sweepHashes(redis, [key], 1_000, async (_key, flat) => {
        for (let f = 0; f < flat.length; f += 2) seen.add(flat[f]!);
      });
    }
    assert.is(seen.size, fields.length, 'every entry reached');
    assert.ok(calls <= 4, `in ${calls} sweeps of at most about 1,000 fields`);
  } finally {
    await redis.del(key);
    redis.disconnect();
  }
});

test.run();
