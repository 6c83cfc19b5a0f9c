import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { Automation } from '../../actors/automation.js';
import { recordOf } from '../../lib/field-list.js';
import { createLogger, type Logger } from '../../lib/log.js';
import { partitionOf } from '../../lib/partition.js';
import { callScript } from '../../streams/lua-scripts.js';
import { WORKER_LEASES } from '../../streams/partition-leases.js';
import type { StreamEntry } from '../../streams/stream-consumer.js';
import { client } from '../helpers/api.js';
import { bootstrapWorkspace, startTestService, type TestService } from '../helpers/service.js';

type Ctx = { service: TestService; api: ReturnType<typeof client>; key: string; tenantId: string };
const chains = suite<Ctx>('a chain whose runs the retention removed');
const OWNER = 'chain-expired-worker';
const log = createLogger('error');

chains.before(async (ctx) => {
  // no worker role: the test hands each batch to its own Automation, as a worker would
  ctx.service = await startTestService('chain-expired');
  ctx.api = client(ctx.service.url);
  const boot = await bootstrapWorkspace(ctx.service, 'chain-expired');
  ctx.key = boot.keys.tenant;
  ctx.tenantId = boot.tenant.id;
  assert.is((await ctx.api.post('/v1/workflows', ctx.key, { slug: 'x-root', trigger: { event: 'x.go' }, steps: [{ type: 'exit' }] })).status, 201);
  assert.is((await ctx.api.post('/v1/workflows', ctx.key, { slug: 'x-child', trigger: { event: '$run.completed', where: { property: 'workflow', eq: 'x-root' } }, steps: [{ type: 'exit' }] })).status, 201);
});
chains.after(async (ctx) => ctx.service.stop());

async function inboxOf(ctx: Ctx, p: number, x: string, after = '-'): Promise<StreamEntry[]> {
  return ((await ctx.service.redis.xrange(ctx.service.keys.inbox(p), after === '-' ? '-' : `(${after}`, '+')) as [string, string[]][])
    .map(([id, list]) => ({ id, fields: recordOf(list) })).filter((e) => e.fields.x === x);
}

/** The retention sweep of ended runs, its cutoff far ahead: every ended run of the partition goes. */
const expireEndedRuns = (ctx: Ctx, p: number) =>
  callScript<number>(ctx.service.redis, 'expireRuns', [ctx.service.keys.runsEnded(p)], [ctx.service.keys.partitionBase(p), Date.now() + 1e9, 100]);

/** A root run of x-root that started and ended, its `$run.completed` waiting in the inbox. */
async function endedRoot(ctx: Ctx, x: string) {
  const { service, api, key, tenantId } = ctx;
  assert.is((await api.post('/v1/subscribers', key, { externalId: x })).status, 201);
  assert.is((await api.post('/v1/events', key, { externalId: x, name: 'x.go' })).status, 202);
  const p = partitionOf(tenantId, x, service.config.partitions);
  await service.redis.set(service.keys.lease(p, WORKER_LEASES), OWNER);
  const first = await inboxOf(ctx, p, x);
  await new Automation(service.redis, service.keys, log, OWNER).handle(p, first);
  const root = ((await api.get('/v1/workflows/x-root/runs', key)).body.data.items as { id: string; externalId: string; status: string }[]).find((r) => r.externalId === x)!;
  assert.is(root.status, 'completed');
  return { p, root, next: await inboxOf(ctx, p, x, first.at(-1)!.id) };
}

const childrenOf = async (ctx: Ctx, x: string) => ((await ctx.api.get('/v1/workflows/x-child/runs', ctx.key)).body.data.items as { externalId: string }[]).filter((r) => r.externalId === x).length;

