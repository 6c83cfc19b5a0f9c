import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { setWebhookResolver } from '../../lib/webhook-resolver.js';
import { createTenant } from '../../streams/identity.js';
import { WEBHOOK_GROUP } from '../../actors/webhook-dispatcher.js';
import { client } from '../helpers/api.js';
import { deliveryKeepMs, MAX_REPLAYS } from '../../lib/webhook-policy.js';
import { BY_TEST, bootstrapWorkspace, makeKey, startTestService, type TestService } from '../helpers/service.js';
import { startReceiver, type Behaviour, type Receiver } from '../helpers/webhook-receiver.js';
import { waitFor } from '../helpers/wait.js';

type Api = ReturnType<typeof client>;
type Ctx = { service: TestService; api: Api; receivers: Receiver[] };
type Workspace = Awaited<ReturnType<typeof bootstrapWorkspace>>;

const ENV = { WEBHOOK_ALLOW_PRIVATE_NETWORKS: '127.0.0.0/8,::1/128', WEBHOOK_RETRY_SCHEDULE: '1s', WEBHOOK_ATTEMPT_TIMEOUT_MS: '1000' };
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

const delivery = suite<Ctx>('webhook delivery');

delivery.before(async (ctx) => {
  ctx.service = await startTestService('wh-delivery', ENV, ['web', 'worker', 'dispatcher']);
  ctx.api = client(ctx.service.url);
});
delivery.before.each((ctx) => {
  ctx.receivers = [];
});
delivery.after.each(async (ctx) => {
  for (const r of ctx.receivers) await r.close();
  setWebhookResolver(null);
});
delivery.after(async (ctx) => ctx.service.stop());

async function receiver(ctx: Ctx, behaviour?: Behaviour): Promise<Receiver> {
  const r = await startReceiver({ behaviour });
  ctx.receivers.push(r);
  return r;
}

/** Creates an endpoint for `r` and teaches `r` its secret. */
async function endpoint(ctx: Ctx, ws: Workspace, r: Receiver, body: Record<string, unknown> = {}, path = '/hook') {
  const res = await ctx.api.post(`/v1/workspaces/${ws.workspace.slug}/webhooks`, ws.keys.workspace, { url: r.url + path, ...body });
  assert.is(res.status, 201, res.text);
  r.secrets.push(res.body.data.secret);
  return res.body.data as { id: string; secret: string };
}

async function track(ctx: Ctx, key: string, name: string, externalId = 'u1', data: Record<string, unknown> = {}) {
  const res = await ctx.api.post('/v1/events', key, { externalId, name, data });
  assert.is(res.status, 202, res.text);
  return res.body.data.items.at(-1) as { id: string; receivedAt: string };
}

const wheOf = (eventId: string) => 'whe_' + eventId.slice('evt_'.length);

/** The deliveries of an endpoint (newest first), optionally with a status filter. */
async function deliveries(ctx: Ctx, ws: Workspace, endpointId: string, status?: string) {
  const res = await ctx.api.get(`/v1/workspaces/${ws.workspace.slug}/webhooks/${endpointId}/deliveries${status ? `?status=${status}` : ''}`, ws.keys.workspace);
  assert.is(res.status, 200, res.text);
  return res.body.data as { items: any[]; total: number };
}

async function deliveryOf(ctx: Ctx, ws: Workspace, endpointId: string, eventId: string) {
  const list = await waitFor(`a delivery of ${eventId}`, async () => (await deliveries(ctx, ws, endpointId)).items.find((d) => d.eventId === eventId));
  const res = await ctx.api.get(`/v1/workspaces/${ws.workspace.slug}/webhooks/${endpointId}/deliveries/${list.id}`, ws.keys.workspace);
  assert.is(res.status, 200, res.text);
  return res.body.data;
}

async function waitDelivery(ctx: Ctx, ws: Workspace, endpointId: string, eventId: string, done: (d: any) => boolean, what: string, timeoutMs = 10_000) {
  return waitFor(what, async () => {
    const d = await deliveryOf(ctx, ws, endpointId, eventId);
    return done(d) ? d : null;
  }, timeoutMs, 100);
}

function assertVerified(r: Receiver) {
  for (const req of r.requests) assert.equal(req.failures, [], `request ${req.id} verified by standardwebhooks with the endpoint secret`);
}

