import { generateKeyPairSync, randomBytes } from 'node:crypto';
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { createSecretBox } from '../../lib/secret-box.js';
import { getApnsCredentials } from '../../streams/apns-credentials.js';
import { LEDGER_FIELDS } from '../../streams/ledger.js';
import { client } from '../helpers/api.js';
import { generateProviderKey, type ProviderKey } from '../helpers/apns-peer.js';
import { bootstrapWorkspace, makeKey, startTestService, type TestService } from '../helpers/service.js';

type Api = ReturnType<typeof client>;
type Ctx = {
  service: TestService; api: Api; encryptionKey: string; provider: ProviderKey;
  workspaceId: string; tenantId: string; keys: { workspace: string; tenant: string; client: string };
};

const PATH = '/v1/apps/apns';
const BUNDLE = 'com.example.herald';
const FINGERPRINT = /^sha256:[0-9a-f]{64}$/;
const ISO = /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$/;

const body = (key: ProviderKey, fields: Record<string, unknown> = {}) => ({ keyId: key.keyId, teamId: key.teamId, bundleId: BUNDLE, privateKey: key.privateKeyPem, ...fields });
const put = (api: Api, key: string, payload: unknown, headers?: Record<string, string>) => api.call('PUT', PATH, { key, body: payload, headers });

/** The base64 body of a PEM, the part that must never leave the service. */
const pemBody = (pem: string) => pem.split('\n').filter((l) => l && !l.startsWith('-----')).join('');

async function ledgerOf(ctx: Ctx): Promise<any[]> {
  const entries = await ctx.service.redis.xrange(ctx.service.keys.ledger(ctx.workspaceId), '-', '+');
  return entries.map(([, fields]) => JSON.parse(fields[fields.indexOf(LEDGER_FIELDS.payload) + 1]!));
}

const routes = suite<Ctx>('apns credentials routes');

routes.before(async (ctx) => {
  ctx.encryptionKey = randomBytes(32).toString('base64');
  ctx.service = await startTestService('apps-routes', { HERALD_ENCRYPTION_KEY: ctx.encryptionKey });
  ctx.api = client(ctx.service.url);
  const boot = await bootstrapWorkspace(ctx.service, 'apps');
  ctx.workspaceId = boot.workspace.id;
  ctx.tenantId = boot.tenant.id;
  ctx.keys = boot.keys;
  ctx.provider = generateProviderKey();
});
routes.after(async (ctx) => ctx.service?.stop());

routes('GET and DELETE answer 404 not_found while nothing is configured', async ({ api, keys }) => {
  const get = await api.get(PATH, keys.tenant);
  assert.is(get.status, 404);
  assert.is(get.body.error.code, 'not_found');
  const del = await api.del(PATH, keys.tenant);
  assert.is(del.status, 404);
});

routes('PUT stores the credentials (201) and answers the public view; GET returns it; the private key never appears', async (ctx) => {
  const { api, keys, provider } = ctx;
  const created = await put(api, keys.tenant, body(provider));
  assert.is(created.status, 201, created.text);
  const view = created.body.data;
  assert.equal(Object.keys(view).sort(), ['bundleId', 'configuredAt', 'keyFingerprint', 'keyId', 'teamId']);
  assert.is(view.keyId, provider.keyId);
  assert.is(view.teamId, provider.teamId);
  assert.is(view.bundleId, BUNDLE);
  assert.match(view.keyFingerprint, FINGERPRINT);
  assert.match(view.configuredAt, ISO);
  const got = await api.get(PATH, keys.tenant);
  assert.is(got.status, 200);
  assert.equal(got.body.data, view);
  for (const text of [created.text, got.text]) {
    assert.not.ok(text.includes('PRIVATE KEY'), 'no PEM armour in an answer');
    assert.not.ok(text.includes(pemBody(provider.privateKeyPem).slice(0, 40)), 'no part of the key in an answer');
  }
});

routes('the key is stored sealed (v1: AES-256-GCM) and decrypts to the PKCS#8 PEM for the sender', async (ctx) => {
  const stored = await ctx.service.redis.hgetall(ctx.service.keys.apnsCredentials(ctx.tenantId));
  assert.match(stored.privateKey!, /^v1:/);
  assert.not.ok(JSON.stringify(stored).includes(pemBody(ctx.provider.privateKeyPem).slice(0, 40)), 'the hash holds no plaintext key');
  const box = createSecretBox(Buffer.from(ctx.encryptionKey, 'base64'));
  const credentials = await getApnsCredentials(ctx.service.redis, ctx.service.keys, box, ctx.tenantId);
  assert.is(credentials!.privateKey, ctx.provider.privateKeyPem);
  assert.is(credentials!.bundleId, BUNDLE);
  assert.match(credentials!.version, /^[0-9a-f]{24}$/);
});

