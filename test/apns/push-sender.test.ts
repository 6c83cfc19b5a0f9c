import { randomBytes } from 'node:crypto';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { connect, createServer, type AddressInfo, type Socket } from 'node:net';
import { join } from 'node:path';
import type { Redis } from 'ioredis';
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { PushSender, backoffMs, limiterBatch, type PushJob } from '../../actors/push-sender.js';
import { apnsIdFor, buildApnsRequest, type PushContent } from '../../lib/apns-payload.js';
import { loadConfig } from '../../lib/config.js';
import type { Logger } from '../../lib/log.js';
import { createSecretBox, type SecretBox } from '../../lib/secret-box.js';
import { deleteApnsCredentials, setApnsCredentials } from '../../streams/apns-credentials.js';
import { createTenant, ensureWorkspace, type Tenant, type Workspace } from '../../streams/identity.js';
import { createKeys, type Keys } from '../../streams/keys.js';
import { connectRedis } from '../../streams/redis.js';
import { generateProviderKey, startApnsPeer, type ApnsPeer, type ProviderKey } from '../helpers/apns-peer.js';
import { freePort, testRedisUrl, uniquePrefix } from '../helpers/redis.js';
import { BY_TEST } from '../helpers/service.js';
import { waitFor } from '../helpers/wait.js';

const BUNDLE = 'com.example.herald';
const BASE_MS = 40;
/** Expected failures (unreadable credentials, refused connections) would log; the tests assert on results instead. */
const quiet: Logger = { debug() {}, info() {}, warn() {}, error() {} };
const deviceToken = () => randomBytes(32).toString('hex');
let deliveries = 0;
const nextIds = () => {
  const n = String(++deliveries).padStart(6, '0');
  return { messageId: `msg_test${n}`, deliveryId: `dlv_test${n}${randomBytes(4).toString('hex')}` };
};

type Ctx = {
  redis: Redis; keys: Keys; box: SecretBox; encryptionKey: string; dir: string; caFile: string;
  key: ProviderKey; production: ApnsPeer; sandbox: ApnsPeer;
  workspace: Workspace; tenant: Tenant; sender: PushSender; env: Record<string, string>;
  extra: PushSender[];
};

function job(ctx: Ctx, fields: Partial<PushJob> = {}, content: PushContent = { title: 'Hello', body: 'From Herald' }): PushJob {
  return { tenantId: ctx.tenant.id, token: deviceToken(), environment: 'production', content, ...nextIds(), ...fields };
}

/** Another sender over the same Redis and peers, with some settings changed; closed after the test. */
function senderWith(ctx: Ctx, overrides: Record<string, string>): PushSender {
  const sender = new PushSender({ redis: ctx.redis, keys: ctx.keys, config: loadConfig({ ...ctx.env, ...overrides }, {}), log: quiet });
  ctx.extra.push(sender);
  return sender;
}

async function tenantWith(ctx: Ctx, slug: string, key: ProviderKey | null): Promise<Tenant> {
  const { tenant } = await createTenant(ctx.redis, ctx.keys, ctx.workspace, slug, BY_TEST);
  if (key) await setApnsCredentials(ctx.redis, ctx.keys, ctx.box, ctx.workspace, tenant, { keyId: key.keyId, teamId: key.teamId, bundleId: BUNDLE, privateKey: key.privateKeyPem }, BY_TEST);
  return tenant;
}

const sends = suite<Ctx>('push sender against a local APNs peer');

sends.before(async (ctx) => {
  ctx.key = generateProviderKey();
  const peerOptions = { keyId: ctx.key.keyId, teamId: ctx.key.teamId, publicKey: ctx.key.publicKey, topic: BUNDLE };
  [ctx.production, ctx.sandbox] = await Promise.all([startApnsPeer(peerOptions), startApnsPeer(peerOptions)]);
  ctx.dir = mkdtempSync(join(tmpdir(), 'herald-push-sender-'));
  ctx.caFile = join(ctx.dir, 'apns-ca.pem');
  writeFileSync(ctx.caFile, ctx.production.ca);
  ctx.encryptionKey = randomBytes(32).toString('hex');
  ctx.box = createSecretBox(Buffer.from(ctx.encryptionKey, 'hex'));
  ctx.redis = connectRedis({ url: await testRedisUrl() });
  ctx.keys = createKeys(uniquePrefix('push-sender'));
  ({ workspace: ctx.workspace, tenant: ctx.tenant } = await ensureWorkspace(ctx.redis, ctx.keys, 'push', BY_TEST));
  await setApnsCredentials(ctx.redis, ctx.keys, ctx.box, ctx.workspace, ctx.tenant, { keyId: ctx.key.keyId, teamId: ctx.key.teamId, bundleId: BUNDLE, privateKey: ctx.key.privateKeyPem }, BY_TEST);
  // The peers are reached only through configuration, the way Apple is: host, port, CA file.
  ctx.env = {
    APNS_HOST: '127.0.0.1', APNS_SANDBOX_HOST: '127.0.0.1', APNS_PORT: String(ctx.production.port), APNS_SANDBOX_PORT: String(ctx.sandbox.port),
    APNS_CA_FILE: ctx.caFile, HERALD_ENCRYPTION_KEY: ctx.encryptionKey, APNS_RETRY_BASE_MS: String(BASE_MS), APNS_CREDENTIALS_CHECK_SECONDS: '0', LOG_LEVEL: 'error',
  };
  ctx.sender = new PushSender({ redis: ctx.redis, keys: ctx.keys, config: loadConfig(ctx.env, {}), log: quiet });
  ctx.extra = [];
});
sends.before.each((ctx) => {
  ctx.production.reset();
  ctx.sandbox.reset();
});
sends.after.each(async (ctx) => {
  await Promise.all(ctx.extra.map((s) => s.close()));
  ctx.extra = [];
});
sends.after(async (ctx) => {
  await ctx.sender?.close();
  await Promise.all([ctx.production?.close(), ctx.sandbox?.close()]);
  await ctx.redis?.quit();
  if (ctx.dir) rmSync(ctx.dir, { recursive: true, force: true });
});

