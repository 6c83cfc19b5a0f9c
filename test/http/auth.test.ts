import { randomBytes } from 'node:crypto';
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { SignJWT, decodeJwt } from 'jose';
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { KEY_KINDS } from '../../lib/key-kinds.js';
import { hasScope, isSessionOnly, ROUTE_SCOPES, SCOPE_RESOURCES, scopeProblem, scopeProblemForKind, SESSION_ONLY_SCOPES, WORKSPACE_ONLY_RESOURCES } from '../../lib/scopes.js';
import { signEventsToken } from '../../lib/events-token.js';
import { createTenant, listApiKeys, revokeApiKey, type Tenant, type Workspace } from '../../streams/identity.js';
import { eventsTokenSecret } from '../../streams/secrets.js';
import type { Reply } from '../helpers/api.js';
import { rawRequest } from '../helpers/raw-request.js';
import { BY_TEST, bootstrapWorkspace, makeKey, startServicePair, stopServicePair, type ServicePair } from '../helpers/service.js';
import { waitFor } from '../helpers/wait.js';

type Ctx = ServicePair & {
  /** workspace `acme` with its default tenant; keys of every kind holding `*` */
  acme: { workspace: Workspace; tenant: Tenant; keys: Record<'workspace' | 'tenant' | 'client', string> };
  /** workspace `globex`; keys of every kind holding `*` */
  globex: { workspace: Workspace; tenant: Tenant; keys: Record<'workspace' | 'tenant' | 'client', string> };
  /** a tenant key (scope `*`) of tenant `second` of `acme` */
  secondKey: string;
};

const auth = suite<Ctx>('http auth');

const EVENT = { externalId: 'u1', name: 'app.open' };
const CLIENT_EVENTS = { externalId: 'u1', source: 'ios', events: [{ name: '$app.opened' }] };

/** Asserts an error answer in the envelope with `status` and `code`. */
function isError(res: Reply, status: number, code: string): void {
  assert.is(res.status, status, `expected ${status} ${code}, got ${res.status}: ${res.text.slice(0, 300)}`);
  assert.is(res.body.success, false);
  assert.is(res.body.data, null);
  assert.is(res.body.error.code, code);
  assert.type(res.body.error.message, 'string');
}

/** Asserts a success answer with `status`. */
function isOk(res: Reply, status = 200): void {
  assert.is(res.status, status, `expected ${status}, got ${res.status}: ${res.text.slice(0, 300)}`);
  assert.is(res.body.success, true);
  assert.is(res.body.error, null);
}

auth.before(async (ctx) => {
  Object.assign(ctx, await startServicePair('auth'));
  ctx.acme = await bootstrapWorkspace(ctx.service, 'acme');
  ctx.globex = await bootstrapWorkspace(ctx.service, 'globex');
  ctx.secondKey = (await makeKey(ctx.service, 'acme', 'tenant', ['*'], { tenant: 'second' })).key;
  // a tenant that exists only in the other workspace
  await createTenant(ctx.service.redis, ctx.service.keys, ctx.globex.workspace, 'elsewhere', BY_TEST);
});
auth.after((ctx) => stopServicePair(ctx));

// ---- Part 5 rule 1 / 401 missing_authorization ------------------------------------------------

auth('a request without an Authorization header is 401 missing_authorization', async ({ api }) => {
  const missing = await api.get('/v1/events/names');
  isError(missing, 401, 'missing_authorization');
  assert.is(missing.headers.get('www-authenticate'), 'Bearer', 'a 401 names the scheme (RFC 9110 11.6.1)');
  assert.is((await api.get('/v1/events/names', 'svc_ws_unknown')).headers.get('www-authenticate'), 'Bearer error="invalid_token"');
  isError(await api.post('/v1/events', undefined, EVENT), 401, 'missing_authorization');
  isError(await api.post('/v1/client/events', undefined, CLIENT_EVENTS), 401, 'missing_authorization');
  isError(await api.del('/v1/workspaces/acme/keys/key_x'), 401, 'missing_authorization');
});

auth('two Authorization lines are 400 bad_request (param Authorization), whichever keys they hold: Node would keep the first, a proxy may read the last', async ({ service, acme, globex }) => {
  const ask = async (lines: string[]) => (await rawRequest(service.url, `GET /v1/whoami HTTP/1.1\r\nHost: x\r\n${lines.map((l) => `${l}\r\n`).join('')}Connection: close\r\n\r\n`)).text;
  for (const lines of [[`Authorization: Bearer ${acme.keys.tenant}`, `Authorization: Bearer ${globex.keys.tenant}`], [`Authorization: Bearer ${acme.keys.tenant}`, `authorization: Bearer ${acme.keys.tenant}`]]) {
    const answer = await ask(lines);
    assert.match(answer, /^HTTP\/1\.1 400 /);
    assert.match(answer, /"code":"bad_request"/);
    assert.match(answer, /"param":"Authorization"/);
  }
  assert.match(await ask([`Authorization: Bearer ${acme.keys.tenant}`]), /^HTTP\/1\.1 200 /, 'one line is fine');
});

