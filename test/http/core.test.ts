import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import SwaggerParser from '@apidevtools/swagger-parser';
import { randomBytes } from 'node:crypto';
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { connect } from 'node:net';
import { gzipSync } from 'node:zlib';
import { client } from '../helpers/api.js';
import { rawRequest } from '../helpers/raw-request.js';
import { bootstrapWorkspace, startTestService, type TestService } from '../helpers/service.js';

const core = suite<{ service: TestService; api: ReturnType<typeof client>; keys: Record<string, string> }>('http core');

core.before(async (ctx) => {
  ctx.service = await startTestService('core', { HTTP_BODY_LIMIT_BYTES: '2048' });
  ctx.api = client(ctx.service.url);
  ctx.keys = (await bootstrapWorkspace(ctx.service, 'core')).keys;
});
core.after(async (ctx) => ctx.service.stop());

core('health answers without a credential, with redis latency, version and live processes per role: degraded while a role has none', async ({ api }) => {
  const res = await api.get('/v1/health');
  assert.is(res.status, 200);
  assert.is(res.body.success, true);
  assert.is(res.body.error, null);
  assert.is(res.body.data.redis.reachable, true);
  assert.type(res.body.data.redis.latencyMs, 'number');
  assert.is(res.body.data.version, '0.1.0');
  // this service runs the web role alone: no worker processes the events it accepts
  assert.equal([res.body.data.status, res.body.data.roles], ['degraded', { web: 1, worker: 0, dispatcher: 0, scheduler: 0 }]);
  const all = await startTestService('core-all-roles', {}, ['web', 'worker', 'dispatcher', 'scheduler']);
  try {
    const whole = await client(all.url).get('/v1/health');
    assert.equal([whole.status, whole.body.data.status, whole.body.data.roles], [200, 'ok', { web: 1, worker: 1, dispatcher: 1, scheduler: 1 }]);
  } finally {
    await all.stop();
  }
});

core('an unknown route is 404 not_found in the envelope', async ({ api, keys }) => {
  const res = await api.get('/v1/nothing-here');
  assert.is(res.status, 404);
  assert.is(res.body.success, false);
  assert.is(res.body.data, null);
  assert.is(res.body.error.code, 'not_found');
  assert.ok(res.body.metadata.timestamp);
  assert.is(res.headers.get('request-id'), res.body.metadata.requestId);
  // paths are case-sensitive, the /v1 prefix too (probe D1: /V1/whoami answered 200)
  for (const path of ['/V1/whoami', '/v1/WhoAmI', '/V1/WHOAMI']) {
    const other = await api.get(path, keys.tenant);
    assert.is(other.status, 404, path);
    assert.is(other.body.error.code, 'not_found', path);
  }
  assert.is((await api.get('/v1/whoami', keys.tenant)).status, 200);
});

core('another method on a known path is 405 method_not_allowed in the envelope', async ({ api, keys }) => {
  const res = await api.call('PUT', '/v1/whoami', { key: keys.tenant, body: {} });
  assert.is(res.status, 405);
  assert.is(res.body.success, false);
  assert.is(res.body.error.code, 'method_not_allowed');
  assert.is(res.headers.get('request-id'), res.body.metadata.requestId);
});

core('a path a route names outright is that route\'s alone: /webhooks/catalog takes GET only, not also the methods of /webhooks/{id} (probe DC)', async ({ service, api, keys }) => {
  const path = '/v1/workspaces/core/webhooks/catalog';
  const allowOf = async (at: string) => (await fetch(`${service.url}${at}`, { method: 'OPTIONS', headers: { authorization: `Bearer ${keys.workspace}` } })).headers.get('allow');
  assert.is(await allowOf(path), 'HEAD, GET, OPTIONS');
  for (const method of ['PATCH', 'DELETE']) {
    const res = await api.call(method, path, { key: keys.workspace, body: { enabled: true } });
    assert.equal([res.status, res.body.error?.code, res.headers.get('allow')], [405, 'method_not_allowed', 'HEAD, GET, OPTIONS'], method);
  }
  assert.is((await api.get(path, keys.workspace)).status, 200);
  // a path two templates with as many parameters match takes the methods of both
  assert.is(await allowOf('/v1/workspaces/core/webhooks/events/rotate'), 'HEAD, GET, POST, OPTIONS');
});

core('a path parameter that is not valid percent-encoding is a malformed id, 404, not the resource named by its raw text (probe BM: /v1/subscribers/50%off deleted "50%off")', async ({ api, keys }) => {
  assert.is((await api.post('/v1/subscribers', keys.tenant, { externalId: '50%off' })).status, 201);
  for (const [method, path] of [['GET', '/v1/subscribers/50%off'], ['DELETE', '/v1/subscribers/50%off'], ['GET', '/v1/subscribers/50%off/preferences'], ['GET', '/v1/topics/%zz']] as const) {
    const res = await api.call(method, path, { key: keys.tenant });
    assert.equal([res.status, res.body.error?.code], [404, 'not_found'], `${method} ${path}: ${res.text.slice(0, 200)}`);
  }
  const encoded = await api.get(`/v1/subscribers/${encodeURIComponent('50%off')}`, keys.tenant);
  assert.equal([encoded.status, encoded.body.data?.externalId], [200, '50%off'], 'still there, at its encoded path');
  // the 404 comes after the credential's checks, as any other id's (probe M: 404 without a credential)
  const answers = async (path: string, key?: string) => {
    const res = await api.call('GET', path, key === undefined ? {} : { key });
    return [res.status, res.body.error?.code];
  };
  assert.equal(await answers('/v1/messages/%FF'), [401, 'missing_authorization']);
  assert.equal(await answers('/v1/messages/%FF', keys.client), [403, 'forbidden']);
  assert.equal(await answers('/v1/workspaces/%FF/webhooks/catalog', keys.workspace), [403, 'forbidden'], 'not this key\'s workspace');
  assert.equal(await answers('/v1/workspaces/core/webhooks/%FF', keys.workspace), [404, 'not_found']);
  assert.equal((await api.call('DELETE', '/v1/client/widgets/%FF')).status, 401);
  // a route without credentials (a source's inbound address) answers 404 at once, as before
  const inbound = await api.call('POST', '/v1/sources/%FF/inbound', { body: {} });
  assert.equal([inbound.status, inbound.body.error?.code, inbound.body.error?.param], [404, 'not_found', 'id']);
});

core('a route with a path parameter gets it decoded, and a path of two segments below it is its own route', async ({ api, keys }) => {
  const externalId = 'user 1/ü';
  const created = await api.post('/v1/subscribers', keys.tenant, { externalId, properties: { plan: 'pro' } });
  assert.ok(created.status === 200 || created.status === 201, JSON.stringify(created.body.error));
  const res = await api.get(`/v1/subscribers/${encodeURIComponent(externalId)}`, keys.tenant);
  const subscriptions = await api.get(`/v1/subscribers/${encodeURIComponent(externalId)}/subscriptions`, keys.tenant);
  assert.is(subscriptions.status, 200);
  assert.equal(subscriptions.body.data.items, []);
  assert.is(res.status, 200);
  assert.is(res.body.data.externalId, externalId);
});

core('malformed JSON is 400 parse, its details naming the body (Part 7: details list each failing field)', async ({ api, keys }) => {
  const res = await api.call('POST', '/v1/events', { key: keys.tenant, raw: '{"a":' });
  assert.is(res.status, 400);
  assert.is(res.body.error.code, 'parse');
  assert.equal(res.body.error.details, [{ param: 'body', message: 'Request body is not valid JSON' }]);
});