sends('a push is sent: 200, the apns-id derived from the delivery id, and the peer saw the payload and headers Herald built', async (ctx) => {
  const content: PushContent = { title: 'Order shipped', body: 'Arrives Tuesday', data: { orderId: 'o_1' }, badge: 2, sound: 'default', threadId: 'orders', collapseId: 'order-o_1', url: 'app://orders/o_1', priority: 'normal', ttl: 600 };
  const j = job(ctx, {}, content);
  const before = Math.floor(Date.now() / 1000);
  const result = await ctx.sender.send(j);
  assert.equal({ ...result, answers: undefined }, { outcome: 'sent', httpStatus: 200, apnsId: apnsIdFor(j.deliveryId), reason: null, timestamp: null, tokenInvalid: false, attempts: 1, answers: undefined });
  assert.is(result.answers.length, 1);
  assert.is(ctx.production.requests.length, 1);
  assert.is(ctx.sandbox.requests.length, 0, 'a production token never reaches the sandbox host');
  const seen = ctx.production.requests[0]!;
  assert.is(seen.path, `/3/device/${j.token}`);
  assert.is(seen.status, 200);
  assert.is(seen.apnsId, result.apnsId);
  assert.equal(seen.payload, buildApnsRequest(content, j).payload);
  const { authorization, ...headers } = seen.headers;
  assert.match(String(authorization), /^bearer [\w-]+\.[\w-]+\.[\w-]+$/, 'a provider token (JWT) the peer verified');
  const expiration = Number(headers['apns-expiration']);
  assert.ok(expiration >= before + 600 && expiration <= Math.floor(Date.now() / 1000) + 600, `expiration ${expiration}`);
  assert.equal(headers, { 'apns-topic': BUNDLE, 'apns-push-type': 'alert', 'apns-priority': '5', 'apns-expiration': String(expiration), 'apns-collapse-id': 'order-o_1', 'apns-id': apnsIdFor(j.deliveryId) });
});

sends('default priority is 10 and no ttl sends no apns-expiration; ttl 0 sends 0', async (ctx) => {
  await ctx.sender.send(job(ctx));
  await ctx.sender.send(job(ctx, {}, { title: 't', body: 'b', ttl: 0 }));
  const [plain, now] = ctx.production.requests;
  assert.is(plain!.headers['apns-priority'], '10');
  assert.not.ok('apns-expiration' in plain!.headers);
  assert.not.ok('apns-collapse-id' in plain!.headers);
  assert.is(now!.headers['apns-expiration'], '0');
});

sends('a resend of the same delivery carries the same apns-id', async (ctx) => {
  const j = job(ctx);
  const first = await ctx.sender.send(j);
  const again = await ctx.sender.send({ ...j });
  assert.is(first.apnsId, again.apnsId);
  assert.equal(ctx.production.requests.map((r) => r.headers['apns-id']), [apnsIdFor(j.deliveryId), apnsIdFor(j.deliveryId)]);
});

sends('a sandbox token goes to the sandbox host (APNS_SANDBOX_HOST / APNS_SANDBOX_PORT), a production token to the production one', async (ctx) => {
  const sandboxJob = job(ctx, { environment: 'sandbox' });
  const productionJob = job(ctx, { environment: 'production' });
  const [s, p] = await Promise.all([ctx.sender.send(sandboxJob), ctx.sender.send(productionJob)]);
  assert.is(s.outcome, 'sent');
  assert.is(p.outcome, 'sent');
  assert.equal(ctx.sandbox.requests.map((r) => r.token), [sandboxJob.token]);
  assert.equal(ctx.production.requests.map((r) => r.token), [productionJob.token]);
});

sends('410 Unregistered fails at once with tokenInvalid and the timestamp APNs gave', async (ctx) => {
  const j = job(ctx);
  ctx.production.respondWith({ token: j.token, status: 410, reason: 'Unregistered', timestamp: 1_700_000_000_000 });
  const result = await ctx.sender.send(j);
  assert.equal({ ...result, answers: undefined }, { outcome: 'failed', httpStatus: 410, apnsId: apnsIdFor(j.deliveryId), reason: 'Unregistered', timestamp: 1_700_000_000_000, tokenInvalid: true, attempts: 1, answers: undefined });
  assert.equal(result.answers.map((a) => [a.httpStatus, a.reason, a.timestamp]), [[410, 'Unregistered', 1_700_000_000_000]]);
  assert.is(ctx.production.requests.length, 1, 'not retried');
});

