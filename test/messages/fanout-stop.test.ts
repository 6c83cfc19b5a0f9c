import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { FANOUT_GROUP } from '../../actors/message-dispatcher.js';
import { client } from '../helpers/api.js';
import type { ApnsPeer } from '../helpers/apns-peer.js';
import { startRoleProcess, stopRoleProcess, type RoleProcess } from '../helpers/processes.js';
import { apnsCredentials, pushSetup } from '../helpers/push-setup.js';
import { bootstrapWorkspace, startTestService, type TestService } from '../helpers/service.js';
import { waitFor } from '../helpers/wait.js';

/**
 * A dispatcher stopped (SIGTERM) mid-fan-out gives the message back: the walk stops at its next
 * chunk, the pushes in flight are recorded, and a live dispatcher goes on at once, not after the
 * claim idle time (here 120 s, longer than the test waits), with no device pushed twice (probe AU:
 * the stop waited for the walk, was cut at its 8 s limit, and the message waited ~60 s).
 */
type Ctx = { service: TestService; peer: ApnsPeer; env: Record<string, string>; dispatchers: RoleProcess[] };
const stop = suite<Ctx>('fan-out given back by a stopping dispatcher');

const MEMBERS = 200;
const RATE = 20; // pushes per second and dispatcher: the walk takes ~10 s

stop.before(async (ctx) => {
  const { peer, key, env } = await pushSetup();
  ctx.peer = peer;
  ctx.env = { ...env, FANOUT_CHUNK_SIZE: '10', DISPATCHER_CLAIM_IDLE_MS: '120000', APNS_RATE_PER_TENANT_PER_SECOND: String(RATE) };
  ctx.service = await startTestService('fanout-stop', ctx.env, ['web']);
  ctx.dispatchers = [];
  const api = client(ctx.service.url);
  const boot = await bootstrapWorkspace(ctx.service, 'stop');
  await api.call('PUT', '/v1/apps/apns', { key: boot.keys.tenant, body: apnsCredentials(key) });
  (ctx as any).boot = boot;
});
stop.after(async (ctx) => {
  for (const d of ctx.dispatchers) await stopRoleProcess(d);
  await ctx.service.stop();
  await ctx.peer.close();
});

stop('a dispatcher stopped mid-fan-out gives the message back to a live one, which finishes it at once: every device gets it, none twice', async (ctx) => {
  const boot = (ctx as any).boot;
  const { service } = ctx;
  const api = client(service.url);
  const ids = Array.from({ length: MEMBERS }, (_, i) => `s-${i}`);
  const tokenOf = (i: number) => (0x6000 + i).toString(16).padStart(64, 'a');
  for (const [i, id] of ids.entries()) await api.post('/v1/client/subscriptions', boot.keys.client, { externalId: id, channel: 'push', token: tokenOf(i), platform: 'ios' });
  await api.post('/v1/topics', boot.keys.tenant, { slug: 'stop-all' });
  await api.post('/v1/topics/stop-all/subscribers', boot.keys.tenant, { externalIds: ids });

  // two dispatchers, both reading the tenant's broadcast queue before the message is sent
  const env = { ...ctx.env, REDIS_URL: service.env.REDIS_URL!, REDIS_KEY_PREFIX: service.env.REDIS_KEY_PREFIX!, HERALD_PARTITIONS: service.env.HERALD_PARTITIONS!, LOG_LEVEL: 'info' };
  ctx.dispatchers.push(startRoleProcess('dispatcher', env), startRoleProcess('dispatcher', env));
  // one-subscriber messages until each dispatcher has taken one (a consumer shows in the group once
  // it was handed an entry): both then know the tenant, whose two queues they read together
  const queue = service.keys.messageQueue(boot.tenant.id, 'audience');
  const oneLane = service.keys.messageQueue(boot.tenant.id, 'one');
  await waitFor('both dispatchers to take a message of the tenant', async () => {
    const warm = (await api.post('/v1/messages', boot.keys.tenant, { to: 's-0', title: 'Warm', body: 'up' })).body.data.id;
    await waitFor('a warm-up message to complete', async () => (await api.get(`/v1/messages/${warm}`, boot.keys.tenant)).body.data.status === 'completed', 60_000, 50);
    return ((await service.redis.xinfo('CONSUMERS', oneLane, FANOUT_GROUP)) as unknown[]).length === 2;
  }, 120_000, 0);

  ctx.peer.reset();
  const id = (await api.post('/v1/messages', boot.keys.tenant, { to: { topic: 'stop-all' }, title: 'Stop', body: 'and go on' })).body.data.id;
  await waitFor('the fan-out to be under way', async () => (await api.get(`/v1/messages/${id}`, boot.keys.tenant)).body.data.counts.sent >= 20, 30_000, 20);
  // the dispatcher holding it: its consumer name ends with its pid and a random part
  const [[, holder]] = (await service.redis.xpending(queue, FANOUT_GROUP, '-', '+', 1)) as [string, string, number, number][];
  const pid = Number(holder.split(':')[2]);
  const stopping = ctx.dispatchers.find((d) => d.child.pid === pid)!;
  assert.ok(stopping, `the holder ${holder} is one of the two`);
  stopping.child.kill('SIGTERM');
  const code = await stopping.exited;
  const atStop = (await api.get(`/v1/messages/${id}`, boot.keys.tenant)).body.data;
  assert.is(code, 0, stopping.output());
  assert.ok(atStop.counts.sent < MEMBERS, `the walk was cut short by the stop (${atStop.counts.sent} sent)`);
  assert.match(stopping.output(), 'gave back a batch cut short');
  assert.not.match(stopping.output(), 'stop cut short');

  const done = await waitFor('the live dispatcher to complete the message', async () => {
    const m = (await api.get(`/v1/messages/${id}`, boot.keys.tenant)).body.data;
    return m.status === 'completed' ? m : null;
  }, 60_000, 100);
  assert.equal(done.counts, { total: MEMBERS, pending: 0, sent: MEMBERS, failed: 0, skipped: 0, canceled: 0 });
  const received = ctx.peer.requests.filter((r) => (r.payload as any)?.herald?.messageId === id);
  const perToken = new Map<string, number>();
  for (const r of received) perToken.set(r.token, (perToken.get(r.token) ?? 0) + 1);
  assert.is(perToken.size, MEMBERS, 'every device got the message');
  assert.equal([...perToken.values()].filter((n) => n > 1), [], 'no device got it twice: the pushes in flight at the stop were recorded');
  // the stopped dispatcher's entry was acked and a new one added: nothing of the message is left pending
  assert.is(Number(((await service.redis.xpending(queue, FANOUT_GROUP)) as [number])[0]), 0);
});

stop.run();
