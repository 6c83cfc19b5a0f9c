import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { callScript } from '../../streams/lua-scripts.js';
import { client } from '../helpers/api.js';
import { auditEntries } from '../helpers/audit.js';
import { bootstrapWorkspace, makeKey, startTestService, type TestService } from '../helpers/service.js';
import { waitFor } from '../helpers/wait.js';
import { assertError, assertValidation, ISO, stripeSecret, swHeaders, swSecret, ZERO_COUNTS } from './signing.js';

// The management routes of Sources (docs/sources.md: Routes, The source record, Secrets by format,
// Mapping, Audit, Limits).

type Ctx = { service: TestService; api: ReturnType<typeof client>; key: string; workspaceKey: string; clientKey: string; workspaceId: string };
const sources = suite<Ctx>('sources');

sources.before(async (ctx) => {
  ctx.service = await startTestService('sources', {}, ['web']);
  ctx.api = client(ctx.service.url);
  const { keys, workspace } = await bootstrapWorkspace(ctx.service, 'sources');
  ctx.key = keys.tenant;
  ctx.workspaceKey = keys.workspace;
  ctx.clientKey = keys.client;
  ctx.workspaceId = workspace.id;
});
sources.after(async (ctx) => ctx.service.stop());

const RECORD_FIELDS = ['id', 'name', 'provider', 'format', 'mapping', 'namePrefix', 'enabled', 'inboundUrl', 'counts', 'lastReceivedAt', 'lastError', 'lastIgnored', 'secretUpdatedAt', 'createdAt', 'updatedAt'].sort();
const CLERK = { name: 'Clerk prod', provider: 'clerk', format: 'standard-webhooks', mapping: { externalId: 'data.id' } };

/** Creates a source (201 asserted) and answers it with its secret. */
async function create(ctx: Ctx, body: Record<string, unknown>, key = ctx.key): Promise<any> {
  const res = await ctx.api.post('/v1/sources', key, body);
  assert.is(res.status, 201, res.text);
  return res.body.data;
}

/** The record without its secret: what every answer but the create one shows. */
const withoutSecret = (s: any) => {
  const { secret: _secret, ...rest } = s;
  return rest;
};

/** Waits until the clock is past `iso`, so a change made now has a later timestamp. */
const pastMillisecond = (iso: string) => waitFor('a later millisecond', async () => Date.now() > Date.parse(iso) + 1, 1_000, 1);

sources('a source is created with its secret shown once, its inbound URL, zero counts and the defaults', async (ctx) => {
  const { api, key, service } = ctx;
  const res = await api.post('/v1/sources', key, CLERK);
  assert.is(res.status, 201, res.text);
  assert.is(res.body.success, true);
  const s = res.body.data;
  assert.equal(Object.keys(s).sort(), [...RECORD_FIELDS, 'secret'].sort());
  assert.match(s.id, /^src_[0-9a-z]+$/);
  assert.is(s.name, 'Clerk prod');
  assert.is(s.provider, 'clerk');
  assert.is(s.format, 'standard-webhooks');
  assert.is(s.namePrefix, 'clerk.', 'the default prefix is `<provider>.`');
  assert.is(s.enabled, true);
  assert.is(s.mapping.externalId, 'data.id');
  for (const member of ['name', 'id', 'timestamp', 'data']) assert.is(s.mapping[member] ?? null, null, `mapping.${member} unset`);
  assert.equal(s.counts, ZERO_COUNTS);
  assert.is(s.lastReceivedAt, null);
  assert.is(s.lastError, null);
  assert.is(s.secretUpdatedAt, null);
  assert.match(s.createdAt, ISO);
  assert.is(s.updatedAt, s.createdAt);
  assert.is(s.inboundUrl, `${service.url}/v1/sources/${s.id}/inbound`);
  assert.ok(s.inboundUrl.endsWith(`/v1/sources/${s.id}/inbound`));
  assert.match(s.secret, /^whsec_[A-Za-z0-9+/]+={0,2}$/, 'a generated Standard Webhooks secret');
  assert.ok(Buffer.from(s.secret.slice('whsec_'.length), 'base64').length >= 16, 'at least 128 bits');

  const read = await api.get(`/v1/sources/${s.id}`, key);
  assert.is(read.status, 200);
  assert.equal(read.body.data, withoutSecret(s));
  assert.not.ok('secret' in read.body.data, 'the secret is shown only by the create answer');
  assert.not.ok(read.text.includes(s.secret.slice('whsec_'.length)));
  const list = await api.get('/v1/sources', key);
  assert.equal(list.body.data.items.find((x: any) => x.id === s.id), withoutSecret(s));
  assert.not.ok(list.text.includes(s.secret.slice('whsec_'.length)), 'not in the list either');

  const other = await create(ctx, CLERK);
  assert.is.not(other.id, s.id);
  assert.is.not(other.secret, s.secret, 'each source its own secret');
});

