import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { partitionOf } from '../../lib/partition.js';
import { readCatalog } from '../../streams/read-models.js';
import { applyEvents, LeaseLost } from '../../streams/apply-events.js';
import { ACTOR_GROUP } from '../../actors/subscriber-actor.js';
import { startRoleProcess, stopRoleProcess, type RoleProcess } from '../helpers/processes.js';
import { bootstrapWorkspace, startTestService, type TestService } from '../helpers/service.js';
import { waitFor } from '../helpers/wait.js';
import { client } from '../helpers/api.js';

type Ctx = { service: TestService; workers: RoleProcess[] };
const workers = suite<Ctx>('worker processes');

const SUBSCRIBERS = 40;

workers.before.each(async (ctx) => {
  // 6,000 events are queued before any worker runs (750 a partition): no tenant limit (docs/events.md, Fairness)
  ctx.service = await startTestService('workers', { PARTITION_LEASE_MS: '1000', TENANT_INBOX_MAX_BACKLOG: '1000000' });
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
  const pipeline = s.redis.pipeline();
  for (let p = 0; p < s.config.partitions; p++) pipeline.hgetall(s.keys.applied(p));
  let total = 0;
  for (const [err, applied] of (await pipeline.exec()) ?? []) {
    if (err) throw err;
    for (const v of Object.values(applied as Record<string, string>)) total += Number(v);
  }
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
  // 6,000 events queued before any worker runs; a worker applies them in well under a second, so a
  // test process held up between seeing the first apply and the kill (a loaded CI machine: ~200 ms)
  // kills it after the end: then another 6,000 are queued and another first worker is killed, at most
  // three times (probe BF reproduced the miss with a 200 ms stall)
  const perSubscriber = new Map<string, number>();
  let ticks = 0;
  let atKill = 0;
  let total = 0;
  for (let attempt = 1; attempt <= 3; attempt++) {
    for (const [x, n] of await track(service, keys.tenant, 60)) perSubscriber.set(x, (perSubscriber.get(x) ?? 0) + n);
    ticks += 6_000;
    total = ticks + SUBSCRIBERS;
    const before = await appliedTotal(service);
    const first = startRoleProcess('worker', workerEnv(service));
    ctx.workers.push(first);
    // a role process's start takes seconds on a loaded machine (a CI-like run: over 20 s)
    await waitFor('the first worker to start applying', async () => (await appliedTotal(service)) > before, 45_000, 5);
    first.child.kill('SIGKILL');
    await first.exited;
    atKill = await appliedTotal(service);
    if (process.env.HERALD_TEST_VERBOSE) console.log(`attempt ${attempt}: killed at ${atKill} of ${total} applied`);
    if (atKill < total) break;
  }
  assert.ok(atKill < total, `killed before the end (${atKill} of ${total} applied)`);
  const second = startRoleProcess('worker', workerEnv(service));
  ctx.workers.push(second);
  await waitFor('the second worker to finish', async () => (await appliedTotal(service)) === total, 60_000);
  const { items: catalog } = await readCatalog(service.redis, service.keys, service.config.partitions, tenant.id);
  assert.is(catalog.find((e) => e.name === 'tick')!.counts.allTime, ticks);
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
  }, 45_000, 100); // two role processes' starts on a loaded machine (a CI-like run: over 20 s)
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
  await waitFor('both workers to hold partitions', async () => new Set((await leaseOwners()).filter(Boolean)).size === 2, 45_000, 100);
  a.child.kill('SIGKILL');
  const started = Date.now();
  await waitFor('one worker to hold every partition', async () => {
    const held = await leaseOwners();
    return held.every(Boolean) && new Set(held).size === 1;
  }, 15_000, 100);
  assert.ok(Date.now() - started < 10_000, `moved in ${Date.now() - started} ms`);
});

/**
 * Probe S2 (a worker stopped 2.5 s under load, then resumed: 8 of 22,500 events missing from the
 * read models): a worker that stalled past its lease read entries of the partition its successor
 * holds, so the holder applied later entries first and the earlier ones were then skipped as
 * already applied. Here the stale reader is played by the test: it reads a batch of the holder's
 * partition into its own name and never applies it (its fenced apply is refused), then a later batch
 * arrives. The holder applies nothing past the stray entries: it claims them and applies in order.
 */
workers('entries a stale worker read after losing its lease are applied by the holder before later ones, and the stale worker applies nothing', async (ctx) => {
  const { service } = ctx;
  const { keys, tenant } = await bootstrapWorkspace(service, 'stale');
  const api = client(service.url);
  const x = 'stale-s';
  const p = partitionOf(tenant.id, x, service.config.partitions);
  const post = async (from: number, n: number) => {
    const res = await api.post('/v1/events', keys.tenant, { events: Array.from({ length: n }, (_, i) => ({ externalId: x, name: 'step', data: { i: from + i } })) });
    assert.is(res.status, 202);
  };
  const holder = startRoleProcess('worker', { ...workerEnv(service), PARTITION_LEASE_MS: '20000' });
  ctx.workers.push(holder);
  await post(0, 5);
  await waitFor('the first batch applied', async () => Number(await service.redis.hget(service.keys.applied(p), `${tenant.id}|${x}`)) === 6, 45_000, 20); // the holder's start included
  // the holder stops reading (its blocking read times out after 1 s), keeping its lease
  holder.child.kill('SIGSTOP');
  // until no read of it is blocked in Redis (a fixed 1.3 s left ~290 ms to a starved Redis, probe BF)
  const blockedRead = (line: string) => /\bcmd=xreadgroup\b/.test(line) && /\bflags=\w*b/.test(line);
  await waitFor('the stopped holder\'s blocking read to time out', async () => !((await service.redis.client('LIST')) as string).split('\n').some(blockedRead), 5_000, 20);
  await post(5, 5);
  const stale = (await service.redis.xreadgroup('GROUP', ACTOR_GROUP, 'worker:stale', 'COUNT', 100, 'STREAMS', service.keys.inbox(p), '>')) as [string, [string, string[]][]][];
  const staleIds = stale[0]![1].map(([id]) => id);
  assert.is(staleIds.length, 5, 'the stale reader took the second batch');
  const refused = await applyEvents(service.redis, service.keys, p, service.config.retentionMs, Date.now(), staleIds, { owner: 'worker:stale', group: ACTOR_GROUP, firstId: staleIds[0]! }).then(() => null, (err: unknown) => err);
  assert.instance(refused, LeaseLost, 'the stale worker\'s apply is refused: it does not hold the lease');
  await post(10, 5);
  holder.child.kill('SIGCONT');
  await waitFor('every event applied', async () => Number(await service.redis.hget(service.keys.applied(p), `${tenant.id}|${x}`)) === 16, 20_000, 50);
  await assertExactlyOnce(service, tenant.id, new Map([[x, 15]]));
  const { items: catalog } = await readCatalog(service.redis, service.keys, service.config.partitions, tenant.id);
  assert.is(catalog.find((e) => e.name === 'step')!.counts.allTime, 15);
  assert.is(Number((await service.redis.xpending(service.keys.inbox(p), ACTOR_GROUP))[0]), 0, 'nothing left pending');
});

workers.run();
