import { createServer, type Socket } from 'node:net';
import { Agent } from 'node:http';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { postWebhook } from '../../actors/webhook-sender.js';
import { createAllowList } from '../../lib/ssrf-guard.js';

const SECRET = `whsec_${Buffer.alloc(24, 7).toString('base64')}`;
const options = { timeoutMs: 5_000, production: false, allow: createAllowList(['127.0.0.0/8']) };

/**
 * A receiver speaking plain HTTP/1.1 that keeps connections open without a `Keep-Alive: timeout`
 * hint and drops `closeOnRequest`-th request of a connection unanswered: at once, as one closing an
 * idle connection at the moment a request arrives on it does, or after `workMs` (it read the request).
 */
async function receiver(closeOnRequest: number, workMs = 0) {
  let connections = 0;
  let answered = 0;
  const server = createServer((socket: Socket) => {
    connections++;
    let requests = 0;
    let buffered = '';
    socket.on('data', (chunk) => {
      buffered += chunk.toString('latin1');
      for (;;) {
        const end = buffered.indexOf('\r\n\r\n');
        if (end < 0) return;
        const length = Number(/content-length:\s*(\d+)/i.exec(buffered.slice(0, end))?.[1] ?? 0);
        if (buffered.length < end + 4 + length) return;
        buffered = buffered.slice(end + 4 + length);
        if (++requests === closeOnRequest) return void (workMs ? setTimeout(() => socket.destroy(), workMs) : socket.destroy());
        answered++;
        socket.write('HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: keep-alive\r\n\r\nok');
      }
    });
    socket.on('error', () => undefined);
  });
  await new Promise<void>((done) => server.listen(0, '127.0.0.1', () => done()));
  const port = (server.address() as { port: number }).port;
  return {
    url: `http://127.0.0.1:${port}/hook`,
    counts: () => ({ connections, answered }),
    close: () => new Promise<void>((done) => server.close(() => done())),
  };
}

type Post = (id: string) => ReturnType<typeof postWebhook>;

/** Runs `body` with a receiver (`receiver(closeOnRequest, workMs)`) and one kept-alive connection to it. */
async function withReceiver(closeOnRequest: number, workMs: number, body: (post: Post, counts: () => { connections: number; answered: number }) => Promise<void>): Promise<void> {
  const r = await receiver(closeOnRequest, workMs);
  const agent = new Agent({ keepAlive: true, maxSockets: 1 });
  try {
    await body((id) => postWebhook(r.url, id, Buffer.from('{}'), [SECRET], agent, options), r.counts);
  } finally {
    agent.destroy();
    await r.close();
  }
}

test('an attempt whose kept-alive connection the receiver closed is sent once more on a new connection, and succeeds (probe EP: it failed with ECONNRESET and waited for the retry schedule)', async () => {
  await withReceiver(2, 0, async (post, counts) => {
    const first = await post('whe_1');
    assert.equal([first.success, first.statusCode], [true, 200]);
    const second = await post('whe_2');
    assert.equal([second.success, second.statusCode, second.error], [true, 200, null]);
    assert.equal(counts(), { connections: 2, answered: 2 }, 'the second on a new connection');
  });
});

test('a kept-alive connection dropped after the receiver worked on the request is a failed attempt, not sent again at once (probe EW)', async () => {
  await withReceiver(2, 400, async (post, counts) => {
    assert.is((await post('whe_4')).success, true);
    const dropped = await post('whe_5');
    assert.equal([dropped.success, dropped.statusCode], [false, null]);
    assert.match(dropped.error ?? '', /ECONNRESET|socket hang up/);
    assert.equal(counts(), { connections: 1, answered: 1 });
  });
});

test('a new connection closed before any answer is a failed attempt, not sent again', async () => {
  await withReceiver(1, 0, async (post, counts) => {
    const attempt = await post('whe_3');
    assert.equal([attempt.success, attempt.statusCode], [false, null]);
    assert.match(attempt.error ?? '', /ECONNRESET|socket hang up/);
    assert.equal(counts(), { connections: 1, answered: 0 });
  });
});

test.run();