core('a body whose bytes are not UTF-8 is 400 parse, whatever charset it declares or coding it comes in; nothing stored with U+FFFD in their place (probe BP)', async ({ api, keys }) => {
  const bytes = (...parts: (string | number[])[]) => Buffer.concat(parts.map((p) => (typeof p === 'string' ? Buffer.from(p, 'utf8') : Buffer.from(p))));
  const bad = bytes('{"externalId":"t-bad', [0xff, 0xfe], '","name":"app.opened"}');
  const latin1 = bytes('{"externalId":"t-lat","name":"app.opened","data":{"n":"caf', [0xe9], '"}}');
  for (const [body, headers, what] of [
    [bad, {}, 'stray bytes'],
    [latin1, { 'content-type': 'application/json; charset=latin1' }, 'latin1 declared'],
    [gzipSync(bad), { 'content-encoding': 'gzip' }, 'compressed'],
    [bytes('{"externalId":"t-cut","name":"app.opened","data":{"n":"', [0xe2, 0x82], '"}}'), {}, 'a character cut short'],
  ] as [Buffer, Record<string, string>, string][]) {
    const res = await api.call('POST', '/v1/events', { key: keys.tenant, raw: body, headers });
    assert.equal([res.status, res.body.error?.code, res.body.error?.param], [400, 'parse', 'body'], what);
    assert.is(res.body.error.message, 'Request body is not valid UTF-8 (JSON must be sent as UTF-8, RFC 8259)', what);
  }
  for (const id of ['t-bad\uFFFD\uFFFD', 't-lat', 't-cut']) assert.is((await api.get(`/v1/subscribers/${encodeURIComponent(id)}`, keys.tenant)).status, 404, id);
  // UTF-8 itself, a BOM in front, a U+FFFD sent as such and a character of four bytes, is stored as sent
  const good = bytes([0xef, 0xbb, 0xbf], '{"externalId":"t-good","name":"app.opened","data":{"n":"caf\u00e9 \ufffd \u{1F600}"}}');
  const ok = await api.call('POST', '/v1/events', { key: keys.tenant, raw: good });
  assert.is(ok.status, 202, ok.text);
  assert.is(ok.body.data.items[0].data.n, 'caf\u00e9 \ufffd \u{1F600}');
});

core('a __proto__ key escaped in the JSON text (\\u005f_proto__) is refused like a plain one', async ({ api, keys }) => {
  const res = await api.call('POST', '/v1/events', { key: keys.tenant, raw: '{"externalId":"proto-esc","name":"app.opened","data":{"\\u005f_proto__":{"admin":true}}}' });
  assert.equal([res.status, res.body.error.code, res.body.error.param], [400, 'validation', 'data.__proto__']);
});

core('a __proto__ key is valid JSON but never accepted: 400 validation naming the field, nothing stored', async ({ api, keys }) => {
  const raw = '{"events":[{"externalId":"proto-1","name":"app.opened","data":{"ok":1,"__proto__":{"admin":true}}}]}';
  const res = await api.call('POST', '/v1/events', { key: keys.tenant, raw });
  assert.is(res.status, 400);
  assert.is(res.body.error.code, 'validation');
  assert.is(res.body.error.param, 'events[0].data.__proto__');
  assert.equal(res.body.error.details, [{ param: 'events[0].data.__proto__', message: 'is not an allowed field' }]);
  const top = await api.call('POST', '/v1/events', { key: keys.tenant, raw: '{"__proto__":{}}' });
  assert.equal([top.status, top.body.error.param], [400, '__proto__']);
  assert.is((await api.get('/v1/subscribers/proto-1', keys.tenant)).status, 404);
});

core('a field path from the request is bounded in the error: a 1,500-character key is named by its first 255 characters, not echoed whole three times (probe BD: a 600 KB answer)', async ({ api, keys }) => {
  const long = 'k'.repeat(1_500); // within the test service's 2 KB body limit
  const raw = `{"events":[{"externalId":"proto-2","name":"app.opened","data":{"${long}":{"__proto__":1}}}]}`;
  const res = await api.call('POST', '/v1/events', { key: keys.tenant, raw });
  assert.equal([res.status, res.body.error.code], [400, 'validation']);
  assert.ok(res.text.length < 2_500, `${res.text.length} bytes`);
  assert.is(res.body.error.param.length, 256);
  assert.ok(res.body.error.param.startsWith('events[0].data.kkk') && res.body.error.param.endsWith('…'), res.body.error.param.slice(0, 40));
  assert.equal(res.body.error.details.map((d: any) => d.param), [res.body.error.param]);
  assert.ok(res.body.error.message.length <= 1_024);
});

core('a lone surrogate (a \\ud800 escape UTF-8 cannot carry) is 400 validation naming the field; a surrogate pair is a character like any other', async ({ api, keys }) => {
  // stored, such a subscriber could never be read again (counted in total, missing from items, not addressable),
  // and a message to it stayed `sending`, its fan-out failing on every retry
  const cases: [string, string, string][] = [
    ['/v1/subscribers', String.raw`{"externalId":"lone-\ud800"}`, 'externalId'],
    ['/v1/messages', String.raw`{"to":"lone-\udfff","title":"t","body":"b"}`, 'to'],
    ['/v1/events', String.raw`{"events":[{"externalId":"lone-1","name":"app.opened","data":{"s":"x\ud800y"}}]}`, 'events[0].data.s'],
    ['/v1/topics', String.raw`{"slug":"lone","name":"\udc00"}`, 'name'],
  ];
  for (const [path, raw, param] of cases) {
    const res = await api.call('POST', path, { key: keys.tenant, raw });
    assert.is(res.status, 400, path);
    assert.equal([res.body.error.code, res.body.error.param], ['validation', param], path);
    assert.equal(res.body.error.details, [{ param, message: 'must be well-formed Unicode: it holds a lone surrogate' }]);
  }
  const key = await api.call('POST', '/v1/events', { key: keys.tenant, raw: String.raw`{"externalId":"lone-1","name":"app.opened","data":{"\ud800":1}}` });
  assert.equal([key.status, key.body.error.param], [400, 'data.\ud800'], 'a key is checked like a value');
  const pair = await api.call('POST', '/v1/subscribers', { key: keys.tenant, raw: String.raw`{"externalId":"pair-\ud83d\ude00"}` });
  assert.is(pair.status, 201);
  assert.is((await api.get(`/v1/subscribers/${encodeURIComponent('pair-😀')}`, keys.tenant)).body.data.externalId, 'pair-😀');
  const list = (await api.get('/v1/subscribers?limit=100', keys.tenant)).body.data;
  assert.is(list.total, list.items.length, 'every subscriber counted is listed');
  assert.is((await api.get('/v1/topics/lone', keys.tenant)).status, 404);
});

core('a number beyond a double (1e999, read as Infinity and stored as null) is 400 validation naming the field, not changed silently', async ({ api, keys }) => {
  for (const [raw, param] of [[`{"externalId":"huge-1","name":"app.opened","data":{"n":1e999}}`, 'data.n'], [`{"events":[{"externalId":"huge-1","name":"app.opened","data":{"a":[-1e400]}}]}`, 'events[0].data.a[0]']] as const) {
    const res = await api.call('POST', '/v1/events', { key: keys.tenant, raw });
    assert.equal([res.status, res.body.error?.code, res.body.error?.param], [400, 'validation', param], raw);
  }
  const fine = await api.call('POST', '/v1/events', { key: keys.tenant, raw: `{"externalId":"huge-1","name":"app.opened","data":{"n":1.7e308,"m":1e-999}}` });
  assert.is(fine.status, 202, 'the largest double, and an underflow to 0, are numbers');
});