chains('a chain count is not written onto a first run the retention removed between the read and the commit: no bare hash is left for good (probe P2)', async (ctx) => {
  const { p, root, next } = await endedRoot(ctx, 'swept-meanwhile');
  const automation = new Automation(ctx.service.redis, ctx.service.keys, log, OWNER, { beforeCommit: async () => void (await expireEndedRuns(ctx, p)) });
  await automation.handle(p, next);
  assert.is(await childrenOf(ctx, 'swept-meanwhile'), 1, 'the follow-up started');
  assert.is(await ctx.service.redis.exists(ctx.service.keys.run(p, ctx.tenantId, root.id)), 0, 'the removed run stays removed');
});

chains('an event of a run the retention removed (a worker behind by more than the retention) still starts its follow-up, not refused as too wide (probe P2)', async (ctx) => {
  const { p, next } = await endedRoot(ctx, 'swept-before');
  await expireEndedRuns(ctx, p);
  const warnings: string[] = [];
  const watching: Logger = { ...log, warn: (msg: string) => void warnings.push(msg) };
  await new Automation(ctx.service.redis, ctx.service.keys, watching, OWNER).handle(p, next);
  assert.is(await childrenOf(ctx, 'swept-before'), 1);
  assert.equal(warnings.filter((w) => w.includes('too wide')), []);
});

chains('a chain whose first run the retention removed counts on from what each run left started with, not from 0 for each (probe P3: ten runs of a capped chain started ten more each)', async (ctx) => {
  const { service, api, key, tenantId } = ctx;
  const x = 'swept-wide';
  const made: string[] = [];
  const workflow = async (slug: string, trigger: object) => {
    assert.is((await api.post('/v1/workflows', key, { slug, trigger, steps: [{ type: 'exit' }] })).status, 201);
    made.push(slug);
  };
  try {
    await workflow('w-root', { event: 'w.go' });
    for (let i = 0; i < 10; i++) await workflow(`w-child-${i}`, { event: '$run.completed', where: { property: 'workflow', eq: 'w-root' } });
    for (let i = 0; i < 10; i++) await workflow(`w-grand-${i}`, { event: '$run.completed', where: { property: 'workflow', ne: 'w-root' } });
    assert.is((await api.post('/v1/subscribers', key, { externalId: x })).status, 201);
    assert.is((await api.post('/v1/events', key, { externalId: x, name: 'w.go' })).status, 202);
    const p = partitionOf(tenantId, x, service.config.partitions);
    await service.redis.set(service.keys.lease(p, WORKER_LEASES), OWNER);
    const automation = new Automation(service.redis, service.keys, log, OWNER);
    let seen = '-';
    const nextBatch = async () => {
      const batch = await inboxOf(ctx, p, x, seen);
      seen = batch.at(-1)!.id;
      await automation.handle(p, batch);
    };
    await nextBatch(); // the first run starts and ends
    const root = ((await api.get('/v1/workflows/w-root/runs', key)).body.data.items as { id: string; externalId: string }[]).find((r) => r.externalId === x)!;
    await nextBatch(); // its $run.completed starts the chain's 10
    // the sweep removes the first run only (its end is the cutoff), as when its followers outlive the retention
    const ended = await service.redis.zscore(service.keys.runsEnded(p), `${tenantId}|${root.id}`);
    await callScript<number>(service.redis, 'expireRuns', [service.keys.runsEnded(p)], [service.keys.partitionBase(p), Number(ended) + 1, 100]);
    assert.is(await service.redis.exists(service.keys.run(p, tenantId, root.id)), 0);
    await nextBatch(); // the 10's $run.completed
    const count = async (prefix: string) => {
      let n = 0;
      for (let i = 0; i < 10; i++) n += ((await api.get(`/v1/workflows/${prefix}-${i}/runs`, key)).body.data.items as { externalId: string }[]).filter((r) => r.externalId === x).length;
      return n;
    };
    assert.is(await count('w-child'), 10);
    // the run that started k-th goes on from k: 9 + 8 + … + 0 more, not 10 each
    assert.is(await count('w-grand'), 45);
  } finally {
    for (const slug of made) await api.del(`/v1/workflows/${slug}`, key);
  }
});

chains.run();
