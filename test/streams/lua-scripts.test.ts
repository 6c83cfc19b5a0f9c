import type { Redis } from 'ioredis';
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { createKeys } from '../../streams/keys.js';
import { callScript, commandName } from '../../streams/lua-scripts.js';
import { connectRedis } from '../../streams/redis.js';
import { testRedisUrl, uniquePrefix } from '../helpers/redis.js';

type Ctx = { redis: Redis; fresh: Redis | null };
const scripts = suite<Ctx>('Lua scripts: defineCommand once, shared by pipelines');

scripts.before(async (ctx) => {
  ctx.redis = connectRedis({ url: await testRedisUrl() });
  ctx.fresh = null;
});

scripts.after(async (ctx) => {
  ctx.redis.disconnect();
  ctx.fresh?.disconnect();
});

scripts('a pipeline carries no copy of the scripts, yet runs them (explicit and auto-pipelined)', async (ctx) => {
  const own = Object.keys(ctx.redis.pipeline()).filter((k) => k.includes(':'));
  assert.equal(own, [], 'no script property is copied onto a new pipeline');
  const keys = createKeys(uniquePrefix('lua'));
  const lease = keys.lease(0, 'test');
  // renewLease: 1 when the caller holds the lease afterwards, 0 when another owner does
  const pipeline = ctx.redis.pipeline();
  callScript(pipeline, 'renewLease', [lease], ['a', 10_000]);
  const [[err, taken]] = (await pipeline.exec()) as [[Error | null, number]];
  assert.is(err, null);
  assert.is(taken, 1);
  // several calls in one tick go through one auto-pipeline
  const many = await Promise.all(Array.from({ length: 5 }, (_, i) => callScript<number>(ctx.redis, 'renewLease', [lease], [i % 2 ? 'a' : 'b', 10_000])));
  assert.equal(many, [0, 1, 0, 1, 0]);
});

scripts('a script not yet loaded on the server is loaded on first use (EVAL fallback), also after SCRIPT FLUSH', async (ctx) => {
  await ctx.redis.script('FLUSH');
  ctx.fresh = connectRedis({ url: await testRedisUrl() });
  const keys = createKeys(uniquePrefix('lua'));
  assert.is(await callScript<number>(ctx.fresh, 'renewLease', [keys.lease(1, 'test')], ['a', 10_000]), 1);
  assert.is(await callScript<number>(ctx.redis, 'renewLease', [keys.lease(1, 'test')], ['b', 10_000]), 0, 'a client that had loaded it before the flush loads it again');
  assert.is(typeof (ctx.fresh as unknown as Record<string, unknown>)[commandName('renewLease')], 'function', 'the client keeps its own script methods');
});

scripts.run();