core('an answer given before the body arrived whole (413 found while it streams in, 401 before it is read) reads the rest of it and drops it: the client reads the answer, and the connection\'s next request is answered', async ({ service, keys }) => {
  const port = Number(new URL(service.url).port);
  // a route read under HTTP_BODY_LIMIT_BYTES (event batches may be larger: EVENT_BATCH_BODY_BYTES)
  const head = (extra: string, key = keys.tenant) => `POST /v1/subscribers HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${key}\r\nContent-Type: application/json\r\n${extra}\r\n`;
  const chunk = `{"externalId":"big-1","properties":{"pad":"${'x'.repeat(3000)}`;
  const ending = '"}}';
  const compressed = gzipSync(Buffer.from(JSON.stringify({ externalId: 'big-1', properties: { pad: randomBytes(300_000).toString('base64') } })));
  const next = 'GET /v1/health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n';
  // what is sent first (enough for the answer), then the rest of the body and a next request on the same connection
  const cases: [string, Buffer, Buffer, number][] = [
    ['chunked, more to come', Buffer.from(`${head('Transfer-Encoding: chunked\r\n')}${chunk.length.toString(16)}\r\n${chunk}\r\n`), Buffer.from(`${ending.length.toString(16)}\r\n${ending}\r\n0\r\n\r\n${next}`), 413],
    ['gzip, more to come', Buffer.concat([Buffer.from(head(`Content-Encoding: gzip\r\nContent-Length: ${compressed.length}\r\n`)), compressed.subarray(0, 100_000)]), Buffer.concat([compressed.subarray(100_000), Buffer.from(next)]), 413],
    ['no key, body not read', Buffer.from(`${head(`Content-Length: ${chunk.length + ending.length}\r\n`, 'svc_tn_' + '0'.repeat(48))}${chunk}`), Buffer.from(`${ending}${next}`), 401],
  ];
  for (const [what, first, rest, status] of cases) {
    const answers = await new Promise<string>((resolve, reject) => {
      const socket = connect(port, '127.0.0.1', () => socket.write(first));
      const limit = setTimeout(() => {
        socket.destroy();
        reject(new Error(`${what}: not answered twice and closed within 5 s`));
      }, 5_000);
      let text = '';
      let restSent = false;
      socket.on('data', (data) => {
        text += data;
        // the answer came before the body was whole: now the rest of it, then the next request
        if (restSent || !text.includes('\r\n\r\n{')) return;
        restSent = true;
        socket.write(rest);
      });
      socket.on('error', () => undefined);
      socket.on('close', () => {
        clearTimeout(limit);
        resolve(text);
      });
    });
    assert.match(answers, new RegExp(`^HTTP/1\\.1 ${status} `), what);
    assert.match(answers, status === 413 ? /"code":"payload_too_large"/ : /"code":"invalid_api_key"/, what);
    const second = answers.indexOf('HTTP/1.1', 10);
    assert.ok(second > 0, `${what}: the next request on the connection is answered`);
    assert.match(answers.slice(second), /^HTTP\/1\.1 200 /, what);
  }
  // Node's fetch sending a body 64 times the limit reads the 413 every time (the connection was cut
  // under it, half the time a network error a client retries: probe CC)
  for (let i = 0; i < 10; i++) {
    const res = await fetch(`${service.url}/v1/subscribers`, { method: 'POST', headers: { authorization: `Bearer ${keys.tenant}`, 'content-type': 'application/json' }, body: Buffer.alloc(64 * 2048, 0x20) });
    assert.is(res.status, 413);
    await res.text();
  }
  // a body read whole keeps its connection (keep-alive) as before
  const fine = await fetch(`${service.url}/v1/events`, { method: 'POST', headers: { authorization: `Bearer ${keys.tenant}`, 'content-type': 'application/json' }, body: JSON.stringify({ externalId: 'big-1', name: 'app.opened' }) });
  assert.is(fine.status, 202);
  assert.is(fine.headers.get('connection'), 'keep-alive');
});

core('early answers again and again on one keep-alive connection leave no listener behind (each used to keep one on the socket, with its request)', async ({ service }) => {
  const port = Number(new URL(service.url).port);
  const warnings: string[] = [];
  const heard = (w: Error) => warnings.push(w.name);
  process.on('warning', heard);
  try {
    const body = `{"externalId":"x","name":"app.opened","data":{"pad":"${'x'.repeat(2000)}"}}`;
    const request = `POST /v1/events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer svc_tn_${'0'.repeat(48)}\r\nContent-Type: application/json\r\nContent-Length: ${body.length}\r\n\r\n`;
    const rounds = 15;
    const answered = await new Promise<number>((resolve, reject) => {
      const socket = connect(port, '127.0.0.1');
      const limit = setTimeout(() => {
        socket.destroy();
        reject(new Error('not answered within 10 s'));
      }, 10_000);
      let text = '';
      let sent = 0;
      // each request's head first; its body once it is answered (early, 401), then the next
      const send = () => {
        sent++;
        socket.write(request);
      };
      socket.on('connect', send);
      socket.on('data', (data) => {
        text += data;
        const answers = text.split('HTTP/1.1 401 ').length - 1;
        if (answers < sent || !text.endsWith('}')) return;
        socket.write(body);
        if (sent < rounds) send();
        else {
          clearTimeout(limit);
          socket.end();
          resolve(answers);
        }
      });
      socket.on('error', reject);
    });
    assert.is(answered, rounds);
    await new Promise((resolve) => setImmediate(resolve));
    assert.equal(warnings.filter((w) => w === 'MaxListenersExceededWarning'), []);
  } finally {
    process.off('warning', heard);
  }
});

core('a body declared larger than what is read after an early answer (16 MiB) is answered, and its connection closed', async ({ service, keys }) => {
  const res = await rawRequest(service.url, `POST /v1/events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${keys.tenant}\r\nContent-Type: application/json\r\nContent-Length: ${32 * 1024 * 1024}\r\n\r\n{"externalId"`);
  assert.is(res.status, 413);
  assert.is(res.headers.connection, 'close');
});

core('a request Node cannot parse (headers over 16 KB, a malformed request line) is 400 bad_request in the envelope, with its Request-Id', async ({ service, keys }) => {
  const cases: [string, string][] = [
    [`GET /v1/events?name=${'x'.repeat(20_000)} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${keys.tenant}\r\n\r\n`, 'headers'],
    [`GET /v1/events HTTP/1.1\r\nHost: x\r\nService-Tenant: ${'x'.repeat(20_000)}\r\n\r\n`, 'headers'],
    ['GET /v1/events HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n', 'request'],
    ['NOT A REQUEST\r\n\r\n', 'request'],
  ];
  for (const [head, param] of cases) {
    const res = await rawRequest(service.url, head);
    assert.is(res.status, 400, head.slice(0, 40));
    assert.is(res.headers['content-type'], 'application/json; charset=utf-8');
    const body = JSON.parse(res.body);
    assert.equal([body.success, body.data, body.error.code, body.error.param], [false, null, 'bad_request', param]);
    assert.equal(body.error.details.map((d: any) => d.param), [param]);
    assert.match(body.metadata.requestId, /^req_/);
    assert.is(res.headers['request-id'], body.metadata.requestId);
    assert.is(res.headers['access-control-allow-origin'], '*', 'a page on another origin reads it too');
    assert.ok(Number.isFinite(Date.parse(body.metadata.timestamp)));
  }
});

