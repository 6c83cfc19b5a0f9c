import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { X509Certificate, randomBytes, randomUUID } from 'node:crypto';
import { connect, type ClientHttp2Session, type OutgoingHttpHeaders } from 'node:http2';
import apn from '@parse/node-apn';
import type { ProviderOptions, ResponseFailure } from '@parse/node-apn';
import { generateProviderKey, signProviderToken, startApnsPeer, type ApnsPeer, type ProviderKey } from '../helpers/apns-peer.js';
import { makeTestCertificates } from '../helpers/tls.js';

const TOPIC = 'com.example.herald';
const deviceToken = () => randomBytes(32).toString('hex');

type Reply = { status: number; headers: Record<string, string | string[] | number | undefined>; body: any };

/** One APNs request over a raw HTTP/2 session. */
function post(session: ClientHttp2Session, path: string, headers: OutgoingHttpHeaders, body?: string | Buffer, method = 'POST'): Promise<Reply> {
  return new Promise((done, fail) => {
    const req = session.request({ ':method': method, ':path': path, ...headers });
    let status = 0;
    let responseHeaders: Reply['headers'] = {};
    let text = '';
    req.setEncoding('utf8');
    req.on('response', (h) => {
      status = Number(h[':status']);
      responseHeaders = h;
    });
    req.on('data', (chunk: string) => (text += chunk));
    req.on('end', () => done({ status, headers: responseHeaders, body: text === '' ? null : JSON.parse(text) }));
    req.on('error', fail);
    req.end(body);
  });
}

const alert = JSON.stringify({ aps: { alert: { title: 'Hello', body: 'From Herald' } } });

// --- the peer over a raw HTTP/2 client -------------------------------------------------------

type RawContext = { peer: ApnsPeer; key: ProviderKey; session: ClientHttp2Session; jwt: string };
const raw = suite<RawContext>('apns peer over raw http2');

raw.before(async (ctx) => {
  ctx.key = generateProviderKey();
  ctx.peer = await startApnsPeer({ keyId: ctx.key.keyId, teamId: ctx.key.teamId, publicKey: ctx.key.publicKey, topic: TOPIC });
  ctx.jwt = await signProviderToken(ctx.key);
  ctx.session = connect(ctx.peer.origin, { ca: ctx.peer.ca });
  ctx.session.on('error', () => {});
});
raw.after(async (ctx) => {
  await new Promise<void>((done) => ctx.session.close(() => done()));
  await ctx.peer.close();
});
raw.before.each((ctx) => ctx.peer.reset());

const send = (ctx: RawContext, headers: OutgoingHttpHeaders = {}, body: string | Buffer | undefined = alert, token = deviceToken()) =>
  post(ctx.session, `/3/device/${token}`, { authorization: `bearer ${ctx.jwt}`, 'apns-topic': TOPIC, 'apns-push-type': 'alert', 'apns-priority': '10', ...headers }, body);

raw('the test certificate is signed by the throwaway CA and names localhost and 127.0.0.1', () => {
  const { caPem, certPem } = makeTestCertificates();
  const cert = new X509Certificate(certPem);
  const ca = new X509Certificate(caPem);
  assert.ok(cert.checkIssued(ca));
  assert.ok(cert.verify(ca.publicKey));
  assert.is(cert.checkHost('localhost'), 'localhost');
  assert.is(cert.checkIP('127.0.0.1'), '127.0.0.1');
  assert.ok(ca.ca);
  assert.not.ok(cert.ca);
  assert.is(makeTestCertificates(), makeTestCertificates());
});

raw('the peer advertises at least 1000 concurrent streams', async ({ session }) => {
  if (!session.remoteSettings.maxConcurrentStreams) await new Promise((r) => session.once('remoteSettings', r));
  assert.ok((session.remoteSettings.maxConcurrentStreams ?? 0) >= 1000);
});