delivery('a workspace that never had an endpoint gets no stream events in its ledger; from its first endpoint on they are delivered', async (ctx) => {
  const ws = await bootstrapWorkspace(ctx.service, 'whd-quiet');
  const before = await track(ctx, ws.keys.tenant, 'quiet.before', 'q1');
  await waitFor('the event applied', async () =>
    (await ctx.api.get('/v1/subscribers/q1/timeline', ws.keys.tenant)).body.data.items.some((e: { id: string }) => e.id === before.id));
  const ledger = await ctx.service.redis.xrange(ctx.service.keys.ledger(ws.workspace.id), '-', '+');
  assert.ok(ledger.length > 0, 'audit entries are in the ledger');
  assert.equal(ledger.filter(([, fields]) => fields[1] === 'stream').length, 0, 'no stream entry: no endpoint could want one');
  const r = await receiver(ctx);
  const e = await endpoint(ctx, ws, r);
  const after = await track(ctx, ws.keys.tenant, 'quiet.after', 'q1');
  await waitDelivery(ctx, ws, e.id, wheOf(after.id), (x) => x.status === 'success', 'the event tracked after the endpoint was made');
  assert.not.ok(r.requests.some((req) => req.body.type === 'quiet.before'), 'an event older than the endpoint is not delivered');
});

delivery('an audit event and a stream event arrive as the signed 2.6 payload, verified by standardwebhooks, and stay readable', async (ctx) => {
  const ws = await bootstrapWorkspace(ctx.service, 'whd-basic');
  const r = await receiver(ctx);
  const e = await endpoint(ctx, ws, r);
  const tracked = await track(ctx, ws.keys.tenant, 'order.completed', 'buyer-1', { total: 42 });
  const { tenant: eu } = await createTenant(ctx.service.redis, ctx.service.keys, ws.workspace, 'eu', BY_TEST);
  await waitFor('three deliveries', async () => r.requests.length >= 3);
  assertVerified(r);
  const byType = new Map(r.requests.map((req) => [req.body.type, req]));
  const stream = byType.get('order.completed')!;
  assert.is(stream.id, wheOf(tracked.id));
  assert.is(stream.body.id, stream.id);
  assert.is(stream.headers['content-type'], 'application/json');
  assert.ok(Math.abs(stream.timestamp - Date.now() / 1000) < 10, 'webhook-timestamp is unix seconds, now');
  assert.match(stream.signatures[0]!, /^v1,[A-Za-z0-9+/]+=*$/);
  assert.equal(Object.keys(stream.body), ['id', 'type', 'apiVersion', 'createdAt', 'workspace', 'tenant', 'data']);
  assert.is(stream.body.apiVersion, 'v1');
  assert.is(stream.body.createdAt, tracked.receivedAt);
  assert.equal(stream.body.workspace, { id: ws.workspace.id, slug: 'whd-basic' });
  assert.equal(stream.body.tenant, { id: ws.tenant.id, slug: 'default' });
  const object = stream.body.data.object;
  assert.equal([object.id, object.sequence, object.name, object.source, object.data, object.subscriber.externalId], [tracked.id, 2, 'order.completed', 'server', { total: 42 }, 'buyer-1']);
  assert.match(object.subscriber.id, /^sub_/);
  assert.ok(byType.get('$subscriber.created'), 'engine events are stream events too');
  const audit = byType.get('tenant.created')!;
  assert.equal(audit.body.tenant, { id: eu.id, slug: 'eu' });
  assert.equal(audit.body.target, { type: 'tenant', id: eu.id });
  assert.equal(audit.body.actor, { type: 'system', id: null });
  assert.ok('request' in audit.body);
  assert.not.ok(r.requests.some((req) => /^(key|webhook)\./.test(req.body.type)), 'private audit events never arrive');

  const stored = await ctx.api.get(`/v1/workspaces/whd-basic/webhooks/events/${stream.id}`, ws.keys.workspace);
  assert.is(stored.status, 200);
  assert.is(JSON.stringify(stored.body.data), stream.raw.toString('utf8'), 'the stored event is the delivered one');
  const d = await waitDelivery(ctx, ws, e.id, stream.id, (x) => x.status === 'success', 'the delivery recorded');
  assert.is(d.attemptCount, 1);
  assert.is(d.lastStatusCode, 204);
  assert.equal(d.event, stream.body);
  assert.is(d.attempts.length, 1);
  const [a] = d.attempts;
  assert.equal([a.attempt, a.trigger, a.statusCode, a.success, a.error, a.response], [1, 'schedule', 204, true, null, '']);
  assert.type(a.durationMs, 'number');
});