core('requests Node would answer itself are answered in the envelope: an Expect other than 100-continue is ignored, CONNECT is 405 or 404', async ({ service, keys }) => {
  const expect = await rawRequest(service.url, `GET /v1/events HTTP/1.1\r\nHost: x\r\nExpect: something-else\r\nAuthorization: Bearer ${keys.tenant}\r\nConnection: close\r\n\r\n`);
  assert.is(expect.status, 200, 'answered as without the header (Node alone answers a bare 417)');
  assert.is(JSON.parse(expect.body).success, true);
  const cases: [string, number, string][] = [
    ['CONNECT /v1/health HTTP/1.1\r\nHost: x\r\n\r\n', 405, 'method_not_allowed'],
    [`CONNECT 127.0.0.1:${new URL(service.url).port} HTTP/1.1\r\nHost: x\r\n\r\n`, 404, 'not_found'],
  ];
  for (const [head, status, code] of cases) {
    const res = await rawRequest(service.url, head); // Node alone closes the connection without a byte
    assert.is(res.status, status, head.split('\r\n')[0]);
    const body = JSON.parse(res.body);
    assert.equal([body.success, body.data, body.error.code], [false, null, code]);
    assert.is(res.headers['request-id'], body.metadata.requestId);
  }
});

core('a method Node\'s parser does not know is 501 not_implemented in the envelope, naming it; a standard name not in capitals says so (probe FE: 400 "not well-formed HTTP")', async ({ service }) => {
  const cases: [string, string][] = [
    ['FOO', 'The method FOO is not one this service knows'],
    ['patch', 'The method patch is not one this service knows; method names are case-sensitive: PATCH'],
    ['Get', 'The method Get is not one this service knows; method names are case-sensitive: GET'],
  ];
  for (const [method, message] of cases) {
    const res = await rawRequest(service.url, `${method} /v1/topics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n`);
    assert.is(res.status, 501, method);
    const body = JSON.parse(res.body);
    assert.equal([body.success, body.data, body.error.code, body.error.message, body.error.param], [false, null, 'not_implemented', message, 'method'], method);
    assert.is(res.headers['request-id'], body.metadata.requestId);
  }
  // the request that failed, after one pipelined before it in the same packet, or after an empty line (probe FG: the 501 named the GET before it)
  for (const bytes of [`GET /v1/health HTTP/1.1\r\nHost: x\r\n\r\nFOO /v1/topics HTTP/1.1\r\nHost: x\r\n\r\n`, `\r\nFOO /v1/topics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n`]) {
    const res = await rawRequest(service.url, bytes);
    const answers = res.text.split('HTTP/1.1 ').slice(1);
    const last = JSON.parse(answers.at(-1)!.slice(answers.at(-1)!.indexOf('\r\n\r\n') + 4));
    assert.equal([answers.at(-1)!.slice(0, 3), last.error.message], ['501', 'The method FOO is not one this service knows'], JSON.stringify(bytes.slice(0, 20)));
  }
  for (const bytes of [`GET /v1/health HTTP/1.1\r\nHost: x\r\n\r\nfoo bar\r\n\r\n`]) {
    const res = await rawRequest(service.url, bytes);
    assert.ok(!res.text.includes(' 501 '), 'a malformed line after a good request is no unknown method');
  }
  // a method that is no token is a malformed request line, as one with no version
  for (const line of ['F{} /v1/topics HTTP/1.1', 'FOO /v1/topics']) {
    const res = await rawRequest(service.url, `${line}\r\nHost: x\r\nConnection: close\r\n\r\n`);
    assert.equal([res.status, JSON.parse(res.body).error.code], [400, 'bad_request'], line);
  }
});

core('requests pipelined before a malformed one get their answers first, in order, then its 400 and the close (they were lost); half-closed too, but for the 400', async ({ service, keys }) => {
  const event = (n: number) => JSON.stringify({ externalId: 'pipelined', name: `pipelined.${n}` });
  const post = (n: number) => `POST /v1/events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${keys.tenant}\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(event(n))}\r\n\r\n${event(n)}`;
  for (const end of [false, true]) {
    const text = await new Promise<string>((done, fail) => {
      const socket = connect(Number(new URL(service.url).port), '127.0.0.1', () => {
        const bytes = post(1) + post(2) + 'GET /v1/health HTTP/1.1\r\nHost: x\r\n\r\n' + 'not http at all\r\n\r\n';
        if (end) socket.end(bytes);
        else socket.write(bytes);
      });
      let out = '';
      socket.on('data', (c) => (out += c.toString()));
      socket.on('close', () => done(out));
      socket.on('error', fail);
    });
    const answers = text.split(/(?=HTTP\/1\.1 \d{3} )/);
    // half-closed, the last good answer is the connection's last (Node's choice on the FIN): the refusal may not follow it
    assert.equal(answers.map((a) => Number(a.slice(9, 12))).slice(0, end ? 3 : 4), [202, 202, 200, 400].slice(0, end ? 3 : 4), `half-closed: ${end}`);
    assert.equal(answers.slice(0, 2).map((a) => JSON.parse(a.slice(a.indexOf('\r\n\r\n') + 4)).data.items[0].name), ['pipelined.1', 'pipelined.2']);
    if (!end) assert.is(JSON.parse(answers[3]!.slice(answers[3]!.indexOf('\r\n\r\n') + 4)).error.code, 'bad_request');
  }
});

core('a cursor that is not one is named beside the query\'s other problems; body and query problems are told together (Part 7; probe BP: one place at a time)', async ({ api, keys }) => {
  const list = await api.get('/v1/subscribers?limit=0&cursor=bad', keys.tenant);
  assert.equal([list.status, list.body.error.details.map((d: any) => d.param)], [400, ['limit', 'cursor']]);
  const alone = await api.get('/v1/subscribers?limit=0', keys.tenant);
  assert.equal(alone.body.error.details.map((d: any) => d.param), ['limit'], 'no cursor, no cursor problem');
  const patch = await api.patch('/v1/client/subscriptions/sbn_x?externalId=%ZZ', keys.client, { enabled: 'yes' });
  assert.equal([patch.status, patch.body.error.details.map((d: any) => d.param)], [400, ['enabled', 'externalId']]);
});

core('list limit is 1 to 100 in decimal digits; other spellings of a number are 400 naming limit', async ({ api, keys }) => {
  assert.is((await api.get('/v1/events?limit=10', keys.tenant)).status, 200);
  assert.is((await api.get('/v1/events?limit=0010', keys.tenant)).status, 200);
  for (const bad of ['1e1', '0x0a', '10.0', ' 10', '+10', '', '0', '101', 'ten']) {
    const res = await api.get(`/v1/events?limit=${encodeURIComponent(bad)}`, keys.tenant);
    assert.is(res.status, 400, bad);
    assert.equal([res.body.error.code, res.body.error.param, res.body.error.details.length], ['validation', 'limit', 1], bad);
  }
  const two = await api.get('/v1/events?limit=1e1&source=fax', keys.tenant);
  assert.equal(two.body.error.details.map((d: any) => d.param).sort(), ['limit', 'source'], 'every failing parameter is listed');
});

