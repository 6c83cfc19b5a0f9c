import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { client } from '../helpers/api.js';
import { bootstrapWorkspace, startTestService, type TestService } from '../helpers/service.js';
import { startReceiver, type Receiver } from '../helpers/webhook-receiver.js';
import { waitFor } from '../helpers/wait.js';
import { eventOf, stripeHeaders, stripeSecret, swHeaders } from './signing.js';

// An accepted delivery is an event like any other (docs/sources.md, first section): on the tenant
// log with its provider, in the catalog, on the subscriber's timeline, a workflow trigger, and in
// outbound webhooks; and Herald's own outbound webhooks are a sender a Source verifies.

type Ctx = { service: TestService; api: ReturnType<typeof client>; receivers: Receiver[] };
const pipeline = suite<Ctx>('sources pipeline');

const ENV = { WEBHOOK_ALLOW_PRIVATE_NETWORKS: '127.0.0.0/8,::1/128', WEBHOOK_RETRY_SCHEDULE: '1s', WEBHOOK_ATTEMPT_TIMEOUT_MS: '5000' };

pipeline.before(async (ctx) => {
  ctx.service = await startTestService('sources-pipeline', ENV, ['web', 'worker', 'dispatcher']);
  ctx.api = client(ctx.service.url);
  ctx.receivers = [];
});
pipeline.after(async (ctx) => {
  for (const r of ctx.receivers) await r.close();
  await ctx.service.stop();
});

async function createSource(ctx: Ctx, key: string, body: Record<string, unknown>): Promise<any> {
  const res = await ctx.api.post('/v1/sources', key, body);
  assert.is(res.status, 201, res.text);
  return res.body.data;
}

const withoutStatus = (e: any) => {
  const { status: _status, ...rest } = e;
  return rest;
};

