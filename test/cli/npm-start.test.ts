import { spawn, spawnSync } from 'node:child_process';
import { Redis } from 'ioredis';
import { connect, createServer } from 'node:net';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { startRoleProcess, stopRoleProcess } from '../helpers/processes.js';
import { freePort, testRedisUrl, uniquePrefix } from '../helpers/redis.js';
import { bootstrapWorkspace, startTestService } from '../helpers/service.js';
import { waitFor } from '../helpers/wait.js';

const ROOT = join(import.meta.dirname, '..', '..');

/**
 * `npm start` as an operator (or a supervisor, or a test suite) runs and stops it: npm forwards the
 * SIGTERM or SIGINT it receives to its child, and that child must be the service itself; a shell
 * in between dies of the signal and leaves the service running, holding its port.
 */
const start = suite('npm start');

/** true when the service answers on `port`, false when nothing listens there */
/** Runs the role `bin/<role>.ts` on a free PORT with `env` until it exits (killed after 20 s): its exit code and stderr. */
async function roleRun(role: string, env: Record<string, string>): Promise<{ code: number | null; stderr: string }> {
  const child = spawn(process.execPath, ['--import', 'tsx', join('bin', `${role}.ts`)], {
    cwd: ROOT,
    env: { ...process.env, ...env, PORT: String(await freePort()) },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let stderr = '';
  child.stderr!.on('data', (d) => (stderr += d));
  // a role gives up on Redis after ~11 s of retries; tsx's start-up on a loaded machine adds seconds (a CI run under load: killed at 20 s)
  const timer = setTimeout(() => child.kill('SIGKILL'), 45_000);
  const code = await new Promise<number | null>((done) => child.once('exit', (c) => done(c)));
  clearTimeout(timer);
  return { code, stderr };
}

async function answers(port: number): Promise<boolean> {
  try {
    const res = await fetch(`http://127.0.0.1:${port}/v1/health`, { signal: AbortSignal.timeout(2_000) });
    return res.status === 200;
  } catch {
    return false;
  }
}

/**
 * `npm start` of the web role on a free PORT with `env`, once it answers (the first start may build
 * dist/ with tsc): the npm process, its port, its output so far and its exit. `detached` gives it a
 * process group of its own, as a terminal's foreground job.
 */
async function npmStart(env: Record<string, string>, detached = false, port?: number) {
  port ??= await freePort();
  const npm = spawn('npm', ['start'], { cwd: ROOT, env: { ...process.env, PORT: String(port), HERALD_ROLES: 'web', ...env }, stdio: ['ignore', 'pipe', 'pipe'], detached });
  let output = '';
  npm.stdout!.on('data', (d) => (output = (output + d).slice(-10_000)));
  npm.stderr!.on('data', (d) => (output = (output + d).slice(-10_000)));
  const exited = new Promise<void>((done) => npm.once('exit', () => done()));
  await waitFor('the service to answer', () => answers(port), 120_000, 200).catch((err: Error) => {
    npm.kill('SIGKILL');
    throw new Error(`${err.message}\n${output}`);
  });
  return { npm, port, exited, output: () => output };
}

for (const signal of ['SIGTERM', 'SIGINT'] as const) {
  start(`${signal} to npm stops the service it started`, async () => {
    const { npm, port, exited } = await npmStart({ REDIS_URL: await testRedisUrl(), REDIS_KEY_PREFIX: uniquePrefix('npm-start'), LOG_LEVEL: 'warn' });
    try {
      npm.kill(signal);
      await waitFor('the service to stop', async () => !(await answers(port)), 15_000, 100);
      await exited;
    } finally {
      npm.kill('SIGKILL');
    }
    assert.not.ok(await answers(port), 'nothing answers on the port once npm is gone');
  });
}

start('Ctrl-C in a terminal (SIGINT to npm and the service together, then npm\'s forwarded copy) stops gracefully: a request in flight is answered', async () => {
  const keysOf = await startTestService('npm-group');
  const boot = await bootstrapWorkspace(keysOf, 'npm-group');
  await keysOf.stop();
  const env = { REDIS_URL: keysOf.env.REDIS_URL!, REDIS_KEY_PREFIX: keysOf.env.REDIS_KEY_PREFIX!, HERALD_PARTITIONS: keysOf.env.HERALD_PARTITIONS!, LOG_LEVEL: 'info' };
  const { npm, port, exited, output } = await npmStart(env, true);
  try {
    const body = JSON.stringify({ externalId: 'ctrl-c', name: 'in.flight' });
    const socket = connect(port, '127.0.0.1');
    let answer = '';
    socket.on('data', (d) => (answer += d));
    const closed = new Promise<void>((done) => socket.once('close', () => done()));
    socket.write(`POST /v1/events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${boot.keys.tenant}\r\nContent-Type: application/json\r\nContent-Length: ${body.length}\r\n\r\n`);
    await new Promise((r) => setTimeout(r, 300));
    process.kill(-npm.pid!, 'SIGINT'); // what the terminal does on Ctrl-C
    await new Promise((r) => setTimeout(r, 500));
    socket.write(body);
    await closed;
    assert.match(answer, /^HTTP\/1\.1 202 /, `the request in flight is answered: ${JSON.stringify(answer.slice(0, 80))}\n${output().slice(-2_000)}`);
    await exited;
    assert.match(output(), /"msg":"stopping"/);
  } finally {
    try { process.kill(-npm.pid!, 'SIGKILL'); } catch { /* gone */ }
  }
  assert.not.ok(await answers(port), 'nothing answers on the port once npm is gone');
});

/**
 * Whether process `pid` has ended: gone, or a zombie its new parent (the orphan went to PID 1, or the
 * nearest subreaper) has not reaped yet, which signal 0 still reaches (a loaded run: "did not exit" for 30 s).
 */
function hasExited(pid: number): boolean {
  try {
    process.kill(pid, 0);
  } catch {
    return true;
  }
  try {
    // /proc/<pid>/stat: `pid (comm) state …`, the state after the last ')'
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    return stat.slice(stat.lastIndexOf(')') + 2).startsWith('Z');
  } catch {
    return false; // no /proc (not Linux): signal 0 alone says it runs
  }
}

/** The pids of the processes whose parent is `pid`. */
function childrenOf(pid: number): number[] {
  return spawnSync('ps', ['-o', 'pid=', '--ppid', String(pid)], { encoding: 'utf8' }).stdout.split('\n').map(Number).filter((n) => n > 0);
}

start('SIGKILL to npm: the service sees its parent gone and stops, releasing its port at once, and a new npm start on that port starts (probe EE: it ran on, holding the port)', async () => {
  const env = { REDIS_URL: await testRedisUrl(), REDIS_KEY_PREFIX: uniquePrefix('npm-kill'), LOG_LEVEL: 'info' };
  const first = await npmStart(env);
  const [service] = childrenOf(first.npm.pid!); // `exec node bin/serve.js`: npm's child is the service
  let second: Awaited<ReturnType<typeof npmStart>> | undefined;
  try {
    assert.ok(service, 'the service runs as npm\'s child');
    first.npm.kill('SIGKILL');
    await waitFor('the orphaned service to release its port', async () => !(await answers(first.port)), 3_000, 50);
    await waitFor('the orphaned service to exit', async () => hasExited(service!), 10_000, 100);
    assert.match(first.output(), /"msg":"stopping"[^\n]*"signal":"parent gone"/);
    second = await npmStart(env, false, first.port);
    assert.ok(await answers(first.port));
  } finally {
    second?.npm.kill('SIGTERM');
    await second?.exited;
    for (const pid of [service]) if (pid) try { process.kill(pid, 'SIGKILL'); } catch { /* gone */ }
  }
});

start('a start whose PORT is released within 3 s waits for it and starts (a restart right after a kill)', async () => {
  const taken = createServer();
  const port = await freePort();
  await new Promise<void>((done) => taken.listen(port, '0.0.0.0', () => done()));
  const child = spawn(process.execPath, ['bin/serve.js'], {
    cwd: ROOT,
    env: { ...process.env, PORT: String(port), REDIS_URL: await testRedisUrl(), REDIS_KEY_PREFIX: uniquePrefix('port-wait'), HERALD_ROLES: 'web', LOG_LEVEL: 'error' },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let stderr = '';
  child.stderr!.on('data', (d) => (stderr += d));
  const exited = new Promise((done) => child.once('exit', done));
  try {
    // released once the start has found it taken (its node and build check take a moment)
    await new Promise((r) => setTimeout(r, 1_500));
    await new Promise<void>((done) => taken.close(() => done()));
    await waitFor('the service to answer', () => answers(port), 20_000, 100).catch((err: Error) => {
      throw new Error(`${err.message}\n${stderr}`);
    });
  } finally {
    taken.close();
    child.kill('SIGTERM');
    await exited;
  }
});

start('a port already in use is one line on stderr and exit 1, before anything started: nothing written to Redis, nothing left running', async () => {
  const { createServer } = await import('node:net');
  const taken = createServer();
  const port = await freePort();
  const prefix = uniquePrefix('port-taken');
  await new Promise<void>((done) => taken.listen(port, '0.0.0.0', () => done()));
  const redis = new Redis(await testRedisUrl());
  try {
    const child = spawn(process.execPath, ['bin/serve.js'], {
      cwd: ROOT,
      env: { ...process.env, PORT: String(port), REDIS_URL: await testRedisUrl(), REDIS_KEY_PREFIX: prefix, HERALD_ROLES: 'web,worker', LOG_LEVEL: 'error' },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let stderr = '';
    child.stderr!.on('data', (d) => (stderr += d));
    const code = await new Promise<number | null>((done) => child.once('exit', (c) => done(c)));
    assert.is(code, 1, stderr);
    assert.is(stderr, `herald: PORT ${port} is already in use: stop what listens on it, or set PORT to a free port\n`);
    // the worker never started: no partition count, lease or heartbeat written (probe BG: it started, then stopped)
    assert.equal((await redis.scan('0', 'MATCH', `${prefix}*`, 'COUNT', 100_000))[1], []);
  } finally {
    taken.close();
    redis.disconnect();
  }
});

start('a REDIS_URL naming a database the server does not have is one line on stderr and exit 1 for every role', async () => {
  const url = new URL(await testRedisUrl());
  for (const role of ['web', 'worker']) {
    const { code, stderr } = await roleRun(role, { REDIS_URL: `redis://${url.host}/99`, REDIS_KEY_PREFIX: uniquePrefix('db-missing'), LOG_LEVEL: 'error' });
    assert.is(code, 1, `${role}: ${stderr}`);
    assert.is(stderr, `herald: cannot use Redis at redis://${url.host}/99: it has no database 99 (ERR DB index is out of range)\n`, role);
  }
});

start('a REDIS_URL nothing answers on is one line on stderr and exit 1 for every role, at the default log level (no warning per retry)', async () => {
  const port = await freePort();
  for (const role of ['web', 'worker']) {
    const { code, stderr } = await roleRun(role, { REDIS_URL: `redis://127.0.0.1:${port}`, REDIS_KEY_PREFIX: uniquePrefix('unreachable'), LOG_LEVEL: 'info' });
    assert.is(code, 1, `${role}: ${stderr}`);
    assert.is(stderr, `herald: cannot reach Redis at redis://127.0.0.1:${port}: connect ECONNREFUSED 127.0.0.1:${port}\n`, role);
  }
});

start('a REDIS_URL whose server takes the connection and never replies is one line on stderr and exit 1 for every role (probe AP: the non-web roles waited forever, silent)', async () => {
  // a black hole: the TCP connection is accepted, nothing is ever read or answered
  const sockets = new Set<import('node:net').Socket>();
  const hole = createServer((socket) => {
    sockets.add(socket);
    socket.on('error', () => undefined);
  });
  const port = await new Promise<number>((done) => hole.listen(0, '127.0.0.1', () => done((hole.address() as import('node:net').AddressInfo).port)));
  try {
    const runs = await Promise.all(['worker', 'web'].map((role) => roleRun(role, { REDIS_URL: `redis://127.0.0.1:${port}`, REDIS_KEY_PREFIX: uniquePrefix('black-hole'), LOG_LEVEL: 'info' })));
    const [worker, web] = runs;
    assert.is(worker!.code, 1, worker!.stderr);
    assert.is(worker!.stderr, `herald: cannot reach Redis at redis://127.0.0.1:${port}: no answer within 12 s (the connection is open, nothing replies)\n`);
    assert.is(web!.code, 1, web!.stderr);
    assert.is(web!.stderr, `herald: cannot reach Redis at redis://127.0.0.1:${port}: no answer within 5 s (the connection is open, nothing replies)\n`, 'a web role alone, its commands timed out at 5 s, says it alike (probe BG: "Command timed out")');
  } finally {
    for (const socket of sockets) socket.destroy();
    hole.close();
  }
});

start('a SIGTERM while a role still waits for Redis at start stops it with exit 0 (probe V: the signal ended it with its own status, nothing said)', async () => {
  const port = await freePort();
  const p = startRoleProcess('web', { REDIS_URL: `redis://127.0.0.1:${port}`, REDIS_KEY_PREFIX: uniquePrefix('term-at-start'), LOG_LEVEL: 'debug', PORT: String(await freePort()) });
  try {
    await waitFor('the start waiting for Redis', async () => p.output().includes('redis connection error while starting'), 20_000);
    p.child.kill('SIGTERM');
    const code = await Promise.race([p.exited, new Promise<string>((r) => setTimeout(() => r('still running after 20 s'), 20_000))]);
    assert.is(code, 0, p.output().slice(-500));
    assert.not.match(p.output(), /cannot reach Redis/);
  } finally {
    await stopRoleProcess(p, 1_000);
  }
});

start('a process whose HERALD_PARTITIONS differs from the deployment\'s stops with one line and exit 1', async () => {
  // Another partition count hashes subscribers into other partitions: the same externalId got a
  // second stream (a second $subscriber.created, sequences from 1 again, dedupe ids accepted twice).
  const env = { REDIS_URL: await testRedisUrl(), REDIS_KEY_PREFIX: uniquePrefix('partitions'), LOG_LEVEL: 'error' };
  const first = await startTestService('partitions', { ...env, HERALD_PARTITIONS: '8' });
  try {
    const { code, stderr } = await roleRun('web', { ...env, HERALD_PARTITIONS: '16' });
    assert.is(code, 1, stderr);
    assert.is(stderr, 'herald: HERALD_PARTITIONS is 16, but this deployment (REDIS_KEY_PREFIX ' + JSON.stringify(env.REDIS_KEY_PREFIX) + ') runs with 8 partitions; the count is fixed for the life of a deployment\n');
    // the same count starts fine
    const second = await startTestService('partitions-same', { ...env, HERALD_PARTITIONS: '8' });
    await second.stop();
  } finally {
    await first.stop();
  }
});

start.run();
