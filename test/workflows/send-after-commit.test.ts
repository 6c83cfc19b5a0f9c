import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { Automation } from '../../actors/automation.js';
import { setClockOffset } from '../../lib/clock.js';
import { createLogger } from '../../lib/log.js';
import { partitionOf } from '../../lib/partition.js';
import { recordOf } from '../../lib/field-list.js';
import { LeaseLost } from '../../streams/apply-events.js';
import { IdentityRefs } from '../../streams/identity.js';
import { WORKER_LEASES } from '../../streams/partition-leases.js';
import { sweepRunSends } from '../../streams/run-sends.js';
import type { StreamEntry } from '../../streams/stream-consumer.js';
import { client } from '../helpers/api.js';
import { bootstrapWorkspace, startTestService, type TestService } from '../helpers/service.js';

type Ctx = { service: TestService; api: ReturnType<typeof client>; key: string; tenantId: string };
const sends = suite<Ctx>('a workflow send step\'s message is made once its batch is committed, and only then');

const OWNER = 'test-worker';
const log = createLogger('error');

sends.before(async (ctx) => {
  // no worker role: the test's own automation step handles the inbox, with hooks around its commit
  ctx.service = await startTestService('wf-send-after-commit');
  ctx.api = client(ctx.service.url);
  const boot = await bootstrapWorkspace(ctx.service, 'wf-send-commit');
  ctx.key = boot.keys.tenant;
  ctx.tenantId = boot.tenant.id;
  const branch = { type: 'branch', if: { attribute: 'plan', eq: 'gold' }, then: [{ type: 'send', message: { title: 'G', body: 'gold' } }], else: [{ type: 'send', message: { title: 'S', body: 'silver' } }] };
  assert.is((await ctx.api.post('/v1/workflows', ctx.key, { slug: 'tiered', trigger: { event: 'go' }, steps: [branch] })).status, 201);
  const then = { type: 'wait', event: 'next', timeout: '1h', onEvent: [{ type: 'send', message: { title: 'C', body: 'after' } }] };
  assert.is((await ctx.api.post('/v1/workflows', ctx.key, { slug: 'ordered', trigger: { event: 'begin' }, steps: [{ type: 'send', message: { title: 'A', body: 'first' } }, then] })).status, 201);
});
sends.after(async (ctx) => ctx.service.stop());

/** A gold subscriber who just tracked `go`: its partition, leased to this test, and the inbox entries its worker would handle. */
async function goldGo(ctx: Ctx, externalId: string, name = 'go'): Promise<{ p: number; entries: StreamEntry[] }> {
  const { service, api, key, tenantId } = ctx;
  assert.is((await api.post('/v1/subscribers', key, { externalId, properties: { plan: 'gold' } })).status, 201);
  assert.is((await api.post('/v1/events', key, { externalId, name })).status, 202);
  const p = partitionOf(tenantId, externalId, service.config.partitions);
  await service.redis.set(service.keys.lease(p, WORKER_LEASES), OWNER);
  return { p, entries: await inboxOf(ctx, p, externalId) };
}

/** The inbox entries of `externalId` in partition `p`, after those of `after` (an entry id). */
async function inboxOf(ctx: Ctx, p: number, externalId: string, after = '-'): Promise<StreamEntry[]> {
  return ((await ctx.service.redis.xrange(ctx.service.keys.inbox(p), after === '-' ? '-' : `(${after}`, '+')) as [string, string[]][])
    .map(([id, list]) => ({ id, fields: recordOf(list) })).filter((e) => e.fields.x === externalId);
}

async function messagesTo(ctx: Ctx, externalId: string): Promise<{ id: string; content: { title: string }; run: { runId: string } }[]> {
  const items = (await ctx.api.get('/v1/messages?limit=100', ctx.key)).body.data.items as { id: string; to: { externalId?: string }; content: { title: string }; run: { runId: string } }[];
  return items.filter((m) => m.to.externalId === externalId);
}

sends('a batch computed again after its worker died before the commit sends only what the commit records (probe ER: the first attempt\'s sends of a path no run took were pushed)', async (ctx) => {
  const { service, api, key } = ctx;
  const { p, entries } = await goldGo(ctx, 'flipper');
  let attempts = 0;
  const automation = new Automation(service.redis, service.keys, log, OWNER, {
    // the first attempt computed the gold branch; its worker dies before the commit, and the plan changes meanwhile
    beforeCommit: async () => {
      if (attempts++ > 0) return;
      assert.is((await api.patch('/v1/subscribers/flipper', key, { properties: { plan: 'silver' } })).status, 200);
      throw new LeaseLost(p);
    },
  });
  await automation.handle(p, entries).then(() => assert.unreachable('the first attempt was to fail'), (err) => assert.instance(err, LeaseLost));
  assert.equal(await messagesTo(ctx, 'flipper'), [], 'nothing made before the commit');
  await automation.handle(p, entries);
  const made = await messagesTo(ctx, 'flipper');
  assert.equal(made.map((m) => m.content.title), ['S'], 'the silver send only, the path the run took');
  const runs = (await api.get('/v1/workflows/tiered/runs', key)).body.data.items as { id: string; externalId: string }[];
  assert.equal(runs.filter((r) => r.externalId === 'flipper').map((r) => r.id), [made[0]!.run.runId]);
});