sends('400 BadDeviceToken marks the token invalid; DeviceTokenNotForTopic (also a wrong bundleId) and another 400 do not', async (ctx) => {
  const dead = job(ctx);
  ctx.production.respondWith({ token: dead.token, status: 400, reason: 'BadDeviceToken' });
  const bad = await ctx.sender.send(dead);
  assert.equal([bad.outcome, bad.httpStatus, bad.reason, bad.tokenInvalid, bad.attempts, bad.timestamp], ['failed', 400, 'BadDeviceToken', true, 1, null]);
  const j = job(ctx);
  ctx.production.respondWith({ token: j.token, status: 400, reason: 'DeviceTokenNotForTopic' });
  const wrongApp = await ctx.sender.send(j);
  assert.equal([wrongApp.outcome, wrongApp.httpStatus, wrongApp.reason, wrongApp.tokenInvalid], ['failed', 400, 'DeviceTokenNotForTopic', false]);
  const collapse = await ctx.sender.send(job(ctx, {}, { title: 't', body: 'b', collapseId: 'c'.repeat(65) }));
  assert.equal([collapse.outcome, collapse.httpStatus, collapse.reason, collapse.tokenInvalid, collapse.attempts], ['failed', 400, 'BadCollapseId', false, 1]);
});

sends('429 twice then 200: sent on the third attempt after growing waits, every attempt with the same apns-id', async (ctx) => {
  const j = job(ctx);
  ctx.production.respondWith({ token: j.token, status: 429, reason: 'TooManyRequests', times: 2 });
  const result = await ctx.sender.send(j);
  assert.is(result.outcome, 'sent');
  assert.is(result.attempts, 3);
  assert.equal(result.answers.map((a) => [a.httpStatus, a.reason]), [[429, 'TooManyRequests'], [429, 'TooManyRequests'], [200, null]]);
  const seen = ctx.production.requests;
  assert.equal(seen.map((r) => r.status), [429, 429, 200]);
  assert.equal(new Set(seen.map((r) => r.headers['apns-id'])), new Set([apnsIdFor(j.deliveryId)]));
  const gaps = [seen[1]!.at - seen[0]!.at, seen[2]!.at - seen[1]!.at];
  assert.ok(gaps[0]! >= BASE_MS * 0.75 - 2, `first wait ${gaps[0]} ms ≥ ${BASE_MS * 0.75}`);
  assert.ok(gaps[1]! >= BASE_MS * 2 * 0.75 - 2, `second wait ${gaps[1]} ms ≥ ${BASE_MS * 1.5} (doubled)`);
});

sends('a push answered 429 goes again after its own backoff, not after the slowest push of its chunk (probe CH: a slow one held every retry beside it)', async (ctx) => {
  const [quick, slow] = [job(ctx), job(ctx)];
  ctx.production.respondWith({ token: quick.token, status: 429, reason: 'TooManyRequests', times: 1 });
  ctx.production.respondWith({ token: slow.token, delayMs: 40 * BASE_MS, times: 1 });
  const order: number[] = [];
  const results = await ctx.sender.sendAll([quick, slow], (i) => order.push(i));
  assert.equal(results.map((r) => [r?.outcome, r?.attempts]), [['sent', 2], ['sent', 1]]);
  assert.equal(order, [0, 1], 'the retried push is sent while the slow one is still out');
});

sends('a sendAll that fails (Redis refusing a read) stops its waiting retries first: nothing is sent once it has rejected (review of session 56: they went on after it)', async (ctx) => {
  const redis = connectRedis({ url: await testRedisUrl() });
  const sender = new PushSender({ redis, keys: ctx.keys, config: loadConfig(ctx.env, {}), log: quiet });
  ctx.extra.push(sender);
  try {
    const [quick, slow] = [job(ctx), job(ctx)];
    ctx.production.respondWith({ token: quick.token, status: 503 });
    ctx.production.respondWith({ token: slow.token, status: 503, delayMs: 8 * BASE_MS });
    // the credentials are read again for each group (APNS_CREDENTIALS_CHECK_SECONDS 0): the retry's read fails
    const hget = redis.hget.bind(redis);
    let reads = 0;
    (redis as unknown as { hget: unknown }).hget = (...args: Parameters<typeof hget>) => (++reads === 2 ? Promise.reject(new Error('redis blip')) : hget(...args));
    const controller = new AbortController();
    await sender.sendAll([quick, slow], undefined, controller.signal).then(() => assert.unreachable('the read failed'), (err: Error) => assert.is(err.message, 'redis blip'));
    controller.abort();
    const seen = ctx.production.requests.length;
    await new Promise((r) => setTimeout(r, 30 * BASE_MS));
    assert.is(ctx.production.requests.length, seen, 'nothing sent after the rejection');
  } finally {
    redis.disconnect();
  }
});

sends('429 TooManyProviderTokenUpdates is not retried: Apple answers the same until enough time has passed (probe AS: four more requests)', async (ctx) => {
  const j = job(ctx);
  ctx.production.respondWith({ token: j.token, status: 429, reason: 'TooManyProviderTokenUpdates' });
  const result = await ctx.sender.send(j);
  assert.equal([result.outcome, result.httpStatus, result.reason, result.attempts, result.tokenInvalid], ['failed', 429, 'TooManyProviderTokenUpdates', 1, false]);
});

sends('503 on every attempt: failed after APNS_MAX_ATTEMPTS (5) with the last answer', async (ctx) => {
  const j = job(ctx);
  ctx.production.respondWith({ token: j.token, status: 503 });
  const result = await ctx.sender.send(j);
  assert.equal([result.outcome, result.httpStatus, result.reason, result.attempts, result.tokenInvalid, result.apnsId], ['failed', 503, 'ServiceUnavailable', 5, false, apnsIdFor(j.deliveryId)]);
  assert.is(result.answers.length, 5);
  assert.is(ctx.production.requests.length, 5, 'node-apn made no retries of its own');
});

