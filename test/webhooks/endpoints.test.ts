import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { setWebhookResolver } from '../../lib/webhook-resolver.js';
import { createTenant } from '../../streams/identity.js';
import { LEDGER_FIELDS } from '../../streams/ledger.js';
import { client } from '../helpers/api.js';
import { BY_TEST, bootstrapWorkspace, makeKey, startTestService, type TestService } from '../helpers/service.js';

type Api = ReturnType<typeof client>;
type Ctx = { service: TestService; api: Api; key: string; tenantKey: string; clientKey: string };

const PUBLIC_URL = 'https://8.8.8.8/hooks';
const base = (slug = 'wh') => `/v1/workspaces/${slug}/webhooks`;

/** Names resolved at save time, without the network. */
const DNS: Record<string, string[]> = {
  'hooks.example.test': ['93.184.216.34'],
  'two.example.test': ['93.184.216.34', '10.1.2.3'],
  'internal.example.test': ['10.0.0.5'],
  'mapped.example.test': ['::ffff:192.168.1.1'],
  'metadata.example.test': ['169.254.169.254'],
};

const endpoints = suite<Ctx>('webhook endpoints API');

endpoints.before(async (ctx) => {
  // no WEBHOOK_ALLOW_PRIVATE_NETWORKS: loopback and private addresses are refused here
  ctx.service = await startTestService('wh-endpoints');
  ctx.api = client(ctx.service.url);
  const { keys } = await bootstrapWorkspace(ctx.service, 'wh');
  ctx.key = keys.workspace;
  ctx.tenantKey = keys.tenant;
  ctx.clientKey = keys.client;
  setWebhookResolver(async (hostname) => {
    const addresses = DNS[hostname];
    if (!addresses) throw Object.assign(new Error(`getaddrinfo ENOTFOUND ${hostname}`), { code: 'ENOTFOUND' });
    return addresses.map((address) => ({ address, family: address.includes(':') ? 6 : 4 }));
  });
});
endpoints.after(async (ctx) => {
  setWebhookResolver(null);
  await ctx.service.stop();
});

endpoints('create answers 201 with the whsec_ secret once; get and list never show it', async ({ api, key }) => {
  const created = await api.post(base(), key, { url: PUBLIC_URL, description: 'orders', events: ['order.*', 'subscriber.created', 'order.*'] });
  assert.is(created.status, 201);
  const e = created.body.data;
  assert.match(e.id, /^whk_/);
  assert.match(e.secret, /^whsec_[A-Za-z0-9+/=]{32}$/);
  assert.equal(e.events, ['order.*', 'subscriber.created'], 'duplicates dropped');
  assert.is(e.enabled, true);
  assert.is(e.tenant, null);
  assert.is(e.failingSince, null);
  const got = await api.get(`${base()}/${e.id}`, key);
  assert.is(got.status, 200);
  assert.is(got.body.data.secret, undefined);
  assert.not.ok(got.text.includes(e.secret));
  const list = await api.get(base(), key);
  assert.not.ok(list.text.includes(e.secret));
  assert.ok(list.body.data.items.some((i: any) => i.id === e.id));
  assert.type(list.body.data.total, 'number');
});

endpoints('events default to *; the list is newest first with total', async ({ api, key }) => {
  const a = (await api.post(base(), key, { url: PUBLIC_URL })).body.data;
  const b = (await api.post(base(), key, { url: PUBLIC_URL })).body.data;
  assert.equal(a.events, ['*']);
  const list = await api.get(`${base()}?limit=2`, key);
  assert.equal(list.body.data.items.map((i: any) => i.id), [b.id, a.id]);
  assert.is(list.body.data.hasMore, true);
  const next = await api.get(`${base()}?limit=2&cursor=${list.body.data.nextCursor}`, key);
  assert.not.ok(next.body.data.items.some((i: any) => i.id === a.id || i.id === b.id));
  assert.is(next.body.data.total, list.body.data.total);
});

