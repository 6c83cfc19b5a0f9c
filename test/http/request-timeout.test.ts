import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { connect } from 'node:net';
import { client } from '../helpers/api.js';
import { bootstrapWorkspace, startTestService, type TestService } from '../helpers/service.js';

const timeout = suite<{ service: TestService; api: ReturnType<typeof client>; keys: Record<string, string> }>('http request timeout');

// Node's own limit is 300 s, checked every 30 s; HTTP_REQUEST_TIMEOUT_MS sets it and the check runs every second.
timeout.before(async (ctx) => {
  ctx.service = await startTestService('request-timeout', { HTTP_REQUEST_TIMEOUT_MS: '1000' });
  ctx.api = client(ctx.service.url);
  ctx.keys = (await bootstrapWorkspace(ctx.service, 'request-timeout')).keys;
});
timeout.after(async (ctx) => ctx.service.stop());

type Answer = { status: number; headers: Record<string, string>; body: string; ms: number; text: string };

/** Writes `head` on a raw connection and never more; resolves with what the server answers once it closes (at most 20 s). */
function stall(service: TestService, head: string): Promise<Answer> {
  return new Promise((resolve, reject) => {
    const started = Date.now();
    const socket = connect(Number(new URL(service.url).port), '127.0.0.1', () => socket.write(head));
    const limit = setTimeout(() => {
      socket.destroy();
      reject(new Error('no answer within 20 s'));
    }, 20_000);
    let text = '';
    socket.on('data', (chunk) => (text += chunk));
    socket.on('error', reject);
    socket.on('close', () => {
      clearTimeout(limit);
      const [top = '', body = ''] = text.split('\r\n\r\n');
      const [statusLine = '', ...lines] = top.split('\r\n');
      const headers = Object.fromEntries(lines.map((l) => [l.slice(0, l.indexOf(':')).toLowerCase(), l.slice(l.indexOf(':') + 1).trim()]));
      resolve({ status: Number(statusLine.split(' ')[1]), headers, body, ms: Date.now() - started, text });
    });
  });
}

function assertRefused(res: Answer, what: string) {
  assert.is(res.status, 400, what);
  assert.is(res.headers.connection, 'close', what);
  const body = JSON.parse(res.body);
  assert.equal([body.success, body.data, body.error.code, body.error.param], [false, null, 'bad_request', 'request'], what);
  assert.match(body.error.message, /in time/, what);
  assert.is(res.headers['request-id'], body.metadata.requestId, what);
  // well before Node's 300 s: the limit (1 s) plus the check interval (1 s) and this machine's slack
  assert.ok(res.ms < 15_000, `${what}: answered after ${res.ms} ms`);
}

timeout('a body shorter than its Content-Length is answered 400 bad_request once the request timeout passes, and nothing of it is stored', async ({ service, api, keys }) => {
  const body = '{"externalId":"slow-1","name":"app.opened"}';
  const head = `POST /v1/events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${keys.tenant}\r\nContent-Type: application/json\r\nContent-Length: ${body.length + 50}\r\n\r\n${body}`;
  assertRefused(await stall(service, head), 'short body');
  const events = await api.get('/v1/events', keys.tenant);
  assert.equal([events.status, events.body.data.items], [200, []]);
  assert.is((await api.get('/v1/subscribers/slow-1', keys.tenant)).status, 404);
});

timeout('a request whose body never arrives, pipelined behind one answered, is refused once the timeout passes: the refusal waits only for whole requests before it', async ({ service, keys }) => {
  const head = (length: number, body: string) => `POST /v1/events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${keys.tenant}\r\nContent-Type: application/json\r\nContent-Length: ${length}\r\n\r\n${body}`;
  const whole = '{"externalId":"slow-2","name":"app.opened"}';
  const res = await stall(service, head(whole.length, whole) + head(100, '{"externalId":'));
  const answers = res.text.split(/(?=HTTP\/1\.1 \d{3} )/);
  assert.equal(answers.map((a) => Number(a.slice(9, 12))), [202, 400]);
  assert.match(answers[1]!, /did not arrive whole in time/);
});

timeout('headers that never end are answered 400 bad_request once the request timeout passes; the service goes on answering', async ({ service, api, keys }) => {
  assertRefused(await stall(service, `GET /v1/whoami HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${keys.tenant}\r\n`), 'unfinished headers');
  const whoami = await api.get('/v1/whoami', keys.tenant);
  assert.is(whoami.status, 200);
});

timeout('an idle keep-alive connection between requests is not a late request', async ({ service, keys }) => {
  const port = Number(new URL(service.url).port);
  const answers = await new Promise<string>((resolve, reject) => {
    const socket = connect(port, '127.0.0.1');
    let text = '';
    socket.on('data', (chunk) => (text += chunk));
    socket.on('error', reject);
    const ask = () => socket.write(`GET /v1/whoami HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${keys.tenant}\r\n\r\n`);
    socket.on('connect', ask);
    // wait past the limit and two checks, then ask again on the same connection
    setTimeout(ask, 3_000);
    // done once a second answer came (or the connection went): a fixed 1.5 s for it could run out on a loaded CI machine
    const done = () => {
      clearTimeout(limit);
      socket.destroy();
      resolve(text);
    };
    const limit = setTimeout(done, 15_000);
    socket.on('data', () => (text.match(/HTTP\/1\.1 \d{3} /g)?.length ?? 0) >= 2 && done());
    socket.on('close', done);
  });
  assert.equal(answers.match(/HTTP\/1\.1 \d+/g), ['HTTP/1.1 200', 'HTTP/1.1 200']);
});

timeout('HTTP_REQUEST_TIMEOUT_MS outside 1000–300000 is a configuration error', async () => {
  const { loadConfig, ConfigError } = await import('../../lib/config.js');
  for (const value of ['999', '300001', 'soon']) {
    try {
      loadConfig({ HTTP_REQUEST_TIMEOUT_MS: value }, {});
      assert.unreachable(value);
    } catch (err) {
      assert.instance(err, ConfigError, value);
      assert.match((err as Error).message, /HTTP_REQUEST_TIMEOUT_MS/);
    }
  }
  assert.is(loadConfig({}, {}).requestTimeoutMs, 30_000);
});

timeout.run();
