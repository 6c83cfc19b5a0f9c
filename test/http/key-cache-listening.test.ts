import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { answersPing } from '../../streams/embedded-redis.js';
import { revokeApiKey } from '../../streams/identity.js';
import { KeyCache } from '../../streams/key-cache.js';
import { createLogger } from '../../lib/log.js';
import { client } from '../helpers/api.js';
import { freePort } from '../helpers/redis.js';
import { BY_TEST, bootstrapWorkspace, makeKey, startTestService, type TestService } from '../helpers/service.js';
import { waitFor } from '../helpers/wait.js';

/**
 * The key cache is trusted only while this process hears revocations. A redis-server of its own:
 * the test lowers `maxclients` so the revocation listener, once its connection is killed, cannot
 * come back while the command connection goes on working.
 */
type Ctx = { dir: string; redis: ChildProcess; service: TestService };
const listening = suite<Ctx>('key cache while revocations cannot be heard');

listening.before(async (ctx) => {
  ctx.dir = mkdtempSync(join(tmpdir(), 'herald-keycache-'));
  const port = await freePort();
  ctx.redis = spawn('redis-server', ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no', '--dir', ctx.dir], { stdio: 'ignore' });
  await waitFor('the redis-server to answer', () => answersPing({ host: '127.0.0.1', port }, 200), 10_000, 50);
  ctx.service = await startTestService('keycache-listening', { REDIS_URL: `redis://127.0.0.1:${port}` });
});

listening.after(async (ctx) => {
  await ctx.service?.stop();
  ctx.redis?.kill('SIGKILL');
  rmSync(ctx.dir, { recursive: true, force: true });
});

listening('a key revoked while the revocation listener is down is refused at once, not served from the cache', async ({ service }) => {
  const api = client(service.url);
  const boot = await bootstrapWorkspace(service, 'listening');
  const { key, record } = await makeKey(service, 'listening', 'tenant', ['events:read']);
  assert.is((await api.get('/v1/events/names', key)).status, 200); // cached now, for 30 s

  const connected = Number(/connected_clients:(\d+)/.exec(await service.redis.info('clients'))![1]);
  await service.redis.config('SET', 'maxclients', String(connected - 1));
  try {
    assert.ok(Number(await service.redis.client('KILL', 'TYPE', 'pubsub')) >= 1);
    // the listener keeps trying and is refused: it cannot hear the revocation published now
    await revokeApiKey(service.redis, service.keys, boot.workspace, record.id, BY_TEST);
    const res = await api.get('/v1/events/names', key);
    assert.is(res.status, 401, res.text);
    assert.is(res.body.error.code, 'invalid_api_key');
  } finally {
    await service.redis.config('SET', 'maxclients', '10000');
  }
  // a key that works is still accepted while the listener is away and once it is back
  const other = await makeKey(service, 'listening', 'tenant', ['events:read']);
  assert.is((await api.get('/v1/events/names', other.key)).status, 200);
  await waitFor('the listener to be back', async () => Number(await service.redis.pubsub('NUMSUB', service.keys.keyRevocations).then((r) => (r as [string, number])[1])) === 1, 10_000, 50);
  assert.is((await api.get('/v1/events/names', key)).status, 401);
  assert.is((await api.get('/v1/events/names', other.key)).status, 200);
});

listening('after a reconnect the cache is trusted only once the revocation channel is subscribed again, not when the connection is ready', async ({ service }) => {
  const cache = new KeyCache(service.redis, service.keys, 30_000, createLogger('error'));
  await cache.start();
  try {
    assert.ok(cache.listening);
    const connection = (cache as unknown as { subscriber: import('ioredis').Redis }).subscriber;
    // added after the cache's own handler: sees what a lookup made at that moment would
    const atReady: boolean[] = [];
    connection.on('ready', () => atReady.push(cache.listening));
    await service.redis.client('KILL', 'TYPE', 'pubsub');
    await waitFor('the connection to be ready again', async () => atReady.length > 0, 10_000, 20);
    assert.equal(atReady, [false], 'not trusted before the SUBSCRIBE is answered');
    await waitFor('the subscription to be back', async () => cache.listening, 10_000, 20);
    assert.is(Number(((await service.redis.pubsub('NUMSUB', service.keys.keyRevocations)) as [string, number])[1]) >= 1, true);
  } finally {
    await cache.stop();
  }
});

listening.run();