raw('a valid notification is answered 200 with a new apns-id and an empty body, and is recorded', async (ctx) => {
  const token = deviceToken();
  const res = await send(ctx, { 'apns-expiration': '0', 'apns-collapse-id': 'greeting' }, alert, token);
  assert.is(res.status, 200);
  assert.is(res.body, null);
  assert.match(String(res.headers['apns-id']), /^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/);
  assert.match(String(res.headers['apns-unique-id']), /^[0-9a-f-]{36}$/);
  assert.is(ctx.peer.received, 1);
  assert.is(ctx.peer.accepted, 1);
  assert.is(ctx.peer.requests.length, 1);
  const recorded = ctx.peer.requests[0]!;
  assert.is(recorded.token, token);
  assert.is(recorded.status, 200);
  assert.is(recorded.reason, null);
  assert.is(recorded.apnsId, res.headers['apns-id']);
  assert.equal(recorded.payload, JSON.parse(alert));
  assert.equal(recorded.headers, {
    authorization: `bearer ${ctx.jwt}`,
    'apns-topic': TOPIC,
    'apns-push-type': 'alert',
    'apns-priority': '10',
    'apns-expiration': '0',
    'apns-collapse-id': 'greeting',
  });
});

raw('the apns-id the client sends is echoed back', async (ctx) => {
  const id = randomUUID();
  const res = await send(ctx, { 'apns-id': id });
  assert.is(res.status, 200);
  assert.is(res.headers['apns-id'], id);
  assert.is(ctx.peer.requests[0]!.headers['apns-id'], id);
});

raw('a token that is not hex is 400 BadDeviceToken, and so is hex of the wrong length', async (ctx) => {
  for (const token of ['not-a-device-token', 'abcd', 'a'.repeat(63), 'z'.repeat(64)]) {
    const res = await send(ctx, {}, alert, token);
    assert.is(res.status, 400, token);
    assert.equal(res.body, { reason: 'BadDeviceToken' });
    assert.ok(res.headers['apns-id']);
  }
  assert.is((await send(ctx, {}, alert, 'AB'.repeat(100))).status, 200, 'upper-case hex of 200 characters is a good token');
  assert.is(ctx.peer.rejected, 4);
});

raw('malformed headers get the reason Apple documents for each', async (ctx) => {
  const cases: [OutgoingHttpHeaders, string][] = [
    [{ 'apns-push-type': 'shout' }, 'InvalidPushType'],
    [{ 'apns-priority': '7' }, 'BadPriority'],
    [{ 'apns-expiration': 'tomorrow' }, 'BadExpirationDate'],
    [{ 'apns-collapse-id': 'x'.repeat(65) }, 'BadCollapseId'],
    [{ 'apns-id': 'not-a-uuid' }, 'BadMessageId'],
  ];
  for (const [headers, reason] of cases) {
    const res = await send(ctx, headers);
    assert.is(res.status, 400, reason);
    assert.equal(res.body, { reason });
  }
  const noTopic = await post(ctx.session, `/3/device/${deviceToken()}`, { authorization: `bearer ${ctx.jwt}` }, alert);
  assert.is(noTopic.status, 400);
  assert.equal(noTopic.body, { reason: 'MissingTopic' });
  for (const priority of ['1', '5', '10']) assert.is((await send(ctx, { 'apns-priority': priority })).status, 200, priority);
  assert.is((await send(ctx, { 'apns-collapse-id': 'é'.repeat(32) })).status, 200, 'a collapse id of exactly 64 bytes');
});

raw('an empty body is 400 PayloadEmpty and one over 4096 bytes is 413 PayloadTooLarge', async (ctx) => {
  const empty = await send(ctx, {}, '');
  assert.is(empty.status, 400);
  assert.equal(empty.body, { reason: 'PayloadEmpty' });
  const pad = (size: number) => {
    const shell = JSON.stringify({ aps: { alert: '' } });
    return JSON.stringify({ aps: { alert: 'x'.repeat(size - shell.length) } });
  };
  assert.is(Buffer.byteLength(pad(4096)), 4096);
  assert.is((await send(ctx, {}, pad(4096))).status, 200);
  const tooLarge = await send(ctx, {}, pad(4097));
  assert.is(tooLarge.status, 413);
  assert.equal(tooLarge.body, { reason: 'PayloadTooLarge' });
  const voip = await send(ctx, { 'apns-push-type': 'voip', 'apns-topic': `${TOPIC}.voip` }, pad(5000));
  assert.is(voip.status, 200, 'voip payloads may be 5 KB');
});

raw('a topic other than the app bundle id is 400 BadTopic; voip needs the .voip suffix', async (ctx) => {
  const wrong = await send(ctx, { 'apns-topic': 'com.example.other' });
  assert.is(wrong.status, 400);
  assert.equal(wrong.body, { reason: 'BadTopic' });
  assert.is((await send(ctx, { 'apns-push-type': 'voip', 'apns-topic': TOPIC })).status, 400);
  assert.is((await send(ctx, { 'apns-push-type': 'voip', 'apns-topic': `${TOPIC}.voip` })).status, 200);
  assert.is((await send(ctx, { 'apns-push-type': 'liveactivity', 'apns-topic': `${TOPIC}.push-type.liveactivity` })).status, 200);
});

