import { connect } from 'node:net';
import { hostname } from 'node:os';
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { client } from '../helpers/api.js';
import { freePort } from '../helpers/port.js';
import { startRoleProcess, stopRoleProcess, type RoleProcess } from '../helpers/processes.js';
import { bootstrapWorkspace, startTestService, type TestService } from '../helpers/service.js';
import { startReceiver, type Receiver } from '../helpers/webhook-receiver.js';
import { waitFor } from '../helpers/wait.js';

type Ctx = { service: TestService; dispatchers: RoleProcess[]; receiver: Receiver | null };

const EVENTS = 30;
const ENV = { WEBHOOK_ALLOW_PRIVATE_NETWORKS: '127.0.0.0/8', WEBHOOK_RETRY_SCHEDULE: '1s', WEBHOOK_ATTEMPT_TIMEOUT_MS: '2000' };

const kill = suite<Ctx>('webhook dispatcher processes');

kill.before.each(async (ctx) => {
  // web and worker here; dispatchers are child processes, as an operator scales them
  ctx.service = await startTestService('wh-kill', ENV, ['web', 'worker']);
  ctx.dispatchers = [];
  ctx.receiver = null;
});
kill.after.each(async (ctx) => {
  for (const d of ctx.dispatchers) await stopRoleProcess(d);
  await ctx.receiver?.close();
  await ctx.service.stop();
});

function startDispatcher(ctx: Ctx, env: Record<string, string> = {}): RoleProcess {
  const s = ctx.service;
  const d = startRoleProcess('dispatcher', { REDIS_URL: s.env.REDIS_URL!, REDIS_KEY_PREFIX: s.env.REDIS_KEY_PREFIX!, HERALD_PARTITIONS: s.env.HERALD_PARTITIONS!, ...ENV, ...env });
  ctx.dispatchers.push(d);
  return d;
}

const running = (ctx: Ctx, d: RoleProcess) =>
  waitFor('the dispatcher to start', async () => (await ctx.service.redis.hexists(ctx.service.keys.processes, `dispatcher:${hostname()}:${d.child.pid}`)) === 1, 45_000, 50);

kill('a dispatcher killed with SIGKILL mid-delivery: another sends every delivery, same webhook-id and identical bytes, each recorded once', async (ctx) => {
  const api = client(ctx.service.url);
  const ws = await bootstrapWorkspace(ctx.service, 'whk-kill');
  let killed = false;
  // answers slowly until the kill, so the kill lands while requests are in flight
  const r = (ctx.receiver = await startReceiver({ behaviour: () => (killed ? { status: 204 } : { status: 204, delayMs: 1_500 }) }));
  const created = await api.post('/v1/workspaces/whk-kill/webhooks', ws.keys.workspace, { url: `${r.url}/hook`, events: ['kill.*'] });
  assert.is(created.status, 201, created.text);
  r.secrets.push(created.body.data.secret);
  const endpointId = created.body.data.id as string;

  const first = startDispatcher(ctx);
  await running(ctx, first);
  const events = Array.from({ length: EVENTS }, (_, i) => ({ externalId: `k-${i % 5}`, name: 'kill.event', data: { i } }));
  const res = await api.post('/v1/events', ws.keys.tenant, { events });
  assert.is(res.status, 202);
  const ids = (res.body.data.items as { id: string }[]).map((e) => 'whe_' + e.id.slice('evt_'.length));

  await waitFor('requests in flight at the first dispatcher', async () => r.requests.length >= 5, 15_000, 10);
  const killedAt = Date.now();
  first.child.kill('SIGKILL');
  await first.exited;
  // the requests still unanswered at the kill: each is answered 1.5 s after it came, and the events may
  // reach the dispatcher in reads seconds apart on a loaded machine, so an early one may have been
  // answered (and recorded) before the kill (the margin: a timer may fire a moment early)
  const inFlight = new Set(r.requests.filter((q) => killedAt - q.at < 1_400).map((q) => q.id));
  assert.ok(inFlight.size > 0, 'the kill lands while requests are in flight');
  killed = true;
  if (process.env.HERALD_TEST_VERBOSE) console.log(`killed with ${inFlight.size} requests unanswered`);

  const second = startDispatcher(ctx);
  await running(ctx, second);
  await waitFor('every delivery to succeed', async () => {
    const list = await api.get(`/v1/workspaces/whk-kill/webhooks/${endpointId}/deliveries?status=success&limit=100`, ws.keys.workspace);
    return list.body.data.total === EVENTS;
  }, 30_000, 200);

  for (const id of ids) {
    const got = r.withId(id);
    assert.ok(got.length >= 1, `${id} arrived`);
    for (const q of got) {
      assert.ok(Buffer.compare(q.raw, got[0]!.raw) === 0, `${id}: identical bytes on every send`);
      assert.equal(q.failures, [], `${id}: verified`);
    }
  }
  for (const id of inFlight) assert.ok(r.withId(id).length >= 2, `${id}, in flight at the kill, was sent again by the second dispatcher`);
  const list = await api.get(`/v1/workspaces/whk-kill/webhooks/${endpointId}/deliveries?limit=100`, ws.keys.workspace);
  assert.is(list.body.data.total, EVENTS, 'one delivery per event');
  for (const d of list.body.data.items) {
    assert.is(d.status, 'success');
    assert.is(d.attemptCount, 1, `${d.id}: the interrupted attempt was recorded once, by the dispatcher that finished it`);
  }
  assert.ok(second.child.exitCode === null, second.output());
});