sends('twelve sends waiting out retries at once print no MaxListenersExceededWarning (probe BE: each retry\'s wait listens on the sender\'s close)', async (ctx) => {
  const jobs = Array.from({ length: 12 }, () => job(ctx));
  for (const j of jobs) ctx.production.respondWith({ token: j.token, status: 503, times: 1 });
  const warnings: string[] = [];
  const onWarning = (w: Error) => warnings.push(`${w.name}: ${w.message}`);
  process.on('warning', onWarning);
  try {
    const results = await Promise.all(jobs.map((j) => ctx.sender.send(j)));
    assert.equal(results.map((r) => [r.outcome, r.attempts]), jobs.map(() => ['sent', 2]));
    await new Promise((r) => setImmediate(r));
  } finally {
    process.off('warning', onWarning);
  }
  assert.equal(warnings, []);
});

sends('500 InternalServerError is retried on a new connection and then sent', async (ctx) => {
  const j = job(ctx);
  ctx.production.respondWith({ token: j.token, status: 500, reason: 'InternalServerError', times: 1 });
  const result = await ctx.sender.send(j);
  assert.equal([result.outcome, result.attempts], ['sent', 2]);
  assert.equal(result.answers.map((a) => [a.httpStatus, a.reason]), [[500, 'InternalServerError'], [200, null]]);
});

sends('a 429 answered on a session another push\'s 500 is closing is recorded as APNs gave it, not as a connection error (probe DJ: node-apn\'s retry check replaced it)', async (ctx) => {
  const sender = senderWith(ctx, { APNS_MAX_ATTEMPTS: '1' });
  const failing = job(ctx);
  const throttled = job(ctx);
  ctx.production.respondWith({ token: failing.token, status: 500, reason: 'InternalServerError' });
  ctx.production.respondWith({ token: throttled.token, status: 429, reason: 'TooManyRequests', delayMs: 300 });
  const late = sender.send(throttled);
  await new Promise((r) => setTimeout(r, 100));
  const first = await sender.send(failing);
  assert.equal([first.httpStatus, first.reason], [500, 'InternalServerError']);
  const result = await late;
  assert.equal([result.outcome, result.httpStatus, result.reason, result.attempts], ['failed', 429, 'TooManyRequests', 1], JSON.stringify(result.answers));
});

sends('a 500 to one push does not cost the pushes in flight beside it their answers: each is sent once (probe I: connection errors, sent again)', async (ctx) => {
  const sender = senderWith(ctx, { APNS_MAX_ATTEMPTS: '2' });
  const failing = job(ctx);
  const slow = [job(ctx), job(ctx), job(ctx)];
  ctx.production.respondWith({ token: failing.token, status: 500, reason: 'InternalServerError' });
  for (const j of slow) ctx.production.respondWith({ token: j.token, delayMs: 300 });
  // the slow ones are in flight on the session when the 500 comes back
  const inFlight = slow.map((j) => sender.send(j));
  await new Promise((r) => setTimeout(r, 100));
  const [failed, ...sent] = await Promise.all([sender.send(failing), ...inFlight]);
  assert.equal([failed!.outcome, failed!.reason, failed!.attempts], ['failed', 'InternalServerError', 2]);
  for (const r of sent) assert.equal([r.outcome, r.attempts, r.httpStatus], ['sent', 1, 200]);
  for (const j of slow) assert.is(ctx.production.requests.filter((q) => q.token === j.token).length, 1, 'the peer got it once');
});

sends('403 ExpiredProviderToken is retried with a new provider token', async (ctx) => {
  const j = job(ctx);
  ctx.production.respondWith({ token: j.token, status: 403, reason: 'ExpiredProviderToken', times: 1 });
  const result = await ctx.sender.send(j);
  assert.equal([result.outcome, result.attempts], ['sent', 2]);
  assert.equal(result.answers[0]!.reason, 'ExpiredProviderToken');
});

sends('a 403 ExpiredProviderToken on every attempt does not sign a new provider token each time: one younger than 20 minutes is kept (probe CH: 15 tokens in 7 s)', async (ctx) => {
  const sender = senderWith(ctx, {});
  const stuck = job(ctx);
  ctx.production.respondWith({ token: stuck.token, status: 403, reason: 'ExpiredProviderToken' });
  const result = await sender.send(stuck);
  assert.is(result.outcome, 'failed');
  assert.ok(result.attempts > 1, 'retried');
  assert.is((await sender.send(job(ctx))).outcome, 'sent');
  const bearers = new Set(ctx.production.requests.map((r) => r.headers.authorization));
  assert.is(bearers.size, 1, 'one provider token for every attempt and the next push');
});

sends('a new connection\'s pushes wait for the peer\'s SETTINGS: a peer allowing 10 streams at once gets 60 pushes, none refused, each sent on its first attempt (probe CH)', async (ctx) => {
  const narrow = await startApnsPeer({ keyId: ctx.key.keyId, teamId: ctx.key.teamId, publicKey: ctx.key.publicKey, topic: BUNDLE, maxConcurrentStreams: 10 });
  try {
    const sender = senderWith(ctx, { APNS_PORT: String(narrow.port) });
    const jobs = Array.from({ length: 60 }, () => job(ctx));
    const results = await Promise.all(jobs.map((j) => sender.send(j)));
    assert.equal(results.map((r) => [r.outcome, r.attempts]), jobs.map(() => ['sent', 1]));
    assert.is(narrow.accepted, 60);
    assert.is(narrow.sessionsOpened, 1);
  } finally {
    await narrow.close();
  }
});