sources('the inbound URL follows the origin the reading request reached, X-Forwarded-* as far as one trusted proxy allows', async (ctx) => {
  const { api, key } = ctx;
  const s = await create(ctx, { ...CLERK, name: 'forwarded' });
  const forwarded = { 'x-forwarded-proto': 'https', 'x-forwarded-host': 'herald.example.com' };
  const read = await api.get(`/v1/sources/${s.id}`, key, forwarded);
  assert.is(read.body.data.inboundUrl, `https://herald.example.com/v1/sources/${s.id}/inbound`);
  const list = await api.get('/v1/sources', key, forwarded);
  assert.is(list.body.data.items.find((x: any) => x.id === s.id).inboundUrl, `https://herald.example.com/v1/sources/${s.id}/inbound`);
});

sources('each format takes its secret: given, generated, or required, and a malformed one is refused by name', async (ctx) => {
  const { api, key } = ctx;
  const given = swSecret();
  assert.is((await create(ctx, { ...CLERK, secret: given })).secret, given, 'a given standard-webhooks secret is kept');

  const stripe = { name: 'Stripe live', provider: 'stripe', format: 'stripe', mapping: { externalId: 'data.object.metadata.userId', data: 'data.object' } };
  assertValidation(await api.post('/v1/sources', key, stripe), 'secret', 'stripe without a secret');
  const signing = stripeSecret();
  const s = await create(ctx, { ...stripe, secret: signing });
  assert.is(s.secret, signing);
  assert.is(s.namePrefix, 'stripe.');
  assert.is(s.mapping.data, 'data.object');

  const github = { name: 'GitHub', provider: 'github', format: 'github', mapping: { externalId: 'sender.login' } };
  const generated = await create(ctx, github);
  assert.type(generated.secret, 'string');
  assert.ok(generated.secret.length >= 8 && generated.secret.length <= 256, `a generated github secret: ${generated.secret}`);
  assert.is((await create(ctx, { ...github, secret: 'paste-me-into-github' })).secret, 'paste-me-into-github');
  assert.is((await create(ctx, { ...github, secret: 'x'.repeat(8) })).secret, 'x'.repeat(8));
  assert.is((await create(ctx, { ...github, secret: 'y'.repeat(256) })).secret, 'y'.repeat(256));

  const before = (await api.get('/v1/sources?limit=1', key)).body.data.total;
  const bad: [Record<string, unknown>, string][] = [
    [{ ...CLERK, secret: 'nope' }, 'not whsec_'],
    [{ ...CLERK, secret: 'c2VjcmV0LXNlY3JldC1zZWNyZXQ=' }, 'base64 without the prefix'],
    [{ ...CLERK, secret: 'whsec_not base64!!' }, 'not base64'],
    [{ ...CLERK, secret: 'whsec_' }, 'empty'],
    [{ ...CLERK, secret: 42 }, 'not a string'],
    [{ ...github, secret: 'x'.repeat(7) }, 'github, 7 characters'],
    [{ ...github, secret: 'x'.repeat(257) }, 'github, 257 characters'],
    [{ ...stripe, secret: '' }, 'stripe, empty'],
  ];
  for (const [body, what] of bad) assertValidation(await api.post('/v1/sources', key, body), 'secret', what);
  assert.is((await api.get('/v1/sources?limit=1', key)).body.data.total, before, 'nothing was created');
});