delivery('the engine\'s $subscriber.updated and $preferences.updated carry changes and previousAttributes at the top, as the audit subscriber.updated does (spec 2.6, probe T)', async (ctx) => {
  const ws = await bootstrapWorkspace(ctx.service, 'whd-updated');
  const r = await receiver(ctx);
  await endpoint(ctx, ws, r, { events: ['$subscriber.*', '$preferences.*', 'subscriber.updated', 'order.updated'] });
  const key = ws.keys.tenant;
  assert.is((await ctx.api.post('/v1/subscribers', key, { externalId: 'pat', locale: 'en', properties: { plan: 'free' } })).status, 201);
  assert.is((await ctx.api.patch('/v1/subscribers/pat', key, { locale: 'fr', properties: { plan: 'pro' } })).status, 200);
  assert.is((await ctx.api.patch('/v1/subscribers/pat/preferences', key, { channels: { email: false }, categories: { news: { push: false } } })).status, 200);
  await track(ctx, key, 'order.updated', 'pat', { changes: 'mine' });
  const byType = await waitFor('the updates delivered', async () => {
    const m = new Map(r.requests.map((req) => [req.body.type, req.body]));
    return ['$subscriber.updated', '$preferences.updated', 'order.updated'].every((t) => m.has(t)) && r.requests.filter((q) => q.body.type === 'subscriber.updated').length >= 2 ? m : null;
  });
  assertVerified(r);
  const attributes = byType.get('$subscriber.updated');
  assert.equal(attributes.changes, { locale: 'fr', properties: { plan: 'pro' } });
  assert.equal(attributes.previousAttributes, { locale: 'en', properties: { plan: 'free' } });
  assert.equal(attributes.data.object.data, { changes: attributes.changes, previousAttributes: attributes.previousAttributes }, 'the stream event itself is unchanged');
  const preferences = byType.get('$preferences.updated');
  assert.equal(preferences.changes, { preferences: { channels: { email: false }, categories: { news: { push: false } } } });
  assert.equal(preferences.previousAttributes, { preferences: { channels: { email: true }, categories: { news: null } } });
  const audit = r.requests.map((q) => q.body).filter((b) => b.type === 'subscriber.updated' && 'preferences' in b.changes)[0];
  assert.equal([audit.changes, audit.previousAttributes], [preferences.changes, preferences.previousAttributes], 'the same as the audit event');
  const own = byType.get('order.updated');
  assert.not.ok('changes' in own || 'previousAttributes' in own, 'a caller\'s *.updated has free-form data: nothing added');
});

delivery('filters pick events by exact name, resource.*, $ names and tenant; private events never match', async (ctx) => {
  const ws = await bootstrapWorkspace(ctx.service, 'whd-filters');
  const { tenant: eu } = await createTenant(ctx.service.redis, ctx.service.keys, ws.workspace, 'eu', BY_TEST);
  const euKey = (await makeKey(ctx.service, 'whd-filters', 'tenant', ['*'], { tenant: 'eu' })).key;
  const [ra, rb, rc, rd] = [await receiver(ctx), await receiver(ctx), await receiver(ctx), await receiver(ctx)];
  await endpoint(ctx, ws, ra, { events: ['order.*'] });
  await endpoint(ctx, ws, rb, { events: ['$subscriber.created'] });
  await endpoint(ctx, ws, rc, { events: ['tenant.*', 'page.viewed'] });
  await endpoint(ctx, ws, rd, { events: ['*'], tenant: 'eu' });
  await track(ctx, ws.keys.tenant, 'order.completed', 'd-1');
  await track(ctx, ws.keys.tenant, 'page.viewed', 'd-1');
  await track(ctx, euKey, 'order.placed', 'e-1');
  await createTenant(ctx.service.redis, ctx.service.keys, ws.workspace, 'apac', BY_TEST);
  await makeKey(ctx.service, 'whd-filters', 'tenant', ['*'], { tenant: 'eu' }); // key.created: private
  const names = (r: Receiver) => r.requests.map((q) => `${q.body.type}@${q.body.tenant?.slug ?? '-'}`).sort();
  await waitFor('every endpoint to receive its events', async () => ra.requests.length >= 2 && rb.requests.length >= 2 && rc.requests.length >= 2 && rd.requests.length >= 2);
  await sleep(500);
  assert.equal(names(ra), ['order.completed@default', 'order.placed@eu']);
  assert.equal(names(rb), ['$subscriber.created@default', '$subscriber.created@eu']);
  assert.equal(names(rc), ['page.viewed@default', 'tenant.created@apac']);
  assert.equal(names(rd), ['$subscriber.created@eu', 'order.placed@eu']);
  for (const r of [ra, rb, rc, rd]) assertVerified(r);
  assert.ok(eu.id);

  const catalog = await waitFor('the catalog to list the names sent', async () => {
    const res = await ctx.api.get('/v1/workspaces/whd-filters/webhooks/catalog', ws.keys.workspace);
    const groups = res.body.data.groups as any[];
    const seen = groups.filter((g) => g.source === 'stream' && !g.resource.startsWith('$')).flatMap((g) => g.events.map((x: any) => x.name));
    return ['order.completed', 'order.placed', 'page.viewed'].every((n) => seen.includes(n)) ? groups : null;
  });
  assert.is(catalog.find((g: any) => g.resource === 'order' && g.source === 'stream').pattern, 'order.*');
});