raw('a request without a provider token is 403 MissingProviderToken', async (ctx) => {
  for (const authorization of [undefined, 'bearer ']) {
    const headers: OutgoingHttpHeaders = { 'apns-topic': TOPIC };
    if (authorization !== undefined) headers.authorization = authorization;
    const res = await post(ctx.session, `/3/device/${deviceToken()}`, headers, alert);
    assert.is(res.status, 403);
    assert.equal(res.body, { reason: 'MissingProviderToken' });
  }
});

raw('a token signed by another key, for another key id or another team is 403 InvalidProviderToken', async (ctx) => {
  const other = generateProviderKey();
  const tokens = [
    await signProviderToken({ ...other, keyId: ctx.key.keyId, teamId: ctx.key.teamId }),
    await signProviderToken({ ...ctx.key, keyId: other.keyId }),
    await signProviderToken({ ...ctx.key, teamId: other.teamId }),
    'not.a.jwt',
  ];
  for (const jwt of tokens) {
    const res = await send(ctx, { authorization: `bearer ${jwt}` });
    assert.is(res.status, 403);
    assert.equal(res.body, { reason: 'InvalidProviderToken' });
  }
  const basic = await send(ctx, { authorization: `basic ${ctx.jwt}` });
  assert.equal(basic.body, { reason: 'InvalidProviderToken' });
});

raw('a token issued more than an hour ago is 403 ExpiredProviderToken', async (ctx) => {
  const now = Math.floor(Date.now() / 1000);
  const old = await send(ctx, { authorization: `bearer ${await signProviderToken(ctx.key, now - 3601)}` });
  assert.is(old.status, 403);
  assert.equal(old.body, { reason: 'ExpiredProviderToken' });
  const recent = await send(ctx, { authorization: `bearer ${await signProviderToken(ctx.key, now - 3000)}` });
  assert.is(recent.status, 200);
});

raw('a path other than /3/device/{token} is 404 BadPath and another method is 405 MethodNotAllowed', async (ctx) => {
  const auth = { authorization: `bearer ${ctx.jwt}`, 'apns-topic': TOPIC };
  for (const path of ['/3/devices/abc', '/2/device/abc', `/3/device/${deviceToken()}/extra`]) {
    const res = await post(ctx.session, path, auth, alert);
    assert.is(res.status, 404, path);
    assert.equal(res.body, { reason: 'BadPath' });
  }
  const get = await post(ctx.session, `/3/device/${deviceToken()}`, auth, undefined, 'GET');
  assert.is(get.status, 405);
  assert.equal(get.body, { reason: 'MethodNotAllowed' });
  const missing = await post(ctx.session, '/3/device/', auth, alert);
  assert.equal(missing.body, { reason: 'MissingDeviceToken' });
});

raw('respondWith answers 410 Unregistered with a timestamp for one token only', async (ctx) => {
  const gone = deviceToken();
  ctx.peer.respondWith({ token: gone, status: 410, reason: 'Unregistered', timestamp: 1_700_000_000_000 });
  const res = await send(ctx, {}, alert, gone);
  assert.is(res.status, 410);
  assert.equal(res.body, { reason: 'Unregistered', timestamp: 1_700_000_000_000 });
  assert.is((await send(ctx, {}, alert, gone)).status, 410, 'a rule without times stays');
  assert.is((await send(ctx)).status, 200, 'other tokens are unaffected');
  const before = Date.now();
  const other = deviceToken();
  ctx.peer.respondWith({ token: other, status: 410 });
  const defaulted = await send(ctx, {}, alert, other);
  assert.is(defaulted.body.reason, 'Unregistered');
  assert.ok(defaulted.body.timestamp >= before && defaulted.body.timestamp <= Date.now());
});

raw('a rule with times expires: 429 twice, then 200', async (ctx) => {
  ctx.peer.respondWith({ status: 429, reason: 'TooManyRequests', times: 2 });
  const token = deviceToken();
  const statuses = [];
  for (let i = 0; i < 3; i++) statuses.push((await send(ctx, {}, alert, token)).status);
  assert.equal(statuses, [429, 429, 200]);
  assert.equal(ctx.peer.requests.map((r) => r.reason), ['TooManyRequests', 'TooManyRequests', null]);
});