kill('a dispatcher stopped with SIGTERM gives back the attempts it took and had not started: another sends them at once, not after their lease (probe AE)', async (ctx) => {
  const api = client(ctx.service.url);
  const ws = await bootstrapWorkspace(ctx.service, 'whk-stop');
  let held = true;
  // the first request hangs past the stop; later ones are answered at once
  const r = (ctx.receiver = await startReceiver({ behaviour: () => (held ? { status: 204, delayMs: 20_000 } : { status: 204 }) }));
  const created = await api.post('/v1/workspaces/whk-stop/webhooks', ws.keys.workspace, { url: `${r.url}/hook`, events: ['stop.*'] });
  assert.is(created.status, 201, created.text);
  r.secrets.push(created.body.data.secret);
  // one request at a time, two attempts taken (perEndpoint), leases of 30 s (three timeouts)
  const slow = { WEBHOOK_ENDPOINT_CONCURRENCY: '1', WEBHOOK_ATTEMPT_TIMEOUT_MS: '10000' };
  const first = startDispatcher(ctx, slow);
  await running(ctx, first);
  const post = async (name: string) => {
    const res = await api.post('/v1/events', ws.keys.tenant, { externalId: 'stop-1', name });
    assert.is(res.status, 202, res.text);
    return 'whe_' + (res.body.data.items[0].id as string).slice('evt_'.length);
  };
  const a = await post('stop.a');
  await waitFor('stop.a in flight', async () => r.withId(a).length === 1, 15_000, 20);
  const b = await post('stop.b');
  const leases = ctx.service.keys.webhookLeases(ws.workspace.id);
  await waitFor('stop.b taken by the first dispatcher, queued behind stop.a', async () => (await ctx.service.redis.hlen(leases)) === 2, 15_000, 20);
  held = false;
  await stopRoleProcess(first);

  const second = startDispatcher(ctx, slow);
  await running(ctx, second);
  await waitFor('stop.b sent by the second dispatcher long before its 30 s lease ran out', async () => r.withId(b).length === 1, 10_000, 50);
  assert.is(r.withId(a).length, 1, 'stop.a, in flight at the stop, waits for its lease');
  assert.equal(r.withId(b)[0]!.failures, [], 'verified');
});

kill('a dispatcher stopped with SIGTERM lets a request in flight finish for up to 5 s and records its answer, so it is not sent again (probe AU: 2 s, and a 6 s receiver got the event twice)', async (ctx) => {
  const api = client(ctx.service.url);
  const ws = await bootstrapWorkspace(ctx.service, 'whk-grace');
  // answered 3 s after it came: longer than the 2 s wait of before, within the 5 s of now
  const r = (ctx.receiver = await startReceiver({ behaviour: () => ({ status: 204, delayMs: 3_000 }) }));
  const created = await api.post('/v1/workspaces/whk-grace/webhooks', ws.keys.workspace, { url: `${r.url}/hook`, events: ['grace.*'] });
  assert.is(created.status, 201, created.text);
  r.secrets.push(created.body.data.secret);
  const endpointId = created.body.data.id as string;
  const first = startDispatcher(ctx, { WEBHOOK_ATTEMPT_TIMEOUT_MS: '10000' });
  await running(ctx, first);
  await api.post('/v1/events', ws.keys.tenant, { externalId: 'grace-1', name: 'grace.slow' });
  await waitFor('the request in flight', async () => r.requests.length === 1, 15_000, 10);
  first.child.kill('SIGTERM');
  assert.is(await first.exited, 0);
  const list = await api.get(`/v1/workspaces/whk-grace/webhooks/${endpointId}/deliveries?limit=10`, ws.keys.workspace);
  assert.is(list.body.data.items.length, 1);
  assert.is(list.body.data.items[0].status, 'success', 'recorded by the stopping dispatcher');
  assert.is(r.requests.length, 1, 'sent once');
});