core('a body over the limit is 413 payload_too_large; a backend\'s event batch is read up to EVENT_BATCH_BODY_BYTES whatever the limit (probe DH: 100 events of 8 KB, non-ASCII escaped, is 2.4 MB)', async ({ api, keys }) => {
  const res = await api.call('POST', '/v1/subscribers', { key: keys.tenant, raw: JSON.stringify({ externalId: 'big', properties: { pad: 'x'.repeat(5000) } }) });
  assert.is(res.status, 413);
  assert.is(res.body.error.code, 'payload_too_large');
  assert.match(res.body.error.message, /limit of \d+ bytes/, 'the message says the limit (probe D1)');
  // every character of data escaped as \u00e9: 8,192 bytes serialized, 24,576 sent, 100 of them
  const events = Array.from({ length: 100 }, (_, i) => ({ externalId: `escaped-${i % 7}`, name: 'big.batch', data: { s: 'é'.repeat(4090) } }));
  const escaped = JSON.stringify({ events }).replace(/é/g, '\\u00e9');
  assert.ok(escaped.length > 2_400_000);
  const batch = await api.call('POST', '/v1/events', { key: keys.tenant, raw: escaped });
  assert.is(batch.status, 202, batch.text);
  assert.equal(new Set(batch.body.data.items.map((e: any) => e.status)), new Set(['accepted']));
  // the app's route keeps the limit: its key is public (an SDK sends UTF-8 as it is)
  const client = await api.call('POST', '/v1/client/events', { key: keys.client, raw: JSON.stringify({ externalId: 'escaped-c', source: 'ios', events: events.map(({ name, data }) => ({ name, data })) }).replace(/é/g, '\\u00e9') });
  assert.is(client.status, 413, client.text);
  const over = await api.call('POST', '/v1/events', { key: keys.tenant, raw: JSON.stringify({ events: [{ externalId: 'x', name: 'y', data: { s: ' '.repeat(4 * 1024 * 1024) } }] }) });
  assert.is(over.status, 413);
});

core('a body in another media type (a form) is 400 bad_request naming Content-Type', async ({ api, keys }) => {
  const res = await api.call('POST', '/v1/events', { key: keys.tenant, raw: 'a=b', headers: { 'content-type': 'application/x-www-form-urlencoded' } });
  assert.is(res.status, 400);
  assert.is(res.body.error.code, 'bad_request');
  assert.is(res.body.error.param, 'Content-Type');
  assert.equal(res.body.error.details.map((d: any) => d.param), ['Content-Type']);
});

core('a JSON body sent as text/plain or without a Content-Type is read as JSON (what fetch sends for a string)', async ({ service, keys }) => {
  const event = JSON.stringify({ externalId: 'plain-1', name: 'plain.sent' });
  for (const headers of [{ 'content-type': 'text/plain;charset=UTF-8' }, {}] as Record<string, string>[]) {
    const res = await fetch(`${service.url}/v1/events`, { method: 'POST', headers: { authorization: `Bearer ${keys.tenant}`, ...headers }, body: new TextEncoder().encode(event) });
    assert.is(res.status, 202);
  }
});

core('every +json media type is read as JSON; a chunked body with nothing in it reads as {} like a Content-Length: 0 one (probe M)', async ({ service, keys }) => {
  const event = JSON.stringify({ externalId: 'plus-json', name: 'plus.sent' });
  for (const type of ['application/merge-patch+json', 'application/ld+json; charset=utf-8', 'application/vnd.api+json', 'application/problem+json']) {
    const res = await fetch(`${service.url}/v1/events`, { method: 'POST', headers: { authorization: `Bearer ${keys.tenant}`, 'content-type': type }, body: event });
    assert.is(res.status, 202, type);
  }
  // an empty chunked body: the route's own field errors, as for an empty one with a length
  const empty = await new Promise<string>((done, fail) => {
    const socket = connect(Number(new URL(service.url).port), '127.0.0.1', () => {
      // written, not ended (Connection: close ends it after the answer)
      socket.write(`POST /v1/events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${keys.tenant}\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n0\r\n\r\n`);
    });
    let text = '';
    socket.on('data', (c) => (text += c.toString()));
    socket.on('end', () => done(text));
    socket.on('error', fail);
  });
  const answer = JSON.parse(empty.slice(empty.indexOf('\r\n\r\n') + 4).replace(/^[0-9a-f]+\r\n/, '').replace(/\r\n0\r\n\r\n$/, ''));
  assert.equal(answer.error.details.map((d: any) => d.param).sort(), ['externalId', 'name']);
});

core('a client that half-closes right after its requests gets every answer, then the connection closes (Node drops them by default)', async ({ service, keys }) => {
  const events = JSON.stringify({ externalId: 'half-closed', name: 'half.closed' });
  const text = await new Promise<string>((done, fail) => {
    const socket = connect(Number(new URL(service.url).port), '127.0.0.1', () => {
      // two pipelined requests, the first handled asynchronously (Redis), then the FIN at once
      socket.end(`POST /v1/events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${keys.tenant}\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(events)}\r\n\r\n${events}`
        + 'GET /v1/health HTTP/1.1\r\nHost: x\r\n\r\n');
    });
    let out = '';
    socket.on('data', (c) => (out += c.toString()));
    socket.on('close', () => done(out));
    socket.on('error', fail);
  });
  assert.equal([...text.matchAll(/HTTP\/1\.1 (\d+) [A-Z]/g)].map((m) => Number(m[1])), [202, 200], text.slice(0, 300));
});

core('an HTTP/1.1 request without a Host, or with two, is 400 bad_request in the envelope with a Request-Id; HTTP/1.0 needs none (probe M: Node\'s bare 400)', async ({ service }) => {
  const raw = (request: string) => new Promise<string>((done, fail) => {
    const socket = connect(Number(new URL(service.url).port), '127.0.0.1', () => socket.write(request));
    let text = '';
    socket.on('data', (c) => (text += c.toString()));
    socket.on('end', () => done(text));
    socket.on('error', fail);
    setTimeout(() => socket.end(), 1_000);
  });
  for (const request of ['GET /v1/health HTTP/1.1\r\nConnection: close\r\n\r\n', 'GET /v1/health HTTP/1.1\r\nHost: a\r\nHost: b\r\nConnection: close\r\n\r\n']) {
    const answer = await raw(request);
    assert.match(answer, /^HTTP\/1\.1 400 /, request);
    const id = /\r\nrequest-id: (\S+)\r\n/i.exec(answer)?.[1];
    const body = JSON.parse(answer.slice(answer.indexOf('\r\n\r\n') + 4));
    assert.equal([body.success, body.error.code, body.error.param, body.metadata.requestId], [false, 'bad_request', 'Host', id], request);
  }
  assert.match(await raw('GET /v1/health HTTP/1.0\r\n\r\n'), /^HTTP\/1\.1 200 /);
});

core('a JSON body that is not an object (null, 42, []) is 400 validation naming the body', async ({ api, keys }) => {
  for (const raw of ['null', '42', '[]']) {
    const res = await api.call('POST', '/v1/events', { key: keys.tenant, raw });
    assert.is(res.status, 400, raw);
    assert.is(res.body.error.code, 'validation', raw);
    assert.is(res.body.error.details[0].param, 'body', raw);
  }
});

