import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { client } from '../helpers/api.js';
import type { ApnsPeer } from '../helpers/apns-peer.js';
import { startRoleProcess, stopRoleProcess, type RoleProcess } from '../helpers/processes.js';
import { apnsCredentials, pushSetup } from '../helpers/push-setup.js';
import { bootstrapWorkspace, runSendsMade, startTestService, workersHoldAll, type TestService } from '../helpers/service.js';
import { waitFor } from '../helpers/wait.js';

type Ctx = { service: TestService; peer: ApnsPeer; env: Record<string, string>; roles: RoleProcess[] };
const kill = suite<Ctx>('sleeping runs survive a worker and scheduler SIGKILL');
const RUNS = 40;

kill.before(async (ctx) => {
  const { peer, key, env } = await pushSetup();
  ctx.peer = peer;
  ctx.env = { ...env, PARTITION_LEASE_MS: '1000' };
  ctx.service = await startTestService('timer-kill', ctx.env, ['web', 'dispatcher']);
  ctx.roles = [];
  const api = client(ctx.service.url);
  const boot = await bootstrapWorkspace(ctx.service, 'timer-kill');
  await api.call('PUT', '/v1/apps/apns', { key: boot.keys.tenant, body: apnsCredentials(key) });
  (ctx as any).boot = boot;
});
kill.after(async (ctx) => {
  for (const r of ctx.roles) await stopRoleProcess(r);
  await ctx.service.stop();
  await ctx.peer.close();
});

kill('every sleeping run wakes exactly once and sends exactly once after its worker and scheduler are killed', async (ctx) => {
  const boot = (ctx as any).boot;
  const api = client(ctx.service.url);
  const env = { ...ctx.env, REDIS_URL: ctx.service.env.REDIS_URL!, REDIS_KEY_PREFIX: ctx.service.env.REDIS_KEY_PREFIX!, HERALD_PARTITIONS: ctx.service.env.HERALD_PARTITIONS! };
  const start = () => {
    const pair = [startRoleProcess('worker', env), startRoleProcess('scheduler', env)];
    ctx.roles.push(...pair);
    return pair;
  };
  const ids = Array.from({ length: RUNS }, (_, i) => `nap-${i}`);
  const tokens = new Map<string, string>();
  for (const id of ids) {
    const token = (0x7000 + tokens.size).toString(16).padStart(64, 'b');
    tokens.set(token, id);
    await api.post('/v1/client/subscriptions', boot.keys.client, { externalId: id, channel: 'push', token, platform: 'ios' });
  }
  await api.post('/v1/workflows', boot.keys.tenant, { slug: 'nap', trigger: { event: 'nap.started' }, steps: [{ type: 'sleep', duration: '15s' }, { type: 'send', message: { title: 'Wake up', body: 'once' } }] });
  const first = start();
  // the 15 s sleep counts from each trigger's arrival: the worker's start (many seconds under CI load)
  // stays out of it, or runs could wake before all of them were seen asleep
  await workersHoldAll(ctx.service);
  await api.post('/v1/events', boot.keys.tenant, { events: ids.map((externalId) => ({ externalId, name: 'nap.started', data: {} })) });
  await waitFor('every run to sleep', async () => (await api.get('/v1/workflows/nap/runs?status=sleeping', boot.keys.tenant)).body.data.total === RUNS, 20_000, 100);
  for (const p of first) p.child.kill('SIGKILL');
  await Promise.all(first.map((p) => p.exited));
  // the timers fall due while nobody runs them (a sleep counts from its trigger's arrival: long enough
  // that the processes' start, seconds under CI load, does not see it end before every run sleeps)
  const sleeping = (await api.get('/v1/workflows/nap/runs?limit=100', boot.keys.tenant)).body.data.items;
  const lastDue = Math.max(...sleeping.map((r: any) => Date.parse(r.wakeAt)));
  await new Promise((r) => setTimeout(r, Math.max(0, lastDue - Date.now()) + 500));
  start();
  // the second pair's start is in this wait (its worker takes the partitions when the killed one's leases lapse)
  await waitFor('every run to complete', async () => (await api.get('/v1/workflows/nap/runs?status=completed', boot.keys.tenant)).body.data.total === RUNS, 60_000, 100);
  const runs = (await api.get('/v1/workflows/nap/runs?limit=100', boot.keys.tenant)).body.data;
  assert.is(runs.total, RUNS);
  for (const run of runs.items) assert.equal(run.history.map((h: any) => h.outcome), ['sleeping', 'woke', 'sent'], run.externalId);
  // a send step's message is made just after the commit that completes its run (docs/automation.md)
  await runSendsMade(ctx.service);
  const messages = (await api.get('/v1/messages?limit=100', boot.keys.tenant)).body.data;
  assert.is(messages.total, RUNS, 'one message per run');
  await waitFor('every push to be sent', async () => ctx.peer.requests.length >= RUNS, 20_000);
  await new Promise((r) => setTimeout(r, 500));
  const perToken = new Map<string, number>();
  for (const r of ctx.peer.requests) perToken.set(r.token, (perToken.get(r.token) ?? 0) + 1);
  assert.is(perToken.size, RUNS, 'every device got its push');
  for (const [token, n] of perToken) assert.is(n, 1, `${tokens.get(token)} got one push`);
});

kill.run();
