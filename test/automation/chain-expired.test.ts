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

chains.run();