auth('two Service-Tenant lines are 400 bad_request (param Service-Tenant), not a tenant named `eu, eu` (probe AM)', async ({ service, acme }) => {
  const ask = async (lines: string[]) => (await rawRequest(service.url, `GET /v1/whoami HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${acme.keys.workspace}\r\n${lines.map((l) => `${l}\r\n`).join('')}Connection: close\r\n\r\n`)).text;
  for (const lines of [['Service-Tenant: default', 'Service-Tenant: default'], ['Service-Tenant: default', 'service-tenant: second']]) {
    const answer = await ask(lines);
    assert.match(answer, /^HTTP\/1\.1 400 /);
    assert.match(answer, /"code":"bad_request"/);
    assert.match(answer, /"param":"Service-Tenant"/);
  }
  assert.match(await ask(['Service-Tenant: second']), /^HTTP\/1\.1 200 /, 'one line is fine');
  assert.match(await ask(['Service-Tenant: ']), /^HTTP\/1\.1 200 /, 'a blank one is none: the default tenant');
  // HTTP's whitespace around a value is space and tab, not a no-break space (byte 0xA0; probe I: `second\xa0` named second)
  const latin1 = async (lines: string[]) => (await rawRequest(service.url, Buffer.from(`GET /v1/whoami HTTP/1.1\r\nHost: x\r\n${lines.map((l) => `${l}\r\n`).join('')}Connection: close\r\n\r\n`, 'latin1'))).text;
  assert.match(await latin1([`Authorization: Bearer ${acme.keys.workspace}`, 'Service-Tenant: \tsecond \t']), /^HTTP\/1\.1 200 /);
  for (const value of ['second\xa0', '\xa0second']) {
    const answer = await latin1([`Authorization: Bearer ${acme.keys.workspace}`, `Service-Tenant: ${value}`]);
    assert.match(answer, /^HTTP\/1\.1 403 /, JSON.stringify(value));
    assert.match(answer, /"param":"Service-Tenant"/);
  }
  assert.match(await latin1([`Authorization: Bearer ${acme.keys.workspace}\xa0`]), /^HTTP\/1\.1 401 /);
  assert.match(await latin1([`Authorization: Bearer\xa0${acme.keys.workspace}`]), /^HTTP\/1\.1 401 /);
  assert.match(await latin1([`Authorization: Bearer \t${acme.keys.workspace}`]), /^HTTP\/1\.1 200 /);
});

auth('the health endpoint answers without a credential', async ({ api }) => {
  const res = await api.get('/v1/health');
  isOk(res);
  assert.is(res.body.data.redis.reachable, true);
});

// ---- 401 invalid_api_key ----------------------------------------------------------------------

auth('a garbage bearer credential is 401 invalid_api_key', async ({ api }) => {
  isError(await api.get('/v1/events/names', 'not-a-key'), 401, 'invalid_api_key');
  isError(await api.get('/v1/events/names', 'sk_live_1234567890'), 401, 'invalid_api_key');
});

auth('a key sent under the Basic scheme is 401 invalid_api_key', async ({ api, acme }) => {
  const basic = `Basic ${Buffer.from(`${acme.keys.workspace}:`).toString('base64')}`;
  isError(await api.call('GET', '/v1/events/names', { headers: { authorization: basic } }), 401, 'invalid_api_key');
  // the key itself, unencoded, under another scheme is refused too
  isError(await api.call('GET', '/v1/events/names', { headers: { authorization: `Token ${acme.keys.workspace}` } }), 401, 'invalid_api_key');
});

auth('an unknown key with a valid prefix is 401 invalid_api_key', async ({ api }) => {
  for (const prefix of ['svc_ws_', 'svc_tn_', 'svc_pk_']) {
    isError(await api.get('/v1/events/names', prefix + randomBytes(24).toString('hex')), 401, 'invalid_api_key');
  }
});

auth('a string under a key prefix that is not a key\'s 48 hex characters is malformed, never looked up nor remembered (probe BZ: 15 KB strings each kept in the hash cache)', async ({ api }) => {
  const malformed = 'The API key is malformed (it must be svc_ws_, svc_tn_, svc_pk_ followed by 48 hex characters)';
  for (const key of ['svc_ws_' + 'a'.repeat(15_000), 'svc_tn_' + randomBytes(24).toString('hex') + '0', 'svc_pk_' + randomBytes(24).toString('hex').toUpperCase(), 'svc_ws_' + 'g'.repeat(48)]) {
    const res = await api.get('/v1/events/names', key);
    isError(res, 401, 'invalid_api_key');
    assert.is(res.body.error.message, malformed, key.slice(0, 20));
  }
  const unknown = await api.get('/v1/events/names', 'svc_ws_' + randomBytes(24).toString('hex'));
  assert.is(unknown.body.error.message, 'The API key is unknown or revoked', 'a well-formed key is looked up');
});

auth('a valid key presented under another kind\'s prefix is 401 invalid_api_key', async ({ api, acme }) => {
  const body = acme.keys.workspace.slice('svc_ws_'.length);
  // the key itself works
  isOk(await api.get('/v1/events/names', acme.keys.workspace));
  isError(await api.get('/v1/events/names', `svc_tn_${body}`), 401, 'invalid_api_key');
  isError(await api.get('/v1/events/names', `svc_pk_${body}`), 401, 'invalid_api_key');
  const tenantBody = acme.keys.tenant.slice('svc_tn_'.length);
  isError(await api.get('/v1/events/names', `svc_ws_${tenantBody}`), 401, 'invalid_api_key');
  const clientBody = acme.keys.client.slice('svc_pk_'.length);
  isError(await api.post('/v1/events', `svc_ws_${clientBody}`, EVENT), 401, 'invalid_api_key');
});

auth('the key store itself refuses a session-only scope, whatever path asks (spec 5.7; probe BZ: only the CLI checked), and writes nothing', async ({ service, acme }) => {
  const before = (await listApiKeys(service.redis, service.keys, acme.workspace.id)).length;
  for (const scopes of [['keys:write'], ['events:read', 'account:read'], ['members:write']]) {
    try {
      await makeKey(service, 'acme', 'workspace', scopes);
      assert.unreachable(`${scopes} granted`);
    } catch (err) {
      assert.match((err as Error).message, /is session-only and can never be granted to a key/, String(scopes));
    }
  }
  assert.is((await listApiKeys(service.redis, service.keys, acme.workspace.id)).length, before);
});

auth('a revoked key is 401 invalid_api_key', async ({ service, api, acme }) => {
  const { key, record } = await makeKey(service, 'acme', 'tenant', ['events:read']);
  isOk(await api.get('/v1/events/names', key));
  const revoked = await revokeApiKey(service.redis, service.keys, acme.workspace, record.id, BY_TEST);
  assert.ok(revoked?.revokedAt);
  isError(await api.get('/v1/events/names', key), 401, 'invalid_api_key');
});