delivery('every name and pattern the catalog lists can be subscribed; caller names in the private words reach * only and are not listed', async (ctx) => {
  const ws = await bootstrapWorkspace(ctx.service, 'whd-catalog');
  const all = await receiver(ctx);
  await endpoint(ctx, ws, all);
  for (const name of ['key.pressed', 'webhook.received', 'profile.viewed', 'keys.typed', 'key']) await track(ctx, ws.keys.tenant, name, 'c-1');
  const groups = await waitFor('the catalog to list the names sent', async () => {
    const res = await ctx.api.get('/v1/workspaces/whd-catalog/webhooks/catalog', ws.keys.workspace);
    const listed = res.body.data.groups as any[];
    return listed.some((g) => g.events.some((e: any) => e.name === 'keys.typed')) && listed.some((g) => g.events.some((e: any) => e.name === 'key')) ? listed : null;
  });
  const names = groups.flatMap((g: any) => g.events.map((e: any) => e.name as string));
  const patterns = groups.map((g: any) => g.pattern as string | null).filter((p: string | null): p is string => p !== null);
  for (const hidden of ['key.pressed', 'webhook.received', 'profile.viewed']) assert.not.ok(names.includes(hidden), hidden);
  assert.not.ok(patterns.includes('key.*'));
  assert.equal(groups.find((g: any) => g.source === 'stream' && g.resource === 'key'), { resource: 'key', source: 'stream', pattern: null, events: [{ name: 'key', description: null }] });
  // the create route takes every one of them (each alone too: one refused pattern refuses the endpoint)
  const listed = [...names, ...patterns];
  assert.ok(listed.length <= 100, String(listed.length));
  const res = await ctx.api.post('/v1/workspaces/whd-catalog/webhooks', ws.keys.workspace, { url: all.url + '/every', events: listed });
  assert.is(res.status, 201, res.text);
  // the hidden names still reach `*`
  await waitFor('the private-word names to reach *', async () => ['key.pressed', 'webhook.received', 'profile.viewed'].every((n) => all.requests.some((q) => q.body.type === n)));
  assertVerified(all);
});

delivery('an endpoint never receives events from before its creation, an edit or a re-enable', async (ctx) => {
  const ws = await bootstrapWorkspace(ctx.service, 'whd-since');
  const { slug } = ws.workspace;
  const before = await track(ctx, ws.keys.tenant, 'b.zero', 'since-1');
  const r = await receiver(ctx);
  const e = await endpoint(ctx, ws, r, { events: ['a.*', 'b.*'] });
  const first = await track(ctx, ws.keys.tenant, 'b.one', 'since-1');
  // b.one arriving means b.zero (the same subscriber's earlier event) was read too: ledger order
  await waitFor('b.one', async () => r.requests.some((q) => q.body.type === 'b.one'));

  await ctx.api.patch(`/v1/workspaces/${slug}/webhooks/${e.id}`, ws.keys.workspace, { events: ['a.*'] });
  const outside = await track(ctx, ws.keys.tenant, 'b.two', 'since-1');
  await ctx.api.patch(`/v1/workspaces/${slug}/webhooks/${e.id}`, ws.keys.workspace, { events: ['b.*'] });
  const afterEdit = await track(ctx, ws.keys.tenant, 'b.three', 'since-1');
  await waitFor('b.three', async () => r.requests.some((q) => q.body.type === 'b.three'));

  await ctx.api.patch(`/v1/workspaces/${slug}/webhooks/${e.id}`, ws.keys.workspace, { enabled: false });
  const whileDisabled = await track(ctx, ws.keys.tenant, 'b.four', 'since-1');
  await sleep(300);
  await ctx.api.patch(`/v1/workspaces/${slug}/webhooks/${e.id}`, ws.keys.workspace, { enabled: true });
  const afterEnable = await track(ctx, ws.keys.tenant, 'b.five', 'since-1');
  await waitFor('b.five', async () => r.requests.some((q) => q.body.type === 'b.five'));
  await sleep(500);
  assert.equal(r.requests.map((q) => q.id), [wheOf(first.id), wheOf(afterEdit.id), wheOf(afterEnable.id)]);
  for (const skipped of [before, outside, whileDisabled]) assert.is((await ctx.api.get(`/v1/workspaces/${slug}/webhooks/events/${wheOf(skipped.id)}`, ws.keys.workspace)).status, 404);
  assertVerified(r);
});