sources('fields outside their rules are 400 validation naming the field, and nothing is created', async (ctx) => {
  const { api, key } = ctx;
  const before = (await api.get('/v1/sources?limit=1', key)).body.data.total;
  const path = (externalId: unknown) => ({ ...CLERK, mapping: { externalId } });
  const cases: [unknown, string][] = [
    [{ ...CLERK, color: 'blue' }, 'color'],
    [{ ...CLERK, counts: ZERO_COUNTS }, 'counts'],
    [{ ...CLERK, mapping: {} }, 'mapping.externalId'],
    [{ ...CLERK, mapping: { name: 'type' } }, 'mapping.externalId'],
    [{ ...CLERK, mapping: { externalId: 'data.id', extra: 'x' } }, 'mapping.extra'],
    [{ name: 'no mapping', provider: 'clerk', format: 'standard-webhooks' }, 'mapping'],
    [path('a..b'), 'mapping.externalId'],
    [path(''), 'mapping.externalId'],
    [path('.a'), 'mapping.externalId'],
    [path('a.'), 'mapping.externalId'],
    [path('a b'), 'mapping.externalId'],
    [path('a/b'), 'mapping.externalId'],
    [path('a.é'), 'mapping.externalId'],
    [path(Array.from({ length: 11 }, (_, i) => `s${i}`).join('.')), 'mapping.externalId'],
    [path(`a.${'x'.repeat(65)}`), 'mapping.externalId'],
    [path(7), 'mapping.externalId'],
    // no delivery may hold a __proto__ key (refused whole), so a path through one could never match
    [path('__proto__.user'), 'mapping.externalId'],
    [path('data.__proto__'), 'mapping.externalId'],
    [{ ...CLERK, mapping: { externalId: 'data.id', name: 'a.__proto__.b' } }, 'mapping.name'],
    [{ ...CLERK, mapping: { externalId: 'data.id', name: 'x..y' } }, 'mapping.name'],
    [{ ...CLERK, mapping: { externalId: 'data.id', id: 'a b' } }, 'mapping.id'],
    [{ ...CLERK, mapping: { externalId: 'data.id', timestamp: '' } }, 'mapping.timestamp'],
    [{ ...CLERK, mapping: { externalId: 'data.id', data: 'x'.repeat(65) } }, 'mapping.data'],
    [{ ...CLERK, name: '' }, 'name'],
    [{ ...CLERK, name: 'n'.repeat(129) }, 'name'],
    [{ provider: 'clerk', format: 'standard-webhooks', mapping: { externalId: 'data.id' } }, 'name'],
    [{ ...CLERK, provider: 'Clerk' }, 'provider'],
    [{ ...CLERK, provider: '-clerk' }, 'provider'],
    [{ ...CLERK, provider: 'cl.erk' }, 'provider'],
    [{ ...CLERK, provider: 'p'.repeat(41) }, 'provider'],
    [{ ...CLERK, provider: '' }, 'provider'],
    [{ name: 'x', format: 'standard-webhooks', mapping: { externalId: 'data.id' } }, 'provider'],
    [{ ...CLERK, format: 'svix' }, 'format'],
    [{ name: 'x', provider: 'clerk', mapping: { externalId: 'data.id' } }, 'format'],
    [{ ...CLERK, enabled: 'yes' }, 'enabled'],
    [{ ...CLERK, namePrefix: 7 }, 'namePrefix'],
    // a prefix that no event name can start with would make every delivery invalid
    [{ ...CLERK, namePrefix: '_' }, 'namePrefix'],
    [{ ...CLERK, namePrefix: '.clerk' }, 'namePrefix'],
    [{ ...CLERK, namePrefix: 'Clerk.' }, 'namePrefix'],
  ];
  for (const [body, param] of cases) assertValidation(await api.post('/v1/sources', key, body), param, JSON.stringify(body).slice(0, 120));
  const notObject = await api.call('POST', '/v1/sources', { key, raw: '[1,2]' });
  assert.is(notObject.status, 400);
  assert.is((await api.get('/v1/sources?limit=1', key)).body.data.total, before, 'nothing was created');

  // the edges that are allowed
  const longest = Array.from({ length: 10 }, (_, i) => `${'k'.repeat(62)}$${i}`).join('.');
  const edge = await create(ctx, { ...CLERK, name: 'n'.repeat(128), provider: 'p'.repeat(40), mapping: { externalId: longest, name: 'items.0.Kind-1_$', id: null, timestamp: null, data: null } });
  assert.is(edge.mapping.externalId, longest);
  assert.is(edge.mapping.name, 'items.0.Kind-1_$');
  assert.is(edge.namePrefix, `${'p'.repeat(40)}.`);
  // the default prefix of the longest provider is one a request may set too: sent back, it is taken
  const same = await api.patch(`/v1/sources/${edge.id}`, key, { namePrefix: edge.namePrefix });
  assert.is(same.status, 200, JSON.stringify(same.body.error));
  assert.is((await create(ctx, { ...CLERK, namePrefix: `${'q'.repeat(40)}.` })).namePrefix, `${'q'.repeat(40)}.`);
  assertValidation(await api.post('/v1/sources', key, { ...CLERK, namePrefix: 'q'.repeat(42) }), 'namePrefix', 'a prefix of 42 characters');
  assert.is((await create(ctx, { ...CLERK, provider: '0a_b-c', namePrefix: '' })).namePrefix, '', 'an empty prefix is kept');
  assert.is((await create(ctx, { ...CLERK, namePrefix: 'auth.' })).namePrefix, 'auth.');
  assert.is((await create(ctx, { ...CLERK, enabled: false })).enabled, false);
});

