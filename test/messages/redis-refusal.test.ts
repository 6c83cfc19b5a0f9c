import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { answersPing } from '../../streams/embedded-redis.js';
import type { client } from '../helpers/api.js';
import type { ApnsPeer } from '../helpers/apns-peer.js';
import { startPushService } from '../helpers/push-setup.js';
import { freePort } from '../helpers/redis.js';
import type { TestService } from '../helpers/service.js';
import { waitFor } from '../helpers/wait.js';

/**
 * A Redis that refuses writes for a second (min-replicas-to-write, as memory full or a failover
 * would) while a topic's pushes are out: the dispatcher waits the refusal out and records APNs's
 * answers, and a failed batch is worked again at once. Until session 48 the answers were dropped
 * with the batch, which waited 60 s for a claim and then sent every push APNs had accepted again
 * (probe P: 200 devices twice). Its own redis-server: CONFIG SET on the suite's shared one would
 * refuse the other tests' writes.
 */
type Ctx = { dir: string; redis: ChildProcess; service: TestService; peer: ApnsPeer; api: ReturnType<typeof client>; key: string; pk: string };
const refusal = suite<Ctx>('dispatcher under a brief write refusal');

refusal.before(async (ctx) => {
  ctx.dir = mkdtempSync(join(tmpdir(), 'herald-refusal-'));
  const port = await freePort();
  ctx.redis = spawn('redis-server', ['--port', String(port), '--bind', '127.0.0.1', '--dir', ctx.dir, '--save', '', '--appendonly', 'no'], { stdio: 'ignore' });
  await waitFor('redis-server to answer', () => answersPing({ host: '127.0.0.1', port }, 200), 10_000);
  const started = await startPushService('refusal', { REDIS_URL: `redis://127.0.0.1:${port}`, FANOUT_CHUNK_SIZE: '25' }, ['web', 'dispatcher']);
  Object.assign(ctx, { service: started.service, peer: started.peer, api: started.api, key: started.key, pk: started.pk });
});
refusal.after(async (ctx) => {
  await ctx.service?.redis.config('SET', 'min-replicas-to-write', '0').catch(() => undefined);
  await ctx.service?.stop();
  await ctx.peer?.close();
  ctx.redis?.kill('SIGTERM');
  rmSync(ctx.dir, { recursive: true, force: true });
});

refusal('writes refused for 1 s mid-fan-out: the message completes within seconds and every device gets it once', async (ctx) => {
  const { api, key, pk, peer, service } = ctx;
  const ids = Array.from({ length: 100 }, (_, i) => `r-${i}`);
  for (const [i, id] of ids.entries()) {
    const res = await api.post('/v1/client/subscriptions', pk, { externalId: id, channel: 'push', token: (0x7000 + i).toString(16).padStart(64, 'd'), platform: 'ios' });
    assert.is(res.status, 201, res.text);
  }
  assert.is((await api.post('/v1/topics', key, { slug: 'refused' })).status, 201);
  assert.is((await api.post('/v1/topics/refused/subscribers', key, { externalIds: ids })).status, 200);
  peer.reset();
  peer.respondWith({ delayMs: 300 }); // the refusal lands with pushes out
  const sent = await api.post('/v1/messages', key, { to: { topic: 'refused' }, title: 'Refused', body: 'for a second' });
  assert.is(sent.status, 202, sent.text);
  await waitFor('pushes out', async () => peer.received > 0, 20_000, 5);
  await service.redis.config('SET', 'min-replicas-to-write', '1');
  await new Promise((r) => setTimeout(r, 1_000));
  await service.redis.config('SET', 'min-replicas-to-write', '0');
  const refusedUntil = Date.now();
  const done = await waitFor('the message to complete', async () => {
    const m = (await api.get(`/v1/messages/${sent.body.data.id}`, key)).body.data;
    return m.status === 'completed' ? m : null;
  }, 40_000, 100);
  assert.ok(Date.now() - refusedUntil < 15_000, `completed ${Date.now() - refusedUntil} ms after the refusal (a claim would take 60 s)`);
  assert.is(done.counts.sent, 100);
  const perToken = new Map<string, number>();
  for (const r of peer.requests) perToken.set(r.token, (perToken.get(r.token) ?? 0) + 1);
  assert.is(perToken.size, 100, 'every device');
  assert.equal([...perToken.values()].filter((n) => n > 1).length, 0, 'none twice');
});

refusal.run();