auth('a revocation takes effect at once in every process through the key-cache invalidation, not the 30 s TTL', async ({ service, peer, api, peerApi, acme }) => {
  assert.is(peer.env.REDIS_KEY_PREFIX, service.env.REDIS_KEY_PREFIX);
  assert.is(peer.config.keyCacheTtlMs, 30_000);
  const revokedKey = await makeKey(service, 'acme', 'workspace', ['events:read']);
  const controlKey = await makeKey(service, 'acme', 'workspace', ['events:read']);
  // both keys are now cached in the peer process
  isOk(await peerApi.get('/v1/events/names', revokedKey.key));
  isOk(await peerApi.get('/v1/events/names', controlKey.key));
  // control: marking a record revoked WITHOUT the published invalidation leaves the peer's cached
  // entry in use, so the cache really serves these keys and only the message can refuse them early
  await service.redis.hset(service.keys.apiKey(controlKey.record.id), 'revokedAt', new Date().toISOString());
  isOk(await peerApi.get('/v1/events/names', controlKey.key));
  // revoke through the first process's Redis client
  const started = Date.now();
  assert.ok(await revokeApiKey(service.redis, service.keys, acme.workspace, revokedKey.record.id, BY_TEST));
  await waitFor('the peer to refuse the revoked key', async () => (await peerApi.get('/v1/events/names', revokedKey.key)).status === 401, 2_000, 20);
  assert.ok(Date.now() - started < 2_000);
  isError(await peerApi.get('/v1/events/names', revokedKey.key), 401, 'invalid_api_key');
  isError(await api.get('/v1/events/names', revokedKey.key), 401, 'invalid_api_key');
  // the control key is still served from the peer's cache: the refusal above was not the TTL
  isOk(await peerApi.get('/v1/events/names', controlKey.key));
});

// ---- 401 api_key_expired ----------------------------------------------------------------------

auth('a key whose expiresAt has passed is 401 api_key_expired', async ({ service, api }) => {
  const past = new Date(Date.now() - 60_000).toISOString();
  const tenant = await makeKey(service, 'acme', 'tenant', ['*'], { expiresAt: past });
  isError(await api.get('/v1/events/names', tenant.key), 401, 'api_key_expired');
  const workspace = await makeKey(service, 'acme', 'workspace', ['*'], { expiresAt: past });
  isError(await api.post('/v1/events', workspace.key, EVENT), 401, 'api_key_expired');
  const clientKey = await makeKey(service, 'acme', 'client', ['client'], { expiresAt: past });
  isError(await api.post('/v1/client/events', clientKey.key, CLIENT_EVENTS), 401, 'api_key_expired');
});

auth('a key with a future expiry works', async ({ service, api }) => {
  const future = new Date(Date.now() + 3_600_000).toISOString();
  const { key } = await makeKey(service, 'acme', 'tenant', ['*'], { expiresAt: future });
  isOk(await api.get('/v1/events/names', key));
  isOk(await api.post('/v1/events', key, EVENT), 202);
});

// ---- 401 invalid_session and the events token --------------------------------------------------

auth('a malformed JWT-looking bearer is 401 invalid_session', async ({ api }) => {
  isError(await api.get('/v1/events/names', 'eyJhbGciOiJIUzI1NiJ9.eyJub3QiOiJ2YWxpZA.c2lnbmF0dXJl'), 401, 'invalid_session');
  isError(await api.get('/v1/events/names', 'eyJ.x.y'), 401, 'invalid_session');
  // on a route that takes no token too: an invalid session is 401 before any route rule
  isError(await api.post('/v1/events', 'eyJ.x.y', EVENT), 401, 'invalid_session');
});

/** The id of the key `key` (from a token it mints: the token names its key). */
async function keyIdOf(api: Ctx['api'], key: string): Promise<string> {
  return decodeJwt((await api.get('/v1/events/token', key)).body.data.token as string).key as string;
}

auth('an events token signed with another secret is 401 invalid_session', async ({ api, acme }) => {
  const { token } = await signEventsToken(randomBytes(32), { workspaceId: acme.workspace.id, tenantId: acme.tenant.id, keyId: await keyIdOf(api, acme.keys.tenant) });
  isError(await api.get('/v1/events/names', token), 401, 'invalid_session');
});

auth('after Redis loses the generated events-token secret, every web process signs and verifies with one secret again within seconds (probe CB)', async ({ service, api, peerApi, acme }) => {
  const { redis, keys } = service;
  const keyId = await keyIdOf(api, acme.keys.tenant);
  const accepted = async (token: string) => (await api.get('/v1/events/names', token)).status === 200 && (await peerApi.get('/v1/events/names', token)).status === 200;
  const before = (await redis.get(keys.eventsTokenSecret))!;
  try {
    // a process started after the loss stored a secret of its own: both processes take it
    const other = randomBytes(32);
    await redis.set(keys.eventsTokenSecret, other.toString('base64'));
    const { token } = await signEventsToken(other, { workspaceId: acme.workspace.id, tenantId: acme.tenant.id, keyId });
    await waitFor('both processes to verify with the stored secret', () => accepted(token), 12_000, 250);
    // the secret gone with the data: a running process stores the one it signs with again, and both verify what either mints
    await redis.del(keys.eventsTokenSecret);
    await waitFor('the secret stored again', () => redis.get(keys.eventsTokenSecret), 12_000, 250);
    assert.is(await redis.get(keys.eventsTokenSecret), other.toString('base64'));
    for (const each of [api, peerApi]) assert.ok(await accepted((await each.get('/v1/events/token', acme.keys.tenant)).body.data.token));
  } finally {
    await redis.set(keys.eventsTokenSecret, before);
    const { token } = await signEventsToken(Buffer.from(before, 'base64'), { workspaceId: acme.workspace.id, tenantId: acme.tenant.id, keyId });
    await waitFor('both processes back on the first secret', () => accepted(token), 12_000, 250);
  }
});