/** A TCP relay to `port` whose n-th connection (from 1) gets the peer's bytes only after `holdMs(n)`: its TLS handshake and SETTINGS come late. */
async function slowStartRelay(port: number, holdMs: (n: number) => number): Promise<{ port: number; connections: number; close: () => void }> {
  const relay = { port: 0, connections: 0, close: () => server.close() };
  const server = createServer((client: Socket) => {
    const upstream = connect(port, '127.0.0.1');
    let held: Buffer[] | null = [];
    setTimeout(() => {
      for (const chunk of held ?? []) client.write(chunk);
      held = null;
    }, holdMs(++relay.connections));
    upstream.on('data', (chunk: Buffer) => (held ? held.push(chunk) : client.write(chunk)));
    client.on('data', (chunk: Buffer) => upstream.write(chunk));
    for (const [a, b] of [[client, upstream], [upstream, client]] as const) {
      a.on('error', () => b.destroy());
      a.on('close', () => b.destroy());
    }
  });
  await new Promise<void>((done) => server.listen(0, '127.0.0.1', () => done()));
  relay.port = (server.address() as AddressInfo).port;
  return relay;
}

sends('an answer on a closing connection while the next one waits for its SETTINGS is recorded as APNs gave it: 429 TooManyProviderTokenUpdates once, not retried (probe CE)', async (ctx) => {
  const relay = await slowStartRelay(ctx.production.port, (n) => (n === 1 ? 0 : 1_500));
  try {
    const sender = senderWith(ctx, { APNS_PORT: String(relay.port) });
    const [p0, p1, p2] = [job(ctx), job(ctx), job(ctx)];
    // p0's 500 makes node-apn close the first connection gracefully; p1 is still out on it, answered later
    ctx.production.respondWith({ token: p0.token, status: 500, reason: 'InternalServerError', times: 1 });
    ctx.production.respondWith({ token: p1.token, status: 429, reason: 'TooManyProviderTokenUpdates', delayMs: 600 });
    const first = sender.sendAll([p0, p1]);
    await waitFor('p0 answered', async () => ctx.production.requests.some((r) => r.token === p0.token && r.status === 500), 3_000, 10);
    // p2 opens the second connection, whose SETTINGS come 1.5 s late: p1's answer arrives meanwhile
    const second = sender.send(p2);
    const [r0, r1] = await first;
    assert.equal([r1!.outcome, r1!.httpStatus, r1!.reason, r1!.attempts], ['failed', 429, 'TooManyProviderTokenUpdates', 1]);
    assert.is(ctx.production.requests.filter((r) => r.token === p1.token).length, 1, 'p1 sent once');
    assert.is(r0!.outcome, 'sent');
    assert.is((await second).outcome, 'sent');
    assert.is(relay.connections, 2);
  } finally {
    relay.close();
  }
});

sends('a tenant without APNs credentials fails with apns_not_configured and sends nothing', async (ctx) => {
  const bare = await tenantWith(ctx, 'bare', null);
  const result = await ctx.sender.send(job(ctx, { tenantId: bare.id }));
  assert.equal(result, { outcome: 'failed', httpStatus: null, apnsId: null, reason: 'apns_not_configured', timestamp: null, tokenInvalid: false, attempts: 0, answers: [] });
  assert.is(ctx.production.received, 0);
});

sends('the peer checks the provider token: credentials with another key fail 403 InvalidProviderToken, not retried', async (ctx) => {
  const impostor = await tenantWith(ctx, 'impostor', generateProviderKey());
  const result = await ctx.sender.send(job(ctx, { tenantId: impostor.id }));
  assert.equal([result.outcome, result.httpStatus, result.reason, result.attempts, result.tokenInvalid], ['failed', 403, 'InvalidProviderToken', 1, false]);
  // The right key's team id but another key: the JWT signature fails, not only the kid.
  const other = generateProviderKey();
  const forged = await tenantWith(ctx, 'forged', { ...other, keyId: ctx.key.keyId, teamId: ctx.key.teamId });
  const second = await ctx.sender.send(job(ctx, { tenantId: forged.id }));
  assert.is(second.reason, 'InvalidProviderToken');
});

sends('new credentials take effect on the next send; deleted credentials stop sends', async (ctx) => {
  const rotating = await tenantWith(ctx, 'rotating', ctx.key);
  assert.is((await ctx.sender.send(job(ctx, { tenantId: rotating.id }))).outcome, 'sent');
  const wrong = generateProviderKey();
  await setApnsCredentials(ctx.redis, ctx.keys, ctx.box, ctx.workspace, rotating, { keyId: wrong.keyId, teamId: wrong.teamId, bundleId: BUNDLE, privateKey: wrong.privateKeyPem }, BY_TEST);
  assert.is((await ctx.sender.send(job(ctx, { tenantId: rotating.id }))).reason, 'InvalidProviderToken', 'the provider was rebuilt from the new (wrong) key');
  await setApnsCredentials(ctx.redis, ctx.keys, ctx.box, ctx.workspace, rotating, { keyId: ctx.key.keyId, teamId: ctx.key.teamId, bundleId: BUNDLE, privateKey: ctx.key.privateKeyPem }, BY_TEST);
  assert.is((await ctx.sender.send(job(ctx, { tenantId: rotating.id }))).outcome, 'sent');
  await deleteApnsCredentials(ctx.redis, ctx.keys, ctx.workspace, rotating, BY_TEST);
  assert.is((await ctx.sender.send(job(ctx, { tenantId: rotating.id }))).reason, 'apns_not_configured');
});