kill('a process running web and dispatcher takes no new webhook work once stopping, while its web role still drains a request (probe BE: it did for the web role\'s 5 s, and what it took then had less than its grace left)', async (ctx) => {
  const api = client(ctx.service.url);
  const ws = await bootstrapWorkspace(ctx.service, 'whk-both');
  const r = (ctx.receiver = await startReceiver());
  const created = await api.post('/v1/workspaces/whk-both/webhooks', ws.keys.workspace, { url: `${r.url}/hook`, events: ['both.*'] });
  assert.is(created.status, 201, created.text);
  r.secrets.push(created.body.data.secret);
  const port = await freePort();
  const s = ctx.service;
  // LOG_LEVEL info: the test waits for its "stopping" line below
  const both = startRoleProcess('start', { REDIS_URL: s.env.REDIS_URL!, REDIS_KEY_PREFIX: s.env.REDIS_KEY_PREFIX!, HERALD_PARTITIONS: s.env.HERALD_PARTITIONS!, ...ENV, HERALD_ROLES: 'web,dispatcher', PORT: String(port), LOG_LEVEL: 'info' });
  ctx.dispatchers.push(both);
  await running(ctx, both);
  // the heartbeat (what `running` sees) starts before the web role listens: a connection made before
  // that is refused, and the held request below would wait for its connect for good
  await waitFor('the process\'s web role to answer', async () => (await fetch(`http://127.0.0.1:${port}/v1/health`).catch(() => null))?.status === 200, 45_000, 100);
  const post = async (name: string) => {
    const res = await api.post('/v1/events', ws.keys.tenant, { externalId: 'both-1', name });
    assert.is(res.status, 202, res.text);
    return 'whe_' + (res.body.data.items[0].id as string).slice('evt_'.length);
  };
  const before = await post('both.before');
  await waitFor('both.before delivered by the process', async () => r.withId(before).length === 1, 15_000, 20);
  // an authenticated request whose body never ends: the web role waits its full grace for it
  const held = connect(port, '127.0.0.1');
  held.on('error', () => undefined);
  await new Promise((done) => held.once('connect', done));
  held.write(`POST /v1/events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${ws.keys.tenant}\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{`);
  both.child.kill('SIGTERM');
  // once its stop has begun (a loaded process may take a moment to handle the signal; a fixed 300 ms was a guess)
  await waitFor('the process to begin its stop', async () => /"msg":"stopping"/.test(both.output()), 10_000, 20);
  const after = await post('both.after');
  // the process is still up (its web role drains for 5 s): its dispatcher must not send this
  await new Promise((done) => setTimeout(done, 2_000));
  assert.is(both.child.exitCode, null, 'still draining the held request');
  assert.is(r.withId(after).length, 0, 'not taken by the stopping process');
  assert.is(await both.exited, 0, both.output());
  held.destroy();
  startDispatcher(ctx);
  await waitFor('both.after sent by the next dispatcher', async () => r.withId(after).length === 1, 20_000, 50);
  assert.equal(r.withId(after)[0]!.failures, [], 'verified');
});