auth('an events token lives no longer than its key: revoking the key, or its expiry, ends the token at once (401 invalid_session)', async ({ service, api, acme }) => {
  const revoked = await makeKey(service, 'acme', 'tenant', ['events:read']);
  const token = (await api.get('/v1/events/token', revoked.key)).body.data.token as string;
  assert.is(decodeJwt(token).key, revoked.record.id);
  isOk(await api.get('/v1/events/names', token));
  await revokeApiKey(service.redis, service.keys, acme.workspace, revoked.record.id, BY_TEST);
  isError(await api.get('/v1/events/names', token), 401, 'invalid_session');
  const expiring = await makeKey(service, 'acme', 'tenant', ['events:read'], { expiresAt: new Date(Date.now() + 3_600_000).toISOString() });
  const second = (await api.get('/v1/events/token', expiring.key)).body.data.token as string;
  isOk(await api.get('/v1/events/names', second));
  await service.redis.hset(service.keys.apiKey(expiring.record.id), 'expiresAt', new Date(Date.now() - 1_000).toISOString());
  isError(await api.get('/v1/events/names', second), 401, 'invalid_session');
  // a key expiring within the hour: the token says so (expiresAt and exp), not an hour it will not get
  const keyExpiry = new Date(Date.now() + 600_000);
  keyExpiry.setMilliseconds(0);
  const shortKey = await makeKey(service, 'acme', 'tenant', ['events:read'], { expiresAt: keyExpiry.toISOString() });
  const short = (await api.get('/v1/events/token', shortKey.key)).body.data;
  assert.is(short.expiresAt, keyExpiry.toISOString());
  assert.is(decodeJwt(short.token).exp, keyExpiry.getTime() / 1000);
  isOk(await api.get('/v1/events/names', short.token));
  // a token naming no key (or one of another workspace) is refused alike
  const { key: secret } = await eventsTokenSecret(service.redis, service.keys, service.config);
  const iat = Math.floor(Date.now() / 1000);
  for (const claims of [{ wid: acme.workspace.id, scope: 'events:read' }, { wid: acme.workspace.id, key: 'key_01m85tazena0dqvre022vdzbtt', scope: 'events:read' }]) {
    const forged = await new SignJWT(claims).setProtectedHeader({ alg: 'HS256', typ: 'JWT' })
      .setIssuer('herald').setAudience('herald:events').setSubject(acme.tenant.id).setIssuedAt(iat).setExpirationTime(iat + 3600).sign(secret);
    isError(await api.get('/v1/events/names', forged), 401, 'invalid_session');
  }
});

auth('an expired events token is 401 invalid_session', async ({ service, api, acme }) => {
  const { key: secret } = await eventsTokenSecret(service.redis, service.keys, service.config);
  const key = await keyIdOf(api, acme.keys.tenant);
  const iat = Math.floor(Date.now() / 1000) - 7200;
  const expired = await new SignJWT({ wid: acme.workspace.id, key, scope: 'events:read' })
    .setProtectedHeader({ alg: 'HS256', typ: 'JWT' })
    .setIssuer('herald').setAudience('herald:events').setSubject(acme.tenant.id).setIssuedAt(iat).setExpirationTime(iat + 3600)
    .sign(secret);
  isError(await api.get('/v1/events/names', expired), 401, 'invalid_session');
  // the same claims, not expired, with the same secret are accepted: only the expiry differs
  const fresh = await new SignJWT({ wid: acme.workspace.id, key, scope: 'events:read' })
    .setProtectedHeader({ alg: 'HS256', typ: 'JWT' })
    .setIssuer('herald').setAudience('herald:events').setSubject(acme.tenant.id).setIssuedAt(iat + 7200).setExpirationTime(iat + 7200 + 3600)
    .sign(secret);
  isOk(await api.get('/v1/events/names', fresh));
  // a token that gives itself more than the hour (signed with the secret, had it leaked) is refused, even within its first hour
  const sign = (issued: number, expires: number) => new SignJWT({ wid: acme.workspace.id, key, scope: 'events:read' })
    .setProtectedHeader({ alg: 'HS256', typ: 'JWT' })
    .setIssuer('herald').setAudience('herald:events').setSubject(acme.tenant.id).setIssuedAt(issued).setExpirationTime(expires)
    .sign(secret);
  const nowS = iat + 7200;
  isError(await api.get('/v1/events/names', await sign(nowS, nowS + 365 * 86_400)), 401, 'invalid_session');
  isError(await api.get('/v1/events/names', await sign(nowS - 3 * 3600, nowS + 600)), 401, 'invalid_session');
  isError(await api.get('/v1/events/names', await sign(nowS + 1800, nowS + 3600)), 401, 'invalid_session');
});

auth('an events token naming a tenant its key cannot reach is 401 invalid_session, had the secret leaked; a workspace key\'s reaches every tenant of its workspace (probe J)', async ({ service, api, acme, secondKey }) => {
  const { key: secret } = await eventsTokenSecret(service.redis, service.keys, service.config);
  const second = decodeJwt((await api.get('/v1/events/token', secondKey)).body.data.token as string).sub as string;
  const nowS = Math.floor(Date.now() / 1000);
  const forge = async (key: string) => new SignJWT({ wid: acme.workspace.id, key, scope: 'events:read' })
    .setProtectedHeader({ alg: 'HS256', typ: 'JWT' })
    .setIssuer('herald').setAudience('herald:events').setSubject(second).setIssuedAt(nowS).setExpirationTime(nowS + 3600)
    .sign(secret);
  isError(await api.get('/v1/events/names', await forge(await keyIdOf(api, acme.keys.tenant))), 401, 'invalid_session');
  isOk(await api.get('/v1/events/names', await forge(await keyIdOf(api, acme.keys.workspace))));
});

auth('a valid events token reads the catalog, volume, recent events and timelines of its tenant', async ({ api, acme }) => {
  isOk(await api.post('/v1/events', acme.keys.tenant, { externalId: 'token-reader', name: 'app.open' }), 202);
  const issued = await api.get('/v1/events/token', acme.keys.tenant);
  isOk(issued);
  const token = issued.body.data.token as string;
  assert.match(token, /^eyJ[^.]+\.[^.]+\.[^.]+$/);
  isOk(await api.get('/v1/events/names', token));
  const volume = await api.get('/v1/events/volume?range=7d', token);
  isOk(volume);
  assert.is(volume.body.data.range, '7d');
  isOk(await api.get('/v1/events', token));
  isOk(await api.get('/v1/subscribers/token-reader/timeline', token));
  // its own tenant named in the header is fine; another tenant is refused
  isOk(await api.get('/v1/events/names', token, { 'Service-Tenant': 'default' }));
  isError(await api.get('/v1/events/names', token, { 'Service-Tenant': 'second' }), 403, 'forbidden');
});

auth('an events token cannot ingest: POST /v1/events is 403 forbidden', async ({ api, acme }) => {
  const token = (await api.get('/v1/events/token', acme.keys.workspace)).body.data.token as string;
  isError(await api.post('/v1/events', token, EVENT), 403, 'forbidden');
});