core('browsers on other origins may call (CORS): a preflight is answered with the methods and headers, every answer allows any origin, errors too', async ({ service, keys }) => {
  const origin = 'https://app.example.com';
  const preflight = await fetch(`${service.url}/v1/client/events`, { method: 'OPTIONS', headers: { origin, 'access-control-request-method': 'POST', 'access-control-request-headers': 'authorization,content-type' } });
  assert.is(preflight.status, 200);
  assert.is(preflight.headers.get('access-control-allow-origin'), '*');
  assert.match(preflight.headers.get('access-control-allow-methods') ?? '', /\bPOST\b/);
  assert.is(preflight.headers.get('access-control-allow-headers'), 'authorization,content-type', 'the headers asked for');
  assert.is(preflight.headers.get('access-control-max-age'), '600');
  const body = (await preflight.json()) as any;
  assert.is(body.success, true, 'in the envelope');
  assert.is(preflight.headers.get('request-id'), body.metadata.requestId);

  const tracked = await fetch(`${service.url}/v1/events`, { method: 'POST', headers: { origin, authorization: `Bearer ${keys.tenant}`, 'content-type': 'application/json' }, body: JSON.stringify({ externalId: 'cors-1', name: 'page.viewed' }) });
  assert.is(tracked.status, 202);
  assert.is(tracked.headers.get('access-control-allow-origin'), '*');
  assert.match(tracked.headers.get('access-control-expose-headers') ?? '', /Request-Id/);
  const refused = await fetch(`${service.url}/v1/events`, { headers: { origin } });
  assert.is(refused.status, 401);
  assert.is(refused.headers.get('access-control-allow-origin'), '*', 'the page can read the error envelope');
  assert.match(refused.headers.get('access-control-expose-headers') ?? '', /WWW-Authenticate/);
  assert.match(refused.headers.get('access-control-expose-headers') ?? '', /\bRetry-After\b/, 'a web page reads the wait a 429 or 503 asks for (probe EB)');
  // the same headers without an Origin: an answer a shared cache keeps serves a page as well
  const server = await fetch(`${service.url}/v1/openapi.json`);
  assert.is(server.headers.get('access-control-allow-origin'), '*');
  assert.is(server.headers.get('vary'), null);
});

core('a preflight never fails in the browser: an unknown path, a method the path does not take, any header names, each told by the actual request the page can read', async ({ service, keys }) => {
  const origin = 'https://app.example.com';
  const preflight = (path: string, method: string, headers?: string) => fetch(`${service.url}${path}`, {
    method: 'OPTIONS',
    headers: { origin, 'access-control-request-method': method, ...(headers ? { 'access-control-request-headers': headers } : {}) },
  });
  for (const [path, method] of [['/v1/nope', 'GET'], ['/v1/client/widget', 'POST'], ['/v1/client/preferences', 'PUT'], ['/v1/health', 'PATCH']] as const) {
    const res = await preflight(path, method, 'authorization');
    assert.is(res.status, 200, `${method} ${path}`);
    assert.ok((res.headers.get('access-control-allow-methods') ?? '').split(', ').includes(method), `${method} ${path} allowed`);
  }
  const actualUnknown = await fetch(`${service.url}/v1/nope`, { headers: { origin, authorization: `Bearer ${keys.client}` } });
  assert.is(actualUnknown.status, 404);
  assert.is(actualUnknown.headers.get('access-control-allow-origin'), '*');
  const actualMethod = await fetch(`${service.url}/v1/health`, { method: 'PATCH', headers: { origin } });
  assert.is(actualMethod.status, 405);
  assert.is(actualMethod.headers.get('access-control-allow-origin'), '*');
  assert.match(actualMethod.headers.get('access-control-expose-headers') ?? '', /\bAllow\b/);

  const traced = await preflight('/v1/client/events', 'POST', 'content-type, x-requested-with, traceparent, baggage');
  assert.is(traced.headers.get('access-control-allow-headers'), 'content-type, x-requested-with, traceparent, baggage');
  assert.is(traced.headers.get('vary'), 'Access-Control-Request-Headers');
  const none = await preflight('/v1/client/events', 'POST');
  assert.match(none.headers.get('access-control-allow-headers') ?? '', /Authorization/, 'the usual list when none is asked for');
  const odd = await preflight('/v1/client/events', 'POST', 'content-type, bad header;');
  assert.is(odd.status, 200);
  assert.match(odd.headers.get('access-control-allow-headers') ?? '', /^Authorization, /, 'a list that is not header names is not echoed');
});

core('a corrupt gzip body is 400 parse, a gzip one is read, an unknown encoding is 400 bad_request', async ({ service, keys }) => {
  const post = (body: Uint8Array, encoding: string) => fetch(`${service.url}/v1/events`, { method: 'POST', headers: { authorization: `Bearer ${keys.tenant}`, 'content-type': 'application/json', 'content-encoding': encoding }, body });
  const event = Buffer.from(JSON.stringify({ externalId: 'gz-1', name: 'gz.sent' }));
  const corrupt = await post(event, 'gzip');
  assert.is(corrupt.status, 400);
  const { error: corruptError } = (await corrupt.json()) as any;
  assert.equal([corruptError.code, corruptError.message], ['parse', 'Request body is not valid for its Content-Encoding (a corrupt or truncated compressed stream)'], 'said as such, not as JSON (probe BP)');
  assert.is((await post(gzipSync(event), 'gzip')).status, 202);
  // codings are case-insensitive and x-gzip is gzip (RFC 9110 8.4.1; probe M: 400 before)
  for (const coding of ['GZIP', 'x-gzip', 'Gzip']) assert.is((await post(gzipSync(event), coding)).status, 202, coding);
  const unknown = await post(event, 'zstd-x');
  assert.is(unknown.status, 400);
  const { error } = (await unknown.json()) as any;
  assert.equal([error.code, error.details.map((d: any) => d.param)], ['bad_request', ['Content-Encoding']]);
});

core('OPTIONS answers the allowed methods in the envelope; 405 carries an Allow header', async ({ service, api, keys }) => {
  // OPTIONS is not an operation of the document, so a plain fetch rather than the checking client
  const options = await fetch(`${service.url}/v1/events`, { method: 'OPTIONS' });
  const body = (await options.json()) as any;
  assert.is(options.status, 200);
  assert.is(body.success, true);
  assert.is(options.headers.get('request-id'), body.metadata.requestId);
  assert.equal([...body.data.allow].sort(), ['GET', 'HEAD', 'OPTIONS', 'POST']);
  assert.is(options.headers.get('allow'), body.data.allow.join(', '));
  const put = await api.call('PUT', '/v1/events', { key: keys.tenant, body: {} });
  assert.is(put.status, 405);
  assert.equal(put.headers.get('allow')!.split(', ').sort(), ['GET', 'HEAD', 'OPTIONS', 'POST']);
});