sends('with a credentials check interval, a cached provider is reused until it expires', async (ctx) => {
  const cached = await tenantWith(ctx, 'cached', ctx.key);
  const sender = senderWith(ctx, { APNS_CREDENTIALS_CHECK_SECONDS: '3600' });
  assert.is((await sender.send(job(ctx, { tenantId: cached.id }))).outcome, 'sent');
  await deleteApnsCredentials(ctx.redis, ctx.keys, ctx.workspace, cached, BY_TEST);
  assert.is((await sender.send(job(ctx, { tenantId: cached.id }))).outcome, 'sent', 'within the interval the provider is not re-checked');
});

sends('credentials this process cannot decrypt fail with apns_credentials_unreadable', async (ctx) => {
  const otherKey = senderWith(ctx, { HERALD_ENCRYPTION_KEY: randomBytes(32).toString('hex') });
  assert.is((await otherKey.send(job(ctx))).reason, 'apns_credentials_unreadable');
  const noKey = senderWith(ctx, { HERALD_ENCRYPTION_KEY: '' });
  assert.is((await noKey.send(job(ctx))).reason, 'apns_credentials_unreadable');
  assert.is(ctx.production.received, 0);
});

sends('after the encryption key changes, storing the same credentials again re-seals them under the new key', async (ctx) => {
  const resealed = await tenantWith(ctx, 'resealed', ctx.key);
  const newKey = randomBytes(32).toString('hex');
  const sender = senderWith(ctx, { HERALD_ENCRYPTION_KEY: newKey });
  assert.is((await sender.send(job(ctx, { tenantId: resealed.id }))).reason, 'apns_credentials_unreadable');
  const { created } = await setApnsCredentials(ctx.redis, ctx.keys, createSecretBox(Buffer.from(newKey, 'hex')), ctx.workspace, resealed, { keyId: ctx.key.keyId, teamId: ctx.key.teamId, bundleId: BUNDLE, privateKey: ctx.key.privateKeyPem }, BY_TEST);
  assert.is(created, false);
  assert.is((await sender.send(job(ctx, { tenantId: resealed.id }))).outcome, 'sent');
  assert.is((await ctx.sender.send(job(ctx, { tenantId: resealed.id }))).reason, 'apns_credentials_unreadable', 'the old key no longer opens them');
});

sends('a host that does not answer is a connection_error, retried up to the attempt limit', async (ctx) => {
  const sender = senderWith(ctx, { APNS_PORT: String(await freePort()), APNS_MAX_ATTEMPTS: '3' });
  const result = await sender.send(job(ctx));
  assert.equal([result.outcome, result.httpStatus, result.reason, result.attempts, result.apnsId], ['failed', null, 'connection_error', 3, null]);
  assert.equal(result.answers.map((a) => a.reason), ['connection_error', 'connection_error', 'connection_error']);
});

sends('an unreachable host is logged once per 10 s with the number of failures left out, not once per attempt (probe DW: 11,236 lines in 90 s)', async (ctx) => {
  const lines: Record<string, unknown>[] = [];
  const recording: Logger = { ...quiet, warn: (message: string, fields?: Record<string, unknown>) => void (message === 'apns request failed without an answer' && lines.push(fields ?? {})) };
  const sender = new PushSender({ redis: ctx.redis, keys: ctx.keys, config: loadConfig({ ...ctx.env, APNS_PORT: String(await freePort()), APNS_MAX_ATTEMPTS: '3' }, {}), log: recording });
  ctx.extra.push(sender);
  const results = await sender.sendAll(Array.from({ length: 10 }, () => job(ctx)));
  assert.ok(results.every((r) => r?.reason === 'connection_error' && r.attempts === 3), 'each push still records its own answers');
  assert.is(lines.length, 1, `one line for 30 failed attempts: ${JSON.stringify(lines)}`);
  assert.is(lines[0]!.repeats, 0);
});

sends('a peer certificate not signed by a trusted CA is refused (no APNS_CA_FILE)', async (ctx) => {
  const sender = senderWith(ctx, { APNS_CA_FILE: '', APNS_MAX_ATTEMPTS: '1' });
  const result = await sender.send(job(ctx));
  assert.equal([result.outcome, result.reason], ['failed', 'connection_error']);
  assert.is(ctx.production.received, 0);
});

sends('an answer slower than APNS_REQUEST_TIMEOUT_MS is a request_timeout, retried', async (ctx) => {
  const sender = senderWith(ctx, { APNS_REQUEST_TIMEOUT_MS: '200' });
  const j = job(ctx);
  ctx.production.respondWith({ token: j.token, delayMs: 600, times: 1 });
  const result = await sender.send(j);
  assert.equal([result.outcome, result.attempts], ['sent', 2]);
  assert.equal(result.answers.map((a) => a.reason), ['request_timeout', null]);
});

sends('an answer that trickles in byte by byte meets the attempt\'s own deadline, and the retry goes out on a new connection (probe V: held for ever)', async (ctx) => {
  const sender = senderWith(ctx, { APNS_REQUEST_TIMEOUT_MS: '300' });
  const j = job(ctx);
  // node-apn's timeout is of inactivity: each byte of this answer resets it
  ctx.production.respondWith({ token: j.token, status: 503, trickle: true, times: 1 });
  const sessionsBefore = ctx.production.sessionsOpened;
  const started = Date.now();
  const result = await sender.send(j);
  assert.equal([result.outcome, result.attempts], ['sent', 2]);
  assert.equal(result.answers.map((a) => a.reason), ['request_timeout', null]);
  assert.ok(Date.now() - started < 5_000, `answered in ${Date.now() - started} ms`);
  assert.ok(ctx.production.sessionsOpened > sessionsBefore, 'the session that timed out is not reused');
});

