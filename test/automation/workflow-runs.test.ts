import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { client } from '../helpers/api.js';
import type { ApnsPeer } from '../helpers/apns-peer.js';
import { apnsCredentials, pushSetup } from '../helpers/push-setup.js';
import { rawRequest } from '../helpers/raw-request.js';
import { bootstrapWorkspace, holdRetentionSweeps, runSendsMade, startTestService, type TestService } from '../helpers/service.js';
import { waitFor } from '../helpers/wait.js';
import { actorsCaughtUp } from '../helpers/inbox.js';
import { partitionOf } from '../../lib/partition.js';
import { findRun } from '../../streams/workflow-runs.js';
import { sweepRetention } from '../../actors/retention-sweeper.js';
import { setClockOffset } from '../../lib/clock.js';

type Ctx = { service: TestService; api: ReturnType<typeof client>; key: string; client: string; tenantId: string; peer: ApnsPeer };
const wf = suite<Ctx>('workflow runs');

wf.before(async (ctx) => {
  const { peer, key, env } = await pushSetup();
  ctx.peer = peer;
  ctx.service = await startTestService('workflow-runs', { ...env, PARTITION_LEASE_MS: '1000' }, ['web', 'worker', 'scheduler', 'dispatcher']);
  await holdRetentionSweeps(ctx.service); // the retention test's sweeps count what they expire
  ctx.api = client(ctx.service.url);
  const boot = await bootstrapWorkspace(ctx.service, 'wf-runs');
  ctx.key = boot.keys.tenant;
  ctx.client = boot.keys.client;
  ctx.tenantId = boot.tenant.id;
  await ctx.api.call('PUT', '/v1/apps/apns', { key: ctx.key, body: apnsCredentials(key) });
});
wf.after(async (ctx) => {
  await ctx.service.stop();
  await ctx.peer.close();
});

let tokens = 0;
async function device(ctx: Ctx, externalId: string): Promise<string> {
  const token = (0x9000 + tokens++).toString(16).padStart(64, 'e');
  const res = await ctx.api.post('/v1/client/subscriptions', ctx.client, { externalId, channel: 'push', token, platform: 'ios' });
  assert.is(res.status, 201, res.text);
  return token;
}
const runsOf = async (ctx: Ctx, slug: string, query = '') => (await ctx.api.get(`/v1/workflows/${slug}/runs?limit=100${query}`, ctx.key)).body.data;
const runOf = async (ctx: Ctx, slug: string, externalId: string, status?: string) => {
  const page = await runsOf(ctx, slug, status ? `&status=${status}` : '');
  return page.items.find((r: any) => r.externalId === externalId) ?? null;
};
const pushesTo = (ctx: Ctx, token: string) => ctx.peer.requests.filter((r) => r.token === token);

wf('a trigger starts a run that sleeps, branches on an attribute and sends once, with its events on the stream', async (ctx) => {
  const { api, key } = ctx;
  const created = await api.post('/v1/workflows', key, {
    slug: 'welcome', name: 'Welcome',
    trigger: { event: 'signed.up' },
    steps: [
      { type: 'sleep', duration: '4s' },
      { type: 'branch', if: { attribute: 'plan', eq: 'pro' }, then: [{ type: 'send', name: 'pro-hello', message: { title: 'Welcome, pro', body: 'Thanks' } }], else: [{ type: 'send', message: { title: 'Welcome', body: 'Try pro' } }] },
    ],
  });
  assert.is(created.status, 201, created.text);
  const token = await device(ctx, 'wf-ann');
  await api.post('/v1/subscribers', key, { externalId: 'wf-ann', properties: { plan: 'pro' } });
  await api.post('/v1/events', key, { externalId: 'wf-ann', name: 'signed.up', data: {} });
  const sleeping = await waitFor('the run to sleep', () => runOf(ctx, 'welcome', 'wf-ann', 'sleeping'), 10_000);
  assert.is(sleeping.step, 'steps[0]');
  assert.ok(sleeping.wakeAt, 'wakeAt is set');
  const done = await waitFor('the run to complete', () => runOf(ctx, 'welcome', 'wf-ann', 'completed'), 15_000);
  const one = (await api.get(`/v1/workflows/welcome/runs/${done.id}`, key)).body.data;
  assert.equal(one.history.map((h: any) => `${h.step}:${h.outcome}`), ['steps[0]:sleeping', 'steps[0]:woke', 'steps[1]:then', 'steps[1].then[0]:sent']);
  assert.is(one.history[3].name, 'pro-hello', 'a named step is named in the history');
  const messageId = one.history[3].messageId;
  assert.match(messageId, /^msg_/);
  const message = await waitFor('the message to be sent', async () => {
    const m = (await api.get(`/v1/messages/${messageId}`, key)).body.data;
    return m.status === 'completed' ? m : null;
  }, 10_000);
  assert.is(message.content.title, 'Welcome, pro');
  assert.is(message.content.priority, 'high', 'the default priority, as a message sent through the API gets it (probe T)');
  assert.equal(message.run, { runId: done.id, step: 'steps[1].then[0]', workflowId: created.body.data.id, workflow: 'welcome', versionId: created.body.data.versionId });
  assert.is(pushesTo(ctx, token).length, 1);
  const timeline = await waitFor('the run events on the timeline', async () => {
    const items = (await api.get('/v1/subscribers/wf-ann/timeline?limit=100', key)).body.data.items as any[];
    return items.some((e) => e.name === '$send') && items.some((e) => e.name === '$run.completed') ? [...items].reverse() : null;
  }, 10_000);
  assert.equal(timeline.map((e: any) => e.name).filter((n: string) => n.startsWith('$run')), ['$run.started', '$run.step', '$run.step', '$run.step', '$run.step', '$run.completed']);
  const send = timeline.find((e: any) => e.name === '$send');
  assert.is(send.data.workflow, 'welcome');
  assert.is(send.runId, done.id);
  assert.is(send.step, 'steps[1].then[0]');
  const started = timeline.find((e: any) => e.name === '$run.started');
  assert.is(started.runId, done.id);
  const sentStep = timeline.find((e: any) => e.name === '$run.step' && e.messageId);
  assert.is(sentStep.step, 'steps[1].then[0]');
  assert.is(sentStep.messageId, messageId);
});