kill('an event from while the endpoint was enabled, read by a dispatcher only after a disable, gets a delivery that waits and is sent on re-enable; one from while disabled never is', async (ctx) => {
  const api = client(ctx.service.url);
  const ws = await bootstrapWorkspace(ctx.service, 'whk-late');
  const r = (ctx.receiver = await startReceiver());
  const created = await api.post('/v1/workspaces/whk-late/webhooks', ws.keys.workspace, { url: `${r.url}/hook`, events: ['late.*'] });
  assert.is(created.status, 201, created.text);
  r.secrets.push(created.body.data.secret);
  const endpoint = `/v1/workspaces/whk-late/webhooks/${created.body.data.id}`;
  const ledger = ctx.service.keys.ledger(ws.workspace.id);
  const inLedger = (type: string) => waitFor(`${type} in the ledger`, async () =>
    (await ctx.service.redis.xrange(ledger, '-', '+')).some(([, f]) => f.join(' ').includes(`"type":"${type}"`)), 10_000, 50);

  // no dispatcher yet: the events wait in the ledger
  const before = await api.post('/v1/events', ws.keys.tenant, { externalId: 'late-1', name: 'late.before' });
  await inLedger('late.before');
  assert.is((await api.patch(endpoint, ws.keys.workspace, { enabled: false })).status, 200);
  const during = await api.post('/v1/events', ws.keys.tenant, { externalId: 'late-1', name: 'late.during' });
  await inLedger('late.during');

  const d = startDispatcher(ctx);
  await running(ctx, d);
  const waiting = await waitFor('a delivery of late.before', async () => {
    const list = await api.get(`${endpoint}/deliveries`, ws.keys.workspace);
    return list.body.data.items.length > 0 ? list.body.data : null;
  }, 15_000, 100);
  assert.equal(waiting.items.map((x: any) => [x.eventType, x.status]), [['late.before', 'pending']], 'one delivery, waiting');
  await new Promise((res) => setTimeout(res, 1_000));
  assert.is(r.requests.length, 0, 'nothing is sent to a disabled endpoint');

  assert.is((await api.patch(endpoint, ws.keys.workspace, { enabled: true })).status, 200);
  const wheOf = (res: { body: any }) => 'whe_' + (res.body.data.items[0].id as string).slice('evt_'.length);
  await waitFor('late.before sent after the re-enable', async () => r.withId(wheOf(before)).length === 1, 10_000, 50);
  await new Promise((res) => setTimeout(res, 1_000));
  assert.equal(r.requests.map((q) => q.body.type), ['late.before'], 'late.during, from while it was disabled, is never sent');
  assert.equal(r.requests[0]!.failures, [], 'verified');
  assert.is((await api.get(`/v1/workspaces/whk-late/webhooks/events/${wheOf(during)}`, ws.keys.workspace)).status, 404);
});

kill('an edit or a re-enable made while no dispatcher read the ledger keeps the events the endpoint wanted when they happened, and adds none from before it (probe A1: both lost them)', async (ctx) => {
  const api = client(ctx.service.url);
  const ws = await bootstrapWorkspace(ctx.service, 'whk-edit');
  const edited = (ctx.receiver = await startReceiver());
  const toggled = await startReceiver();
  try {
    const make = async (r: Receiver) => {
      const res = await api.post('/v1/workspaces/whk-edit/webhooks', ws.keys.workspace, { url: `${r.url}/hook`, events: ['ed.*'] });
      assert.is(res.status, 201, res.text);
      r.secrets.push(res.body.data.secret);
      return `/v1/workspaces/whk-edit/webhooks/${res.body.data.id}`;
    };
    const [editedPath, toggledPath] = [await make(edited), await make(toggled)];
    const ledger = ctx.service.keys.ledger(ws.workspace.id);
    const inLedger = (type: string) => waitFor(`${type} in the ledger`, async () =>
      (await ctx.service.redis.xrange(ledger, '-', '+')).some(([, f]) => f.join(' ').includes(`"type":"${type}"`)), 10_000, 50);
    // no dispatcher: the events wait in the ledger while the endpoints change
    await api.post('/v1/events', ws.keys.tenant, { events: [{ externalId: 'ed-1', name: 'ed.one' }, { externalId: 'ed-1', name: 'new.early' }] });
    await inLedger('new.early');
    await new Promise((res) => setTimeout(res, 20)); // the changes come strictly after the events
    assert.is((await api.patch(editedPath, ws.keys.workspace, { events: ['ed.*', 'new.*'] })).status, 200);
    assert.is((await api.patch(toggledPath, ws.keys.workspace, { enabled: false })).status, 200);
    await api.post('/v1/events', ws.keys.tenant, { externalId: 'ed-1', name: 'ed.while-disabled' });
    await inLedger('ed.while-disabled');
    assert.is((await api.patch(toggledPath, ws.keys.workspace, { enabled: true })).status, 200);
    await api.post('/v1/events', ws.keys.tenant, { events: [{ externalId: 'ed-1', name: 'ed.after' }, { externalId: 'ed-1', name: 'new.after' }] });
    await inLedger('new.after');

    await running(ctx, startDispatcher(ctx));
    const types = (r: Receiver) => r.requests.map((q) => q.body.type as string).sort();
    await waitFor('every delivery', async () => edited.requests.length >= 4 && toggled.requests.length >= 2, 15_000, 50);
    await new Promise((res) => setTimeout(res, 1_000));
    // edited: ed.one as it was then (ed.*), not new.early (new.* came after it); everything after the edit
    assert.equal(types(edited), ['ed.after', 'ed.while-disabled', 'ed.one', 'new.after'].sort());
    // toggled: ed.one from before the disable; never the event from while it was disabled
    assert.equal(types(toggled), ['ed.after', 'ed.one']);
    for (const q of [...edited.requests, ...toggled.requests]) assert.equal(q.failures, [], 'verified');
  } finally {
    await toggled.close();
  }
});

kill.run();