delivery('a receiver answering 500 then 200 gets the same webhook-id and identical bytes, freshly signed, and the delivery succeeds', async (ctx) => {
  const ws = await bootstrapWorkspace(ctx.service, 'whd-retry');
  const r = await receiver(ctx, (_req, i) => (i === 0 ? { status: 500, body: 'try again' } : { status: 200, body: '{"ok":true}' }));
  const e = await endpoint(ctx, ws, r, { events: ['retry.me'] });
  const tracked = await track(ctx, ws.keys.tenant, 'retry.me');
  await waitFor('two requests', async () => r.requests.length >= 2);
  const [one, two] = r.requests as [any, any];
  assert.is(one.id, wheOf(tracked.id));
  assert.is(two.id, one.id);
  assert.ok(Buffer.compare(one.raw, two.raw) === 0, 'identical bytes');
  assert.ok(two.timestamp >= one.timestamp + 1, 'a fresh webhook-timestamp');
  assert.is.not(two.signatures[0], one.signatures[0]);
  assertVerified(r);
  const d = await waitDelivery(ctx, ws, e.id, one.id, (x) => x.status === 'success', 'success on attempt 2');
  assert.is(d.attemptCount, 2);
  assert.equal(d.attempts.map((a: any) => [a.attempt, a.statusCode, a.success, a.response]), [[1, 500, false, 'try again'], [2, 200, true, '{"ok":true}']]);
  await sleep(1300);
  assert.is(r.requests.length, 2, 'nothing after success');
  // record and payload are kept the retention after the last attempt the schedule could make (probe R)
  const { redis, keys, config } = ctx.service;
  const keep = deliveryKeepMs(config.retentionMs, config.webhookRetryScheduleMs);
  for (const key of [keys.webhookDelivery(ws.workspace.id, d.id), keys.webhookEvent(ws.workspace.id, one.id)]) {
    const ttl = await redis.pttl(key);
    assert.ok(ttl > config.retentionMs && ttl <= keep, `${key}: ${ttl} ms to live, keep ${keep} (retention ${config.retentionMs} + the schedule's span)`);
  }
});

delivery('a 302 is a failed attempt and the redirect is not followed', async (ctx) => {
  const ws = await bootstrapWorkspace(ctx.service, 'whd-redirect');
  const r = await receiver(ctx, (req) => (req.path === '/hook' ? { status: 302, headers: { location: '/elsewhere' } } : { status: 204 }));
  const e = await endpoint(ctx, ws, r, { events: ['moved.*'] });
  const tracked = await track(ctx, ws.keys.tenant, 'moved.away');
  const d = await waitDelivery(ctx, ws, e.id, wheOf(tracked.id), (x) => x.attempts.length >= 1, 'the first attempt');
  await ctx.api.patch(`/v1/workspaces/${ws.workspace.slug}/webhooks/${e.id}`, ws.keys.workspace, { enabled: false });
  assert.is(d.status, 'failed');
  assert.equal([d.attempts[0].statusCode, d.attempts[0].success], [302, false]);
  assert.match(d.attempts[0].error, /redirect not followed \(302 to \/elsewhere\)/);
  assert.ok(d.nextAttemptAt, 'a retry is scheduled');
  assert.not.ok(r.requests.some((q) => q.path !== '/hook'), 'nothing went to the Location');
});

delivery('a receiver that never answers times out; one that closes the socket is a network error; only 4 KB of an answer is kept', async (ctx) => {
  const ws = await bootstrapWorkspace(ctx.service, 'whd-broken');
  const hang = await receiver(ctx, () => ({ hang: true }));
  const drop = await receiver(ctx, () => ({ destroy: true }));
  const big = await receiver(ctx, () => ({ status: 200, body: 'x'.repeat(10_000) }));
  const euro = await receiver(ctx, () => ({ status: 200, body: 'ab' + '€'.repeat(3000) }));
  const eh = await endpoint(ctx, ws, hang, { events: ['broken.*'] });
  const ed = await endpoint(ctx, ws, drop, { events: ['broken.*'] });
  const eb = await endpoint(ctx, ws, big, { events: ['broken.*'] });
  const ee = await endpoint(ctx, ws, euro, { events: ['broken.*'] });
  const tracked = await track(ctx, ws.keys.tenant, 'broken.one');
  const id = wheOf(tracked.id);
  const hung = await waitDelivery(ctx, ws, eh.id, id, (x) => x.attempts.length >= 1, 'the timed-out attempt');
  const dropped = await waitDelivery(ctx, ws, ed.id, id, (x) => x.attempts.length >= 1, 'the dropped attempt');
  const long = await waitDelivery(ctx, ws, eb.id, id, (x) => x.status === 'success', 'the long answer');
  const multi = await waitDelivery(ctx, ws, ee.id, id, (x) => x.status === 'success', 'the long multi-byte answer');
  for (const e of [eh, ed]) await ctx.api.patch(`/v1/workspaces/${ws.workspace.slug}/webhooks/${e.id}`, ws.keys.workspace, { enabled: false });
  const t = hung.attempts[0];
  assert.equal([t.statusCode, t.success, t.response], [null, false, null]);
  assert.match(t.error, /^timeout: no complete answer within 1000 ms/);
  assert.ok(t.durationMs >= 950 && t.durationMs < 3000, `took ${t.durationMs} ms`);
  assert.is(hung.status, 'failed');
  const n = dropped.attempts[0];
  assert.equal([n.statusCode, n.success], [null, false]);
  assert.match(n.error, /socket hang up|ECONNRESET/);
  assert.is(long.attempts[0].response.length, 4096);
  assert.is(long.attempts[0].response, 'x'.repeat(4096));
  // 4 KB cut back to the last whole character (4,094 bytes), not a U+FFFD the receiver never sent
  assert.is(multi.attempts[0].response, 'ab' + '€'.repeat(1364));
  assertVerified(big);
});

