import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { partitionOf } from '../../lib/partition.js';
import { readCatalog } from '../../streams/read-models.js';
import { startRoleProcess, stopRoleProcess, type RoleProcess } from '../helpers/processes.js';
import { bootstrapWorkspace, startTestService, type TestService } from '../helpers/service.js';
import { waitFor } from '../helpers/wait.js';
import { client } from '../helpers/api.js';

type Ctx = { service: TestService; workers: RoleProcess[] };
const workers = suite<Ctx>('worker processes');

const SUBSCRIBERS = 40;

workers.before.each(async (ctx) => {
  ctx.service = await startTestService('workers', { PARTITION_LEASE_MS: '1000' });
  ctx.workers = [];
});
workers.after.each(async (ctx) => {
  for (const w of ctx.workers) await stopRoleProcess(w);
  await ctx.service.stop();
});

const workerEnv = (s: TestService) => ({ REDIS_URL: s.env.REDIS_URL!, REDIS_KEY_PREFIX: s.env.REDIS_KEY_PREFIX!, HERALD_PARTITIONS: s.env.HERALD_PARTITIONS!, PARTITION_LEASE_MS: '1000' });

async function track(s: TestService, key: string, batches: number): Promise<Map<string, number>> {
  const api = client(s.url);
  const perSubscriber = new Map<string, number>();
  for (let b = 0; b < batches; b++) {
    const events = Array.from({ length: 100 }, (_, i) => ({ externalId: `s-${(b * 100 + i) % SUBSCRIBERS}`, name: 'tick', data: { b, i } }));
    const res = await api.post('/v1/events', key, { events });
    assert.is(res.status, 202);
    for (const e of events) perSubscriber.set(e.externalId, (perSubscriber.get(e.externalId) ?? 0) + 1);
  }
  return perSubscriber;
}

async function appliedTotal(s: TestService): Promise<number> {
  let total = 0;
  for (let p = 0; p < s.config.partitions; p++) for (const v of Object.values(await s.redis.hgetall(s.keys.applied(p)))) total += Number(v);
  return total;
}

/** Every subscriber's events are in its log exactly once, sequences 1..n without gaps, in order. */
async function assertExactlyOnce(s: TestService, tenantId: string, perSubscriber: Map<string, number>) {
  for (const [externalId, n] of perSubscriber) {
    const p = partitionOf(tenantId, externalId, s.config.partitions);
    const members = await s.redis.zrange(s.keys.timeline(p, tenantId, externalId), 0, -1, 'WITHSCORES');
    const seqs = members.filter((_, i) => i % 2 === 1).map(Number);
    assert.equal(seqs, Array.from({ length: n + 1 }, (_, i) => i + 1), `${externalId}: sequences 1..${n + 1}`);
    const logIds = members.filter((_, i) => i % 2 === 0);
    const sorted = [...logIds].sort((a, b) => { const [am, as] = a.split('-').map(Number); const [bm, bs] = b.split('-').map(Number); return am! - bm! || as! - bs!; });
    assert.equal(logIds, sorted, `${externalId}: applied in sequence order`);
  }
  let logged = 0;
  for (let p = 0; p < s.config.partitions; p++) logged += await s.redis.xlen(s.keys.tenantLog(p, tenantId));
  const expected = [...perSubscriber.values()].reduce((a, b) => a + b, 0) + perSubscriber.size;
  assert.is(logged, expected, 'the tenant log holds every event once');
}

workers('a worker killed with SIGKILL mid-batch loses nothing and counts nothing twice', async (ctx) => {
  const { service } = ctx;
  const { keys, tenant } = await bootstrapWorkspace(service, 'kill');
  const perSubscriber = await track(service, keys.tenant, 60); // 6,000 events queued before any worker runs
  const total = 6_000 + SUBSCRIBERS;
  const first = startRoleProcess('worker', workerEnv(service));
  ctx.workers.push(first);
  await waitFor('the first worker to start applying', async () => (await appliedTotal(service)) > 0, 20_000, 5);
  first.child.kill('SIGKILL');
  await first.exited;
  const atKill = await appliedTotal(service);
  assert.ok(atKill < total, `killed before the end (${atKill} of ${total} applied)`);
  if (process.env.HERALD_TEST_VERBOSE) console.log(`killed at ${atKill} of ${total} applied`);
  const second = startRoleProcess('worker', workerEnv(service));
  ctx.workers.push(second);
  await waitFor('the second worker to finish', async () => (await appliedTotal(service)) === total, 30_000);
  const catalog = await readCatalog(service.redis, service.keys, service.config.partitions, tenant.id);
  assert.is(catalog.find((e) => e.name === 'tick')!.counts.allTime, 6_000);
  assert.is(catalog.find((e) => e.name === '$subscriber.created')!.counts.allTime, SUBSCRIBERS);
  await assertExactlyOnce(service, tenant.id, perSubscriber);
  await waitFor('the inbox to be trimmed once acked', async () => {
    let left = 0;
    for (let p = 0; p < service.config.partitions; p++) left += await service.redis.xlen(service.keys.inbox(p));
    return left < total / 2;
  }, 15_000, 200);
});

workers('two workers share the partitions and keep per-subscriber order', async (ctx) => {
  const { service } = ctx;
  const { keys, tenant } = await bootstrapWorkspace(service, 'pair');
  ctx.workers.push(startRoleProcess('worker', workerEnv(service)), startRoleProcess('worker', workerEnv(service)));
  const owners = await waitFor('both workers to hold partitions', async () => {
    const held = await Promise.all(Array.from({ length: service.config.partitions }, (_, p) => service.redis.get(service.keys.lease(p, 'worker'))));
    const distinct = new Set(held.filter(Boolean));
    return distinct.size === 2 && held.every(Boolean) ? distinct : null;
  }, 20_000, 100);
  assert.is(owners.size, 2);
  const perSubscriber = await track(service, keys.tenant, 30);
  await waitFor('both workers to apply everything', async () => (await appliedTotal(service)) === 3_000 + SUBSCRIBERS, 30_000);
  await assertExactlyOnce(service, tenant.id, perSubscriber);
});

workers('a dead worker\'s partitions move to a live one within seconds', async (ctx) => {
  const { service } = ctx;
  const a = startRoleProcess('worker', workerEnv(service));
  const b = startRoleProcess('worker', workerEnv(service));
  ctx.workers.push(a, b);
  const leaseOwners = () => Promise.all(Array.from({ length: service.config.partitions }, (_, p) => service.redis.get(service.keys.lease(p, 'worker'))));
  await waitFor('both workers to hold partitions', async () => new Set((await leaseOwners()).filter(Boolean)).size === 2, 20_000, 100);
  a.child.kill('SIGKILL');
  const started = Date.now();
  await waitFor('one worker to hold every partition', async () => {
    const held = await leaseOwners();
    return held.every(Boolean) && new Set(held).size === 1;
  }, 15_000, 100);
  assert.ok(Date.now() - started < 10_000, `moved in ${Date.now() - started} ms`);
});

workers.run();