auth('an events token cannot mint another token: GET /v1/events/token is 403 forbidden', async ({ api, acme }) => {
  const token = (await api.get('/v1/events/token', acme.keys.tenant)).body.data.token as string;
  isError(await api.get('/v1/events/token', token), 403, 'forbidden');
});

auth('an events token reads only the event routes: GET /v1/whoami is 403 forbidden', async ({ api, acme }) => {
  const issued = (await api.get('/v1/events/token', acme.keys.tenant)).body.data;
  isError(await api.get('/v1/whoami', issued.token), 403, 'forbidden');
});

// ---- 403 missing_permission -----------------------------------------------------------------

auth('a key with only events:read posting events is 403 missing_permission', async ({ service, api }) => {
  const tenant = await makeKey(service, 'acme', 'tenant', ['events:read']);
  isError(await api.post('/v1/events', tenant.key, EVENT), 403, 'missing_permission');
  const workspace = await makeKey(service, 'acme', 'workspace', ['events:read', 'messages:send']);
  isError(await api.post('/v1/events', workspace.key, EVENT), 403, 'missing_permission');
  // it reads
  isOk(await api.get('/v1/events/names', tenant.key));
});

auth('a key with events:* may post and read events', async ({ service, api }) => {
  const { key } = await makeKey(service, 'acme', 'tenant', ['events:*']);
  isOk(await api.post('/v1/events', key, EVENT), 202);
  isOk(await api.get('/v1/events/names', key));
  isOk(await api.get('/v1/events/token', key));
});

auth('a key of another resource\'s wildcard lacks the events scopes (403 missing_permission)', async ({ service, api }) => {
  const { key } = await makeKey(service, 'acme', 'tenant', ['messages:*', 'subscribers:read']);
  isError(await api.post('/v1/events', key, EVENT), 403, 'missing_permission');
  isError(await api.get('/v1/events/names', key), 403, 'missing_permission');
});

auth('a key with * still gets 403 missing_permission on the session-only keys:write route', async ({ api, acme }) => {
  isOk(await api.post('/v1/events', acme.keys.workspace, EVENT), 202);
  const res = await api.del('/v1/workspaces/acme/keys/key_x', acme.keys.workspace);
  isError(res, 403, 'missing_permission');
  assert.match(res.body.error.message, /keys:write/);
});

auth('the session-only keys:write route checks the key kind and workspace first (403 forbidden), as every workspace route does', async ({ api, acme, globex }) => {
  for (const key of [acme.keys.tenant, acme.keys.client, globex.keys.workspace]) {
    isError(await api.del('/v1/workspaces/acme/keys/key_x', key), 403, 'forbidden');
  }
  isError(await api.del('/v1/workspaces/globex/keys/key_x', acme.keys.workspace), 403, 'forbidden');
  isError(await api.del('/v1/workspaces/globex/keys/key_x', globex.keys.workspace), 403, 'missing_permission');
  // authentication still comes first
  isError(await api.del('/v1/workspaces/acme/keys/key_x', 'svc_ws_unknown'), 401, 'invalid_api_key');
});

auth('an unauthenticated request is 401 before its body is read', async ({ api }) => {
  isError(await api.call('POST', '/v1/events', { raw: '{bad' }), 401, 'missing_authorization');
  isError(await api.call('POST', '/v1/events', { raw: 'a=b', headers: { 'content-type': 'application/x-www-form-urlencoded' } }), 401, 'missing_authorization');
  isError(await api.call('POST', '/v1/events', { key: 'svc_tn_unknown', raw: '{bad' }), 401, 'invalid_api_key');
});

auth('a client key holding scopes other than client or * is 403 missing_permission on client routes', async ({ service, api }) => {
  const { key } = await makeKey(service, 'acme', 'client', ['events:write', 'events:read']);
  isError(await api.post('/v1/client/events', key, CLIENT_EVENTS), 403, 'missing_permission');
});

auth('a client key holding client or * may track from the app', async ({ service, api, acme }) => {
  isOk(await api.post('/v1/client/events', acme.keys.client, CLIENT_EVENTS), 202);
  const { key } = await makeKey(service, 'acme', 'client', ['client']);
  isOk(await api.post('/v1/client/events', key, CLIENT_EVENTS), 202);
});

// ---- 403 forbidden ---------------------------------------------------------------------------

auth('a tenant key on a workspace route is 403 forbidden', async ({ api, acme }) => {
  isError(await api.get('/v1/workspaces/acme/webhooks', acme.keys.tenant), 403, 'forbidden');
});

auth('a client key on a tenant route is 403 forbidden', async ({ api, acme }) => {
  isError(await api.post('/v1/events', acme.keys.client, EVENT), 403, 'forbidden');
  isError(await api.get('/v1/events/names', acme.keys.client), 403, 'forbidden');
  isError(await api.get('/v1/subscribers/u1/timeline', acme.keys.client), 403, 'forbidden');
});

auth('a client key on a workspace route is 403 forbidden', async ({ api, acme }) => {
  isError(await api.get('/v1/workspaces/acme/webhooks', acme.keys.client), 403, 'forbidden');
});

/** Every operation of the published OpenAPI document, its path parameters filled in (`{workspaceSlug}` with acme's). */
async function publishedOperations(api: Ctx['api']): Promise<{ method: string; path: string; open: boolean }[]> {
  const doc = (await api.get('/v1/openapi.json')).body as { paths: Record<string, Record<string, { security?: unknown[] }>> };
  const methods = ['get', 'post', 'put', 'patch', 'delete'];
  return Object.entries(doc.paths).flatMap(([template, item]) => Object.keys(item).filter((m) => methods.includes(m)).map((m) => ({
    method: m.toUpperCase(),
    path: template.replace('{workspaceSlug}', 'acme').replace(/\{[^}]+\}/g, 'some-id'),
    // published as taking no credential (`security: []`): health, the document, a source's inbound deliveries
    open: Array.isArray(item[m]!.security) && item[m]!.security!.length === 0,
  })));
}