routes('the same credentials again change nothing (200, same configuredAt); a new key is 200 with a new fingerprint, audited', async (ctx) => {
  const { api, keys, provider } = ctx;
  const before = (await api.get(PATH, keys.tenant)).body.data;
  const version = await ctx.service.redis.hget(ctx.service.keys.apnsCredentials(ctx.tenantId), 'version');
  const same = await put(api, keys.tenant, body(provider));
  assert.is(same.status, 200);
  assert.equal(same.body.data, before);
  assert.is(await ctx.service.redis.hget(ctx.service.keys.apnsCredentials(ctx.tenantId), 'version'), version, 'the version is kept, so senders keep their connection');

  const rotated = generateProviderKey();
  const replaced = await put(api, keys.tenant, body(rotated, { teamId: provider.teamId }));
  assert.is(replaced.status, 200);
  assert.is(replaced.body.data.keyId, rotated.keyId);
  assert.is.not(replaced.body.data.keyFingerprint, before.keyFingerprint);
  ctx.provider = { ...rotated, teamId: provider.teamId };

  const audits = (await ledgerOf(ctx)).filter((e) => e.type === 'apns.updated');
  assert.is(audits.length, 2, 'one for the first write, one for the key change; none for the no-op');
  const [first, second] = audits;
  assert.equal(first.previousAttributes, { keyId: null, teamId: null, bundleId: null, keyFingerprint: null, configuredAt: null });
  assert.equal(first.data.object, before);
  assert.equal(first.target, { type: 'apns_credentials', id: ctx.tenantId });
  assert.equal(first.tenant.id, ctx.tenantId);
  assert.equal(Object.keys(second.changes).sort(), ['configuredAt', 'keyFingerprint', 'keyId']);
  assert.is(second.previousAttributes.keyId, provider.keyId);
  assert.is(second.actor.type, 'api_key');
  assert.ok(second.request.id);
  const ledgerText = JSON.stringify(await ledgerOf(ctx));
  assert.not.ok(ledgerText.includes('PRIVATE KEY') || ledgerText.includes(pemBody(rotated.privateKeyPem).slice(0, 40)), 'no key material in the audit log');
});

routes('a privateKey that is not an unencrypted EC P-256 PEM is 400 validation naming privateKey', async ({ api, keys, provider }) => {
  const rsa = generateKeyPairSync('rsa', { modulusLength: 2048 }).privateKey.export({ type: 'pkcs8', format: 'pem' }).toString();
  const p384 = generateKeyPairSync('ec', { namedCurve: 'secp384r1' }).privateKey.export({ type: 'pkcs8', format: 'pem' }).toString();
  const encrypted = generateKeyPairSync('ec', { namedCurve: 'prime256v1' }).privateKey.export({ type: 'pkcs8', format: 'pem', cipher: 'aes-256-cbc', passphrase: 'pw' }).toString();
  const truncated = provider.privateKeyPem.slice(0, 80);
  const cases: [string, string, RegExp][] = [
    ['not a key', 'hello', /is not a PEM private key/],
    ['truncated', truncated, /is not a PEM private key/],
    ['rsa', rsa, /must be an EC P-256 key .*got rsa/],
    ['p-384', p384, /must be an EC P-256 key .*got curve secp384r1/],
    ['encrypted', encrypted, /is an encrypted key/],
    // the length is counted in characters (code points) as the document's maxLength is (probe EO: UTF-16 units were)
    ['astral, within 8192 characters', '\u{1D4B3}'.repeat(5000), /is not a PEM private key/],
    ['over 8192 characters', 'x'.repeat(8193), /8192/],
  ];
  for (const [what, privateKey, message] of cases) {
    const res = await put(api, keys.tenant, body(provider, { privateKey }));
    assert.is(res.status, 400, what);
    assert.is(res.body.error.code, 'validation', what);
    assert.is(res.body.error.param, 'privateKey', what);
    assert.match(res.body.error.details[0].message, message);
  }
  const sec1 = generateKeyPairSync('ec', { namedCurve: 'prime256v1' }).privateKey.export({ type: 'sec1', format: 'pem' }).toString();
  const res = await put(api, keys.tenant, body(provider, { privateKey: sec1 }));
  assert.is(res.status, 200, 'a P-256 key in SEC1 PEM is accepted and stored as PKCS#8');
  await put(api, keys.tenant, body(provider));
});

routes('bad ids, missing and unknown fields are 400 validation naming each field', async ({ api, keys, provider }) => {
  const bad = await put(api, keys.tenant, body(provider, { keyId: 'abc', teamId: 'lowercase1', bundleId: 'nodots' }));
  assert.is(bad.status, 400);
  assert.equal(bad.body.error.details.map((d: any) => d.param).sort(), ['bundleId', 'keyId', 'teamId']);
  const missing = await put(api, keys.tenant, { keyId: provider.keyId });
  assert.equal(missing.body.error.details.map((d: any) => d.param).sort(), ['bundleId', 'privateKey', 'teamId']);
  const extra = await put(api, keys.tenant, body(provider, { environment: 'sandbox' }));
  assert.equal(extra.body.error.details, [{ param: 'environment', message: 'is not an allowed field' }]);
  const notObject = await put(api, keys.tenant, []);
  assert.is(notObject.status, 400);
});