pipeline('an accepted delivery reaches the tenant log by provider, the catalog, the subscriber and its timeline', async (ctx) => {
  const { api } = ctx;
  const { keys } = await bootstrapWorkspace(ctx.service, 'sources-pipe');
  const key = keys.tenant;
  const s = await createSource(ctx, key, { name: 'Clerk', provider: 'clerk', format: 'standard-webhooks', mapping: { externalId: 'data.id' } });
  const body = JSON.stringify({ type: 'user.signed_in', data: { id: 'pipe-user-1', method: 'passkey' } });
  const res = await api.call('POST', `/v1/sources/${s.id}/inbound`, { raw: body, headers: swHeaders(s.secret, body) });
  assert.is(res.status, 202, res.text);
  assert.is(res.body.data.status, 'accepted');
  const event = withoutStatus(eventOf(res));
  const server = await api.post('/v1/events', key, { externalId: 'pipe-user-1', name: 'clerk.user.signed_in', data: { by: 'backend' } });
  assert.is(server.status, 202, server.text);
  const serverEvent = server.body.data.items[0];

  const byProvider = await waitFor('the event on the tenant log, by provider', async () => {
    const items = (await api.get('/v1/events?provider=clerk&limit=100', key)).body.data.items as any[];
    return items.some((e) => e.id === event.id) ? items : null;
  });
  assert.equal(byProvider.find((e) => e.id === event.id), event, 'the event as the inbound answer gave it');
  assert.ok(byProvider.every((e) => e.provider === 'clerk' && e.source === 'webhook'), 'only events the source received');
  assert.not.ok(byProvider.some((e) => e.id === serverEvent.id), 'the backend\'s event of the same name has no provider');
  await waitFor('the backend event applied', async () => (await api.get('/v1/events?limit=100', key)).body.data.items.some((e: any) => e.id === serverEvent.id));
  assert.equal((await api.get('/v1/events?provider=other', key)).body.data.items, [], 'another provider lists none of it');
  // a provider no source can have is a typo: 400, not a silently empty list (probe BD)
  for (const provider of ['Clerk', 'a'.repeat(41), '-x']) {
    const res = await api.get(`/v1/events?provider=${provider}`, key);
    assert.equal([res.status, res.body.error?.code, res.body.error?.param], [400, 'validation', 'provider'], provider);
  }
  assert.ok((await api.get('/v1/events?source=webhook', key)).body.data.items.some((e: any) => e.id === event.id));
  assert.not.ok((await api.get('/v1/events?source=server', key)).body.data.items.some((e: any) => e.id === event.id));
  const byName = (await api.get('/v1/events?name=clerk.user.signed_in', key)).body.data.items as any[];
  assert.equal(byName.map((e) => e.id).sort(), [event.id, serverEvent.id].sort());

  const entry = await waitFor('the catalog entry', async () => {
    const items = (await api.get('/v1/events/names', key)).body.data.items as any[];
    const found = items.find((e) => e.name === 'clerk.user.signed_in');
    return found && found.counts.allTime === 2 ? found : null;
  });
  assert.ok(entry.providers.includes('clerk'), JSON.stringify(entry));
  assert.ok(entry.sources.includes('webhook'), JSON.stringify(entry));
  assert.equal(entry.providers, ['clerk']);
  assert.equal(entry.sources, ['server', 'webhook']);
  const one = await api.get('/v1/events/names/clerk.user.signed_in', key);
  assert.is(one.status, 200);
  assert.ok(one.body.data.samples.some((e: any) => e.id === event.id && e.provider === 'clerk'));

  const subscriber = await waitFor('the subscriber', async () => {
    const r = await api.get('/v1/subscribers/pipe-user-1', key);
    return r.status === 200 ? r : null;
  });
  assert.is(subscriber.body.data.externalId, 'pipe-user-1');
  const timeline = await waitFor('the timeline', async () => {
    const items = (await api.get('/v1/subscribers/pipe-user-1/timeline', key)).body.data.items as any[];
    return items.some((e) => e.id === event.id) && items.some((e) => e.id === serverEvent.id) ? items : null;
  });
  assert.equal(timeline.map((e) => e.name), ['clerk.user.signed_in', 'clerk.user.signed_in', '$subscriber.created']);
  assert.equal(timeline.find((e) => e.id === event.id), event);
  assert.is(timeline.find((e) => e.name === '$subscriber.created').provider, null);

  const state = (await api.get(`/v1/sources/${s.id}`, key)).body.data;
  assert.equal(state.counts, { accepted: 1, duplicate: 0, ignored: 0, rejected: 0 });
});

pipeline('a source event triggers a workflow', async (ctx) => {
  const { api } = ctx;
  const { keys } = await bootstrapWorkspace(ctx.service, 'sources-wf');
  const key = keys.tenant;
  const wf = await api.post('/v1/workflows', key, { slug: 'on-invoice', trigger: { event: 'stripe.invoice.paid' }, steps: [{ type: 'exit' }] });
  assert.is(wf.status, 201, wf.text);
  const secret = stripeSecret();
  const s = await createSource(ctx, key, { name: 'Stripe', provider: 'stripe', format: 'stripe', secret, mapping: { externalId: 'data.object.metadata.userId', data: 'data.object' } });
  const body = JSON.stringify({ id: 'evt_wf_1', type: 'invoice.paid', created: Math.floor(Date.now() / 1000), data: { object: { id: 'in_1', metadata: { userId: 'wf-payer' } } } });
  const res = await api.call('POST', `/v1/sources/${s.id}/inbound`, { raw: body, headers: stripeHeaders(secret, body) });
  assert.is(res.status, 202, res.text);
  const event = eventOf(res);
  const run = await waitFor('a run of the workflow', async () => {
    const items = (await api.get('/v1/workflows/on-invoice/runs?limit=100', key)).body.data.items as any[];
    return items.find((r) => r.externalId === 'wf-payer');
  }, 15_000, 100);
  assert.is(run.triggerEventId, event.id);
});