auth('a client key is 403 forbidden on every published operation outside /v1/client, and an events token outside the event reads', async ({ api, acme }) => {
  const token = (await api.get('/v1/events/token', acme.keys.tenant)).body.data.token as string;
  const tokenReads = /^\/v1\/(events(\/names(\/[^/]+)?|\/volume)?|subscribers\/[^/]+\/timeline)$/;
  const published = await publishedOperations(api);
  assert.equal(published.filter((op) => op.open).map((op) => `${op.method} ${op.path}`).sort(), ['GET /v1/health', 'GET /v1/openapi.json', 'POST /v1/sources/some-id/inbound']);
  const operations = published.filter((op) => !op.open);
  assert.ok(operations.length > 50, `${operations.length} operations published`);
  let tokenChecked = 0;
  for (const { method, path } of operations) {
    const body = method === 'GET' || method === 'DELETE' ? undefined : {};
    // the key revocation route answers every API key 403 missing_permission, whatever its kind (issue #3; test above)
    if (!path.startsWith('/v1/client/') && !path.startsWith('/v1/workspaces/acme/keys/')) {
      const res = await api.call(method, path, { key: acme.keys.client, body });
      assert.is(`${method} ${path} ${res.status} ${res.body.error?.code}`, `${method} ${path} 403 forbidden`);
    }
    if (!(method === 'GET' && tokenReads.test(path))) {
      const res = await api.call(method, path, { key: token, body });
      assert.is(`${method} ${path} ${res.status} ${res.body.error?.code}`, `${method} ${path} 403 forbidden`, 'an events token');
      tokenChecked++;
    }
  }
  assert.ok(tokenChecked > 40);
});

auth('workspace and tenant keys on /v1/client/events are 403 forbidden', async ({ api, acme }) => {
  isError(await api.post('/v1/client/events', acme.keys.workspace, CLIENT_EVENTS), 403, 'forbidden');
  isError(await api.post('/v1/client/events', acme.keys.tenant, CLIENT_EVENTS), 403, 'forbidden');
});

auth('a workspace key of another workspace on a workspace route is 403 forbidden', async ({ api, globex }) => {
  isError(await api.get('/v1/workspaces/acme/webhooks', globex.keys.workspace), 403, 'forbidden');
  // the same key on its own workspace passes the workspace check
  isOk(await api.get('/v1/workspaces/globex/webhooks', globex.keys.workspace), 200);
});

auth('a workspace route sent a Service-Tenant that is not one of the key\'s workspace is 403 forbidden; one of its own tenants is fine (probe G)', async ({ api, acme, globex }) => {
  // `elsewhere` exists, but only in globex
  isError(await api.get('/v1/workspaces/acme/webhooks', acme.keys.workspace, { 'Service-Tenant': 'elsewhere' }), 403, 'forbidden');
  isError(await api.get('/v1/workspaces/acme/webhooks', acme.keys.workspace, { 'Service-Tenant': 'no-such-tenant' }), 403, 'forbidden');
  isError(await api.del('/v1/workspaces/acme/keys/key_x', acme.keys.workspace, { 'Service-Tenant': 'elsewhere' }), 403, 'forbidden');
  isOk(await api.get('/v1/workspaces/acme/webhooks', acme.keys.workspace, { 'Service-Tenant': 'default' }), 200);
  isOk(await api.get('/v1/workspaces/globex/webhooks', globex.keys.workspace, { 'Service-Tenant': 'elsewhere' }), 200);
});

auth('a workspace key naming a tenant that does not exist in Service-Tenant is 403 forbidden', async ({ api, acme }) => {
  isError(await api.get('/v1/events/names', acme.keys.workspace, { 'Service-Tenant': 'no-such-tenant' }), 403, 'forbidden');
  isError(await api.post('/v1/events', acme.keys.workspace, EVENT, { 'Service-Tenant': 'no-such-tenant' }), 403, 'forbidden');
});

auth('a workspace key naming a tenant of another workspace in Service-Tenant is 403 forbidden', async ({ api, acme, globex }) => {
  // `elsewhere` exists, but only in globex
  isOk(await api.get('/v1/events/names', globex.keys.workspace, { 'Service-Tenant': 'elsewhere' }));
  isError(await api.get('/v1/events/names', acme.keys.workspace, { 'Service-Tenant': 'elsewhere' }), 403, 'forbidden');
  isError(await api.post('/v1/events', acme.keys.workspace, EVENT, { 'Service-Tenant': 'elsewhere' }), 403, 'forbidden');
});

auth('a tenant key naming another tenant in Service-Tenant is 403 forbidden, its own slug is fine', async ({ api, acme, secondKey }) => {
  isError(await api.get('/v1/events/names', acme.keys.tenant, { 'Service-Tenant': 'second' }), 403, 'forbidden');
  isError(await api.post('/v1/events', secondKey, EVENT, { 'Service-Tenant': 'default' }), 403, 'forbidden');
  isOk(await api.get('/v1/events/names', acme.keys.tenant, { 'Service-Tenant': 'default' }));
  isOk(await api.post('/v1/events', secondKey, EVENT, { 'Service-Tenant': 'second' }), 202);
});

auth('a client key naming another tenant in Service-Tenant is 403 forbidden, its own slug is fine', async ({ api, acme }) => {
  isError(await api.post('/v1/client/events', acme.keys.client, CLIENT_EVENTS, { 'Service-Tenant': 'second' }), 403, 'forbidden');
  isOk(await api.post('/v1/client/events', acme.keys.client, CLIENT_EVENTS, { 'Service-Tenant': 'default' }), 202);
});

// ---- Part 5 rule 4: tenant selection ---------------------------------------------------------

auth('every refused Service-Tenant names the header as param, whatever the credential, and the message does not echo it (probe O)', async ({ api, acme }) => {
  const token = (await api.get('/v1/events/token', acme.keys.tenant)).body.data.token as string;
  const long = 'x'.repeat(4000);
  const cases: [string, string, string][] = [
    ['workspace key', acme.keys.workspace, '/v1/events/names'],
    ['tenant key', acme.keys.tenant, '/v1/events/names'],
    ['events token', token, '/v1/events/names'],
    ['client key', acme.keys.client, '/v1/client/events'],
  ];
  for (const [what, credential, path] of cases) {
    for (const header of ['zz', long]) {
      const res = path === '/v1/client/events'
        ? await api.post(path, credential, CLIENT_EVENTS, { 'Service-Tenant': header })
        : await api.get(path, credential, { 'Service-Tenant': header });
      isError(res, 403, 'forbidden');
      assert.is(res.body.error.param, 'Service-Tenant', what);
      assert.not.ok(res.body.error.message.includes(header), `${what}: the header is not echoed`);
    }
  }
});