wf('a wait resumes on the awaited event, times out to its other branch, and cancelOn ends a waiting run', async (ctx) => {
  const { api, key } = ctx;
  await api.post('/v1/workflows', key, {
    slug: 'cart-nudge',
    trigger: { event: 'cart.updated' },
    cancelOn: { event: 'account.closed' },
    // the timeout counts from each trigger's arrival: long enough that the buyer's and the leaver's events
    // arrive before it, after the three runs were seen waiting, on a loaded machine (2 s left little room)
    steps: [{
      type: 'wait', event: 'checkout.completed', where: { property: 'total', gte: 1 }, timeout: '8s',
      onEvent: [{ type: 'exit' }],
      onTimeout: [{ type: 'send', message: { title: 'Your cart', body: 'is waiting' } }],
    }],
  });
  for (const x of ['buyer', 'idler', 'leaver']) await api.post('/v1/events', key, { externalId: x, name: 'cart.updated', data: {} });
  await waitFor('three waiting runs', async () => (await runsOf(ctx, 'cart-nudge', '&status=waiting')).total === 3, 10_000);
  await api.post('/v1/events', key, { externalId: 'buyer', name: 'checkout.completed', data: { total: 0 } }); // where false: still waiting
  await api.post('/v1/events', key, { externalId: 'buyer', name: 'checkout.completed', data: { total: 30 } });
  await api.post('/v1/events', key, { externalId: 'leaver', name: 'account.closed', data: {} });
  const buyer = await waitFor('buyer completes by the event', () => runOf(ctx, 'cart-nudge', 'buyer', 'completed'), 10_000);
  assert.equal(buyer.history.map((h: any) => h.outcome), ['waiting', 'event', 'exit']);
  const leaver = await waitFor('leaver canceled', () => runOf(ctx, 'cart-nudge', 'leaver', 'canceled'), 10_000);
  assert.is(leaver.reason, 'canceled_by_event');
  const idler = await waitFor('idler times out and is nudged', () => runOf(ctx, 'cart-nudge', 'idler', 'completed'), 30_000);
  assert.equal(idler.history.map((h: any) => h.outcome), ['waiting', 'timeout', 'sent']);
  const page = await runsOf(ctx, 'cart-nudge');
  assert.is(page.total, 3);
  assert.is((await runsOf(ctx, 'cart-nudge', '&status=canceled')).total, 1);
  assert.is((await runsOf(ctx, 'cart-nudge', '&status=waiting')).total, 0);
});

wf('two versions run side by side: runs keep the version they started on', async (ctx) => {
  const { api, key } = ctx;
  await api.post('/v1/workflows', key, { slug: 'versions', trigger: { event: 'v.start' }, steps: [{ type: 'sleep', duration: '5s' }, { type: 'send', message: { title: 'v1', body: 'first' } }] });
  await device(ctx, 'ver-old');
  await device(ctx, 'ver-new');
  await api.post('/v1/events', key, { externalId: 'ver-old', name: 'v.start', data: {} });
  await waitFor('the v1 run sleeps', () => runOf(ctx, 'versions', 'ver-old', 'sleeping'), 10_000);
  const patched = await api.patch('/v1/workflows/versions', key, { steps: [{ type: 'send', message: { title: 'v2', body: 'second' } }] });
  assert.is(patched.body.data.version, 2);
  await api.post('/v1/events', key, { externalId: 'ver-new', name: 'v.start', data: {} });
  const newer = await waitFor('the v2 run completes', () => runOf(ctx, 'versions', 'ver-new', 'completed'), 10_000);
  assert.is(newer.version, 2);
  const older = await waitFor('the v1 run completes on v1', () => runOf(ctx, 'versions', 'ver-old', 'completed'), 15_000);
  assert.is(older.version, 1);
  await runSendsMade(ctx.service);
  const titles = async (run: any) => (await api.get(`/v1/messages/${run.history.find((h: any) => h.messageId).messageId}`, key)).body.data.content.title;
  assert.is(await titles(older), 'v1');
  assert.is(await titles(newer), 'v2');
});