sends('a host that takes the connection and never speaks TLS: each timed-out attempt\'s connection is closed, not kept (probe AS: 16 sockets after 6 messages)', async (ctx) => {
  const open = new Set<Socket>();
  const silent = createServer((socket) => {
    open.add(socket);
    socket.resume(); // read (and drop) the client's hello, so its close is seen
    socket.on('error', () => undefined);
    socket.once('close', () => open.delete(socket));
  });
  await new Promise<void>((done) => silent.listen(0, '127.0.0.1', done));
  try {
    const sender = senderWith(ctx, { APNS_PORT: String((silent.address() as AddressInfo).port), APNS_REQUEST_TIMEOUT_MS: '150', APNS_MAX_ATTEMPTS: '2' });
    for (let i = 0; i < 4; i++) {
      const result = await sender.send(job(ctx));
      assert.equal([result.outcome, result.reason, result.attempts], ['failed', 'request_timeout', 2]);
    }
    // each connection is dropped when its attempt times out (a session closing with streams out, at the latest a grace later)
    const deadline = Date.now() + 10_000;
    while (open.size > 1 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 50));
    assert.ok(open.size <= 1, `${open.size} connections still open after 8 attempts`);
  } finally {
    for (const socket of open) socket.destroy();
    await new Promise<void>((done) => silent.close(() => done()));
  }
});

sends('a token that is not hex is refused before sending (malformed_token) and marked invalid, as APNs would answer BadDeviceToken (probe AS)', async (ctx) => {
  for (const token of ['not-a-device-token', 'abcd/../../x', 'abcdef?x=1', 'abcd ef\n01']) {
    const result = await ctx.sender.send(job(ctx, { token }));
    assert.equal([result.outcome, result.httpStatus, result.reason, result.tokenInvalid, result.attempts], ['failed', null, 'malformed_token', true, 0]);
  }
  assert.is(ctx.production.received, 0);
});

sends('a payload over 4096 bytes is refused before sending', async (ctx) => {
  const result = await ctx.sender.send(job(ctx, {}, { title: 't', body: 'x'.repeat(5000) }));
  assert.equal([result.outcome, result.reason, result.attempts], ['failed', 'payload_too_large', 0]);
  assert.is(ctx.production.received, 0);
});

sends('2,000 concurrent sends of one tenant all succeed through the limiter, on one provider', async (ctx) => {
  const jobs = Array.from({ length: 2000 }, (_, i) => job(ctx, { environment: i % 2 ? 'sandbox' : 'production' }));
  const results = await Promise.all(jobs.map((j) => ctx.sender.send(j)));
  assert.is(results.filter((r) => r.outcome === 'sent').length, 2000);
  assert.ok(results.every((r, i) => r.apnsId === apnsIdFor(jobs[i]!.deliveryId) && r.attempts === 1));
  assert.is(ctx.production.accepted + ctx.sandbox.accepted, 2000);
  assert.is(ctx.production.accepted, 1000);
});

sends('APNS_MAX_CONCURRENT_PER_TENANT caps requests in flight', async (ctx) => {
  const sender = senderWith(ctx, { APNS_MAX_CONCURRENT_PER_TENANT: '2' });
  ctx.production.respondWith({ delayMs: 150 });
  const started = Date.now();
  const results = await Promise.all(Array.from({ length: 6 }, () => sender.send(job(ctx))));
  const elapsed = Date.now() - started;
  assert.ok(results.every((r) => r.outcome === 'sent'));
  assert.ok(elapsed >= 3 * 150 - 10, `6 requests of 150 ms, 2 at a time, took ${elapsed} ms`);
});

sends('APNS_RATE_PER_TENANT_PER_SECOND caps requests started per second; another tenant has its own budget', async (ctx) => {
  // 15 at 5 per second: the last five wait for the third second's budget, so the other tenant's five
  // (its own first budget) have some 2 s to show they were not held back (a bound of 900 ms, with its
  // connection's TLS and token to make, was near on a loaded machine)
  const sender = senderWith(ctx, { APNS_RATE_PER_TENANT_PER_SECOND: '5' });
  const other = await tenantWith(ctx, 'rated', ctx.key);
  const started = Date.now();
  const [limited, free] = await Promise.all([
    Promise.all(Array.from({ length: 15 }, () => sender.send(job(ctx)))),
    Promise.all(Array.from({ length: 5 }, () => sender.send(job(ctx, { tenantId: other.id }))).map((p) => p.then((r) => ({ r, ms: Date.now() - started })))),
  ]);
  const elapsed = Date.now() - started;
  assert.ok(limited.every((r) => r.outcome === 'sent'));
  assert.ok(elapsed >= 1_900, `15 sends at 5 per second took ${elapsed} ms`);
  assert.ok(free.every(({ r, ms }) => r.outcome === 'sent' && ms < 1_900), `the other tenant's 5 sends were not held back: ${free.map((f) => f.ms)}`);
});