sends('a worker killed after its commit leaves the message to the sweeper, which makes it once, with the id the run names', async (ctx) => {
  const { service, api, key } = ctx;
  const { p, entries } = await goldGo(ctx, 'orphan');
  const automation = new Automation(service.redis, service.keys, log, OWNER, {
    afterCommit: async () => {
      throw new LeaseLost(p);
    },
  });
  await automation.handle(p, entries).then(() => assert.unreachable('the worker was to die'), (err) => assert.instance(err, LeaseLost));
  assert.equal(await messagesTo(ctx, 'orphan'), [], 'not made by the dead worker');
  assert.is(await service.redis.hlen(service.keys.runSends(p)), 1, 'owed in the partition');
  const refs = new IdentityRefs(service.redis, service.keys);
  assert.equal(await sweepRunSends(service.redis, service.keys, service.config.partitions, refs, 0, log), { finished: 1, kept: 0 });
  assert.equal(await sweepRunSends(service.redis, service.keys, service.config.partitions, refs, 0, log), { finished: 0, kept: 0 }, 'once');
  const made = await messagesTo(ctx, 'orphan');
  assert.equal(made.map((m) => m.content.title), ['G']);
  const subscriberId = (await api.get('/v1/subscribers/orphan', key)).body.data.id as string;
  assert.is(await service.redis.hget(service.keys.message(ctx.tenantId, made[0]!.id), 'sid'), subscriberId, 'for the run\'s subscriber only');
  const run = ((await api.get('/v1/workflows/tiered/runs', key)).body.data.items as { id: string; externalId: string }[]).find((r) => r.externalId === 'orphan')!;
  assert.is(made[0]!.run.runId, run.id);
  const detail = (await api.get(`/v1/workflows/tiered/runs/${run.id}`, key)).body.data as { history: { messageId?: string | null }[] };
  assert.ok(detail.history.some((s) => s.messageId === made[0]!.id), 'the run\'s step names the message made');
});

sends('a send left by a worker killed after its commit goes out before the run\'s next send, made by the next commit of the partition (probe EV: the next step went first, the left one ~16 s later by the sweeper)', async (ctx) => {
  const { service, api, key } = ctx;
  const { p, entries } = await goldGo(ctx, 'stepper', 'begin');
  const dying = new Automation(service.redis, service.keys, log, OWNER, { afterCommit: async () => { throw new LeaseLost(p); } });
  await dying.handle(p, entries).then(() => assert.unreachable('the worker was to die'), (err) => assert.instance(err, LeaseLost));
  assert.equal(await messagesTo(ctx, 'stepper'), [], 'A not made by the dead worker');
  assert.is((await api.post('/v1/events', key, { externalId: 'stepper', name: 'next' })).status, 202);
  const next = await inboxOf(ctx, p, 'stepper', entries[entries.length - 1]!.id);
  await new Automation(service.redis, service.keys, log, OWNER).handle(p, next);
  const made = await messagesTo(ctx, 'stepper');
  assert.equal(made.map((m) => m.content.title).sort(), ['A', 'C'], 'both made by the next commit');
  const [a, c] = ['A', 'C'].map((t) => made.find((m) => m.content.title === t)! as unknown as { createdAt: string });
  assert.ok(Date.parse(a!.createdAt) <= Date.parse(c!.createdAt), 'A first');
  assert.is(await service.redis.hlen(service.keys.runSends(p)), 0, 'nothing owed');
});

sends('a run that sent in the batch that also holds its subscriber\'s delete names a message that exists (probe EV: the send was dropped, the run said sent)', async (ctx) => {
  const { service, api, key } = ctx;
  const { p } = await goldGo(ctx, 'leaver');
  assert.is((await api.del('/v1/subscribers/leaver', key)).status, 200);
  const entries = await inboxOf(ctx, p, 'leaver');
  assert.ok(entries.some((e) => e.fields.n === '$subscriber.deleted'), 'the delete is in the batch');
  await new Automation(service.redis, service.keys, log, OWNER).handle(p, entries);
  const runs = (await api.get('/v1/workflows/tiered/runs', key)).body.data.items as { id: string; externalId: string; history: { messageId?: string | null }[] }[];
  const run = runs.find((r) => r.externalId === 'leaver')!;
  const messageId = run.history.find((h) => h.messageId)?.messageId;
  assert.ok(messageId, 'the run sent');
  assert.is((await api.get(`/v1/messages/${messageId}`, key)).status, 200, 'and its message exists');
});