core('the OpenAPI document is 3.0.x at version 1.0.0 and describes its own routes', async ({ service }) => {
  const res = await fetch(`${service.url}/v1/openapi.json`);
  assert.is(res.status, 200);
  const doc = (await res.json()) as any;
  assert.match(doc.openapi, /^3\.0\.\d+$/);
  assert.is(doc.info.version, '1.0.0');
  assert.ok(doc.paths['/v1/health'].get);
  assert.ok(doc.paths['/v1/workspaces/{workspaceSlug}/keys/{id}'].delete);
  assert.ok(doc.components.schemas.ErrorEnvelope);
  // a strict OpenAPI 3.0 validator (schema of the specification, every $ref) accepts it
  await SwaggerParser.validate(structuredClone(doc));
  // credentialed operations list the statuses of Part 7 they can answer
  const timeline = doc.paths['/v1/subscribers/{externalId}/timeline'].get.responses;
  for (const status of ['400', '401', '403', '404']) assert.ok(timeline[status], status);
  assert.not.ok(doc.paths['/v1/health'].get.responses['401']);
  // spec 4: the 401, 403 and 404 of Part 7 apply to every credentialed endpoint, so every one declares them
  for (const [path, item] of Object.entries<any>(doc.paths)) {
    for (const [method, op] of Object.entries<any>(item)) {
      if (!op?.responses || (Array.isArray(op.security) && op.security.length === 0)) continue;
      for (const status of ['401', '403', '404']) assert.ok(op.responses[status], `${method} ${path} declares ${status}`);
      // every 503 carries Retry-After (the redis gate's and the error middleware's alike), and the document says so (probe O)
      assert.is(op.responses['503']?.$ref, '#/components/responses/Unavailable', `${method} ${path} declares 503 with Retry-After`);
    }
  }
  // a body over HTTP_BODY_LIMIT_BYTES is 413 wherever a body is read, and only there
  assert.ok(doc.paths['/v1/events'].post.responses['413']);
  assert.not.ok(doc.paths['/v1/events'].get.responses['413']);
  // every answer declares the Request-Id header (spec 2.1), directly or through a shared response
  const resolve = (r: any) => (r.$ref ? doc.components.responses[r.$ref.split('/').pop()] : r);
  let answers = 0;
  for (const item of Object.values<any>(doc.paths)) {
    for (const op of Object.values<any>(item)) {
      for (const [status, response] of Object.entries<any>(op?.responses ?? {})) {
        assert.equal(resolve(response).headers?.['Request-Id'], { $ref: '#/components/headers/RequestId' }, status);
        answers++;
      }
    }
  }
  assert.ok(answers > 300, `${answers} answers`);
  assert.ok(doc.paths['/v1/messages'].post.responses['202'].headers['Idempotent-Replayed'], 'headers an operation declares stay');
});

core('the operations whose writes retry a compare-and-set list 429 lock_timeout with its Retry-After, and no other does (probe U: the client routes documented it in prose only)', async ({ service }) => {
  const doc = (await (await fetch(`${service.url}/v1/openapi.json`)).json()) as any;
  const listing = Object.entries<any>(doc.paths).flatMap(([template, item]) => Object.entries<any>(item)
    .filter(([, op]) => op?.responses?.['429']?.$ref === '#/components/responses/LockTimeout').map(([method]) => `${method.toUpperCase()} ${template}`));
  assert.equal(listing.sort(), [
    'POST /v1/subscribers', 'PATCH /v1/subscribers/{externalId}', 'DELETE /v1/subscribers/{externalId}',
    'PATCH /v1/subscribers/{externalId}/subscriptions/{id}', 'DELETE /v1/subscribers/{externalId}/subscriptions/{id}', 'PATCH /v1/subscribers/{externalId}/preferences',
    'POST /v1/client/identify', 'POST /v1/client/subscriptions', 'PATCH /v1/client/subscriptions/{id}', 'DELETE /v1/client/subscriptions/{id}',
    'PATCH /v1/client/preferences', 'POST /v1/client/widgets',
    'POST /v1/topics/{topicSlug}/subscribers', 'POST /v1/topics/{topicSlug}/subscribers/remove',
    'PATCH /v1/workflows/{workflowSlug}', 'DELETE /v1/workflows/{workflowSlug}',
  ].sort());
  assert.ok(doc.components.responses.LockTimeout.headers['Retry-After'], 'its Retry-After');
});

core('topic, segment and workflow slugs in paths carry the slug rules of spec 2.3 in the document (4.5), and a malformed one is 404', async ({ service, api, keys }) => {
  const doc = (await (await fetch(`${service.url}/v1/openapi.json`)).json()) as any;
  const shared = doc.components.parameters ?? {};
  const rule = { type: 'string', minLength: 3, maxLength: 48, pattern: '^[a-z0-9]+(?:-[a-z0-9]+)*$' };
  let seen = 0;
  for (const [template, item] of Object.entries<any>(doc.paths)) {
    for (const [method, op] of Object.entries<any>(item)) {
      if (!op?.responses) continue;
      for (const name of ['topicSlug', 'segmentSlug', 'workflowSlug']) {
        if (!template.includes(`{${name}}`)) continue;
        const param = (op.parameters ?? []).map((p: any) => (p.$ref ? shared[p.$ref.split('/').pop()] : p)).find((p: any) => p?.name === name && p.in === 'path');
        assert.ok(param, `${method.toUpperCase()} ${template} declares ${name}`);
        assert.equal(param.schema, rule, `${method.toUpperCase()} ${template} ${name}`);
        seen++;
      }
    }
  }
  assert.ok(seen >= 17, `${seen} slug parameters`);
  for (const path of ['/v1/topics/AB', '/v1/segments/Not_A_Slug', `/v1/workflows/${'a'.repeat(49)}/runs`]) {
    const res = await api.call('GET', path, { key: keys.tenant });
    assert.equal([res.status, res.body.error.code], [404, 'not_found'], path);
  }
});

core('the bounds the document declares on string query parameters (cursor too) are the ones the service checks', async ({ service, api, keys }) => {
  const doc = (await (await fetch(`${service.url}/v1/openapi.json`)).json()) as any;
  const shared = doc.components.parameters ?? {};
  const keyFor = (path: string) => (path.startsWith('/v1/client/') ? keys.client : path.startsWith('/v1/workspaces/') ? keys.workspace : keys.tenant);
  let probed = 0;
  let cursors = 0;
  for (const [template, item] of Object.entries<any>(doc.paths)) {
    const path = template.replace('{workspaceSlug}', 'core').replace(/\{[^}]+\}/g, 'qp-missing');
    for (const [method, op] of Object.entries<any>(item)) {
      if (!op?.responses || !Array.isArray(op.parameters)) continue;
      const query = op.parameters.map((p: any) => (p.$ref ? shared[p.$ref.split('/').pop()] : p)).filter((p: any) => p.in === 'query');
      const base = Object.fromEntries(query.filter((p: any) => p.required).map((p: any) => [p.name, 'qp-1']));
      for (const param of query) {
        const schema = param.schema ?? {};
        if (schema.type !== 'string' || schema.enum || schema.format) continue;
        // a list under a resource that does not exist answers 404 before it reads its cursor: probe the top-level lists
        if (param.name === 'cursor' && /\{(?!workspaceSlug\})/.test(template)) continue;
        const limit = schema.maxLength ?? 1000;
        for (const [value, refused] of [['', (schema.minLength ?? 0) > 0], ['a'.repeat(limit + 1), schema.maxLength !== undefined]] as const) {
          const qs = new URLSearchParams({ ...base, [param.name]: value });
          const res = await api.call(method.toUpperCase(), `${path}?${qs}`, { key: keyFor(template), body: method === 'patch' ? { enabled: true } : undefined });
          assert.is(res.status === 400, refused, `${method.toUpperCase()} ${template} ${param.name}=${value.length} chars answered ${res.status}; the document declares ${JSON.stringify(schema)}`);
          probed++;
          if (param.name === 'cursor') cursors++;
        }
      }
    }
  }
  assert.ok(probed >= 10, `${probed} probes`);
  assert.ok(cursors >= 8, `${cursors} cursor probes`);
});

/**
 * The query schema each route's handler reads (`checkQuery('<schema>')`, `pageRequest(ctx,
 * '<schema>')`, `pageRequest(ctx)` for ListQuery, or a helper of the file that does), read from the
 * source: `METHOD /path` → schema.
 */
