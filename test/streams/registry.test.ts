import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { connectRedis } from '../../streams/redis.js';
import { readRegistry, REGISTRY_PAGE } from '../../streams/registry.js';
import { testRedisUrl, uniquePrefix } from '../helpers/redis.js';

test('a registry is read whole, in rank order, by pages no larger than REGISTRY_PAGE', async () => {
  const redis = connectRedis({ url: await testRedisUrl() });
  const key = `${uniquePrefix('registry')}set`;
  const members = Array.from({ length: Math.round(REGISTRY_PAGE * 2.3) }, (_, i) => `m${String(i).padStart(6, '0')}`);
  const sizes: number[] = [];
  const zrange = redis.zrange.bind(redis) as (...args: unknown[]) => Promise<string[]>;
  (redis as unknown as { zrange: (...args: unknown[]) => Promise<string[]> }).zrange = async (...args: unknown[]) => {
    const reply = await zrange(...args);
    sizes.push(reply.length);
    return reply;
  };
  try {
    assert.equal(await readRegistry(redis, key), [], 'an absent registry is empty');
    for (let i = 0; i < members.length; i += 500) await redis.zadd(key, ...members.slice(i, i + 500).flatMap((m) => [0, m]));
    sizes.length = 0;
    assert.equal(await readRegistry(redis, key), members);
    assert.ok(Math.max(...sizes) <= REGISTRY_PAGE, `a page of ${Math.max(...sizes)}`);
    assert.is(sizes.length, 3);
  } finally {
    await redis.del(key);
    redis.disconnect();
  }
});

test.run();