raw('server errors 500 and 503 are answered with their reasons until reset', async (ctx) => {
  ctx.peer.respondWith({ status: 500, reason: 'InternalServerError', times: 1 });
  ctx.peer.respondWith({ status: 503 });
  const first = await send(ctx);
  assert.is(first.status, 500);
  assert.equal(first.body, { reason: 'InternalServerError' });
  const second = await send(ctx);
  assert.is(second.status, 503);
  assert.equal(second.body, { reason: 'ServiceUnavailable' });
  ctx.peer.reset();
  assert.is((await send(ctx)).status, 200);
});

raw('a request that fails validation is not answered by a rule', async (ctx) => {
  ctx.peer.respondWith({ status: 503, times: 1 });
  assert.equal((await send(ctx, {}, alert, 'nothex')).body, { reason: 'BadDeviceToken' });
  assert.is((await send(ctx)).status, 503, 'the rule is still there for the next valid request');
});

raw('delayMs delays the answer for the matching token while others are answered at once', async (ctx) => {
  const slow = deviceToken();
  ctx.peer.respondWith({ token: slow, delayMs: 200, times: 1 });
  const order: string[] = [];
  const started = Date.now();
  const [delayed] = await Promise.all([
    send(ctx, {}, alert, slow).then((r) => (order.push('slow'), r)),
    send(ctx).then((r) => (order.push('fast'), r)),
  ]);
  assert.is(delayed.status, 200);
  assert.ok(Date.now() - started >= 190);
  assert.equal(order, ['fast', 'slow']);
  const again: string[] = [];
  await Promise.all([send(ctx, {}, alert, slow).then(() => again.push('slow')), new Promise((r) => setTimeout(r, 150)).then(() => again.push('timer'))]);
  assert.equal(again, ['slow', 'timer'], 'the rule was used up');
});

raw('a request cut off by its sender (the connection lost with the body half sent, as when a dispatcher is killed) is neither answered nor recorded', async (ctx) => {
  const session = connect(ctx.peer.origin, { ca: ctx.peer.ca });
  session.on('error', () => {});
  const req = session.request({ ':method': 'POST', ':path': `/3/device/${deviceToken()}`, authorization: `bearer ${ctx.jwt}`, 'apns-topic': TOPIC, 'apns-push-type': 'alert' });
  req.on('error', () => {});
  req.write('{"aps":');
  while (ctx.peer.received === 0) await new Promise((r) => setTimeout(r, 5));
  session.destroy();
  await new Promise((r) => setTimeout(r, 100));
  assert.is(ctx.peer.received, 1);
  assert.is(ctx.peer.requests.length, 0);
  assert.is(ctx.peer.rejected, 0);
  assert.is(ctx.peer.accepted, 0);
});

raw('many concurrent streams on one connection are all answered', async (ctx) => {
  const results = await Promise.all(Array.from({ length: 2000 }, () => send(ctx)));
  assert.ok(results.every((r) => r.status === 200));
  assert.is(ctx.peer.received, 2000);
  assert.is(ctx.peer.accepted, 2000);
  assert.is(new Set(results.map((r) => r.headers['apns-id'])).size, 2000);
});

raw('with record: false the peer keeps counters but no requests, and takes a PEM public key', async (ctx) => {
  const quiet = await startApnsPeer({ keyId: ctx.key.keyId, teamId: ctx.key.teamId, publicKey: ctx.key.publicKey.export({ type: 'spki', format: 'pem' }).toString(), record: false });
  const session = connect(quiet.origin, { ca: quiet.ca });
  try {
    const headers = { authorization: `bearer ${ctx.jwt}`, 'apns-topic': 'any.topic.at.all' };
    assert.is((await post(session, `/3/device/${deviceToken()}`, headers, alert)).status, 200);
    assert.is((await post(session, '/3/device/nothex', headers, alert)).status, 400);
    assert.is(quiet.received, 2);
    assert.is(quiet.accepted, 1);
    assert.is(quiet.rejected, 1);
    assert.is(quiet.requests.length, 0);
  } finally {
    await new Promise<void>((done) => session.close(() => done()));
    await quiet.close();
  }
});

raw.run();

// --- the peer with @parse/node-apn -----------------------------------------------------------