sources('the list is newest first with total and cursor pages that join into the whole', async (ctx) => {
  const { service, api } = ctx;
  const { keys } = await bootstrapWorkspace(service, 'sources-list');
  const empty = (await api.get('/v1/sources', keys.tenant)).body.data;
  assert.equal(empty, { items: [], hasMore: false, nextCursor: null, total: 0 });
  const made: string[] = [];
  for (let i = 0; i < 5; i++) made.push((await create(ctx, { ...CLERK, name: `list-${i}` }, keys.tenant)).id);
  const newestFirst = [...made].reverse();
  const all = (await api.get('/v1/sources', keys.tenant)).body.data;
  assert.is(all.total, 5);
  assert.is(all.hasMore, false);
  assert.is(all.nextCursor, null);
  assert.equal(all.items.map((s: any) => s.id), newestFirst);
  assert.equal(all.items.map((s: any) => s.name), ['list-4', 'list-3', 'list-2', 'list-1', 'list-0']);
  for (const item of all.items) assert.not.ok('secret' in item);

  const seen: string[] = [];
  let cursor: string | null = null;
  for (let page = 0; page < 10; page++) {
    const res: any = await api.get(`/v1/sources?limit=1${cursor ? `&cursor=${encodeURIComponent(cursor)}` : ''}`, keys.tenant);
    assert.is(res.status, 200);
    assert.is(res.body.data.total, 5);
    assert.is(res.body.data.items.length, 1);
    seen.push(res.body.data.items[0].id);
    cursor = res.body.data.nextCursor;
    if (!res.body.data.hasMore) {
      assert.is(cursor, null);
      break;
    }
    assert.type(cursor, 'string');
  }
  assert.equal(seen, newestFirst, 'limit=1 pages walk every source once, newest first');

  assertValidation(await api.get('/v1/sources?limit=101', keys.tenant), 'limit');
  assertValidation(await api.get('/v1/sources?limit=0', keys.tenant), 'limit');
  assertValidation(await api.get('/v1/sources?cursor=garbage', keys.tenant), 'cursor');
});