wf('a run of an old version reads the topics and subscriptions its version names, though the current version reads none', async (ctx) => {
  const { api, key } = ctx;
  await api.post('/v1/topics', key, { slug: 'ver-vip' });
  const created = await api.post('/v1/workflows', key, {
    slug: 'old-branch', trigger: { event: 'ob.start' },
    steps: [
      { type: 'sleep', duration: '4s' },
      { type: 'branch', if: { all: [{ topic: 'ver-vip' }, { subscription: { channel: 'push', enabled: true } }] }, then: [{ type: 'exit', name: 'yes' }], else: [{ type: 'exit', name: 'no' }] },
    ],
  });
  assert.is(created.status, 201, created.text);
  await device(ctx, 'ob-ann');
  await api.post('/v1/topics/ver-vip/subscribers', key, { externalIds: ['ob-ann'] });
  await api.post('/v1/events', key, { externalId: 'ob-ann', name: 'ob.start', data: {} });
  await waitFor('the v1 run sleeps', () => runOf(ctx, 'old-branch', 'ob-ann', 'sleeping'), 10_000);
  assert.is((await api.patch('/v1/workflows/old-branch', key, { steps: [{ type: 'exit' }] })).body.data.version, 2);
  const done = await waitFor('the v1 run wakes and branches', () => runOf(ctx, 'old-branch', 'ob-ann', 'completed'), 15_000);
  assert.is(done.version, 1);
  assert.ok(done.history.some((h: any) => h.step === 'steps[1]' && h.outcome === 'then'), JSON.stringify(done.history));
});

wf('a run never starts its own workflow again, a deleted subscriber cancels its run, a disabled workflow starts nothing', async (ctx) => {
  const { api, key } = ctx;
  await device(ctx, 'echo');
  // triggered by $send: its own send must not start it again (it would loop forever)
  await api.post('/v1/workflows', key, { slug: 'echo', trigger: { event: '$send' }, steps: [{ type: 'send', message: { title: 'echo', body: 'once' } }] });
  await api.post('/v1/messages', key, { to: 'echo', title: 'hello', body: 'world' });
  await waitFor('the echo run completes', () => runOf(ctx, 'echo', 'echo', 'completed'), 15_000);
  await new Promise((r) => setTimeout(r, 1_500));
  // (the tenant's other subscribers' $send events, such as the previous test's late deliveries, may start runs of their own)
  assert.is((await runsOf(ctx, 'echo')).items.filter((r: any) => r.externalId === 'echo').length, 1, 'exactly one run');
  await api.patch('/v1/workflows/echo', key, { enabled: false });
  const runsWhenDisabled = (await runsOf(ctx, 'echo')).total;

  await api.post('/v1/workflows', key, { slug: 'long-sleep', trigger: { event: 'nap' }, steps: [{ type: 'sleep', duration: '1h' }, { type: 'exit' }] });
  await api.post('/v1/events', key, { externalId: 'sleeper', name: 'nap', data: {} });
  await waitFor('the sleeper sleeps', () => runOf(ctx, 'long-sleep', 'sleeper', 'sleeping'), 10_000);
  await api.del('/v1/subscribers/sleeper', key);
  const canceled = await waitFor('the run is canceled', () => runOf(ctx, 'long-sleep', 'sleeper', 'canceled'), 10_000);
  assert.is(canceled.reason, 'subscriber_deleted');

  await api.post('/v1/messages', key, { to: 'echo', title: 'again', body: 'disabled now' });
  await new Promise((r) => setTimeout(r, 1_500));
  assert.is((await runsOf(ctx, 'echo')).total, runsWhenDisabled, 'a disabled workflow starts no run');
});

wf('$subscription.removed starts a run when a device goes, but not when its subscriber is deleted (nobody is left to send to)', async (ctx) => {
  const { api, key } = ctx;
  await api.post('/v1/workflows', key, { slug: 'device-gone', trigger: { event: '$subscription.removed' }, steps: [{ type: 'sleep', duration: '1h' }, { type: 'exit' }] });
  await device(ctx, 'keeps-one');
  await device(ctx, 'keeps-one');
  await device(ctx, 'leaves');
  const held = (await api.get('/v1/subscribers/keeps-one/subscriptions', key)).body.data.items;
  assert.is((await api.del(`/v1/subscribers/keeps-one/subscriptions/${held[0].id}`, key)).status, 200);
  assert.is((await api.del('/v1/subscribers/leaves', key)).status, 200);
  await waitFor('the run of the removed device', () => runOf(ctx, 'device-gone', 'keeps-one', 'sleeping'), 10_000);
  await waitFor('the actors through the delete', () => actorsCaughtUp(ctx.service, partitionOf(ctx.tenantId, 'leaves', ctx.service.config.partitions)), 10_000);
  assert.is(await runOf(ctx, 'device-gone', 'leaves'), null, 'no run for the deleted subscriber');
});