delivery('replay resends the stored payload as one extra attempt; a 2xx replay marks a failed delivery success; disabled is 400 endpoint_disabled', async (ctx) => {
  const ws = await bootstrapWorkspace(ctx.service, 'whd-replay');
  const { slug } = ws.workspace;
  let failures = 0;
  const r = await receiver(ctx, (req) => (req.body.type === 'replay.fails' && failures++ === 0 ? { status: 500 } : { status: 204 }));
  const e = await endpoint(ctx, ws, r, { events: ['replay.*'] });
  const ok = await track(ctx, ws.keys.tenant, 'replay.ok');
  const okId = wheOf(ok.id);
  const done = await waitDelivery(ctx, ws, e.id, okId, (x) => x.status === 'success', 'the first delivery');
  const replay = await ctx.api.post(`/v1/workspaces/${slug}/webhooks/${e.id}/deliveries/${done.id}/replay`, ws.keys.workspace);
  assert.is(replay.status, 202);
  assert.is(replay.body.data.id, done.id);
  await waitFor('the replay', async () => r.withId(okId).length === 2);
  const [first, again] = r.withId(okId) as [any, any];
  assert.ok(Buffer.compare(first.raw, again.raw) === 0, 'the stored bytes');
  const replayed = await waitDelivery(ctx, ws, e.id, okId, (x) => x.attempts.length === 2, 'the replay recorded');
  assert.equal(replayed.attempts.map((a: any) => a.trigger), ['schedule', 'replay']);
  assert.equal([replayed.status, replayed.attemptCount, replayed.replayCount], ['success', 1, 1]);

  const failing = await track(ctx, ws.keys.tenant, 'replay.fails');
  const failedId = wheOf(failing.id);
  const failed = await waitDelivery(ctx, ws, e.id, failedId, (x) => x.status === 'failed', 'the failed delivery');
  await ctx.api.post(`/v1/workspaces/${slug}/webhooks/${e.id}/deliveries/${failed.id}/replay`, ws.keys.workspace);
  const fixed = await waitDelivery(ctx, ws, e.id, failedId, (x) => x.status === 'success', 'success after the replay');
  assert.is(fixed.attempts[0].statusCode, 500);
  assert.ok(fixed.attempts.some((a: any) => a.success), 'a 2xx attempt');

  const listed = await deliveries(ctx, ws, e.id);
  assert.equal(listed.items.map((x) => x.eventId), [failedId, okId], 'newest first');
  assert.is((await deliveries(ctx, ws, e.id, 'success')).total, 2);
  assert.is((await deliveries(ctx, ws, e.id, 'failed')).total, 0);

  await ctx.api.patch(`/v1/workspaces/${slug}/webhooks/${e.id}`, ws.keys.workspace, { enabled: false });
  const refused = await ctx.api.post(`/v1/workspaces/${slug}/webhooks/${e.id}/deliveries/${done.id}/replay`, ws.keys.workspace);
  assert.is(refused.status, 400);
  assert.is(refused.body.error.code, 'endpoint_disabled');
  assertVerified(r);
});

delivery('a delivery is replayed at most MAX_REPLAYS times; the next is 409 conflict and queues nothing (probe EU: replays grew one record without bound)', async (ctx) => {
  const ws = await bootstrapWorkspace(ctx.service, 'whd-replays');
  const { slug } = ws.workspace;
  const r = await receiver(ctx, () => ({ status: 204 }));
  const e = await endpoint(ctx, ws, r, { events: ['replays.*'] });
  const id = wheOf((await track(ctx, ws.keys.tenant, 'replays.one')).id);
  const d = await waitDelivery(ctx, ws, e.id, id, (x) => x.status === 'success', 'the delivery');
  const replay = () => ctx.api.post(`/v1/workspaces/${slug}/webhooks/${e.id}/deliveries/${d.id}/replay`, ws.keys.workspace);
  for (let i = 0; i < MAX_REPLAYS; i++) assert.is((await replay()).status, 202, `replay ${i + 1}`);
  const refused = await replay();
  assert.equal([refused.status, refused.body.error.code], [409, 'conflict']);
  const all = await waitDelivery(ctx, ws, e.id, id, (x) => x.attempts.length === MAX_REPLAYS + 1, 'every replay recorded');
  assert.is(all.replayCount, MAX_REPLAYS);
  assert.is(r.withId(id).length, MAX_REPLAYS + 1, 'the refused one was not sent');
});