sources('PATCH changes name, enabled, mapping and namePrefix; updatedAt moves only on a change; provider and format are refused by name', async (ctx) => {
  const { api, key } = ctx;
  const s = await create(ctx, { ...CLERK, name: 'Before' });
  await pastMillisecond(s.updatedAt);

  const renamed = await api.patch(`/v1/sources/${s.id}`, key, { name: 'After' });
  assert.is(renamed.status, 200, renamed.text);
  assert.is(renamed.body.data.name, 'After');
  assert.is(renamed.body.data.createdAt, s.createdAt);
  assert.ok(renamed.body.data.updatedAt > s.updatedAt, 'updatedAt moves');
  assert.not.ok('secret' in renamed.body.data);
  assert.equal(renamed.body.data, { ...withoutSecret(s), name: 'After', updatedAt: renamed.body.data.updatedAt }, 'nothing else changed');

  await pastMillisecond(renamed.body.data.updatedAt);
  const same = await api.patch(`/v1/sources/${s.id}`, key, { name: 'After' });
  assert.is(same.status, 200);
  assert.is(same.body.data.updatedAt, renamed.body.data.updatedAt, 'no change, updatedAt stays');
  const sameEnabled = await api.patch(`/v1/sources/${s.id}`, key, { enabled: true, namePrefix: 'clerk.' });
  assert.is(sameEnabled.body.data.updatedAt, renamed.body.data.updatedAt, 'values equal to the stored ones are no change');

  const disabled = await api.patch(`/v1/sources/${s.id}`, key, { enabled: false });
  assert.is(disabled.body.data.enabled, false);
  assert.ok(disabled.body.data.updatedAt > renamed.body.data.updatedAt);
  const prefixed = await api.patch(`/v1/sources/${s.id}`, key, { namePrefix: '' });
  assert.is(prefixed.body.data.namePrefix, '');
  const remapped = await api.patch(`/v1/sources/${s.id}`, key, { mapping: { externalId: 'user.id', name: 'event.kind', data: 'user' } });
  assert.is(remapped.status, 200, remapped.text);
  assert.is(remapped.body.data.mapping.externalId, 'user.id');
  assert.is(remapped.body.data.mapping.name, 'event.kind');
  assert.is(remapped.body.data.mapping.data, 'user');
  assert.is(remapped.body.data.secretUpdatedAt, null, 'no secret was set');
  const read = (await api.get(`/v1/sources/${s.id}`, key)).body.data;
  assert.equal(read, remapped.body.data, 'GET shows the change');

  for (const [body, param] of [
    [{ provider: 'stripe' }, 'provider'],
    [{ format: 'stripe' }, 'format'],
    [{ format: 'standard-webhooks' }, 'format'],
    [{ provider: 'github', name: 'x' }, 'provider'],
    [{ name: '' }, 'name'],
    [{ name: 'n'.repeat(129) }, 'name'],
    [{ enabled: 'no' }, 'enabled'],
    [{ mapping: { externalId: 'a..b' } }, 'mapping.externalId'],
    [{ secret: 'nope' }, 'secret'],
    [{ counts: ZERO_COUNTS }, 'counts'],
    [{ id: 'src_other' }, 'id'],
    [{ inboundUrl: 'https://elsewhere.example.com' }, 'inboundUrl'],
  ] as [Record<string, unknown>, string][]) {
    assertValidation(await api.patch(`/v1/sources/${s.id}`, key, body), param, JSON.stringify(body));
  }
  const bothWrong = await api.patch(`/v1/sources/${s.id}`, key, { provider: 'stripe', format: 'stripe' });
  assertValidation(bothWrong, 'provider');
  assertValidation(bothWrong, 'format');
  const after = (await api.get(`/v1/sources/${s.id}`, key)).body.data;
  assert.equal(after, read, 'a refused PATCH changes nothing, not even the valid members beside it');
  assert.is(after.provider, 'clerk');
  assert.is(after.format, 'standard-webhooks');
});

sources('PATCH with a new secret sets secretUpdatedAt and never shows the secret', async (ctx) => {
  const { api, key } = ctx;
  const s = await create(ctx, CLERK);
  await pastMillisecond(s.updatedAt);
  const next = swSecret();
  const res = await api.patch(`/v1/sources/${s.id}`, key, { secret: next });
  assert.is(res.status, 200, res.text);
  assert.not.ok('secret' in res.body.data);
  assert.not.ok(res.text.includes(next.slice('whsec_'.length)), 'the new secret is not in the answer');
  assert.match(res.body.data.secretUpdatedAt, ISO);
  assert.ok(res.body.data.secretUpdatedAt > s.createdAt);
  assert.ok(res.body.data.updatedAt > s.updatedAt, 'a new secret is a change');
  const read = await api.get(`/v1/sources/${s.id}`, key);
  assert.is(read.body.data.secretUpdatedAt, res.body.data.secretUpdatedAt);
  assert.not.ok(read.text.includes(next.slice('whsec_'.length)));
});

sources('delete answers the source as it was; from then on the source and its inbound URL are 404', async (ctx) => {
  const { api, key } = ctx;
  const s = await create(ctx, { ...CLERK, name: 'short-lived' });
  const before = (await api.get('/v1/sources?limit=1', key)).body.data.total;
  const asItWas = (await api.get(`/v1/sources/${s.id}`, key)).body.data;
  const deleted = await api.del(`/v1/sources/${s.id}`, key);
  assert.is(deleted.status, 200, deleted.text);
  assert.equal(deleted.body.data, asItWas);
  assert.not.ok('secret' in deleted.body.data);
  assertError(await api.get(`/v1/sources/${s.id}`, key), 404, 'not_found');
  assertError(await api.patch(`/v1/sources/${s.id}`, key, { name: 'x' }), 404, 'not_found');
  assertError(await api.del(`/v1/sources/${s.id}`, key), 404, 'not_found');
  const body = JSON.stringify({ type: 'user.created', data: { id: 'u-1' } });
  assertError(await api.call('POST', `/v1/sources/${s.id}/inbound`, { raw: body, headers: swHeaders(s.secret, body) }), 404, 'not_found', 'a signed delivery to a deleted source');
  const list = (await api.get('/v1/sources', key)).body.data;
  assert.is(list.total, before - 1);
  assert.not.ok(list.items.some((x: any) => x.id === s.id));
});