endpoints('URLs with credentials, private, loopback, link-local, CGNAT, multicast or reserved addresses are 400 invalid_url', async ({ api, key }) => {
  const refused = [
    'https://user:pass@8.8.8.8/hooks', 'https://user@8.8.8.8/', 'https://127.0.0.1/', 'http://localhost:3000/', 'https://10.0.0.1/', 'https://172.16.5.4/',
    'https://192.168.1.1/', 'https://169.254.169.254/latest/meta-data', 'https://100.64.0.1/', 'https://224.0.0.1/', 'https://240.0.0.1/',
    'https://0.0.0.0/', 'https://[::1]/', 'https://[::ffff:10.0.0.1]/', 'https://[::ffff:127.0.0.1]/', 'https://[fe80::1]/', 'https://[fc00::1]/',
    'https://[ff02::1]/', 'https://2130706433/', 'https://0x7f.1/', 'ftp://8.8.8.8/', 'not a url',
    // names are resolved at save time: every address must be public
    'https://internal.example.test/', 'https://two.example.test/', 'https://mapped.example.test/', 'https://metadata.example.test/',
  ];
  for (const url of refused) {
    const res = await api.post(base(), key, { url });
    assert.is(res.status, 400, url);
    assert.is(res.body.error.code, 'invalid_url', url);
    assert.is(res.body.error.param, 'url', url);
    // a resolved name's refusal says neither the address nor its kind (probe Z: it mapped the
    // service's own network for any key holder)
    if (url.includes('example.test')) assert.not.match(JSON.stringify(res.body.error), /10\.|192\.168|169\.254|private|link-local|loopback/, url);
  }
  const ok = await api.post(base(), key, { url: 'https://hooks.example.test/in' });
  assert.is(ok.status, 201);
  assert.is(ok.body.data.url, 'https://hooks.example.test/in');
  // a name that does not resolve now points nowhere private: saved (each attempt resolves it again)
  const unresolved = await api.post(base(), key, { url: 'https://nowhere.example.test/in' });
  assert.is(unresolved.status, 201, JSON.stringify(unresolved.body));
  assert.is((await api.patch(`${base()}/${unresolved.body.data.id}`, key, { url: 'https://nowhere-else.example.test/in' })).status, 200);
  await api.del(`${base()}/${unresolved.body.data.id}`, key);
});

endpoints('the URL bound holds once normalised: non-ASCII text percent-encoded past 2,048 characters is 400 validation (probe Z)', async ({ api, key }) => {
  const grown = await api.post(base(), key, { url: `https://8.8.8.8/${'é'.repeat(2000)}` });
  assert.is(grown.status, 400, JSON.stringify(grown.body));
  assert.equal([grown.body.error.code, grown.body.error.param], ['validation', 'url']);
  const fits = await api.post(base(), key, { url: `https://8.8.8.8/${'é'.repeat(300)}` });
  assert.is(fits.status, 201, JSON.stringify(fits.body));
  assert.ok(fits.body.data.url.length <= 2048);
  await api.del(`${base()}/${fits.body.data.id}`, key);
});

endpoints('a URL with credentials is refused, not rewritten, on PATCH too', async ({ api, key }) => {
  const e = (await api.post(base(), key, { url: PUBLIC_URL })).body.data;
  const res = await api.patch(`${base()}/${e.id}`, key, { url: 'https://admin:secret@8.8.8.8/x' });
  assert.is(res.status, 400);
  assert.is(res.body.error.code, 'invalid_url');
  assert.is((await api.get(`${base()}/${e.id}`, key)).body.data.url, PUBLIC_URL);
});