function handlerQueries(): Map<string, string> {
  const dir = join(import.meta.dirname, '..', '..', 'http', 'routes');
  const found = new Map<string, string>();
  const schemaIn = (text: string, helpers: Map<string, string>): string | undefined => {
    const direct = /checkQuery(?:<[^(]*>)?\('(\w+)'|pageRequest(?:<[^(]*>)?\(ctx(?:, '(\w+)')?[,)]/.exec(text);
    if (direct) return direct[1] ?? direct[2] ?? 'ListQuery';
    for (const [helper, schema] of helpers) if (new RegExp(`\\b${helper}\\(ctx`).test(text)) return schema;
    return undefined;
  };
  for (const file of readdirSync(dir).filter((f) => f.endsWith('.ts'))) {
    const source = readFileSync(join(dir, file), 'utf8');
    const helpers = new Map<string, string>();
    // a helper may read the query through another defined before it
    for (const m of source.matchAll(/async function (\w+)\(ctx: Context[^]*?\n  }\n/g)) {
      const schema = schemaIn(m[0], helpers);
      if (schema) helpers.set(m[1]!, schema);
    }
    const routes = [...source.matchAll(/router\.(get|post|put|patch|delete)\('([^']+)'/g)];
    routes.forEach((m, i) => {
      const body = source.slice(m.index!, i + 1 < routes.length ? routes[i + 1]!.index : source.length);
      const schema = schemaIn(body.split('/**')[0]!, helpers);
      if (schema) found.set(`${m[1]!.toUpperCase()} ${m[2]!.replace(/:(\w+)/g, '{$1}')}`, schema);
    });
  }
  return found;
}

core('each operation lists the query parameters of the schema its route reads the query with, that schema\'s bounds and patterns included', async ({ service }) => {
  const doc = (await (await fetch(`${service.url}/v1/openapi.json`)).json()) as any;
  const read = handlerQueries();
  assert.ok(read.size >= 20, `${read.size} routes read a query`);
  const documented = new Map<string, string>();
  for (const [template, item] of Object.entries<any>(doc.paths)) {
    assert.not.ok((item.parameters ?? []).some((p: any) => p.in === 'query'), `${template}: query parameters are listed per operation`);
    for (const [method, op] of Object.entries<any>(item)) {
      if (!op?.responses) continue;
      const key = `${method.toUpperCase()} ${template}`;
      const query = (op.parameters ?? []).filter((p: any) => p.in === 'query' || /parameters\/(limit|cursor)$/.test(p.$ref ?? ''));
      if (op['x-query'] === undefined) {
        assert.equal(query, [], `${key} takes no query`);
        continue;
      }
      documented.set(key, op['x-query']);
      const schema = doc.components.schemas[op['x-query']];
      assert.equal(query.map((p: any) => p.name ?? p.$ref.split('/').pop()), Object.keys(schema.properties), key);
      for (const p of query.filter((q: any) => q.name)) {
        const { description: _, ...bare } = schema.properties[p.name];
        assert.equal(p.schema, bare, `${key} ${p.name}`);
      }
    }
  }
  assert.equal([...documented].sort(), [...read].sort(), 'x-query of each operation is the schema its handler reads');
  assert.match(doc.paths['/v1/events'].get.parameters.find((p: any) => p.name === 'name').schema.pattern, /^\^/, 'the event name filter carries its pattern');
});

core('a query parameter given twice is 400 validation naming it, whichever copy is valid', async ({ api, keys }) => {
  for (const qs of ['limit=500&limit=1', 'limit=1&limit=500', 'status=zzz&status=queued', 'status=queued&status=queued']) {
    const res = await api.get(`/v1/messages?${qs}`, keys.tenant);
    assert.equal([res.status, res.body.error?.code, res.body.error?.details], [400, 'validation', [{ param: qs.split('=')[0], message: 'must be given once' }]], qs);
  }
  assert.is((await api.get('/v1/messages?limit=1&status=queued', keys.tenant)).status, 200);
});

core('a query parameter the operation does not list is 400 validation naming it, Object.prototype names too (probe R: ?__proto__= passed unnamed)', async ({ api, keys }) => {
  for (const name of ['nosuch', 'constructor', '__proto__', 'toString']) {
    for (const path of ['/v1/messages', '/v1/topics', '/v1/events']) {
      const res = await api.get(`${path}?${name}=1`, keys.tenant);
      assert.equal([res.status, res.body.error?.code, res.body.error?.details?.map((d: any) => d.param)], [400, 'validation', [name]], `${path}?${name}=1`);
    }
  }
});

core('every pair of a query is read (probe T: Koa read the first 1,000, so a filter after 1,000 empty pairs went unread and widened the list); percent-encoding must be UTF-8 and a pair needs a name', async ({ api, keys }) => {
  const problems = async (path: string, key = keys.tenant) => {
    const res = await api.get(path, key);
    assert.equal([res.status, res.body.error?.code], [400, 'validation'], `${path.slice(0, 60)}…: ${res.text.slice(0, 200)}`);
    return res.body.error.details as { param: string; message: string }[];
  };
  const empties = '&'.repeat(1_000);
  assert.equal((await problems(`/v1/messages?${empties}status=zzz`)).map((d) => d.param), ['status'], 'the filter is read and checked');
  assert.equal((await problems(`/v1/messages?${empties}nosuch=1`)).map((d) => d.param), ['nosuch']);
  assert.equal((await problems(`/v1/messages?${'limit=1&'.repeat(1_000)}foo=1`)).map((d) => d.param).sort(), ['foo', 'limit']);
  const filtered = await api.get(`/v1/topics?${empties}limit=1`, keys.tenant);
  assert.equal([filtered.status, filtered.body.data?.items.length <= 1], [200, true], 'empty pairs are nothing');
  for (const value of ['%FF', '%C3', '%zz', '%', 'queu%ED%A0%80d']) {
    assert.equal(await problems(`/v1/messages?status=${value}`), [{ param: 'status', message: 'is not percent-encoded UTF-8' }], value);
  }
  assert.equal(await problems('/v1/client/preferences?externalId=%FF', keys.client), [{ param: 'externalId', message: 'is not percent-encoded UTF-8' }], 'not the subscriber "\\uFFFD"');
  for (const qs of ['=x', '=', '&=&', 'limit=1&=2']) assert.equal((await problems(`/v1/topics?${qs}`)).map((d) => d.param), ['query'], qs);
  assert.equal((await problems('/v1/topics?%FF=1')).map((d) => d.param), ['query']);
  assert.is((await api.get('/v1/messages?status=queu%65d&limit=%31', keys.tenant)).status, 200, 'percent-encoded names and values are read');
  assert.equal((await problems('/v1/messages?status=+queued')).map((d) => d.param), ['status'], '+ is a space, as in a form');
});

core('a list path with a trailing slash is the same list, cursors included (probe T: its cursors were refused by the other form)', async ({ api, keys }) => {
  for (const slug of ['slash-a', 'slash-b', 'slash-c']) assert.is((await api.post('/v1/topics', keys.tenant, { slug })).status, 201);
  const first = await api.get('/v1/topics?limit=1', keys.tenant);
  const cursor = first.body.data.nextCursor as string;
  assert.type(cursor, 'string');
  const slashed = await api.get(`/v1/topics/?limit=1&cursor=${cursor}`, keys.tenant);
  assert.is(slashed.status, 200, slashed.text);
  assert.not.equal(slashed.body.data.items[0].id, first.body.data.items[0].id, 'the next page');
  const back = await api.get(`/v1/topics?limit=1&cursor=${slashed.body.data.nextCursor}`, keys.tenant);
  assert.is(back.status, 200, back.text);
});

core.run();