sources('an unknown, malformed or other-kind id is 404 not_found on every route', async ({ api, key }) => {
  const body = JSON.stringify({ type: 'user.created', data: { id: 'u-1' } });
  for (const id of ['nope', 'tpc_x', 'src_x', 'src_0000000000000000000000000', 'src_00000000000000000000000000', 'tpc_0000000000000000000000000', 'SRC_00000000000000000000000000']) {
    assertError(await api.get(`/v1/sources/${id}`, key), 404, 'not_found', `GET ${id}`);
    assertError(await api.patch(`/v1/sources/${id}`, key, { name: 'x' }), 404, 'not_found', `PATCH ${id}`);
    // as on every PATCH, the body is checked before the id is looked up
    assertError(await api.patch(`/v1/sources/${id}`, key, { nonsense: 1 }), 400, 'validation', `PATCH ${id} with a bad body`);
    assertError(await api.del(`/v1/sources/${id}`, key), 404, 'not_found', `DELETE ${id}`);
    assertError(await api.call('POST', `/v1/sources/${id}/inbound`, { raw: body, headers: swHeaders(swSecret(), body) }), 404, 'not_found', `inbound ${id}`);
  }
});

sources('sources:read reads, sources:write writes, a key without them is missing_permission; a client key is forbidden', async (ctx) => {
  const { service, api, clientKey } = ctx;
  const s = await create(ctx, CLERK);
  const reader = (await makeKey(service, 'sources', 'tenant', ['sources:read'])).key;
  assert.is((await api.get('/v1/sources', reader)).status, 200);
  assert.is((await api.get(`/v1/sources/${s.id}`, reader)).status, 200);
  for (const res of [
    await api.post('/v1/sources', reader, CLERK),
    await api.patch(`/v1/sources/${s.id}`, reader, { name: 'by reader' }),
    await api.del(`/v1/sources/${s.id}`, reader),
  ]) assertError(res, 403, 'missing_permission');
  const other = (await makeKey(service, 'sources', 'tenant', ['events:read', 'events:write', 'topics:*'])).key;
  assertError(await api.get('/v1/sources', other), 403, 'missing_permission');
  assertError(await api.get(`/v1/sources/${s.id}`, other), 403, 'missing_permission');
  assertError(await api.post('/v1/sources', other, CLERK), 403, 'missing_permission');
  const writerOnly = (await makeKey(service, 'sources', 'tenant', ['sources:write'])).key;
  assert.is((await api.post('/v1/sources', writerOnly, { ...CLERK, name: 'by writer' })).status, 201);
  const star = (await makeKey(service, 'sources', 'tenant', ['sources:*'])).key;
  assert.is((await api.patch(`/v1/sources/${s.id}`, star, { name: 'by star' })).status, 200);
  assert.is((await api.get(`/v1/sources/${s.id}`, ctx.key)).body.data.name, 'by star');

  for (const res of [
    await api.get('/v1/sources', clientKey),
    await api.get(`/v1/sources/${s.id}`, clientKey),
    await api.post('/v1/sources', clientKey, CLERK),
    await api.patch(`/v1/sources/${s.id}`, clientKey, { name: 'by client' }),
    await api.del(`/v1/sources/${s.id}`, clientKey),
  ]) assertError(res, 403, 'forbidden');
  assertError(await api.get('/v1/sources'), 401, 'missing_authorization', 'the management routes need a key');
  assert.is((await api.get(`/v1/sources/${s.id}`, ctx.key)).body.data.name, 'by star', 'nothing changed');
});

sources('another tenant\'s source is 404; a workspace key reaches it with Service-Tenant', async (ctx) => {
  const { service, api, key, workspaceKey } = ctx;
  const euKey = (await makeKey(service, 'sources', 'tenant', ['*'], { tenant: 'eu' })).key;
  const eu = await create(ctx, { ...CLERK, name: 'eu only' }, euKey);
  assertError(await api.get(`/v1/sources/${eu.id}`, key), 404, 'not_found');
  assertError(await api.patch(`/v1/sources/${eu.id}`, key, { name: 'hijacked' }), 404, 'not_found');
  assertError(await api.del(`/v1/sources/${eu.id}`, key), 404, 'not_found');
  assert.not.ok((await api.get('/v1/sources?limit=100', key)).body.data.items.some((x: any) => x.id === eu.id));
  assertError(await api.get(`/v1/sources/${eu.id}`, workspaceKey), 404, 'not_found', 'a workspace key defaults to the default tenant');
  const viaHeader = await api.get(`/v1/sources/${eu.id}`, workspaceKey, { 'Service-Tenant': 'eu' });
  assert.is(viaHeader.status, 200);
  assert.is(viaHeader.body.data.name, 'eu only');
  const euList = (await api.get('/v1/sources', euKey)).body.data;
  assert.equal(euList.items.map((x: any) => x.id), [eu.id]);
  assert.is(euList.total, 1);
  const made = await api.post('/v1/sources', workspaceKey, { ...CLERK, name: 'eu by workspace key' }, { 'Service-Tenant': 'eu' });
  assert.is(made.status, 201);
  assert.is((await api.get('/v1/sources', euKey)).body.data.total, 2);
  assert.is((await api.get(`/v1/sources/${eu.id}`, euKey)).body.data.name, 'eu only', 'untouched by the other tenant');
});