endpoints('private audit names are 400 invalid_event; malformed patterns are 400 validation', async (ctx) => {
  const { api, key } = ctx;
  for (const events of [['key.*'], ['order.*', 'webhook.created'], ['profile.*'], ['key.revoked']]) {
    const res = await api.post(base(), key, { url: PUBLIC_URL, events });
    assert.is(res.status, 400, JSON.stringify(events));
    assert.is(res.body.error.code, 'invalid_event', JSON.stringify(events));
  }
  for (const events of [['Order.*'], ['*.created'], ['$nope'], [], ['order..*']]) {
    const res = await api.post(base(), key, { url: PUBLIC_URL, events });
    assert.is(res.status, 400, JSON.stringify(events));
    assert.is(res.body.error.code, 'validation', JSON.stringify(events));
  }
  // the published document refuses the malformed ones as the service does, and takes the rest (probe F1: `*.completed` passed it)
  const doc = (await (await fetch(`${ctx.service.url}/v1/openapi.json`)).json()) as any;
  const shape = new RegExp(doc.components.schemas.CreateWebhookRequest.properties.events.items.pattern);
  for (const p of ['Order.*', '*.created', 'order..*', 'order.**', '*.completed']) assert.not.ok(shape.test(p), p);
  for (const p of ['*', 'order.*', 'order', 'order.', '$subscription.*', 'key.*', 'o.*']) assert.ok(shape.test(p), p);
  // a malformed pattern is validation, and its details name the private patterns of the list too (probe DF), on create and update
  const res = await api.post(base(), key, { url: PUBLIC_URL, events: ['key.*', 'Bad', 'order.*', 'webhook.disabled'] });
  assert.is(res.body.error.code, 'validation');
  assert.equal(res.body.error.details.map((d: any) => d.param), ['events[0]', 'events[1]', 'events[3]']);
  const both = await api.post(base(), key, { events: ['profile.x', 'Order.*'] });
  assert.equal(both.body.error.details.map((d: any) => d.param), ['url', 'events[0]', 'events[1]']);
  const e = (await api.post(base(), key, { url: PUBLIC_URL })).body.data;
  const patched = await api.patch(`${base()}/${e.id}`, key, { events: ['webhook.*'] });
  assert.is(patched.body.error.code, 'invalid_event');
  const malformed = await api.patch(`${base()}/${e.id}`, key, { events: ['webhook.*', '*.x'] });
  assert.equal([malformed.body.error.code, malformed.body.error.details.map((d: any) => d.param)], ['validation', ['events[0]', 'events[1]']]);
});

endpoints('tenant narrows to a tenant slug of the workspace; an unknown slug is 400 validation', async ({ service, api, key }) => {
  const { workspace } = (await bootstrapWorkspace(service, 'wh'));
  await createTenant(service.redis, service.keys, workspace, 'eu', BY_TEST);
  const unknown = await api.post(base(), key, { url: PUBLIC_URL, tenant: 'nope' });
  assert.is(unknown.status, 400);
  assert.is(unknown.body.error.code, 'validation');
  assert.is(unknown.body.error.param, 'tenant');
  const e = (await api.post(base(), key, { url: PUBLIC_URL, tenant: 'eu' })).body.data;
  assert.is(e.tenant, 'eu');
  const cleared = await api.patch(`${base()}/${e.id}`, key, { tenant: null });
  assert.is(cleared.body.data.tenant, null);
});

endpoints('webhook routes refuse tenant and client keys, keys without the scope, and other workspaces', async ({ service, api, key, tenantKey, clientKey }) => {
  for (const k of [tenantKey, clientKey]) {
    const res = await api.get(base(), k);
    assert.is(res.status, 403);
    assert.is(res.body.error.code, 'forbidden');
  }
  const reader = (await makeKey(service, 'wh', 'workspace', ['webhooks:read'])).key;
  assert.is((await api.get(base(), reader)).status, 200);
  assert.is((await api.get(`${base()}/catalog`, reader)).status, 200);
  const write = await api.post(base(), reader, { url: PUBLIC_URL });
  assert.is(write.status, 403);
  assert.is(write.body.error.code, 'missing_permission');
  const other = (await bootstrapWorkspace(service, 'wh-other')).keys.workspace;
  assert.is((await api.get(base(), other)).status, 403);
  const e = (await api.post(base(), key, { url: PUBLIC_URL })).body.data;
  assert.is((await api.get(`${base('wh-other')}/${e.id}`, other)).status, 404, 'another workspace\'s endpoint is not found');
  assert.is((await api.get(base(), undefined)).status, 401);
});