auth('GET /v1/whoami applies the Service-Tenant rule of every route: a tenant key naming another tenant is 403 forbidden', async ({ api, acme, secondKey }) => {
  isError(await api.get('/v1/whoami', acme.keys.tenant, { 'Service-Tenant': 'second' }), 403, 'forbidden');
  isError(await api.get('/v1/whoami', secondKey, { 'Service-Tenant': 'no-such-tenant' }), 403, 'forbidden');
  const own = await api.get('/v1/whoami', secondKey, { 'Service-Tenant': 'second' });
  isOk(own);
  assert.is(own.body.data.tenant.slug, 'second');
  const selected = await api.get('/v1/whoami', acme.keys.workspace, { 'Service-Tenant': 'second' });
  isOk(selected);
  assert.is(selected.body.data.tenant.slug, 'second');
});

auth('a workspace key without Service-Tenant works in the default tenant', async ({ api, acme, secondKey }) => {
  isOk(await api.post('/v1/events', acme.keys.workspace, { externalId: 'in-default', name: 'app.open' }), 202);
  isOk(await api.get('/v1/subscribers/in-default/timeline', acme.keys.tenant));
  isOk(await api.get('/v1/subscribers/in-default/timeline', acme.keys.workspace));
  isError(await api.get('/v1/subscribers/in-default/timeline', secondKey), 404, 'not_found');
});

auth('a workspace key with Service-Tenant: second works in tenant second', async ({ api, acme, secondKey }) => {
  isOk(await api.post('/v1/events', acme.keys.workspace, { externalId: 'in-second', name: 'app.open' }, { 'Service-Tenant': 'second' }), 202);
  isOk(await api.get('/v1/subscribers/in-second/timeline', secondKey));
  isOk(await api.get('/v1/subscribers/in-second/timeline', acme.keys.workspace, { 'Service-Tenant': 'second' }));
  isError(await api.get('/v1/subscribers/in-second/timeline', acme.keys.tenant), 404, 'not_found');
  isError(await api.get('/v1/subscribers/in-second/timeline', acme.keys.workspace), 404, 'not_found');
});

// ---- 404 not_found --------------------------------------------------------------------------

auth('an unknown route is 404 not_found with or without a credential', async ({ api, acme }) => {
  isError(await api.get('/v1/nothing-here'), 404, 'not_found');
  isError(await api.get('/v1/nothing-here', acme.keys.workspace), 404, 'not_found');
  isError(await api.get('/v1/nothing-here', 'garbage'), 404, 'not_found');
});

auth('an unknown subscriber\'s timeline is 404 not_found', async ({ api, acme }) => {
  isError(await api.get('/v1/subscribers/never-seen/timeline', acme.keys.tenant), 404, 'not_found');
});

auth('a list under a malformed or unknown id or slug is 404 not_found even when its query is also invalid (spec 2.3 rule 2)', async ({ api, acme }) => {
  const tenantLists = [
    '/v1/subscribers/never-seen/timeline?limit=0',
    '/v1/subscribers/never-seen/subscriptions?limit=0',
    '/v1/topics/no-such-topic/subscribers?limit=0',
    '/v1/segments/no-such-segment/members?limit=0',
    '/v1/workflows/ab/runs?limit=0&status=bogus',
    '/v1/workflows/no-such-workflow/versions?limit=0',
    '/v1/messages/msg_bogus/deliveries?status=bogus',
  ];
  for (const path of tenantLists) isError(await api.get(path, acme.keys.tenant), 404, 'not_found');
  isError(await api.get(`/v1/workspaces/${acme.workspace.slug}/webhooks/whk_bogus/deliveries?status=bogus`, acme.keys.workspace), 404, 'not_found');
});

auth('an event name the tenant has not seen is 404 not_found', async ({ api, acme }) => {
  isError(await api.get('/v1/events/names/never.seen', acme.keys.tenant), 404, 'not_found');
});

auth('a subscriber of another tenant is 404 not_found', async ({ api, acme, globex, secondKey }) => {
  isOk(await api.post('/v1/events', secondKey, { externalId: 'only-second', name: 'app.open' }), 202);
  isOk(await api.get('/v1/subscribers/only-second/timeline', secondKey));
  isError(await api.get('/v1/subscribers/only-second/timeline', acme.keys.tenant), 404, 'not_found');
  // the same externalId in another workspace's default tenant
  isError(await api.get('/v1/subscribers/only-second/timeline', globex.keys.tenant), 404, 'not_found');
});

// ---- scope rules as units -------------------------------------------------------------------

auth('hasScope: exact scopes, resource:* and * match', () => {
  assert.ok(hasScope(['events:write'], 'events:write'));
  assert.not.ok(hasScope(['events:read'], 'events:write'));
  assert.ok(hasScope(['events:*'], 'events:write'));
  assert.ok(hasScope(['events:*'], 'events:read'));
  assert.not.ok(hasScope(['events:*'], 'messages:send'));
  assert.not.ok(hasScope(['event:*'], 'events:read'));
  assert.ok(hasScope(['*'], 'messages:send'));
  assert.ok(hasScope(['*'], 'client'));
  assert.ok(hasScope(['client'], 'client'));
  assert.not.ok(hasScope(['events:*'], 'client'));
  assert.not.ok(hasScope([], 'events:read'));
});

auth('session-only scopes are never matched, not even by * or their own wildcard', () => {
  for (const scope of ['keys:*', 'keys:write', 'keys:read', 'invites:*', 'invites:send', 'members:write', 'workspace:delete', 'tenants:secrets', 'account:*', 'account:read']) {
    assert.ok(isSessionOnly(scope), scope);
    assert.not.ok(hasScope(['*'], scope), `* matched ${scope}`);
    assert.not.ok(hasScope([scope], scope), `${scope} matched itself`);
    const wildcard = `${scope.split(':')[0]}:*`;
    assert.not.ok(hasScope([wildcard], scope), `${wildcard} matched ${scope}`);
  }
  for (const scope of ['events:read', 'events:*', 'messages:send', 'tenants:read', 'members:read', '*', 'client']) assert.not.ok(isSessionOnly(scope), scope);
});