sources('a tenant holds at most 100 sources: the 101st create is 400 bad_request, as every count cap', async (ctx) => {
  const { service, api } = ctx;
  const { keys } = await bootstrapWorkspace(service, 'sources-limit');
  for (let batch = 0; batch < 10; batch++) {
    const made = await Promise.all(Array.from({ length: 10 }, (_, i) => api.post('/v1/sources', keys.tenant, { ...CLERK, name: `s-${batch * 10 + i}` })));
    for (const res of made) assert.is(res.status, 201, res.text);
  }
  assertError(await api.post('/v1/sources', keys.tenant, { ...CLERK, name: 's-100' }), 400, 'bad_request', 'the 101st source');
});

sources('at the limit nothing is written, even by racing creates; a delete makes room; the limit is per tenant', async (ctx) => {
  const { service, api } = ctx;
  const { keys } = await bootstrapWorkspace(service, 'sources-limit');
  const total = async () => (await api.get('/v1/sources?limit=1', keys.tenant)).body.data.total;
  assert.is(await total(), 100, 'the previous test filled the tenant');
  const refused = (res: { status: number; text: string }, what: string) => assert.ok(res.status >= 400 && res.status < 500, `${what} refused: ${res.status} ${res.text.slice(0, 200)}`);
  refused(await api.post('/v1/sources', keys.tenant, { ...CLERK, name: 'over' }), 'one more');
  const racing = await Promise.all(Array.from({ length: 5 }, () => api.post('/v1/sources', keys.tenant, { ...CLERK, name: 'racing' })));
  for (const res of racing) refused(res, 'a racing create');
  assert.is(await total(), 100, 'nothing written');
  const oldest = (await api.get('/v1/sources?limit=100', keys.tenant)).body.data.items.at(-1);
  assert.is((await api.del(`/v1/sources/${oldest.id}`, keys.tenant)).status, 200);
  assert.is((await api.post('/v1/sources', keys.tenant, { ...CLERK, name: 'room again' })).status, 201);
  refused(await api.post('/v1/sources', keys.tenant, { ...CLERK, name: 'over again' }), 'one more after the refill');
  assert.is(await total(), 100);
  const other = await makeKey(service, 'sources-limit', 'tenant', ['*'], { tenant: 'second' });
  assert.is((await api.post('/v1/sources', other.key, CLERK)).status, 201, 'the limit is per tenant');
});