delivery('the status filter lists each status with its total', async (ctx) => {
  const ws = await bootstrapWorkspace(ctx.service, 'whd-status');
  const r = await receiver(ctx, (req) => (req.body.type === 'status.bad' ? { status: 503 } : { status: 204 }));
  const e = await endpoint(ctx, ws, r, { events: ['status.*'] });
  const good1 = await track(ctx, ws.keys.tenant, 'status.good');
  const bad = await track(ctx, ws.keys.tenant, 'status.bad');
  const good2 = await track(ctx, ws.keys.tenant, 'status.good');
  await waitDelivery(ctx, ws, e.id, wheOf(bad.id), (x) => x.status === 'failed', 'the failed one');
  // each good one: their attempts run side by side in the endpoint's lanes, so good2's result may be recorded before good1's
  for (const good of [good1, good2]) await waitDelivery(ctx, ws, e.id, wheOf(good.id), (x) => x.status === 'success', 'the good ones');
  await ctx.api.patch(`/v1/workspaces/${ws.workspace.slug}/webhooks/${e.id}`, ws.keys.workspace, { enabled: false });
  const success = await deliveries(ctx, ws, e.id, 'success');
  assert.equal([success.total, success.items.map((x) => x.eventId)], [2, [wheOf(good2.id), wheOf(good1.id)]]);
  const failed = await deliveries(ctx, ws, e.id, 'failed');
  assert.equal([failed.total, failed.items.map((x) => x.eventId)], [1, [wheOf(bad.id)]]);
  assert.is((await deliveries(ctx, ws, e.id, 'exhausted')).total, 0);
  assert.is((await deliveries(ctx, ws, e.id)).total, 3);
});

delivery('deliveries of a burst list newest first by createdAt, a subscriber\'s events newest first, across pages without repeats or gaps', async (ctx) => {
  const ws = await bootstrapWorkspace(ctx.service, 'whd-burst');
  const r = await receiver(ctx);
  const e = await endpoint(ctx, ws, r, { events: ['burst.*', '$subscriber.created'] });
  const buyers = Array.from({ length: 8 }, (_, i) => `burst-${i}`);
  // one batch of new subscribers: each also writes $subscriber.created, so 16 events within a few ms
  const res = await ctx.api.post('/v1/events', ws.keys.tenant, { events: buyers.map((externalId) => ({ externalId, name: 'burst.done' })) });
  assert.is(res.status, 202, res.text);
  await waitFor('16 successful deliveries', async () => (await deliveries(ctx, ws, e.id, 'success')).total === 16, 10_000, 100);
  const base = `/v1/workspaces/${ws.workspace.slug}/webhooks/${e.id}/deliveries`;
  const all = (await ctx.api.get(`${base}?limit=100`, ws.keys.workspace)).body.data.items as any[];
  const nonIncreasing = (list: any[]) => list.every((d, i) => i === 0 || Date.parse(d.createdAt) <= Date.parse(list[i - 1].createdAt));
  assert.ok(nonIncreasing(all), `createdAt never increases down the list: ${all.map((d) => `${d.eventType} ${d.createdAt}`).join(', ')}`);
  const externalIdOf = new Map(r.requests.map((req) => [req.id, req.body.data.object.subscriber.externalId as string]));
  for (const buyer of buyers) {
    const mine = all.filter((d) => externalIdOf.get(d.eventId) === buyer).map((d) => d.eventType);
    assert.equal(mine, ['burst.done', '$subscriber.created'], `${buyer}: its later event is listed first`);
  }
  const paged: any[] = [];
  let cursor: string | null = null;
  do {
    const page: any = (await ctx.api.get(`${base}?limit=3${cursor ? `&cursor=${cursor}` : ''}`, ws.keys.workspace)).body.data;
    paged.push(...page.items);
    cursor = page.nextCursor;
  } while (cursor);
  assert.equal(paged.map((d) => d.id), all.map((d) => d.id), 'pages of 3 give the same list, each delivery once');
  assert.ok(nonIncreasing(paged));
  assert.equal((await ctx.api.get(`${base}?status=success&limit=100`, ws.keys.workspace)).body.data.items.map((d: any) => d.id), all.map((d) => d.id), 'the status filter keeps the order');
});