endpoints('unknown, malformed and foreign ids are 404', async ({ api, key }) => {
  for (const id of ['whk_nope', 'whd_01m83tcsvns1q77h1wqtd24w3m', 'whk_01m83tcsvns1q77h1wqtd24w3m']) {
    assert.is((await api.get(`${base()}/${id}`, key)).status, 404, id);
    assert.is((await api.patch(`${base()}/${id}`, key, { enabled: false })).status, 404, id);
    assert.is((await api.del(`${base()}/${id}`, key)).status, 404, id);
    assert.is((await api.post(`${base()}/${id}/rotate`, key)).status, 404, id);
    assert.is((await api.get(`${base()}/${id}/deliveries`, key)).status, 404, id);
  }
  const e = (await api.post(base(), key, { url: PUBLIC_URL })).body.data;
  assert.is((await api.get(`${base()}/${e.id}/deliveries/whd_01m83tcsvns1q77h1wqtd24w3m`, key)).status, 404);
  assert.is((await api.post(`${base()}/${e.id}/deliveries/nope/replay`, key)).status, 404);
  assert.is((await api.get(`${base()}/events/whe_01m83tcsvns1q77h1wqtd24w3m`, key)).status, 404);
  assert.is((await api.get(`${base()}/events/evt_01m83tcsvns1q77h1wqtd24w3m`, key)).status, 404);
  const bad = await api.get(`${base()}/${e.id}/deliveries?status=nope`, key);
  assert.is(bad.status, 400);
  assert.is(bad.body.error.code, 'validation');
});

endpoints('PATCH edits url, description, events, tenant and enabled; disabling sets disabledAt, enabling clears it', async ({ api, key }) => {
  const e = (await api.post(base(), key, { url: PUBLIC_URL, events: ['order.*'] })).body.data;
  const patched = await api.patch(`${base()}/${e.id}`, key, { url: 'https://8.8.4.4/other', description: 'x', events: ['*'] });
  assert.is(patched.status, 200);
  assert.equal([patched.body.data.url, patched.body.data.description, patched.body.data.events], ['https://8.8.4.4/other', 'x', ['*']]);
  const off = await api.patch(`${base()}/${e.id}`, key, { enabled: false });
  assert.is(off.body.data.enabled, false);
  assert.ok(off.body.data.disabledAt);
  const on = await api.patch(`${base()}/${e.id}`, key, { enabled: true });
  assert.is(on.body.data.enabled, true);
  assert.is(on.body.data.disabledAt, null);
  const cleared = await api.patch(`${base()}/${e.id}`, key, { description: null });
  assert.is(cleared.body.data.description, null);
  const unknown = await api.patch(`${base()}/${e.id}`, key, { secret: 'whsec_x' });
  assert.is(unknown.status, 400);
  assert.is(unknown.body.error.code, 'validation');
});

endpoints('PATCH with a JSON body that is not an object (null too), an empty one or none is 400 validation, as on every other route', async ({ api, key }) => {
  const e = (await api.post(base(), key, { url: PUBLIC_URL })).body.data;
  for (const raw of ['null', '42', '[]', '"x"']) {
    const res = await api.call('PATCH', `${base()}/${e.id}`, { key, raw });
    assert.is(res.status, 400, raw);
    assert.is(res.body.error.code, 'validation', raw);
    assert.equal(res.body.error.details, [{ param: 'body', message: 'must be object' }], raw);
  }
  // nothing to change (an empty object, or no body at all) is 400 too, as on the other PATCH routes
  for (const raw of ['{}', '']) {
    const res = await api.call('PATCH', `${base()}/${e.id}`, { key, raw });
    assert.is(res.status, 400, `${JSON.stringify(raw)}: ${res.text}`);
    assert.is(res.body.error.code, 'validation');
  }
});

endpoints('rotate answers a new secret once; the endpoint shows when it rotated', async ({ api, key }) => {
  const e = (await api.post(base(), key, { url: PUBLIC_URL })).body.data;
  const rotated = await api.post(`${base()}/${e.id}/rotate`, key);
  assert.is(rotated.status, 200);
  assert.match(rotated.body.data.secret, /^whsec_/);
  assert.is.not(rotated.body.data.secret, e.secret);
  const got = (await api.get(`${base()}/${e.id}`, key)).body.data;
  assert.ok(got.secretRotatedAt);
  assert.is(got.secret, undefined);
});

endpoints('delete answers the endpoint, then it is gone', async ({ api, key }) => {
  const e = (await api.post(base(), key, { url: PUBLIC_URL })).body.data;
  const deleted = await api.del(`${base()}/${e.id}`, key);
  assert.is(deleted.status, 200);
  assert.is(deleted.body.data.id, e.id);
  assert.is((await api.get(`${base()}/${e.id}`, key)).status, 404);
  assert.is((await api.get(`${base()}/${e.id}/deliveries`, key)).status, 404);
});