sources('create, update and delete are audited in the workspace ledger, never with the secret; the webhook catalog lists them', async (ctx) => {
  const { service, api, key, workspaceId, workspaceKey } = ctx;
  const first = swSecret();
  const created = await create(ctx, { ...CLERK, name: 'Before', secret: first });
  await api.patch(`/v1/sources/${created.id}`, key, { name: 'After', enabled: false });
  await api.patch(`/v1/sources/${created.id}`, key, { name: 'After' }); // no change, no entry
  const second = swSecret();
  const rotated = (await api.patch(`/v1/sources/${created.id}`, key, { secret: second })).body.data;
  const deleted = (await api.del(`/v1/sources/${created.id}`, key)).body.data;
  const github = await create(ctx, { name: 'GitHub', provider: 'github', format: 'github', mapping: { externalId: 'sender.login' } });

  const mine = async () => (await auditEntries(service, workspaceId)).filter((e) => e.target?.id === created.id);
  const entries = await waitFor('the four source audit entries', async () => {
    const found = await mine();
    return found.length >= 4 ? found : null;
  });
  assert.equal(entries.map((e) => e.type), ['source.created', 'source.updated', 'source.updated', 'source.deleted']);
  const [c, u, r, d] = entries;
  assert.match(c.id, /^whe_/);
  assert.equal(c.target, { type: 'source', id: created.id });
  assert.is(c.tenant.slug, 'default');
  assert.is(c.actor.type, 'api_key');
  assert.match(c.actor.id, /^key_/);
  assert.ok(c.request.id);
  assert.is(c.data.object.id, created.id);
  assert.is(c.data.object.name, 'Before');
  assert.is(c.data.object.provider, 'clerk');
  assert.not.ok('secret' in c.data.object);
  assert.equal(u.changes, { name: 'After', enabled: false });
  assert.equal(u.previousAttributes, { name: 'Before', enabled: true });
  assert.is(u.data.object.name, 'After');
  assert.ok('secretUpdatedAt' in r.changes, `a new secret shows as a change of secretUpdatedAt: ${JSON.stringify(r.changes)}`);
  assert.is(r.changes.secretUpdatedAt, rotated.secretUpdatedAt);
  assert.is(r.previousAttributes.secretUpdatedAt, null);
  assert.not.ok('secret' in r.changes);
  assert.not.ok('secret' in r.previousAttributes);
  assert.is(d.data.object.id, deleted.id);
  assert.is(d.data.object.name, 'After');
  assert.is(d.changes, undefined);

  const ghEntry = await waitFor('the github source audited', async () => (await auditEntries(service, workspaceId)).find((e) => e.target?.id === github.id));
  assert.is(ghEntry.type, 'source.created');

  const ledger = JSON.stringify(await service.redis.xrange(service.keys.ledger(workspaceId), '-', '+'));
  for (const secret of [first, second, github.secret]) {
    assert.not.ok(ledger.includes(secret), 'no secret in the ledger');
    const bare = secret.startsWith('whsec_') ? secret.slice('whsec_'.length) : secret;
    assert.not.ok(ledger.includes(bare), 'not even without its prefix');
    assert.not.ok(ledger.includes(JSON.stringify(bare).slice(1, -1)), 'nor JSON-escaped');
  }

  const groups = (await api.get('/v1/workspaces/sources/webhooks/catalog', workspaceKey)).body.data.groups as any[];
  const group = groups.find((g) => g.resource === 'source' && g.source === 'audit');
  assert.ok(group, 'the catalog has a source group');
  assert.equal(group.events.map((e: any) => e.name), ['source.created', 'source.updated', 'source.deleted']);
  const endpoint = await api.post('/v1/workspaces/sources/webhooks', workspaceKey, { url: 'https://8.8.8.8/herald', events: ['source.created', 'source.*'] });
  assert.is(endpoint.status, 201, `an endpoint can subscribe to them: ${endpoint.text}`);
});

sources('the update and delete scripts answer (and so their outbox intents keep) the record without a secret, a replaced one included', async (ctx) => {
  const { service } = ctx;
  const s = await create(ctx, CLERK);
  const rotated = swSecret();
  assert.is((await ctx.api.patch(`/v1/sources/${s.id}`, ctx.key, { secret: rotated })).status, 200);
  const tenantId = (await ctx.api.get('/v1/whoami', ctx.key)).body.data.tenant.id as string;
  const secretFields = ['secret', 'retiredSecrets', 'previousSecret'];
  const stored = await service.redis.hgetall(service.keys.source(tenantId, s.id));
  for (const f of secretFields) assert.ok(stored[f], `the record holds ${f}`);
  const update = await callScript<[number, string[], string[]]>(service.redis, 'updateSource', [service.keys.source(tenantId, s.id), service.keys.tenantOutbox(tenantId)],
    [new Date().toISOString(), 'tok-test', '{}', Date.now(), 86_400_000, 10, 1, 'secret', swSecret()]);
  const del = await callScript<[number, string[]]>(service.redis, 'deleteSource', [service.keys.sourceIndex(tenantId), service.keys.source(tenantId, s.id), service.keys.tenantOutbox(tenantId)], [s.id, 'tok-test-2', '{}']);
  await service.redis.hdel(service.keys.tenantOutbox(tenantId), 'tok-test', 'tok-test-2');
  for (const list of [update[1], update[2], del[1]]) {
    assert.ok(list.includes('id'));
    for (const f of secretFields) assert.not.ok(list.includes(f), `no ${f} in ${list.filter((_, i) => i % 2 === 0).join(',')}`);
    for (const value of [s.secret, rotated]) assert.not.ok(list.some((v) => v.includes(value)), 'no secret value');
  }
});

sources.run();