routes('scopes: apps:read reads, apps:write writes, other scopes and client keys are refused', async (ctx) => {
  const { api, service, provider } = ctx;
  const reader = (await makeKey(service, 'apps', 'tenant', ['apps:read'])).key;
  const writer = (await makeKey(service, 'apps', 'tenant', ['apps:write'])).key;
  const wildcard = (await makeKey(service, 'apps', 'tenant', ['apps:*'])).key;
  const other = (await makeKey(service, 'apps', 'tenant', ['events:read', 'messages:send'])).key;
  assert.is((await api.get(PATH, reader)).status, 200);
  const readerPut = await put(api, reader, body(provider));
  assert.is(readerPut.status, 403);
  assert.is(readerPut.body.error.code, 'missing_permission');
  assert.is((await api.del(PATH, reader)).body.error.code, 'missing_permission');
  assert.is((await put(api, writer, body(provider))).status, 200);
  assert.is((await api.get(PATH, writer)).body.error.code, 'missing_permission');
  assert.is((await api.get(PATH, wildcard)).status, 200);
  for (const res of [await api.get(PATH, other), await put(api, other, body(provider))]) assert.is(res.body.error.code, 'missing_permission');
  const byClient = await api.get(PATH, ctx.keys.client);
  assert.is(byClient.status, 403);
  assert.is(byClient.body.error.code, 'forbidden');
  assert.is((await api.get(PATH)).body.error.code, 'missing_authorization');
});

routes('credentials belong to one tenant: a workspace key picks the tenant with Service-Tenant', async (ctx) => {
  const { api, service, keys } = ctx;
  await makeKey(service, 'apps', 'tenant', ['apps:read'], { tenant: 'emea' });
  const emea = await api.get(PATH, keys.workspace, { 'service-tenant': 'emea' });
  assert.is(emea.status, 404, 'the default tenant\'s credentials are not emea\'s');
  const other = generateProviderKey();
  assert.is((await put(api, keys.workspace, body(other), { 'service-tenant': 'emea' })).status, 201);
  assert.is((await api.get(PATH, keys.workspace, { 'service-tenant': 'emea' })).body.data.keyId, other.keyId);
  assert.is((await api.get(PATH, keys.workspace)).body.data.keyId, ctx.provider.keyId, 'the default tenant is unchanged');
  assert.is((await api.get(PATH, keys.tenant, { 'service-tenant': 'emea' })).status, 403, 'a tenant key cannot reach another tenant');
});

routes('DELETE removes the credentials, answers what was removed, and audits apns.deleted', async (ctx) => {
  const { api, keys } = ctx;
  const before = (await api.get(PATH, keys.tenant)).body.data;
  const del = await api.del(PATH, keys.tenant);
  assert.is(del.status, 200);
  assert.equal(del.body.data, before);
  assert.is((await api.get(PATH, keys.tenant)).status, 404);
  assert.is(await ctx.service.redis.exists(ctx.service.keys.apnsCredentials(ctx.tenantId)), 0);
  const deleted = (await ledgerOf(ctx)).filter((e) => e.type === 'apns.deleted');
  assert.is(deleted.length, 1);
  assert.equal(deleted[0].data.object, before);
  assert.is((await api.del(PATH, keys.tenant)).status, 404);
});

routes('the published document describes the three operations, with privateKey write-only', async ({ api }) => {
  const doc = (await api.get('/v1/openapi.json')).body;
  assert.equal(Object.keys(doc.paths[PATH]).filter((k) => k !== 'parameters').sort(), ['delete', 'get', 'put']);
  assert.is(doc.components.schemas.ApnsCredentialsUpdate.properties.privateKey.writeOnly, true);
  assert.not.ok('privateKey' in doc.components.schemas.ApnsCredentials.properties);
});

routes.run();

const unkeyed = suite<{ service: TestService; api: Api; key: string }>('apns credentials without HERALD_ENCRYPTION_KEY');

unkeyed.before(async (ctx) => {
  ctx.service = await startTestService('apps-unkeyed', { HERALD_ENCRYPTION_KEY: '' });
  ctx.api = client(ctx.service.url);
  ctx.key = (await bootstrapWorkspace(ctx.service, 'unkeyed')).keys.tenant;
});
unkeyed.after(async (ctx) => ctx.service?.stop());

unkeyed('storing credentials is refused with 503 unavailable naming the setting; reads still answer', async ({ api, key, service }) => {
  const provider = generateProviderKey();
  const res = await put(api, key, body(provider));
  assert.is(res.status, 503);
  assert.is(res.body.error.code, 'unavailable');
  assert.match(res.body.error.message, /HERALD_ENCRYPTION_KEY/);
  assert.is((await api.get(PATH, key)).status, 404);
  const bad = await put(api, key, body(provider, { privateKey: 'nope' }));
  assert.is(bad.status, 400, 'bad input is still reported first');
  const keys = await service.redis.keys(`${service.keys.prefix}*:apns`);
  assert.equal(keys, [], 'nothing was stored');
});

unkeyed.run();