pipeline('Herald\'s own outbound webhook is a sender a source verifies; the resulting event goes out with its provider, and source audit events without the secret', async (ctx) => {
  const { api, service } = ctx;
  const recv = await bootstrapWorkspace(service, 'sources-recv');
  const send = await bootstrapWorkspace(service, 'sources-send');

  // the receiving workspace's own endpoint, for the events that name the provider and the source audit
  const r = await startReceiver();
  ctx.receivers.push(r);
  const mine = await api.post('/v1/workspaces/sources-recv/webhooks', recv.keys.workspace, { url: `${r.url}/hook`, events: ['herald.*', 'source.*'] });
  assert.is(mine.status, 201, mine.text);
  r.secrets.push(mine.body.data.secret);

  const s = await createSource(ctx, recv.keys.tenant, { name: 'Upstream Herald', provider: 'herald', format: 'standard-webhooks', mapping: { externalId: 'data.object.subscriber.externalId' } });
  const upstream = await api.post('/v1/workspaces/sources-send/webhooks', send.keys.workspace, { url: s.inboundUrl, events: ['order.completed'] });
  assert.is(upstream.status, 201, upstream.text);
  const upstreamSecret = upstream.body.data.secret as string;
  const patched = await api.patch(`/v1/sources/${s.id}`, recv.keys.tenant, { secret: upstreamSecret });
  assert.is(patched.status, 200, patched.text);

  const tracked = await api.post('/v1/events', send.keys.tenant, { externalId: 'buyer-7', name: 'order.completed', data: { total: 42 } });
  assert.is(tracked.status, 202, tracked.text);
  const trackedEvent = tracked.body.data.items.at(-1);

  const arrived = await waitFor('the upstream event at the source', async () => {
    const items = (await api.get('/v1/events?provider=herald', recv.keys.tenant)).body.data.items as any[];
    return items.find((e) => e.name === 'herald.order.completed');
  }, 20_000, 100);
  assert.is(arrived.externalId, 'buyer-7');
  assert.is(arrived.source, 'webhook');
  assert.is(arrived.data.type, 'order.completed');
  assert.is(arrived.data.id, 'whe_' + trackedEvent.id.slice('evt_'.length));
  assert.equal(arrived.data.data.object.data, { total: 42 });

  const out = await waitFor('the event delivered with its provider', async () => r.requests.find((q) => q.body?.type === 'herald.order.completed'), 20_000, 100);
  assert.equal(out.failures, [], 'signed by the receiving workspace\'s endpoint');
  assert.is(out.body.data.object.provider, 'herald');
  assert.is(out.body.data.object.source, 'webhook');
  assert.is(out.body.data.object.id, arrived.id);
  assert.is(out.body.data.object.subscriber.externalId, 'buyer-7');

  const audit = await waitFor('source.created and source.updated delivered', async () => {
    const created = r.requests.find((q) => q.body?.type === 'source.created' && q.body.data.object.id === s.id);
    const updated = r.requests.find((q) => q.body?.type === 'source.updated' && q.body.data.object.id === s.id);
    return created && updated ? { created, updated } : null;
  }, 20_000, 100);
  assert.equal(audit.created.failures, []);
  assert.ok('secretUpdatedAt' in audit.updated.body.changes, JSON.stringify(audit.updated.body.changes));
  for (const q of [audit.created, audit.updated]) {
    const raw = q.raw.toString('utf8');
    for (const secret of [s.secret as string, upstreamSecret]) {
      assert.not.ok(raw.includes(secret.slice('whsec_'.length)), `no secret in ${q.body.type}`);
    }
  }

  const state = await waitFor('the source counts', async () => {
    const data = (await api.get(`/v1/sources/${s.id}`, recv.keys.tenant)).body.data;
    return data.counts.accepted >= 1 ? data : null;
  });
  assert.is(state.counts.accepted, 1);
  assert.is(state.counts.rejected, 0, 'every delivery Herald sent verified');
  assert.is(state.lastError, null);
});

pipeline.run();