sends('a run of a subscriber deleted and created again before the worker got to it sends to the deleted one only (probe EV2: the new one\'s device got the push)', async (ctx) => {
  const { service, api, key } = ctx;
  const { p } = await goldGo(ctx, 'reborn');
  const oldId = (await api.get('/v1/subscribers/reborn', key)).body.data.id as string;
  assert.is((await api.del('/v1/subscribers/reborn', key)).status, 200);
  assert.is((await api.post('/v1/subscribers', key, { externalId: 'reborn' })).status, 201);
  const newId = (await api.get('/v1/subscribers/reborn', key)).body.data.id as string;
  await new Automation(service.redis, service.keys, log, OWNER).handle(p, await inboxOf(ctx, p, 'reborn'));
  const [made] = await messagesTo(ctx, 'reborn');
  assert.ok(made, 'the run sent');
  assert.is(await service.redis.hget(service.keys.message(ctx.tenantId, made!.id), 'sid'), oldId, `for ${oldId}, not ${newId}`);
});

/**
 * A silver subscriber's run of a workflow that sleeps a minute, then branches on `plan` (gold: `<prefix>G`, else `<prefix>S`),
 * handled by this test's worker; then, two minutes on, the subscriber deleted and created again as gold, and `handleLater` run.
 * Answers the titles of the messages made for the externalId, and whether each is for the deleted subscriber (its `sid`).
 */
async function napThroughRebirth(ctx: Ctx, externalId: string, prefix: string, handleLater: (p: number, automation: Automation, asleep: StreamEntry[], timer: string) => Promise<void>): Promise<{ titles: string[]; forOld: boolean[] }> {
  const { service, api, key, tenantId } = ctx;
  const branch = { type: 'branch', if: { attribute: 'plan', eq: 'gold' }, then: [{ type: 'send', message: { title: `${prefix}G`, body: 'gold' } }], else: [{ type: 'send', message: { title: `${prefix}S`, body: 'not gold' } }] };
  assert.is((await api.post('/v1/workflows', key, { slug: `${externalId}-flow`, trigger: { event: `${externalId}-nap` }, steps: [{ type: 'sleep', duration: '1m' }, branch] })).status, 201);
  assert.is((await api.post('/v1/subscribers', key, { externalId, properties: { plan: 'silver' } })).status, 201);
  const oldId = (await api.get(`/v1/subscribers/${externalId}`, key)).body.data.id as string;
  assert.is((await api.post('/v1/events', key, { externalId, name: `${externalId}-nap` })).status, 202);
  const p = partitionOf(tenantId, externalId, service.config.partitions);
  await service.redis.set(service.keys.lease(p, WORKER_LEASES), OWNER);
  const automation = new Automation(service.redis, service.keys, log, OWNER);
  const asleep = await inboxOf(ctx, p, externalId);
  await automation.handle(p, asleep);
  const run = ((await api.get(`/v1/workflows/${externalId}-flow/runs`, key)).body.data.items as { id: string; externalId: string }[]).find((r) => r.externalId === externalId)!;
  const timer = await service.redis.hget(service.keys.run(p, tenantId, run.id), 'timer');
  assert.ok(timer, 'the run sleeps');
  setClockOffset(2 * 60_000);
  try {
    assert.is((await api.del(`/v1/subscribers/${externalId}`, key)).status, 200);
    assert.is((await api.post('/v1/subscribers', key, { externalId, properties: { plan: 'gold' } })).status, 201);
    await handleLater(p, automation, asleep, timer!);
  } finally {
    setClockOffset(0);
  }
  const made = await messagesTo(ctx, externalId);
  const sids = await Promise.all(made.map((m) => service.redis.hget(service.keys.message(tenantId, m.id), 'sid')));
  return { titles: made.map((m) => m.content.title), forOld: sids.map((sid) => sid === oldId) };
}

sends('a deleted subscriber\'s run whose sleep ended before the delete branches on that subscriber as it is now, gone, not on the one created again under its externalId (probe FA: it took the new one\'s attributes)', async (ctx) => {
  // the worker comes back after the sleep's end and handles the inbox: the delete and the new subscriber behind the sleep's end
  const made = await napThroughRebirth(ctx, 'napper', 'N', async (p, automation, asleep) => automation.handle(p, await inboxOf(ctx, p, 'napper', asleep.at(-1)!.id)));
  assert.equal(made, { titles: ['NS'], forOld: [true] }, 'the branch saw the deleted subscriber, with no plan');
});

