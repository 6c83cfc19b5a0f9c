import { Agent, request, type ClientRequest, type IncomingMessage } from 'node:http';
import { connect } from 'node:net';
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { client } from '../helpers/api.js';
import { roleEnv } from '../helpers/audit.js';
import { startRoleProcess } from '../helpers/processes.js';
import { bootstrapWorkspace, startTestService } from '../helpers/service.js';
import { waitFor } from '../helpers/wait.js';

/**
 * Stopping the web role (SIGTERM, `npm start` stopped) answers the requests already in flight
 * instead of cutting their connections: a request the service has begun to take must not be
 * stored and then lost to the caller as a reset connection.
 */
const shutdown = suite('web shutdown');

type Answer = { status: number; connection: string | undefined; body: any };

/** Sends the head and the first half of a POST now; `finish()` sends the rest and resolves with the answer. */
function slowPost(url: string, path: string, key: string, body: unknown, agent: Agent): { req: ClientRequest; finish: () => Promise<Answer> } {
  const data = Buffer.from(JSON.stringify(body));
  let answer!: Promise<Answer>;
  const req = request(url + path, { method: 'POST', agent, headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json', 'content-length': data.length } });
  answer = new Promise((done, fail) => {
    req.on('response', (res: IncomingMessage) => {
      let text = '';
      res.on('data', (chunk) => (text += chunk));
      res.on('end', () => done({ status: res.statusCode!, connection: res.headers.connection, body: JSON.parse(text) }));
    });
    req.on('error', fail);
  });
  answer.catch(() => undefined); // awaited by finish(); a reset fails the test there, not the process
  req.write(data.subarray(0, 10));
  return { req, finish: () => (req.end(data.subarray(10)), answer) };
}

shutdown('SIGHUP (a terminal closed under `npm start`) stops a role gracefully, exit 0 (probe EJ: Node\'s default ended it at once)', async () => {
  const service = await startTestService('sighup');
  // PORT 0: a port picked free here could be taken by another shard's process before this one binds it
  const web = startRoleProcess('web', { ...roleEnv(service), PORT: '0', LOG_LEVEL: 'info' });
  try {
    // a role process takes seconds to start on a loaded CI machine (20 s ran out with three shards at work)
    await waitFor('the web role to listen', async () => web.output().includes('listening'), 45_000, 50);
    web.child.kill('SIGHUP');
    assert.is(await web.exited, 0, web.output());
    assert.match(web.output(), /"signal":"SIGHUP"/);
  } finally {
    web.child.kill('SIGKILL');
    await service.stop();
  }
});

shutdown('a library\'s own console warning is a JSON log line like every other (probe I: ioredis\'s warning about a password the Redis server does not ask for came as plain text)', async () => {
  const service = await startTestService('library-warning');
  const url = new URL(service.env.REDIS_URL!);
  url.password = 'not-needed';
  const web = startRoleProcess('web', { ...roleEnv(service), REDIS_URL: url.href, PORT: '0', LOG_LEVEL: 'info' });
  try {
    await waitFor('the web role to listen', async () => web.output().includes('listening'), 45_000, 50);
    web.child.kill('SIGTERM');
    assert.is(await web.exited, 0, web.output());
    const lines = web.output().split('\n').filter((line) => line !== '');
    for (const line of lines) assert.not.throws(() => JSON.parse(line), line);
    assert.ok(lines.some((line) => JSON.parse(line).msg === 'library warning' && /does not require a password/.test(JSON.parse(line).message)), web.output());
  } finally {
    web.child.kill('SIGKILL');
    await service.stop();
  }
});

shutdown('a request in flight when the service stops is answered, its connection then closed', async () => {
  const service = await startTestService('shutdown');
  const { keys } = await bootstrapWorkspace(service, 'shutdown');
  const api = client(service.url);
  const agent = new Agent({ keepAlive: true });
  try {
    // An idle keep-alive connection (a client between two requests) must not hold the stop up.
    assert.is((await api.get('/v1/health')).status, 200);
    const idle = await new Promise<number>((done, fail) => request(service.url + '/v1/health', { agent }, (res) => { res.resume(); res.on('end', () => done(res.statusCode!)); }).on('error', fail).end());
    assert.is(idle, 200);

    const inFlight = slowPost(service.url, '/v1/events', keys.tenant, { externalId: 'late-1', name: 'shutdown.test', id: 'late-1' }, new Agent({ keepAlive: true }));
    await new Promise((r) => setTimeout(r, 100)); // the service has the head and part of the body
    let stopped = false;
    const stopping = service.stop().then(() => (stopped = true));
    await new Promise((r) => setTimeout(r, 100));
    assert.is(stopped, false, 'the stop waits for the request in flight');

    const answer = await inFlight.finish();
    const answeredAt = Date.now();
    assert.is(answer.status, 202);
    assert.is(answer.body.data.items[0].status, 'accepted');
    assert.is(answer.connection, 'close', 'the answer tells the client the connection ends');
    await waitFor('the stop to finish', async () => stopped, 3_000);
    // (the wait allows more on a loaded machine: the bound that matters is the grace, 5 s, not waited out)
    assert.ok(Date.now() - answeredAt < 4_500, `stopped ${Date.now() - answeredAt} ms after the answer`);
    await stopping;
  } finally {
    agent.destroy();
    await service.stop();
  }
});

shutdown('a connection still sending the rest of a body already answered (401 before it was read) does not hold the stop up: it is cut (probe CD)', async () => {
  const service = await startTestService('shutdown-linger');
  const { port } = new URL(service.url);
  try {
    const socket = connect(Number(port), '127.0.0.1');
    let text = '';
    const closed = new Promise<void>((done) => socket.on('close', () => done()));
    socket.on('data', (chunk) => (text += chunk));
    socket.on('error', () => undefined);
    socket.write('POST /v1/events HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"externalI');
    await waitFor('the early answer', async () => text.includes('"code":"missing_authorization"'), 3_000);
    // the rest never comes: the stop cuts the connection instead of waiting out its grace (5 s)
    let stopped = false;
    const stopAt = Date.now();
    const stopping = service.stop().then(() => (stopped = true));
    await waitFor('the stop to finish without waiting out the grace', async () => stopped, 2_500);
    assert.ok(Date.now() - stopAt < 4_500, `stopped in ${Date.now() - stopAt} ms, within the grace (5 s)`);
    await stopping;
    await closed;
  } finally {
    await service.stop();
  }
});

shutdown.run();