/** What the service answers (status line to body) a raw request whose Idempotency-Key holds `value` (bytes as latin1). */
async function rawAnswer(url: string, key: string, value: string): Promise<string> {
  const { hostname } = new URL(url);
  return (await rawRequest(url, Buffer.concat([
    Buffer.from(`POST /v1/messages HTTP/1.1\r\nHost: ${hostname}\r\nAuthorization: Bearer ${key}\r\nContent-Type: application/json\r\nIdempotency-Key: `),
    Buffer.from(value, 'latin1'),
    Buffer.from('\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}'),
  ]))).text;
}

wf('a caller\'s Idempotency-Key spelling a run step\'s key neither breaks the run\'s send nor replays its message', async (ctx) => {
  const { api, key } = ctx;
  await api.post('/v1/workflows', key, { slug: 'idem-clash', trigger: { event: 'ic.start' }, steps: [{ type: 'sleep', duration: '4s' }, { type: 'send', message: { title: 'From workflow', body: 'wf body' } }] });
  const token = await device(ctx, 'ic-user');
  await api.post('/v1/events', key, { externalId: 'ic-user', name: 'ic.start', data: {} });
  const sleeping = await waitFor('the run to sleep', () => runOf(ctx, 'idem-clash', 'ic-user', 'sleeping'), 10_000);
  // the key the engine used before it had a namespace of its own, with the very content of the step
  const clash = { 'Idempotency-Key': `run:${sleeping.id}:steps[1]` };
  const mine = await api.call('POST', '/v1/messages', { key, body: { to: 'ic-user', title: 'From workflow', body: 'wf body' }, headers: clash });
  assert.is(mine.status, 202, mine.text);
  assert.is(mine.headers.get('idempotent-replayed'), null);
  assert.is(mine.body.data.run, null);
  const done = await waitFor('the run to complete', () => runOf(ctx, 'idem-clash', 'ic-user', 'completed'), 15_000);
  assert.equal(done.history.map((h: any) => `${h.step}:${h.outcome}`), ['steps[0]:sleeping', 'steps[0]:woke', 'steps[1]:sent']);
  const sent = done.history[2].messageId;
  assert.is.not(sent, mine.body.data.id);
  assert.is((await api.get(`/v1/messages/${sent}`, key)).body.data.run.runId, done.id);
  // the caller's key still answers the caller's own message, unchanged
  const again = await api.call('POST', '/v1/messages', { key, body: { to: 'ic-user', title: 'From workflow', body: 'wf body' }, headers: clash });
  assert.is(again.headers.get('idempotent-replayed'), 'true');
  assert.is(again.body.data.id, mine.body.data.id);
  const other = await api.call('POST', '/v1/messages', { key, body: { to: 'ic-user', title: 'Other', body: 'request' }, headers: clash });
  assert.is(other.body.error.code, 'idempotency_key_reused');
  await waitFor('both messages pushed, once each', async () => pushesTo(ctx, token).length === 2, 10_000);
  // the engine's keys begin with NUL, which no header value can carry: Node refuses it before any route
  const refused = await rawAnswer(ctx.service.url, key, `\u0000run:${done.id}:steps[1]`);
  assert.match(refused, /^HTTP\/1\.1 400 /);
  // Node's refusal, in the envelope (http/middleware/errors.ts answerUnparsedRequest): `bad_request` on `request`, where a route answers `validation` on the header
  assert.match(refused, /"error":\{"code":"bad_request","message":"The request is not well-formed HTTP","param":"request"/, 'refused by Node, not by a route');
  assert.match(await rawAnswer(ctx.service.url, key, 'plain-key'), /"code":"validation"/, 'the same probe with a plain key reaches the route ({} fails its schema)');
});

wf('deleting a workflow cancels its sleeping and waiting runs at their next step (timer, timeout or awaited event), sending nothing', async (ctx) => {
  const { api, key, service, tenantId } = ctx;
  // the worker of this service starts every run below, so it holds their versions in its cache when the workflows go
  // (the sleep and the timeout count from each trigger's arrival: long enough that the deletes come first on a loaded machine)
  const sleepy = (await api.post('/v1/workflows', key, { slug: 'del-sleep', trigger: { event: 'ds.start' }, steps: [{ type: 'sleep', duration: '8s' }, { type: 'send', message: { title: 'd', body: 'd' } }] })).body.data;
  const waitEvent = (await api.post('/v1/workflows', key, { slug: 'del-wait-event', trigger: { event: 'dwe.start' }, steps: [{ type: 'wait', event: 'dwe.go', timeout: '1h', onEvent: [{ type: 'send', message: { title: 'e', body: 'e' } }] }, { type: 'send', message: { title: 'f', body: 'f' } }] })).body.data;
  const waitTimeout = (await api.post('/v1/workflows', key, { slug: 'del-wait-timeout', trigger: { event: 'dwt.start' }, steps: [{ type: 'wait', event: 'dwt.go', timeout: '8s', onTimeout: [{ type: 'send', message: { title: 't', body: 't' } }] }, { type: 'send', message: { title: 'u', body: 'u' } }] })).body.data;
  const cases = [
    { wf: sleepy, slug: 'del-sleep', x: 'del-sleeper', start: 'ds.start', status: 'sleeping' },
    { wf: waitEvent, slug: 'del-wait-event', x: 'del-awaiter', start: 'dwe.start', status: 'waiting' },
    { wf: waitTimeout, slug: 'del-wait-timeout', x: 'del-timer', start: 'dwt.start', status: 'waiting' },
  ];
  const tokens = new Map<string, string>();
  for (const c of cases) {
    tokens.set(c.x, await device(ctx, c.x));
    await api.post('/v1/events', key, { externalId: c.x, name: c.start, data: {} });
  }
  const runIds = new Map<string, string>();
  for (const c of cases) runIds.set(c.x, (await waitFor(`${c.slug} to be ${c.status}`, () => runOf(ctx, c.slug, c.x, c.status), 10_000)).id);
  for (const c of cases) assert.is((await api.del(`/v1/workflows/${c.slug}`, key)).status, 200);
  assert.is((await api.get('/v1/workflows/del-sleep/runs', key)).status, 404, 'the runs of a deleted workflow are not listed any more');
  // the awaited event, after the delete, reaches the run at once (its wait lasts an hour)
  await api.post('/v1/events', key, { externalId: 'del-awaiter', name: 'dwe.go', data: {} });
  const scope = { tenantId, partitions: service.config.partitions };
  for (const c of cases) {
    const run = await waitFor(`the ${c.slug} run to be canceled`, async () => {
      const r = await findRun(service.redis, service.keys, scope, c.wf.id, runIds.get(c.x)!);
      return r && r.status !== c.status ? r : null;
    }, 20_000);
    assert.is(run.status, 'canceled', c.slug);
    assert.is(run.reason, 'workflow_deleted', c.slug);
    assert.ok(run.history.every((h: any) => h.type !== 'send'), `${c.slug}: no step ran after the delete`);
    const timeline = await waitFor(`${c.x}'s $run.canceled on the timeline`, async () => {
      const items = (await api.get(`/v1/subscribers/${c.x}/timeline?limit=100`, key)).body.data.items as any[];
      return items.some((e) => e.name === '$run.canceled') ? items : null;
    }, 10_000);
    assert.is(timeline.find((e) => e.name === '$run.canceled').data.reason, 'workflow_deleted');
    assert.not.ok(timeline.some((e) => e.name === '$send'), `${c.x} was sent nothing`);
  }
  await new Promise((r) => setTimeout(r, 1_000));
  for (const c of cases) assert.is(pushesTo(ctx, tokens.get(c.x)!).length, 0, `${c.x} got no push`);
});

/**
 * Probe W2: any event some other definition acted on canceled a deleted workflow's run at once (a
 * sleeping run 17 s before its timer, on another workflow's trigger). Only its next step does: its
 * timer, or an event its workflow's versions waited for or were canceled on.
 */
wf('an unrelated event leaves a deleted workflow\'s run as it is; its cancelOn event cancels it', async (ctx) => {
  const { api, key, service, tenantId } = ctx;
  const gone = (await api.post('/v1/workflows', key, { slug: 'del-unrelated', trigger: { event: 'du.start' }, cancelOn: { event: 'du.stop' }, steps: [{ type: 'wait', event: 'du.go', timeout: '1h' }] })).body.data;
  const other = (await api.post('/v1/workflows', key, { slug: 'del-other', trigger: { event: 'du.other' }, steps: [{ type: 'exit' }] })).body.data;
  const x = 'del-unrelated-x';
  await api.post('/v1/events', key, { externalId: x, name: 'du.start', data: {} });
  const runId = (await waitFor('the run to wait', () => runOf(ctx, 'del-unrelated', x, 'waiting'), 10_000)).id;
  assert.is((await api.del('/v1/workflows/del-unrelated', key)).status, 200);
  await api.post('/v1/events', key, { externalId: x, name: 'du.other', data: {} });
  await waitFor('the other workflow\'s run to complete (the event was handled)', () => runOf(ctx, 'del-other', x, 'completed'), 10_000);
  const scope = { tenantId, partitions: service.config.partitions };
  assert.is((await findRun(service.redis, service.keys, scope, gone.id, runId))!.status, 'waiting', 'an event its workflow never watched leaves it waiting');
  await api.post('/v1/events', key, { externalId: x, name: 'du.stop', data: {} });
  const run = await waitFor('the run canceled by its cancelOn event', async () => {
    const r = await findRun(service.redis, service.keys, scope, gone.id, runId);
    return r?.status === 'canceled' ? r : null;
  }, 10_000);
  assert.is(run.reason, 'workflow_deleted');
  assert.ok(other.id);
});

/** Waits until `count()` reaches `expected`, then a while more, and answers what it is then (a loop would go past it). */
async function settles(what: string, count: () => Promise<number>, expected: number): Promise<number> {
  await waitFor(what, async () => (await count()) >= expected, 20_000);
  await new Promise((r) => setTimeout(r, 2_000));
  return count();
}

wf('two $send workflows that each send stop after depth 3: four runs of each, nine pushes for one API message', async (ctx) => {
  const { api, key } = ctx;
  const token = await device(ctx, 'loop-send');
  for (const slug of ['echo-a', 'echo-b']) await api.post('/v1/workflows', key, { slug, trigger: { event: '$send' }, steps: [{ type: 'send', message: { title: slug, body: 'echo' } }] });
  const runsOfUser = async (slug: string) => (await runsOf(ctx, slug)).items.filter((r: any) => r.externalId === 'loop-send');
  await api.post('/v1/messages', key, { to: 'loop-send', title: 'hello', body: 'one message' });
  const total = await settles('the chain to end', async () => (await runsOfUser('echo-a')).length + (await runsOfUser('echo-b')).length, 8);
  assert.is(total, 8, 'runs at depths 0 to 3 of each workflow, no more');
  for (const slug of ['echo-a', 'echo-b']) {
    const runs = await runsOfUser(slug);
    assert.equal(runs.map((r: any) => r.depth).sort(), [0, 1, 2, 3], slug);
    assert.ok(runs.every((r: any) => r.status === 'completed'), slug);
  }
  await waitFor('nine pushes', async () => pushesTo(ctx, token).length >= 9, 10_000);
  await new Promise((r) => setTimeout(r, 1_000));
  assert.is(pushesTo(ctx, token).length, 9, 'the API message and one per run');
  for (const slug of ['echo-a', 'echo-b']) await api.del(`/v1/workflows/${slug}`, key);
});

wf('a chain of runs starts at most 10 runs after its first, however many each sends: two workflows triggered by each other\'s $send, three sends each, make 11 runs and 34 pushes of one message (probe Q: 40 runs, 121 pushes)', async (ctx) => {
  const { api, key } = ctx;
  const token = await device(ctx, 'loop-wide');
  const sends = (slug: string) => [0, 1, 2].map((n) => ({ type: 'send', message: { title: `${slug}${n}`, body: 'wide' } }));
  await api.post('/v1/workflows', key, { slug: 'wide-c', trigger: { event: '$send', where: { not: { property: 'workflow', eq: 'wide-c' } } }, steps: sends('wide-c') });
  await api.post('/v1/workflows', key, { slug: 'wide-d', trigger: { event: '$send', where: { property: 'workflow', eq: 'wide-c' } }, steps: sends('wide-d') });
  const runsOfUser = async (slug: string) => (await runsOf(ctx, slug)).items.filter((r: any) => r.externalId === 'loop-wide');
  try {
    await api.post('/v1/messages', key, { to: 'loop-wide', title: 'hello', body: 'one message' });
    const total = await settles('the chain to end', async () => (await runsOfUser('wide-c')).length + (await runsOfUser('wide-d')).length, 11);
    assert.is(total, 11, 'the chain\'s first run and 10 more');
    // which runs the 10 are depends on the order the sends' $send arrive in; the first is the only one at depth 0
    const depths = [...await runsOfUser('wide-c'), ...await runsOfUser('wide-d')].map((r: any) => r.depth);
    assert.equal([depths.filter((d) => d === 0).length, depths.every((d) => d <= 3)], [1, true], String(depths));
    await waitFor('34 pushes', async () => pushesTo(ctx, token).length >= 34, 20_000);
    await new Promise((r) => setTimeout(r, 1_000));
    assert.is(pushesTo(ctx, token).length, 34, 'the API message and three per run');
  } finally {
    // left enabled, wide-c would start runs on every later test's $send
    for (const slug of ['wide-c', 'wide-d']) await api.del(`/v1/workflows/${slug}`, key);
  }
});

wf('a chain at its 10 runs stays there however many other chains of its subscriber come after (probe S: 32 others pushed its count out of the automation hash, and it started 10 more)', async (ctx) => {
  const { api, key } = ctx;
  await device(ctx, 'loop-kept');
  const sends = (n: number, title: string) => Array.from({ length: n }, (_, i) => ({ type: 'send', message: { title: `${title}${i}`, body: 'kept' } }));
  await api.post('/v1/workflows', key, { slug: 'kept-root', trigger: { event: 'kept.go' }, steps: [...sends(10, 'first'), { type: 'wait', event: 'kept.more', timeout: '1d', onEvent: sends(10, 'more') }] });
  await api.post('/v1/workflows', key, { slug: 'kept-child', trigger: { event: '$send', where: { property: 'workflow', eq: 'kept-root' } }, steps: [{ type: 'exit' }] });
  await api.post('/v1/workflows', key, { slug: 'kept-fill', trigger: { event: 'kept.fill' }, steps: sends(1, 'fill') });
  await api.post('/v1/workflows', key, { slug: 'kept-fill-child', trigger: { event: '$send', where: { property: 'workflow', eq: 'kept-fill' } }, steps: [{ type: 'exit' }] });
  const count = async (slug: string) => (await runsOf(ctx, slug)).items.filter((r: any) => r.externalId === 'loop-kept').length;
  try {
    await api.post('/v1/events', key, { externalId: 'loop-kept', name: 'kept.go', data: {} });
    assert.is(await settles('the first ten children', () => count('kept-child'), 10), 10);
    // 33 chains after it, each starting one run
    await api.post('/v1/events', key, { events: Array.from({ length: 33 }, (_, i) => ({ externalId: 'loop-kept', name: 'kept.fill', id: `fill-${i}` })) });
    assert.is(await settles('every other chain\'s run', () => count('kept-fill-child'), 33), 33);
    await api.post('/v1/events', key, { externalId: 'loop-kept', name: 'kept.more', data: {} });
    await waitFor('the first chain\'s run to complete', async () => (await runsOf(ctx, 'kept-root')).items.some((r: any) => r.externalId === 'loop-kept' && r.status === 'completed'), 20_000);
    await new Promise((r) => setTimeout(r, 2_000)); // its last sends' $send handled
    assert.is(await count('kept-child'), 10, 'the chain started no more than its 10');
  } finally {
    for (const slug of ['kept-root', 'kept-child', 'kept-fill', 'kept-fill-child']) await api.del(`/v1/workflows/${slug}`, key);
  }
});

wf('two workflows triggered by $run.completed stop after depth 3, the chain started by a third', async (ctx) => {
  const { api, key } = ctx;
  await api.post('/v1/workflows', key, { slug: 'chain-start', trigger: { event: 'chain.go' }, steps: [{ type: 'exit' }] });
  for (const slug of ['follow-a', 'follow-b']) await api.post('/v1/workflows', key, { slug, trigger: { event: '$run.completed' }, steps: [{ type: 'exit' }] });
  const runsOfUser = async (slug: string) => (await runsOf(ctx, slug)).items.filter((r: any) => r.externalId === 'loop-done');
  await api.post('/v1/events', key, { externalId: 'loop-done', name: 'chain.go', data: {} });
  const total = await settles('the chain to end', async () => (await runsOfUser('follow-a')).length + (await runsOfUser('follow-b')).length, 6);
  assert.is(total, 6);
  assert.equal((await runsOfUser('chain-start')).map((r: any) => r.depth), [0]);
  for (const slug of ['follow-a', 'follow-b']) assert.equal((await runsOfUser(slug)).map((r: any) => r.depth).sort(), [1, 2, 3], slug);
  // the run at depth 3 completed, and its $run.completed started nothing; that run's events reach the
  // timeline in the worker's next batch, after the commit that made the run (the 2 s of settles are not a bound)
  await waitFor('the actors through the chain\'s events', () => actorsCaughtUp(ctx.service, partitionOf(ctx.tenantId, 'loop-done', ctx.service.config.partitions)), 10_000);
  const timeline = (await api.get('/v1/subscribers/loop-done/timeline?limit=100', key)).body.data.items as any[];
  assert.is(timeline.filter((e) => e.name === '$run.started').length, 7);
  assert.is(timeline.filter((e) => e.name === '$run.completed').length, 7);
  for (const slug of ['chain-start', 'follow-a', 'follow-b']) await api.del(`/v1/workflows/${slug}`, key);
});

wf('a caller\'s event whose data holds a workflowId is no event of a run: it starts that workflow', async (ctx) => {
  const { api, key } = ctx;
  const created = await api.post('/v1/workflows', key, { slug: 'form-sent', trigger: { event: 'form.sent' }, steps: [{ type: 'exit' }] });
  assert.is(created.status, 201, created.text);
  // free-form data that happens to name the workflow (a caller echoing a webhook payload, say)
  await api.post('/v1/events', key, { externalId: 'form-filler', name: 'form.sent', data: { workflowId: created.body.data.id } });
  const run = await waitFor('the run to complete', () => runOf(ctx, 'form-sent', 'form-filler', 'completed'), 10_000);
  assert.is(run.depth, 0);
  await api.del('/v1/workflows/form-sent', key);
});

wf('runs list newest started first, a trigger back-dated by an offline batch included', async (ctx) => {
  const { api, key } = ctx;
  assert.is((await api.post('/v1/workflows', key, { slug: 'run-order', trigger: { event: 'order.test' }, steps: [{ type: 'sleep', duration: '1h' }] })).status, 201);
  await api.post('/v1/events', key, { externalId: 'ord-1', name: 'order.test' });
  await waitFor('the first run', async () => (await runsOf(ctx, 'run-order')).items.length === 1, 10_000);
  await new Promise((r) => setTimeout(r, 5));
  const twoDaysAgo = new Date(Date.now() - 2 * 86_400_000).toISOString();
  await api.post('/v1/events', key, { externalId: 'ord-2', name: 'order.test', timestamp: twoDaysAgo });
  const page = await waitFor('the second run', async () => { const p = await runsOf(ctx, 'run-order'); return p.items.length === 2 ? p : null; }, 10_000);
  assert.equal(page.items.map((r: any) => r.externalId), ['ord-2', 'ord-1'], 'the later start first, whatever the trigger\'s timestamp');
});

wf('the runs of one batch of triggers (one millisecond) list in the events\' order, newest first, as GET /v1/events does', async (ctx) => {
  const { api, key } = ctx;
  assert.is((await api.post('/v1/workflows', key, { slug: 'tie-order', trigger: { event: 'tie.go' }, steps: [{ type: 'sleep', duration: '1h' }] })).status, 201);
  const ids = Array.from({ length: 8 }, (_, i) => `tie-${i}`);
  const posted = await api.post('/v1/events', key, { events: ids.map((externalId) => ({ externalId, name: 'tie.go' })) });
  assert.is(posted.status, 202);
  const newestFirst = [...ids].reverse();
  const page = await waitFor('eight runs', async () => { const p = await runsOf(ctx, 'tie-order'); return p.items.length === 8 ? p : null; }, 10_000);
  assert.equal(page.items.map((r: any) => r.externalId), newestFirst);
  const events = await waitFor('the events listed', async () => {
    const items = (await api.get('/v1/events?name=tie.go', key)).body.data.items as any[];
    return items.length === 8 ? items : null;
  }, 10_000);
  assert.equal(events.map((e: any) => e.externalId), newestFirst);
});

wf('a run that ended before the retention goes from the runs list, with its message; one still sleeping stays', async (ctx) => {
  const { api, key } = ctx;
  assert.is((await api.post('/v1/workflows', key, { slug: 'ret-done', trigger: { event: 'ret.done' }, steps: [{ type: 'send', message: { title: 'Now', body: 'done' } }] })).status, 201);
  assert.is((await api.post('/v1/workflows', key, { slug: 'ret-asleep', trigger: { event: 'ret.asleep' }, steps: [{ type: 'sleep', duration: '60d' }, { type: 'send', message: { title: 'Later', body: 'x' } }] })).status, 201);
  await api.post('/v1/events', key, { events: [{ externalId: 'ret-1', name: 'ret.done' }, { externalId: 'ret-1', name: 'ret.asleep' }] });
  const done = await waitFor('the run to complete', () => runOf(ctx, 'ret-done', 'ret-1', 'completed'), 10_000);
  const asleep = await waitFor('the other to sleep', () => runOf(ctx, 'ret-asleep', 'ret-1', 'sleeping'), 10_000);
  const messageId = await waitFor('its message to complete', async () => {
    const items = (await api.get('/v1/messages?status=completed&limit=100', key)).body.data.items as any[];
    return items.find((m) => m.run?.runId === done.id)?.id ?? null;
  }, 10_000);
  const sweep = () => sweepRetention({ config: ctx.service.config, redis: ctx.service.redis, keys: ctx.service.keys, log: console as any, target: { url: '' } });
  try {
    setClockOffset(29 * 86_400_000);
    assert.is((await sweep()).runsExpired, 0);
    setClockOffset(31 * 86_400_000);
    assert.ok((await sweep()).runsExpired >= 1);
  } finally {
    setClockOffset(0);
  }
  assert.is((await api.get(`/v1/workflows/ret-done/runs/${done.id}`, key)).status, 404);
  const page = await runsOf(ctx, 'ret-done');
  assert.is(page.total, 0);
  assert.is((await runsOf(ctx, 'ret-done', '&status=completed')).total, 0);
  assert.is((await api.get(`/v1/messages/${messageId}`, key)).status, 404, 'the run step\'s message went too');
  assert.is((await api.get(`/v1/workflows/ret-asleep/runs/${asleep.id}`, key)).status, 200, 'a sleeping run stays');
  const p = partitionOf(ctx.tenantId, 'ret-1', ctx.service.config.partitions);
  assert.is(await ctx.service.redis.exists(ctx.service.keys.run(p, ctx.tenantId, done.id)), 0);
  // only this run's entry: runs of other tests in the partition may end while the clock is moved (their 1h sleeps come due)
  assert.is(await ctx.service.redis.zscore(ctx.service.keys.runsEnded(p), `${ctx.tenantId}|${done.id}`), null);
});

wf('a subscriber\'s cap of 100 active runs counts only workflows that exist: runs of a deleted one, still sleeping, hold no place (probe AX)', async (ctx) => {
  const { api, key } = ctx;
  assert.is((await api.post('/v1/workflows', key, { slug: 'cap-old', trigger: { event: 'cap.old' }, steps: [{ type: 'sleep', duration: '1h' }, { type: 'exit' }] })).status, 201);
  assert.is((await api.post('/v1/workflows', key, { slug: 'cap-new', trigger: { event: 'cap.new' }, steps: [{ type: 'sleep', duration: '1h' }, { type: 'exit' }] })).status, 201);
  const events = Array.from({ length: 100 }, () => ({ externalId: 'cap-user', name: 'cap.old' }));
  assert.is((await api.post('/v1/events', key, { events })).status, 202);
  await waitFor('100 runs asleep', async () => (await runsOf(ctx, 'cap-old', '&status=sleeping')).total === 100, 20_000, 50);
  // at the cap: another workflow starts nothing
  await api.post('/v1/events', key, { externalId: 'cap-user', name: 'cap.new' });
  await waitFor('the actors through it', () => actorsCaughtUp(ctx.service, partitionOf(ctx.tenantId, 'cap-user', ctx.service.config.partitions)), 10_000);
  assert.is((await runsOf(ctx, 'cap-new')).total, 0, 'the cap holds while the workflow exists');
  assert.is((await api.del('/v1/workflows/cap-old', key)).status, 200);
  await api.post('/v1/events', key, { externalId: 'cap-user', name: 'cap.new' });
  const started = await waitFor('a run of the other workflow', async () => ((await runsOf(ctx, 'cap-new')).total === 1 ? true : null), 10_000, 50);
  assert.ok(started);
});

wf.run();