auth('scopeProblem never lets a session-only scope be granted and checks the shape and resource', () => {
  for (const scope of [...SESSION_ONLY_SCOPES, 'keys:write', 'account:read', 'tenants:*']) assert.match(scopeProblem(scope) ?? '', /session-only/, scope);
  for (const scope of ['*', 'client', 'events:*', 'events:read', 'messages:send', 'topics:*', 'subscribers:read']) assert.is(scopeProblem(scope), null, scope);
  assert.match(scopeProblem('Events:Read') ?? '', /is not a scope/);
  assert.match(scopeProblem('events') ?? '', /is not a scope/);
  assert.match(scopeProblem('bogus:read') ?? '', /unknown resource/);
});

auth('scopeProblemForKind: client keys hold only client or *, the others never client, tenant keys no workspace-only resource', () => {
  for (const kind of KEY_KINDS) assert.is(scopeProblemForKind(kind, '*'), null, `* on a ${kind} key`);
  assert.is(scopeProblemForKind('client', 'client'), null);
  for (const scope of ['events:write', 'events:*', 'subscribers:read', 'webhooks:*']) {
    assert.match(scopeProblemForKind('client', scope) ?? '', new RegExp(`^"${scope.replace('*', '\\*')}" can never be used by a client key: .*need the scope client`), scope);
  }
  for (const kind of ['workspace', 'tenant'] as const) assert.match(scopeProblemForKind(kind, 'client') ?? '', new RegExp(`^"client" can never be used by a ${kind} key`));
  for (const scope of ['webhooks:read', 'webhooks:write', 'webhooks:*']) {
    assert.match(scopeProblemForKind('tenant', scope) ?? '', /can never be used by a tenant key: webhooks routes are workspace routes/, scope);
    assert.is(scopeProblemForKind('workspace', scope), null, `${scope} on a workspace key`);
  }
  for (const scope of ['events:read', 'events:*', 'messages:send', 'subscribers:write', 'topics:*', 'apps:write']) {
    assert.is(scopeProblemForKind('tenant', scope), null, `${scope} on a tenant key`);
    assert.is(scopeProblemForKind('workspace', scope), null, `${scope} on a workspace key`);
  }
});

/** Every `authorize(deps, '<plane>', '<scope>'…)` of http/routes, read from the source. */
function routeScopes(): { plane: string; scope: string }[] {
  const dir = join(import.meta.dirname, '..', '..', 'http', 'routes');
  return readdirSync(dir).filter((f) => f.endsWith('.ts')).flatMap((f) =>
    [...readFileSync(join(dir, f), 'utf8').matchAll(/authorize\(deps, '([a-z]+)', '([^']+)'/g)].map((m) => ({ plane: m[1]!, scope: m[2]! })));
}

auth('the kind rules match the routes: client routes need client, and the workspace-only resources are those only workspace routes name', () => {
  const found = routeScopes();
  assert.ok(found.length > 20, `found ${found.length} authorize calls`);
  for (const { scope } of found.filter((r) => r.plane === 'client')) assert.is(scope, 'client', 'a client route needs the scope client');
  const planes = new Map<string, Set<string>>();
  for (const { plane, scope } of found) {
    const resource = scope.split(':')[0]!;
    if (!(SCOPE_RESOURCES as readonly string[]).includes(resource)) continue; // session-only (keys:write) or client
    planes.set(resource, (planes.get(resource) ?? new Set()).add(plane));
  }
  const workspaceOnly = [...planes].filter(([, p]) => p.size === 1 && p.has('workspace')).map(([r]) => r).sort();
  assert.equal(workspaceOnly, [...WORKSPACE_ONLY_RESOURCES].sort());
  // the grantable scopes are exactly those some route requires
  const required = [...new Set(found.map((r) => r.scope).filter((s) => s !== 'client' && !isSessionOnly(s)))].sort();
  assert.equal(required, [...ROUTE_SCOPES].sort());
});

auth('a scope no route requires cannot be granted: deliveries:read, widgets:read, messages:write are refused, naming what the resource takes', () => {
  assert.match(scopeProblem('deliveries:read') ?? '', /unknown resource "deliveries"/);
  assert.match(scopeProblem('widgets:read') ?? '', /unknown resource "widgets"/);
  assert.match(scopeProblem('tenants:read') ?? '', /unknown resource "tenants"/);
  assert.is(scopeProblem('messages:write'), '"messages:write" is no route\'s scope: messages takes read, send (or *)');
  assert.match(scopeProblem('events:send') ?? '', /events takes read, write/);
  for (const scope of ['messages:send', 'messages:*', 'events:read', 'webhooks:write', '*', 'client']) assert.is(scopeProblem(scope), null, scope);
});

// KeyCache.lookup reads the key, then its workspace and tenant, then caches: a revocation announced in
// between must not leave the stale record cached for the TTL.
auth('a revocation published while a lookup of that key is in flight still refuses the key afterwards', async ({ service, api, acme }) => {
  const { key, record } = await makeKey(service, 'acme', 'workspace', ['events:read']);
  const redis = service.redis as unknown as { hgetall: (key: string) => Promise<Record<string, string>> };
  const original = redis.hgetall;
  let armed = true;
  // test hook on the service's own Redis client: revoke right after the lookup has read the key record
  redis.hgetall = async function (this: unknown, k: string) {
    const out = await original.call(service.redis, k);
    if (armed && k === service.keys.apiKey(record.id)) {
      armed = false;
      await revokeApiKey(service.redis, service.keys, acme.workspace, record.id, BY_TEST);
      await new Promise((done) => setTimeout(done, 100)); // the published invalidation reaches the subscriber
    }
    return out;
  };
  try {
    await api.get('/v1/events/names', key); // in flight during the revocation: either answer is acceptable
  } finally {
    redis.hgetall = original;
  }
  assert.not.ok(armed);
  // the revocation has completed and been published: the key must be refused from now on
  isError(await api.get('/v1/events/names', key), 401, 'invalid_api_key');
});

auth.run();