delivery('a host name whose DNS answer moves to a private address is refused at send time, and the attempt says why', async (ctx) => {
  const ws = await bootstrapWorkspace(ctx.service, 'whd-dns');
  let answer = '127.0.0.1';
  setWebhookResolver(async (hostname) => {
    if (hostname !== 'receiver.example.test') throw Object.assign(new Error(`getaddrinfo ENOTFOUND ${hostname}`), { code: 'ENOTFOUND' });
    return [{ address: answer, family: answer.includes(':') ? 6 : 4 }];
  });
  // Connection: close, so every attempt connects (and resolves) again
  const r = await receiver(ctx, () => ({ status: 204, headers: { connection: 'close' } }));
  const res = await ctx.api.post(`/v1/workspaces/whd-dns/webhooks`, ws.keys.workspace, { url: `http://receiver.example.test:${r.port}/hook`, events: ['dns.*'] });
  assert.is(res.status, 201, res.text);
  r.secrets.push(res.body.data.secret);
  const e = res.body.data;
  const ok = await track(ctx, ws.keys.tenant, 'dns.one');
  await waitDelivery(ctx, ws, e.id, wheOf(ok.id), (x) => x.status === 'success', 'delivery while the name is allowed');
  answer = '10.20.30.40';
  const moved = await track(ctx, ws.keys.tenant, 'dns.two');
  const refused = await waitDelivery(ctx, ws, e.id, wheOf(moved.id), (x) => x.attempts.length >= 1, 'the refused attempt');
  assert.equal([refused.status, refused.attempts[0].statusCode], ['failed', null]);
  // neither the address nor its kind (probe BZ: the attempt named 10.20.30.40, private, to any webhooks:read key)
  assert.is(refused.attempts[0].error, 'refused: receiver.example.test does not resolve to a public address only');
  answer = '::ffff:169.254.169.254';
  const mapped = await track(ctx, ws.keys.tenant, 'dns.three');
  const refusedMapped = await waitDelivery(ctx, ws, e.id, wheOf(mapped.id), (x) => x.attempts.length >= 1, 'the refused IPv4-mapped attempt');
  assert.is(refusedMapped.attempts[0].error, 'refused: receiver.example.test does not resolve to a public address only');
  await ctx.api.patch(`/v1/workspaces/whd-dns/webhooks/${e.id}`, ws.keys.workspace, { enabled: false });
  assert.equal(r.requests.map((q) => q.body.type), ['dns.one'], 'nothing reached a refused address');
  assertVerified(r);
});

delivery('a consumer group lost (NOGROUP) is recreated and delivery goes on, without sending anything twice', async (ctx) => {
  const ws = await bootstrapWorkspace(ctx.service, 'whd-nogroup');
  const r = await receiver(ctx);
  await endpoint(ctx, ws, r, { events: ['nogroup.*'] });
  const one = await track(ctx, ws.keys.tenant, 'nogroup.one');
  await waitFor('the first event', async () => r.requests.length === 1);
  const ledger = ctx.service.keys.ledger(ws.workspace.id);
  await waitFor('the group to have consumed it', async () => {
    const groups = (await ctx.service.redis.xinfo('GROUPS', ledger)) as unknown[][];
    return groups.some((g) => g.includes(WEBHOOK_GROUP));
  });
  assert.is(await ctx.service.redis.xgroup('DESTROY', ledger, WEBHOOK_GROUP), 1);
  const two = await track(ctx, ws.keys.tenant, 'nogroup.two');
  await waitFor('the event after the loss', async () => r.requests.length >= 2);
  await sleep(500);
  assert.equal(r.requests.map((q) => q.id), [wheOf(one.id), wheOf(two.id)], 're-reading the ledger sent nothing twice');
});

delivery('ten failed attempts make a delivery exhausted, then nothing more is sent; a replay that succeeds is recorded and leaves it exhausted (spec 3.2)', async (ctx) => {
  const ws = await bootstrapWorkspace(ctx.service, 'whd-exhaust');
  let status = 503;
  const r = await receiver(ctx, () => ({ status }));
  const e = await endpoint(ctx, ws, r, { events: ['doomed.*'] });
  const tracked = await track(ctx, ws.keys.tenant, 'doomed.event');
  const id = wheOf(tracked.id);
  // ten attempts 1 s apart, each claimed and recorded: ~10 s, more on a loaded machine
  const d = await waitDelivery(ctx, ws, e.id, id, (x) => x.status === 'exhausted', 'exhausted', 40_000);
  assert.is(d.attemptCount, 10);
  assert.equal(d.attempts.map((a: any) => a.statusCode), Array(10).fill(503));
  assert.is(d.nextAttemptAt, null);
  await sleep(1500);
  assert.is(r.requests.length, 10, 'no eleventh attempt');
  assert.ok(r.requests.every((q) => q.id === id && Buffer.compare(q.raw, r.requests[0]!.raw) === 0), 'same id and bytes every time');
  assertVerified(r);
  assert.is((await deliveries(ctx, ws, e.id, 'exhausted')).total, 1);
  status = 200;
  await ctx.api.post(`/v1/workspaces/whd-exhaust/webhooks/${e.id}/deliveries/${d.id}/replay`, ws.keys.workspace);
  const replayed = await waitDelivery(ctx, ws, e.id, id, (x) => x.attempts.length === 11, 'the replay recorded');
  assert.equal([replayed.status, replayed.attemptCount, replayed.attempts[10].trigger, replayed.attempts[10].statusCode], ['exhausted', 10, 'replay', 200]);
  assert.is(r.requests.length, 11, 'the replay was sent');
  assert.equal([(await deliveries(ctx, ws, e.id, 'exhausted')).total, (await deliveries(ctx, ws, e.id, 'success')).total], [1, 0]);
});

delivery.run();
