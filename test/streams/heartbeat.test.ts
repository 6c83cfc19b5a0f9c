import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { hostname } from 'node:os';
import { now } from '../../lib/clock.js';
import { startHeartbeat } from '../../streams/heartbeat.js';
import { createKeys } from '../../streams/keys.js';
import { connectRedis } from '../../streams/redis.js';
import { testRedisUrl, uniquePrefix } from '../helpers/redis.js';
import { waitFor } from '../helpers/wait.js';

/**
 * A process killed without its stop leaves its heartbeat fields; they were removed only when the
 * health route was read (probe Z: four fields per killed process for good where nothing polls it).
 * Each live process now sweeps them about once a minute, at its first beat too.
 */
test('a heartbeat removes the entries of processes that died without a stop', async () => {
  const redis = connectRedis({ url: await testRedisUrl() });
  const keys = createKeys(uniquePrefix('heartbeat'));
  try {
    await redis.hset(keys.processes, 'worker:gone-host:1', String(now() - 120_000), 'web:recent-host:2', String(now() - 5_000));
    const stop = startHeartbeat(redis, keys, ['web', 'worker'], 64);
    const mine = [`web:${hostname()}:${process.pid}`, `worker:${hostname()}:${process.pid}`];
    const fields = await waitFor('the stale entry removed', async () => {
      const all = await redis.hgetall(keys.processes);
      return all['worker:gone-host:1'] === undefined && mine.every((f) => all[f]) ? Object.keys(all).sort() : null;
    }, 10_000, 20);
    assert.equal(fields, ['web:recent-host:2', ...mine].sort(), 'a recent one stays');
    await stop();
    assert.equal(Object.keys(await redis.hgetall(keys.processes)), ['web:recent-host:2'], 'a stop removes its own');
  } finally {
    await redis.del(keys.processes);
    redis.disconnect();
  }
});

test('a heartbeat records the partition count again once a Redis restarted empty has lost it (probe M: a process with another count then started)', async () => {
  const redis = connectRedis({ url: await testRedisUrl() });
  const keys = createKeys(uniquePrefix('heartbeat-partitions'));
  const stop = startHeartbeat(redis, keys, ['worker'], 64);
  try {
    assert.is(await waitFor('the count recorded', async () => (await redis.get(keys.partitionCount)) ?? null, 10_000, 20), '64');
    await redis.del(keys.partitionCount); // what an empty restart leaves
    assert.is(await redis.get(keys.partitionCount), null);
    // the next beat, within 5 s (margin for a loaded machine)
    assert.is(await waitFor('the count recorded again', async () => (await redis.get(keys.partitionCount)) ?? null, 15_000, 50), '64');
    // and one that was recorded is never overwritten
    await redis.set(keys.partitionCount, '32');
    await new Promise((r) => setTimeout(r, 5_500));
    assert.is(await redis.get(keys.partitionCount), '32');
  } finally {
    await stop();
    await redis.del(keys.processes, keys.partitionCount);
    redis.disconnect();
  }
});

test.run();