endpoints('endpoint changes are private audit events in the ledger, without secrets', async ({ service, api, key }) => {
  const e = (await api.post(base(), key, { url: PUBLIC_URL })).body.data;
  await api.patch(`${base()}/${e.id}`, key, { description: 'changed' });
  const rotated = (await api.post(`${base()}/${e.id}/rotate`, key)).body.data;
  await api.del(`${base()}/${e.id}`, key);
  const workspaceId = (await bootstrapWorkspace(service, 'wh')).workspace.id;
  const entries = (await service.redis.xrange(service.keys.ledger(workspaceId), '-', '+'))
    .map(([, f]) => ({ kind: f[1], raw: f[3]!, payload: JSON.parse(f[f.indexOf(LEDGER_FIELDS.payload) + 1]!) }))
    .filter((x) => x.payload.target?.id === e.id);
  assert.equal(entries.map((x) => x.payload.type), ['webhook.created', 'webhook.updated', 'webhook.rotated', 'webhook.deleted']);
  const updated = entries[1]!.payload;
  assert.equal(updated.changes, { description: 'changed', updatedAt: updated.changes.updatedAt });
  assert.is(updated.previousAttributes.description, null);
  assert.equal(updated.actor.type, 'api_key');
  for (const x of entries) {
    assert.is(x.kind, 'audit');
    assert.not.ok(x.raw.includes('whsec_'), `${x.payload.type} carries no secret`);
    assert.not.ok(x.raw.includes(e.secret) || x.raw.includes(rotated.secret));
  }
});

endpoints('the catalog lists public audit events and reserved stream events by resource, never private ones', async ({ api, key }) => {
  const res = await api.get(`${base()}/catalog`, key);
  assert.is(res.status, 200);
  const groups = res.body.data.groups as any[];
  const names = groups.flatMap((g) => g.events.map((e: any) => e.name));
  for (const n of ['tenant.created', 'subscriber.created', 'subscription.updated', 'topic.deleted', '$subscription.muted', '$app.opened', '$send']) assert.ok(names.includes(n), n);
  assert.not.ok(names.some((n: string) => /^(key|webhook|profile)\./.test(n)));
  assert.is(groups.find((g) => g.resource === 'subscriber' && g.source === 'audit').pattern, 'subscriber.*');
});

endpoints('a workspace has at most 50 endpoints: the 51st is 400 bad_request', async ({ service, api }) => {
  const { keys } = await bootstrapWorkspace(service, 'wh-limit');
  const made: string[] = [];
  for (let i = 0; i < 50; i++) {
    const res = await api.post(base('wh-limit'), keys.workspace, { url: PUBLIC_URL });
    assert.is(res.status, 201, `endpoint ${i + 1}`);
    made.push(res.body.data.id);
  }
  const over = await api.post(base('wh-limit'), keys.workspace, { url: PUBLIC_URL });
  assert.is(over.status, 400);
  assert.is(over.body.error.code, 'bad_request');
  assert.is((await api.get(base('wh-limit'), keys.workspace)).body.data.total, 50);
  await api.del(`${base('wh-limit')}/${made[0]}`, keys.workspace);
  assert.is((await api.post(base('wh-limit'), keys.workspace, { url: PUBLIC_URL })).status, 201);
});

endpoints.run();

const production = suite<{ service: TestService; api: Api; key: string }>('webhook endpoints in production');

production.before(async (ctx) => {
  ctx.service = await startTestService('wh-production', { NODE_ENV: 'production' });
  ctx.api = client(ctx.service.url);
  ctx.key = (await bootstrapWorkspace(ctx.service, 'whp')).keys.workspace;
});
production.after(async (ctx) => ctx.service.stop());

production('NODE_ENV=production makes URLs https-only', async ({ api, key }) => {
  const plain = await api.post(base('whp'), key, { url: 'http://8.8.8.8/hooks' });
  assert.is(plain.status, 400);
  assert.is(plain.body.error.code, 'invalid_url');
  assert.match(plain.body.error.message, /https/);
  assert.is((await api.post(base('whp'), key, { url: 'https://8.8.8.8/hooks' })).status, 201);
});

production.run();