type ApnContext = { peer: ApnsPeer; key: ProviderKey; providers: apn.Provider[] };
const nodeApn = suite<ApnContext>('apns peer with @parse/node-apn');

nodeApn.before(async (ctx) => {
  ctx.key = generateProviderKey();
  // The public key as a JWK here (a KeyObject and a PEM in the raw suite).
  ctx.peer = await startApnsPeer({ keyId: ctx.key.keyId, teamId: ctx.key.teamId, publicKey: ctx.key.publicKey.export({ format: 'jwk' }), topic: TOPIC });
  ctx.providers = [];
});
nodeApn.before.each((ctx) => ctx.peer.reset());
nodeApn.after.each(async (ctx) => {
  await Promise.all(ctx.providers.map((p) => p.shutdown()));
  ctx.providers = [];
});
nodeApn.after(async (ctx) => ctx.peer.close());

/** A node-apn provider pointed at the peer exactly as it would be at Apple: host, port, CA. */
function provider(ctx: ApnContext, key: Pick<ProviderKey, 'keyId' | 'teamId' | 'privateKeyPem'> = ctx.key, extra: Partial<ProviderOptions> = {}) {
  const p = new apn.Provider({
    token: { key: key.privateKeyPem, keyId: key.keyId, teamId: key.teamId },
    production: false,
    address: ctx.peer.host,
    port: ctx.peer.port,
    ca: [ctx.peer.ca],
    ...extra,
  });
  ctx.providers.push(p);
  return p;
}

function note(fields: Partial<{ topic: string; pushType: apn.NotificationPushType; body: string; id: string }> = {}) {
  const n = new apn.Notification();
  n.topic = fields.topic ?? TOPIC;
  n.pushType = fields.pushType ?? 'alert';
  n.alert = { title: 'Hello', body: fields.body ?? 'From Herald' };
  if (fields.id) n.id = fields.id;
  return n;
}

nodeApn('node-apn sends through the peer and gets the apns-id back in sent', async (ctx) => {
  const token = deviceToken();
  const id = randomUUID();
  const result = await provider(ctx).send(note({ id }), token);
  assert.is(result.failed.length, 0);
  assert.is(result.sent.length, 1);
  const sent = result.sent[0] as unknown as Record<string, string>;
  assert.is(sent.device, token);
  assert.is(sent['apns-id'], id);
  assert.ok(sent['apns-unique-id']);
  const recorded = ctx.peer.requests[0]!;
  assert.is(recorded.token, token);
  assert.is(recorded.headers['apns-topic'], TOPIC);
  assert.is(recorded.headers['apns-push-type'], 'alert');
  assert.is(recorded.headers['apns-priority'], '10');
  assert.match(recorded.headers.authorization ?? '', /^bearer [\w-]+\.[\w-]+\.[\w-]+$/);
  assert.equal(recorded.payload, { aps: { alert: { title: 'Hello', body: 'From Herald' } } });
});

nodeApn('one provider token is verified once and reused for many devices', async (ctx) => {
  const tokens = Array.from({ length: 50 }, deviceToken);
  const result = await provider(ctx).send(note(), tokens);
  assert.is(result.sent.length, 50);
  assert.is(new Set(ctx.peer.requests.map((r) => r.headers.authorization)).size, 1);
});

nodeApn('a bad device token lands in failed with status 400 and reason BadDeviceToken', async (ctx) => {
  const result = await provider(ctx).send(note(), 'abcd');
  assert.is(result.sent.length, 0);
  const failure = result.failed[0] as ResponseFailure;
  assert.is(failure.device, 'abcd');
  assert.is(failure.status, 400);
  assert.is(failure.response?.reason, 'BadDeviceToken');
});

nodeApn('an unregistered device lands in failed with status 410, reason Unregistered and the timestamp', async (ctx) => {
  const gone = deviceToken();
  const live = deviceToken();
  ctx.peer.respondWith({ token: gone, status: 410, reason: 'Unregistered', timestamp: 1_700_000_000_000 });
  const result = await provider(ctx).send(note(), [gone, live]);
  assert.equal(result.sent.map((s) => s.device), [live]);
  const failure = result.failed[0] as ResponseFailure;
  assert.is(failure.device, gone);
  assert.is(failure.status, 410);
  assert.equal(failure.response as unknown, { reason: 'Unregistered', timestamp: 1_700_000_000_000 });
});