sends('a rate that is no multiple of the concurrency is reached all the same: 60 pushes at 30 per second, 20 at a time, go out in two seconds\' budgets (probe J: 20 per second, three)', async (ctx) => {
  const sender = senderWith(ctx, { APNS_RATE_PER_TENANT_PER_SECOND: '30', APNS_MAX_CONCURRENT_PER_TENANT: '20' });
  const started = Date.now();
  const results = await sender.sendAll(Array.from({ length: 60 }, () => job(ctx)), () => undefined);
  const elapsed = Date.now() - started;
  assert.ok(results.every((r) => r?.outcome === 'sent'));
  // the reservoir refills each second: 30 start at once, 30 a second later (groups of 20 left 10 unused a second, so the last 20 waited for the third)
  assert.ok(elapsed >= 900 && elapsed < 1_950, `60 sends at 30 per second took ${elapsed} ms`);
});

sends('a limiter job weighs a divisor of the rate down to half the most it may, where the rate binds; else the most it may (pure)', () => {
  assert.is(limiterBatch(1_000, 20_000), 1_000);
  assert.is(limiterBatch(20, 30), 15);
  assert.is(limiterBatch(2, 5), 1);
  assert.is(limiterBatch(50, 10), 10, 'never more than the rate');
  assert.is(limiterBatch(20, 29), 20, 'no divisor down to half: groups stay whole (probe P: groups of one, one push a round trip)');
  assert.is(limiterBatch(20, 46), 20);
  assert.is(limiterBatch(500, 997), 500);
  assert.is(limiterBatch(3, 1_000_000), 3, 'a rate that does not bind changes nothing');
  assert.is(limiterBatch(1_000, 20_010), 1_000);
  for (let rate = 1; rate <= 300; rate++) for (const concurrency of [1, 2, 7, 20, 64, 1_000]) {
    const w = limiterBatch(concurrency, rate);
    const cap = Math.min(concurrency, rate);
    assert.ok(w >= Math.ceil(cap / 2) && w <= cap, `${concurrency}/${rate}: ${w}`);
  }
});

sends('an abort (a stopping dispatcher) ends sendAll without waiting for the pushes still in the limiter: those get no result and are never sent; those already out are answered (review of session 52: 400 at 50/s drained for 8 s)', async (ctx) => {
  const sender = senderWith(ctx, { APNS_RATE_PER_TENANT_PER_SECOND: '20' });
  const jobs = Array.from({ length: 120 }, () => job(ctx)); // 6 s at 20 per second
  const before = ctx.production.received;
  const answered: number[] = [];
  const controller = new AbortController();
  setTimeout(() => controller.abort(), 300);
  const started = Date.now();
  const results = await sender.sendAll(jobs, (i) => answered.push(i), controller.signal);
  const elapsed = Date.now() - started;
  const sent = results.filter((r) => r?.outcome === 'sent').length;
  assert.ok(sent >= 1 && sent < jobs.length, `${sent} sent before the abort`);
  assert.is(results.filter((r) => r === undefined).length, jobs.length - sent, 'the rest have no result');
  assert.is(answered.length, sent, 'every push out was answered and told');
  assert.ok(elapsed < 3_000, `returned ${elapsed} ms after the start, not when the limiter had let all through (~6 s)`);
  await new Promise((r) => setTimeout(r, 1_500)); // the limiter's next turns: nothing more goes out
  assert.is(ctx.production.received - before, sent, 'nothing was sent after the abort');
});

sends('close() ends a push waiting to retry with sender_closed, and later sends send nothing', async (ctx) => {
  const sender = senderWith(ctx, { APNS_RETRY_BASE_MS: '5000' });
  const j = job(ctx);
  ctx.production.respondWith({ token: j.token, status: 503 });
  const pending = sender.send(j);
  while (ctx.production.received === 0) await new Promise((r) => setTimeout(r, 10));
  await new Promise((r) => setTimeout(r, 20));
  const started = Date.now();
  await sender.close();
  const result = await pending;
  assert.ok(Date.now() - started < 2000, 'close did not wait out the backoff');
  assert.equal([result.outcome, result.reason, result.attempts, result.answers.length], ['failed', 'sender_closed', 1, 1]);
  const after = await sender.send(job(ctx));
  assert.equal([after.outcome, after.reason, after.attempts], ['failed', 'sender_closed', 0]);
  assert.is(ctx.production.received, 1);
});

sends('a missing APNS_CA_FILE is a clear error at start', (ctx) => {
  assert.throws(() => senderWith(ctx, { APNS_CA_FILE: join(ctx.dir, 'nope.pem') }), (err: Error) => /^APNS_CA_FILE ".*nope\.pem" cannot be read/.test(err.message));
  const notPem = join(ctx.dir, 'not.pem');
  writeFileSync(notPem, 'hello');
  assert.throws(() => senderWith(ctx, { APNS_CA_FILE: notPem }), (err: Error) => /holds no PEM certificate/.test(err.message));
});

sends('backoff doubles from the base with ±25% jitter and is capped at 30 s', () => {
  for (let i = 0; i < 200; i++) {
    for (const [attempt, exact] of [[1, 250], [2, 500], [3, 1000], [4, 2000], [5, 4000]] as const) {
      const ms = backoffMs(250, attempt);
      assert.ok(ms >= exact * 0.75 && ms <= exact * 1.25, `attempt ${attempt}: ${ms}`);
    }
    // the cap holds after the jitter (probe V: up to 37.5 s when it was applied before)
    assert.ok(backoffMs(250, 20) <= 30_000);
    assert.ok(backoffMs(250, 9) <= 30_000);
  }
});

sends.run();