sends('so does one whose batch holds its timer alone, read before the delete and handled after the subscriber was created again: its send is for the deleted subscriber (probe FG: it took the new one\'s branch, and its message was for the new one)', async (ctx) => {
  // the timer's inbox entry as the scheduler writes it when the sleep ends, handled on its own
  const made = await napThroughRebirth(ctx, 'lone-napper', 'A', (p, automation, asleep, timer) => automation.handle(p, [
    { id: '9999999999999-0', fields: { t: ctx.tenantId, w: asleep[0]!.fields.w!, x: 'lone-napper', k: 'timer', tm: timer } },
  ]));
  assert.equal(made, { titles: ['AS'], forOld: [true] }, 'the branch saw the deleted subscriber, with no plan; the message is for it');
});

sends('a run of a subscriber created again, its items handled by a worker of an earlier version (which keeps no `u`), whose batch holds its timer alone, branches on and sends to that subscriber (probe K: the stale `u` named the deleted one; wrong branch, sent to nobody)', async (ctx) => {
  const { service, api, key, tenantId } = ctx;
  const x = 'rolled-napper';
  const branch = { type: 'branch', if: { attribute: 'plan', eq: 'gold' }, then: [{ type: 'send', message: { title: 'RG', body: 'gold' } }], else: [{ type: 'send', message: { title: 'RS', body: 'not gold' } }] };
  assert.is((await api.post('/v1/workflows', key, { slug: `${x}-flow`, trigger: { event: `${x}-nap` }, steps: [{ type: 'sleep', duration: '1m' }, branch] })).status, 201);
  assert.is((await api.post('/v1/subscribers', key, { externalId: x, properties: { plan: 'silver' } })).status, 201);
  assert.is((await api.post('/v1/events', key, { externalId: x, name: `${x}-nap` })).status, 202);
  const p = partitionOf(tenantId, x, service.config.partitions);
  await service.redis.set(service.keys.lease(p, WORKER_LEASES), OWNER);
  const automation = new Automation(service.redis, service.keys, log, OWNER);
  const first = await inboxOf(ctx, p, x);
  await automation.handle(p, first);
  const autoKey = service.keys.automation(p, tenantId, x);
  const [u, us] = await service.redis.hmget(autoKey, 'u', 'us');
  assert.ok(u && us, `this version keeps u with the sequence it stands at: ${JSON.stringify(await service.redis.hgetall(autoKey))}`);
  // deleted and created again, its new self triggers the workflow: all handled by an earlier version's
  // worker, which advances the cursor and leaves u and us as they were (here: handled, then set back)
  assert.is((await api.del(`/v1/subscribers/${x}`, key)).status, 200);
  assert.is((await api.post('/v1/subscribers', key, { externalId: x, properties: { plan: 'gold' } })).status, 201);
  const newId = (await api.get(`/v1/subscribers/${x}`, key)).body.data.id as string;
  assert.is((await api.post('/v1/events', key, { externalId: x, name: `${x}-nap` })).status, 202);
  const later = await inboxOf(ctx, p, x, first.at(-1)!.id);
  await automation.handle(p, later);
  await service.redis.hset(autoKey, 'u', u!, 'us', us!);
  assert.ok(Number(await service.redis.hget(autoKey, 'seq')) > Number(us), 'the cursor moved on past us');
  // the deleted subscriber's run was canceled with it; its successor's sleeps
  const runs = (await api.get(`/v1/workflows/${x}-flow/runs`, key)).body.data.items as { id: string; status: string }[];
  assert.equal(runs.map((r) => r.status), ['sleeping', 'canceled']);
  const timer = await service.redis.hget(service.keys.run(p, tenantId, runs[0]!.id), 'timer');
  assert.ok(timer, 'the new subscriber\'s run sleeps');
  setClockOffset(2 * 60_000);
  try {
    // the run's timer, handled on its own by this version's worker
    await automation.handle(p, [{ id: '9999999999999-0', fields: { t: tenantId, w: first[0]!.fields.w!, x, k: 'timer', tm: timer! } }]);
  } finally {
    setClockOffset(0);
  }
  const made = await messagesTo(ctx, x);
  const sids = await Promise.all(made.map((m) => service.redis.hget(service.keys.message(tenantId, m.id), 'sid')));
  assert.equal({ titles: made.map((m) => m.content.title), sids }, { titles: ['RG'], sids: [newId] }, 'the branch saw the subscriber the run is for, and the message is for it');
});

sends.run();