nodeApn('node-apn retries 429 TooManyRequests and the third attempt is sent', async (ctx) => {
  ctx.peer.respondWith({ status: 429, reason: 'TooManyRequests', times: 2 });
  const result = await provider(ctx).send(note(), deviceToken());
  assert.is(result.sent.length, 1);
  assert.is(result.failed.length, 0);
  assert.equal(ctx.peer.requests.map((r) => r.status), [429, 429, 200]);
});

nodeApn('429 beyond the retry limit lands in failed with status 429', async (ctx) => {
  ctx.peer.respondWith({ status: 429, reason: 'TooManyRequests' });
  const result = await provider(ctx, ctx.key, { connectionRetryLimit: 1 }).send(note(), deviceToken());
  const failure = result.failed[0] as ResponseFailure;
  assert.is(failure.status, 429);
  assert.is(failure.response?.reason, 'TooManyRequests');
  assert.is(ctx.peer.requests.length, 2);
});

nodeApn('503 ServiceUnavailable lands in failed after retries; 500 becomes an error', async (ctx) => {
  ctx.peer.respondWith({ status: 503, reason: 'ServiceUnavailable', times: 2 });
  ctx.peer.respondWith({ status: 500, reason: 'InternalServerError', times: 2 });
  const result = await provider(ctx, ctx.key, { connectionRetryLimit: 1 }).send(note(), [deviceToken()]);
  // First attempt and its retry get 503; node-apn then gives up with the 503.
  const unavailable = result.failed[0] as ResponseFailure;
  assert.is(unavailable.status, 503);
  assert.is(unavailable.response?.reason, 'ServiceUnavailable');
  const again = await provider(ctx, ctx.key, { connectionRetryLimit: 1 }).send(note(), [deviceToken()]);
  const internal = again.failed[0] as ResponseFailure;
  assert.is(internal.status, 500);
  assert.instance(internal.error, Error);
  assert.match(internal.error!.message, /Error 500/);
});

nodeApn('a provider with the wrong key lands in failed with 403 InvalidProviderToken', async (ctx) => {
  const stranger = generateProviderKey();
  const result = await provider(ctx, { ...stranger, keyId: ctx.key.keyId, teamId: ctx.key.teamId }).send(note(), deviceToken());
  const failure = result.failed[0] as ResponseFailure;
  assert.is(failure.status, 403);
  assert.is(failure.response?.reason, 'InvalidProviderToken');
  const wrongTeam = await provider(ctx, { ...ctx.key, teamId: stranger.teamId }).send(note(), deviceToken());
  assert.is((wrongTeam.failed[0] as ResponseFailure).response?.reason, 'InvalidProviderToken');
});

nodeApn('node-apn renews its token after 403 ExpiredProviderToken and the retry is sent', async (ctx) => {
  ctx.peer.respondWith({ status: 403, reason: 'ExpiredProviderToken', times: 1 });
  const result = await provider(ctx).send(note(), deviceToken());
  assert.is(result.sent.length, 1);
  assert.equal(ctx.peer.requests.map((r) => r.reason), ['ExpiredProviderToken', null]);
});

nodeApn('a wrong topic lands in failed with 400 BadTopic', async (ctx) => {
  const result = await provider(ctx).send(note({ topic: 'com.example.elsewhere' }), deviceToken());
  const failure = result.failed[0] as ResponseFailure;
  assert.is(failure.status, 400);
  assert.is(failure.response?.reason, 'BadTopic');
});

nodeApn('a payload over 4096 bytes lands in failed with 413 PayloadTooLarge', async (ctx) => {
  const result = await provider(ctx).send(note({ body: 'x'.repeat(4100) }), deviceToken());
  const failure = result.failed[0] as ResponseFailure;
  assert.is(failure.status, 413);
  assert.is(failure.response?.reason, 'PayloadTooLarge');
});

nodeApn('node-apn refuses the peer without its CA', async (ctx) => {
  const p = new apn.Provider({
    token: { key: ctx.key.privateKeyPem, keyId: ctx.key.keyId, teamId: ctx.key.teamId },
    address: ctx.peer.host,
    port: ctx.peer.port,
    connectionRetryLimit: 0,
    requestTimeout: 2000,
  });
  ctx.providers.push(p);
  const result = await p.send(note(), deviceToken());
  assert.is(result.sent.length, 0);
  assert.ok((result.failed[0] as ResponseFailure).error);
  assert.is(ctx.peer.received, 0);
});

nodeApn.run();
