import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { chmodSync, chownSync, existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { createConnection } from 'node:net';
import { join } from 'node:path';
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { ConfigError, loadConfig } from '../../lib/config.js';
import { answersPing, INSTALL_HINT, namesFolderServer, resolveRedis, type ResolveOptions, type ResolvedRedis } from '../../streams/embedded-redis.js';
import type { Logger } from '../../lib/log.js';
import { connectRedis } from '../../streams/redis.js';
import { freePort, testRedisUrl } from '../helpers/redis.js';
import { waitFor } from '../helpers/wait.js';

const ROOT = join(import.meta.dirname, '..', '..');

type Ctx = { temps: string[]; started: ResolvedRedis[] };
const embedded = suite<Ctx>('embedded redis');

/** A temporary directory removed after the suite. */
function temp(ctx: Ctx, name: string): string {
  const dir = mkdtempSync(join(tmpdir(), `herald-${name}-`));
  ctx.temps.push(dir);
  return dir;
}

/** Resolves with a config that has no REDIS_URL and data under `dataDir`; remembers what it starts. */
async function resolveEmbedded(ctx: Ctx, dataDir: string, local: { host: string; port: number }, options: ResolveOptions = {}, env: Record<string, string> = {}): Promise<ResolvedRedis> {
  const resolved = await resolveRedis(loadConfig({ HERALD_DATA_DIR: dataDir, ...env }, {}), local, options);
  ctx.started.push(resolved);
  return resolved;
}

/** Whether something takes connections on the local `port`. */
function listening(port: number): Promise<boolean> {
  return new Promise((done) => {
    const socket = createConnection(port, '127.0.0.1');
    socket.once('connect', () => {
      socket.destroy();
      done(true);
    });
    socket.once('error', () => done(false));
  });
}

/** Somewhere nothing listens: a port that was free a moment ago. */
async function nobody(): Promise<{ host: string; port: number }> {
  return { host: '127.0.0.1', port: await freePort() };
}

embedded.before((ctx) => {
  ctx.temps = [];
  ctx.started = [];
});

embedded.after(async (ctx) => {
  for (const resolved of ctx.started) await resolved.stop();
  for (const dir of ctx.temps) rmSync(dir, { recursive: true, force: true });
});

embedded('a process is the folder\'s server when its program is redis-server, by name (Linux) or whole path (macOS, probes EN, EW), and its arguments name the socket', () => {
  const socket = '/srv/herald/var/redis/redis.sock';
  assert.ok(namesFolderServer('redis-server', `redis-server unixsocket:${socket}`, socket));
  assert.ok(namesFolderServer('/opt/homebrew/bin/redis-server', `/opt/homebrew/bin/redis-server unixsocket:${socket}`, socket));
  assert.ok(namesFolderServer('/Users/a b/bin/redis-server', `/Users/a b/bin/redis-server unixsocket:${socket}`, socket), 'a path with a space');
  assert.not.ok(namesFolderServer('redis-server', 'redis-server unixsocket:/other/redis.sock', socket), 'another folder\'s');
  assert.not.ok(namesFolderServer('tail', `tail -f ${socket}`, socket), 'another program');
  assert.not.ok(namesFolderServer('/usr/bin/tail', `tail -f /opt/redis-server ${socket}`, socket), 'another program naming it');
});

embedded('with REDIS_URL set it uses that URL and starts nothing', async (ctx) => {
  const dataDir = temp(ctx, 'url');
  // Not even reachable: REDIS_URL is taken as given, without a probe.
  const config = loadConfig({ REDIS_URL: 'redis://127.0.0.1:1/3', HERALD_DATA_DIR: dataDir }, {});
  const resolved = await resolveRedis(config, await nobody());
  assert.equal(resolved.target, { url: 'redis://127.0.0.1:1/3', verifyTls: true });
  assert.is(resolved.embedded, false);
  assert.not.ok(existsSync(join(dataDir, 'redis')), 'no data directory is made');
  await resolved.stop();
});

embedded('without REDIS_URL it uses the local Redis when that answers', async (ctx) => {
  const dataDir = temp(ctx, 'local');
  const { hostname, port } = new URL(await testRedisUrl());
  const resolved = await resolveEmbedded(ctx, dataDir, { host: hostname, port: Number(port) });
  assert.equal(resolved.target, { url: `redis://${hostname}:${port}` });
  assert.is(resolved.embedded, false);
  assert.not.ok(existsSync(join(dataDir, 'redis')), 'no data directory is made');
  await resolved.stop();
  assert.ok(await answersPing({ host: hostname, port: Number(port) }), 'stop leaves a Redis it did not start alone');
});

embedded('without REDIS_URL a local Redis that wants a password is the one used, not passed over for a private server (probe BG)', async (ctx) => {
  const dataDir = temp(ctx, 'local-auth');
  const port = await freePort();
  const server = spawn('redis-server', ['--port', String(port), '--save', '', '--appendonly', 'no', '--requirepass', 'secret'], { stdio: 'ignore' });
  try {
    await waitFor('the password-protected server to listen', () => listening(port), 10_000, 50);
    const resolved = await resolveEmbedded(ctx, dataDir, { host: '127.0.0.1', port });
    assert.equal([resolved.target, resolved.embedded], [{ url: `redis://127.0.0.1:${port}` }, false]);
    assert.not.ok(existsSync(join(dataDir, 'redis')), 'no private server is made');
  } finally {
    server.kill('SIGKILL');
  }
});

embedded('with nothing reachable it starts a private redis-server with append-only persistence under <dataDir>/redis, over a unix socket, and data survives a restart', async (ctx) => {
  const dataDir = temp(ctx, 'data');
  const socket = join(dataDir, 'redis', 'redis.sock');
  const first = await resolveEmbedded(ctx, dataDir, await nobody());
  assert.equal(first.target, { path: socket });
  assert.is(first.embedded, true);
  assert.ok(await answersPing({ path: socket }));

  const redis = connectRedis(first.target);
  try {
    assert.is(await redis.config('GET', 'appendonly').then((r) => (r as string[])[1]), 'yes');
    assert.is(await redis.config('GET', 'appendfsync').then((r) => (r as string[])[1]), 'everysec');
    assert.is(await redis.config('GET', 'port').then((r) => (r as string[])[1]), '0', 'no TCP port is opened');
    await redis.set('herald-embedded-test', 'kept');
    await redis.rpush('herald-embedded-list', 'a', 'b', 'c');
  } finally {
    redis.disconnect();
  }
  await first.stop();
  assert.not.ok(await answersPing({ path: socket }), 'after stop() nothing answers on the socket');

  const files = readdirSync(join(dataDir, 'redis'));
  assert.ok(files.includes('redis.log'), `files: ${files}`);
  // Redis 7 keeps the append-only file as a directory of base and incremental files plus a manifest.
  const aof = files.includes('appendonlydir') ? readdirSync(join(dataDir, 'redis', 'appendonlydir')) : files.filter((f) => f.endsWith('.aof'));
  assert.ok(aof.some((f) => /\.aof$/.test(f)), `append-only files: ${aof}`);

  const second = await resolveEmbedded(ctx, dataDir, await nobody());
  assert.equal(second.target, { path: socket });
  assert.is(second.embedded, true);
  const again = connectRedis(second.target);
  try {
    assert.is(await again.get('herald-embedded-test'), 'kept');
    assert.equal(await again.lrange('herald-embedded-list', 0, -1), ['a', 'b', 'c']);
  } finally {
    again.disconnect();
  }
  await second.stop();
  assert.not.ok(await answersPing({ path: socket }));
});

embedded('stop() returns at once when the embedded redis-server was killed by a signal (probe V: a SIGKILLed child left exitCode null, its exit had fired, and the stop waited for it for good)', async (ctx) => {
  const dataDir = temp(ctx, 'killed');
  const resolved = await resolveEmbedded(ctx, dataDir, await nobody());
  const redis = connectRedis(resolved.target);
  const pid = Number(/process_id:(\d+)/.exec(await redis.info('server'))![1]);
  redis.disconnect();
  process.kill(pid, 'SIGKILL');
  for (let i = 0; i < 100 && (await answersPing(resolved.target as { path: string })); i++) await new Promise((r) => setTimeout(r, 50));
  await new Promise((r) => setTimeout(r, 100)); // the child's exit is seen by this process
  const stopped = await Promise.race([resolved.stop().then(() => 'stopped'), new Promise((r) => setTimeout(() => r('still waiting after 3 s'), 3_000))]);
  assert.is(stopped, 'stopped');
});

embedded('EMBEDDED_REDIS_APPENDFSYNC=always makes the embedded server sync before every reply', async (ctx) => {
  const resolved = await resolveRedis(loadConfig({ HERALD_DATA_DIR: temp(ctx, 'fsync'), EMBEDDED_REDIS_APPENDFSYNC: 'always' }, {}), await nobody());
  ctx.started.push(resolved);
  const redis = connectRedis(resolved.target);
  try {
    assert.is(await redis.config('GET', 'appendfsync').then((r) => (r as string[])[1]), 'always');
  } finally {
    redis.disconnect();
  }
  await resolved.stop();
  assert.throws(() => loadConfig({ EMBEDDED_REDIS_APPENDFSYNC: 'never' }, {}), /EMBEDDED_REDIS_APPENDFSYNC must be one of everysec, always, got "never"/);
});

embedded('a second resolve while the embedded server runs reuses it, and its stop() leaves it running', async (ctx) => {
  const dataDir = temp(ctx, 'reuse');
  const first = await resolveEmbedded(ctx, dataDir, await nobody());
  const second = await resolveEmbedded(ctx, dataDir, await nobody());
  assert.equal(second.target, first.target);
  assert.is(second.embedded, true);

  const a = connectRedis(first.target);
  const b = connectRedis(second.target);
  try {
    const pid = (info: string) => /process_id:(\d+)/.exec(info)?.[1];
    const pidA = pid(await a.info('server'));
    assert.ok(pidA);
    assert.is(pid(await b.info('server')), pidA, 'one redis-server serves both');
    await second.stop();
    assert.ok(await answersPing(first.target as { path: string }), 'the reused server is still up');
    assert.is(await a.ping(), 'PONG');
  } finally {
    a.disconnect();
    b.disconnect();
  }
  await first.stop();
  assert.not.ok(await answersPing(first.target as { path: string }), 'the server is stopped by the resolve that started it');
  await first.stop(); // a second stop is harmless
});

/*
 * Ctrl-C in a terminal sends SIGINT to the whole foreground process group: npm, the service and
 * any child in that group. The service stops gracefully on it and needs its Redis to do so (it
 * answers the requests in flight, records webhook results, releases leases), then stops the
 * embedded server last. A redis-server in the service's group would quit at once instead.
 */
embedded('a Ctrl-C to the process group of the service does not reach the embedded redis-server; the service stops it last', async (ctx) => {
  const dataDir = temp(ctx, 'ctrl-c');
  const { port } = await nobody();
  const script = `
    import { loadConfig } from ${JSON.stringify(join(ROOT, 'lib', 'config.ts'))};
    import { resolveRedis } from ${JSON.stringify(join(ROOT, 'streams', 'embedded-redis.ts'))};
    const resolved = await resolveRedis(loadConfig(), { host: '127.0.0.1', port: ${port} });
    process.on('SIGINT', () => process.stdout.write('sigint\\n'));
    process.on('SIGTERM', async () => { await resolved.stop(); process.exit(0); });
    process.stdout.write(JSON.stringify(resolved.target) + '\\n');
    setInterval(() => {}, 1000);`;
  // detached: the child leads a process group of its own, as npm start does in a terminal
  const child = spawn(process.execPath, ['--import', 'tsx', '--input-type=module', '-e', script], { cwd: ROOT, env: { ...process.env, HERALD_DATA_DIR: dataDir, REDIS_URL: '' }, stdio: ['ignore', 'pipe', 'pipe'], detached: true });
  let stdout = '';
  let stderr = '';
  child.stdout!.on('data', (c: Buffer) => (stdout += c.toString()));
  child.stderr!.on('data', (c: Buffer) => (stderr += c.toString()));
  const exited = new Promise<number | null>((done) => child.once('exit', (code) => done(code)));
  try {
    const deadline = Date.now() + 90_000; // a tsx process's start on a loaded machine
    while (!stdout.includes('\n') && Date.now() < deadline && child.exitCode === null) await new Promise((r) => setTimeout(r, 50));
    const target = JSON.parse(stdout.split('\n')[0]!) as { path: string };
    assert.ok(await answersPing(target), stderr);

    process.kill(-child.pid!, 'SIGINT'); // what the terminal does on Ctrl-C
    const until = Date.now() + 5_000;
    while (!stdout.includes('sigint') && Date.now() < until) await new Promise((r) => setTimeout(r, 50));
    await new Promise((r) => setTimeout(r, 300));
    assert.ok(await answersPing(target), 'the embedded redis-server is still up while the service stops');

    child.kill('SIGTERM');
    assert.is(await exited, 0);
    assert.not.ok(await answersPing(target), 'the service stopped it');
  } finally {
    if (child.exitCode === null) process.kill(-child.pid!, 'SIGKILL');
  }
});

/**
 * Another process that resolves the embedded server under `dataDir` (starting it, or taking it
 * over) and prints its target; on SIGTERM it runs its `stop` and exits, as a stopping service does.
 */
async function startOwnerProcess(dataDir: string, local: { host: string; port: number }, env: Record<string, string> = {}, startAt = 0) {
  const script = `
    import { loadConfig } from ${JSON.stringify(join(ROOT, 'lib', 'config.ts'))};
    import { resolveRedis } from ${JSON.stringify(join(ROOT, 'streams', 'embedded-redis.ts'))};
    await new Promise((r) => setTimeout(r, Math.max(0, ${startAt} - Date.now())));
    const resolved = await resolveRedis(loadConfig(), ${JSON.stringify(local)});
    process.on('SIGTERM', async () => { await resolved.stop(); process.exit(0); });
    process.stdout.write(JSON.stringify(resolved.target) + '\\n');
    setInterval(() => {}, 1000);`;
  const child = spawn(process.execPath, ['--import', 'tsx', '--input-type=module', '-e', script], { cwd: ROOT, env: { ...process.env, ...env, HERALD_DATA_DIR: dataDir, REDIS_URL: '' }, stdio: ['ignore', 'pipe', 'pipe'] });
  let stdout = '';
  let stderr = '';
  child.stdout!.on('data', (c: Buffer) => (stdout += c.toString()));
  child.stderr!.on('data', (c: Buffer) => (stderr += c.toString()));
  const exited = new Promise<void>((done) => child.once('exit', () => done()));
  // a tsx process's start takes seconds, several started at once on a loaded machine over 30 s (a CI-like run)
  const deadline = Date.now() + 90_000;
  while (!stdout.includes('\n') && Date.now() < deadline && child.exitCode === null) await new Promise((r) => setTimeout(r, 50));
  if (!stdout.includes('\n')) {
    // one that did not start is not left running (nor, through the caller, its siblings and their server)
    child.kill('SIGKILL');
    await exited;
    throw new Error(`the owner process did not resolve Redis (exit ${child.exitCode ?? child.signalCode}): ${stderr.slice(-2_000)}`);
  }
  const target = JSON.parse(stdout.split('\n')[0]!) as { path: string };
  return { child, exited, target };
}

embedded('a server left running by a SIGKILLed process is reused by the next one, which then stops it (README: stopped with the service)', async (ctx) => {
  const dataDir = temp(ctx, 'orphan');
  const local = await nobody();
  const { child, exited, target } = await startOwnerProcess(dataDir, local);
  child.kill('SIGKILL');
  await exited;
  assert.ok(await answersPing(target), 'the server outlives the process killed with SIGKILL (nothing is lost)');

  const next = await resolveEmbedded(ctx, dataDir, local);
  assert.equal(next.target, target, 'the next start reuses it');
  const other = await resolveEmbedded(ctx, dataDir, local);
  await other.stop();
  assert.ok(await answersPing(target), 'a process using it while its owner runs (the CLI) leaves it running');
  await next.stop();
  assert.not.ok(await answersPing(target), 'the process that took it over stops it');
});

embedded('the last one out stops it: an owner stopping while another process still uses the server leaves it to that process, which stops it', async (ctx) => {
  const dataDir = temp(ctx, 'last-out');
  const local = await nobody();
  const owner = await startOwnerProcess(dataDir, local);
  const user = await resolveEmbedded(ctx, dataDir, local); // a second `npm start` on the same project
  const connection = connectRedis(user.target);
  try {
    assert.is(await connection.ping(), 'PONG');
    owner.child.kill('SIGTERM');
    await owner.exited;
    assert.ok(await answersPing(owner.target), 'still up for the process using it (it was shut down under it)');
    assert.is(await connection.ping(), 'PONG');
  } finally {
    connection.disconnect();
  }
  await user.stop();
  assert.not.ok(await answersPing(owner.target), 'the last process to stop stops it');
});

embedded('processes of one folder resolving at the same moment start one server between them, and the last to stop stops it (probe F: each started its own on the same socket and files, and some were left running)', async (ctx) => {
  const dataDir = temp(ctx, 'together');
  const local = await nobody();
  // each child waits for the same moment before it resolves, past its own start-up
  const startAt = Date.now() + 4_000;
  const started = await Promise.allSettled(Array.from({ length: 4 }, () => startOwnerProcess(dataDir, local, {}, startAt)));
  const processes = started.flatMap((r) => (r.status === 'fulfilled' ? [r.value] : []));
  // the redis-server processes serving this folder: `<pid> redis-server unixsocket:<dataDir>/redis/redis.sock`
  const servers = () => spawnSync('ps', ['-eo', 'pid=,args='], { encoding: 'utf8' }).stdout.split('\n').map((line) => line.trim()).filter((line) => / redis-server /.test(` ${line}`) && line.includes(dataDir));
  try {
    // the ones that started, and their server, are stopped below whatever happened to the others
    for (const r of started) if (r.status === 'rejected') throw r.reason;
    assert.equal(new Set(processes.map((p) => p.target.path)).size, 1);
    assert.is(servers().length, 1, servers().join('\n'));
    const ready = readFileSync(join(dataDir, 'redis', 'redis.log'), 'utf8').split('\n').filter((line) => /Server initialized/.test(line));
    assert.is(ready.length, 1, 'one server was started');
    assert.not.ok(existsSync(join(dataDir, 'redis', 'start.lock')), 'the start lock was released');
    for (const p of processes) {
      p.child.kill('SIGTERM');
      await p.exited;
    }
    assert.not.ok(await answersPing(processes[0]!.target), 'the last to stop stopped it');
    assert.is(servers().length, 0, servers().join('\n'));
  } finally {
    for (const p of processes) if (p.child.exitCode === null) p.child.kill('SIGKILL');
    for (const line of servers()) process.kill(Number(line.split(' ')[0]), 'SIGKILL');
  }
});

embedded('a start lock left by a process killed while starting the server does not hold up the next start', async (ctx) => {
  const dataDir = temp(ctx, 'stale-lock');
  mkdirSync(join(dataDir, 'redis'), { recursive: true });
  // a pid that is not running: a process that exited has no pid any more by the time the child is reaped
  const gone = spawnSync(process.execPath, ['-e', 'process.stdout.write(String(process.pid))'], { encoding: 'utf8' }).stdout;
  writeFileSync(join(dataDir, 'redis', 'start.lock'), `${gone}\n`);
  const started = Date.now();
  const resolved = await resolveEmbedded(ctx, dataDir, await nobody());
  assert.ok(await answersPing(resolved.target as { path: string }));
  assert.ok(Date.now() - started < 5_000, `took ${Date.now() - started} ms`);
  assert.not.ok(existsSync(join(dataDir, 'redis', 'start.lock')));
  await resolved.stop();
});

embedded('a process taking over a server left running applies its own EMBEDDED_REDIS_APPENDFSYNC', async (ctx) => {
  const dataDir = temp(ctx, 'fsync');
  const local = await nobody();
  const first = await startOwnerProcess(dataDir, local);
  first.child.kill('SIGKILL');
  await first.exited;
  const next = await resolveRedis(loadConfig({ HERALD_DATA_DIR: dataDir, EMBEDDED_REDIS_APPENDFSYNC: 'always' }, {}), local);
  ctx.started.push(next);
  const connection = connectRedis(next.target);
  try {
    assert.equal(await connection.config('GET', 'appendfsync'), ['appendfsync', 'always'], 'was everysec, as the killed process started it');
  } finally {
    connection.disconnect();
  }
  await next.stop();
});

embedded('a redis-server that exits at start is reported with the reason from its log', async (ctx) => {
  const dataDir = temp(ctx, 'broken');
  mkdirSync(join(dataDir, 'redis'), { recursive: true });
  writeFileSync(join(dataDir, 'redis', 'appendonlydir'), 'a file where redis-server keeps a folder');
  const err = await resolveRedis(loadConfig({ HERALD_DATA_DIR: dataDir }, {}), await nobody()).catch((e: unknown) => e);
  assert.match(String((err as Error).message), /^redis-server exited with code 1 before it was ready: .*append.* \(.*redis\.log\)$/i);
});

embedded('a data folder whose socket path is too long for a unix socket is a ConfigError naming HERALD_DATA_DIR, before redis-server is started', async (ctx) => {
  const dataDir = join(temp(ctx, 'long'), 'x'.repeat(100));
  const err = await resolveRedis(loadConfig({ HERALD_DATA_DIR: dataDir }, {}), await nobody()).catch((e: unknown) => e);
  assert.ok(err instanceof ConfigError, String(err));
  assert.match((err as Error).message, /HERALD_DATA_DIR/);
  assert.match((err as Error).message, /over the 103/);
});

embedded('without redis-server on PATH it rejects with a ConfigError whose message is the install hint', async (ctx) => {
  const dataDir = temp(ctx, 'nopath');
  const emptyBin = temp(ctx, 'empty-bin');
  const local = await nobody();
  const path = process.env.PATH;
  let error: unknown;
  try {
    process.env.PATH = emptyBin;
    await resolveEmbedded(ctx, dataDir, local);
  } catch (err) {
    error = err;
  } finally {
    process.env.PATH = path;
  }
  assert.instance(error, ConfigError);
  assert.is((error as Error).message, INSTALL_HINT);
  assert.not.match(INSTALL_HINT, /\n/, 'the hint is one line');
  assert.match(INSTALL_HINT, /apt-get install -y redis-server/);
  assert.match(INSTALL_HINT, /REDIS_URL/);
});

/*
 * bin/start.ts (through bin/run.ts and startService) calls resolveRedis(config) with the fixed
 * local address 127.0.0.1:6379, which no environment variable moves. On a machine where that
 * port answers, the process would use it, so the real entry cannot be tested here without the
 * shared Redis being down. Instead a child process without redis-server on its PATH runs the same
 * calls as bin/run.ts (loadConfig from its environment, resolveRedis, the error printed as run.ts
 * prints it) against a local address nobody answers on.
 */
embedded('a process without redis-server on PATH stops with exit 1 and the one-line install hint on stderr', async (ctx) => {
  const bin = temp(ctx, 'node-only-bin');
  symlinkSync(process.execPath, join(bin, 'node'));
  const dataDir = temp(ctx, 'child-data');
  const { port } = await nobody();
  const script = `
    import { ConfigError, loadConfig } from ${JSON.stringify(join(ROOT, 'lib', 'config.ts'))};
    import { resolveRedis } from ${JSON.stringify(join(ROOT, 'streams', 'embedded-redis.ts'))};
    try {
      const resolved = await resolveRedis(loadConfig(), { host: '127.0.0.1', port: ${port} });
      await resolved.stop();
      process.stdout.write('resolved\\n');
    } catch (err) {
      process.stderr.write('herald: ' + (err instanceof ConfigError ? err.message : 'cannot start: ' + err.message) + '\\n');
      process.exit(1);
    }`;
  const env: Record<string, string> = { PATH: bin, HERALD_DATA_DIR: dataDir, HOME: process.env.HOME ?? '/tmp' };
  const run = await new Promise<{ code: number | null; stdout: string; stderr: string }>((done, fail) => {
    const child = spawn(join(bin, 'node'), ['--import', 'tsx', '--input-type=module', '-e', script], { cwd: ROOT, env, stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (c: Buffer) => (stdout += c.toString()));
    child.stderr.on('data', (c: Buffer) => (stderr += c.toString()));
    const timer = setTimeout(() => {
      child.kill('SIGKILL');
      fail(new Error(`child did not finish: ${stderr}`));
    }, 30_000);
    child.on('error', fail);
    child.on('close', (code) => {
      clearTimeout(timer);
      done({ code, stdout, stderr });
    });
  });
  assert.is(run.code, 1, run.stderr);
  assert.is(run.stdout, '');
  assert.is(run.stderr, `herald: ${INSTALL_HINT}\n`);
  assert.not.ok(existsSync(join(dataDir, 'redis')), 'nothing is created before the hint');
});

/** A logger keeping its lines (`<level> <msg> <fields>`), for tests that look for what was told. */
function keptLog(): Logger & { lines: string[] } {
  const lines: string[] = [];
  const keep = (level: string) => (msg: string, fields?: Record<string, unknown>) => void lines.push(`${level} ${msg} ${JSON.stringify(fields ?? {})}`);
  return { lines, debug: keep('debug'), info: keep('info'), warn: keep('warn'), error: keep('error') };
}

/** The first reply line of the server on `path` to PING, or null. */
function pingReply(path: string): Promise<string | null> {
  return new Promise((done) => {
    const socket = createConnection(path);
    const timer = setTimeout(() => finish(null), 500);
    const finish = (reply: string | null) => {
      clearTimeout(timer);
      socket.destroy();
      done(reply);
    };
    socket.once('connect', () => socket.write('PING\r\n'));
    socket.once('data', (d) => finish(d.toString().split('\r\n')[0]!));
    socket.once('error', () => finish(null));
  });
}

/** The redis-server processes whose command line names `dataDir`: `<pid> redis-server unixsocket:<dataDir>/redis/redis.sock`. */
function serversOf(dataDir: string): string[] {
  return spawnSync('ps', ['-eo', 'pid=,args='], { encoding: 'utf8' }).stdout.split('\n').map((line) => line.trim()).filter((line) => /[ /]redis-server /.test(` ${line}`) && line.includes(dataDir));
}

/**
 * A folder to put first on PATH whose `redis-server` loads each key of the data `delayUs` µs slowly
 * (redis-server's --key-load-delay), as a data set of a few GB loads slowly (probe EE's wrapper), and
 * answers clients between keys (LOADING) as a large one does every 2 MB.
 */
function slowLoadingRedis(ctx: Ctx, delayUs: number): string {
  const real = spawnSync('sh', ['-c', 'command -v redis-server'], { encoding: 'utf8' }).stdout.trim();
  const bin = temp(ctx, 'slow-bin');
  writeFileSync(join(bin, 'redis-server'), `#!/bin/sh\ncase "$1" in --version) exec ${real} --version;; esac\nexec ${real} "$@" --key-load-delay ${delayUs} --loading-process-events-interval-bytes 1024\n`, { mode: 0o755 });
  return bin;
}

/** Makes a data folder whose server, started by `slowLoadingRedis`, loads `keys` keys (in the append-only file's base, where the delay applies). */
async function seedData(ctx: Ctx, dataDir: string, keys: number): Promise<void> {
  const resolved = await resolveEmbedded(ctx, dataDir, await nobody());
  const redis = connectRedis(resolved.target);
  try {
    for (let i = 0; i < keys; i++) await redis.set(`seed:${i}`, randomBytes(1_024).toString('hex')); // over the 1 KB between answers, and not compressible
    await redis.bgrewriteaof();
    await waitFor('the append-only rewrite', async () => /aof_rewrite_in_progress:0[\s\S]*aof_rewrite_scheduled:0|aof_rewrite_scheduled:0[\s\S]*aof_rewrite_in_progress:0/.test(await redis.info('persistence')), 10_000, 50);
  } finally {
    redis.disconnect();
  }
  await resolved.stop();
}

/** Runs `fn` with `bin` first on PATH (the spawned redis-server, and the --version check, find it there). */
async function withPath<T>(bin: string, fn: () => Promise<T>): Promise<T> {
  const path = process.env.PATH;
  process.env.PATH = `${bin}:${path}`;
  try {
    return await fn();
  } finally {
    process.env.PATH = path;
  }
}

/**
 * Another process resolving the embedded Redis of `dataDir` with `bin`'s slow redis-server, once
 * its server is loading (answers -LOADING on `socket`); the caller kills it.
 */
async function loadingElsewhere(dataDir: string, local: { host: string; port: number }, bin: string, socket: string): Promise<ChildProcess> {
  const script = `
    import { loadConfig } from ${JSON.stringify(join(ROOT, 'lib', 'config.ts'))};
    import { resolveRedis } from ${JSON.stringify(join(ROOT, 'streams', 'embedded-redis.ts'))};
    await resolveRedis(loadConfig(), ${JSON.stringify(local)});`;
  const child = spawn(process.execPath, ['--import', 'tsx', '--input-type=module', '-e', script], { cwd: ROOT, env: { ...process.env, PATH: `${bin}:${process.env.PATH}`, HERALD_DATA_DIR: dataDir, REDIS_URL: '' }, stdio: 'ignore' });
  try {
    // a tsx process's start takes seconds on a loaded machine; the loading lasts seconds after it
    await waitFor('the first server to be loading', async () => (await pingReply(socket))?.startsWith('-LOADING'), 45_000, 20);
  } catch (err) {
    child.kill('SIGKILL');
    throw err;
  }
  return child;
}

embedded('a server left loading its data by a killed start is used and waited for, with a log line, never doubled (probe EE: taken for none, a second server was spawned on the same append-only file)', async (ctx) => {
  const dataDir = temp(ctx, 'loading');
  const local = await nobody();
  await seedData(ctx, dataDir, 40);
  const bin = slowLoadingRedis(ctx, 100_000); // 40 keys: 4 s of loading
  const socket = join(dataDir, 'redis', 'redis.sock');
  // a start killed while its server loads (as one that gave up after 10 s was, before)
  (await loadingElsewhere(dataDir, local, bin, socket)).kill('SIGKILL');
  const log = keptLog();
  const next = await withPath(bin, () => resolveEmbedded(ctx, dataDir, local, { log }));
  assert.is(await pingReply(socket), '+PONG', 'ready once resolved');
  assert.is(serversOf(dataDir).length, 1, serversOf(dataDir).join('\n'));
  assert.ok(log.lines.some((line) => line.startsWith('info waiting for the embedded redis-server to load its data')), log.lines.join('\n'));
  const redis = connectRedis(next.target);
  try {
    assert.is(await redis.dbsize(), 40);
  } finally {
    redis.disconnect();
  }
  await next.stop();
  assert.is(serversOf(dataDir).length, 0, 'it took the server over from the killed start, and stopped it');
});

embedded('a start whose own server does not finish loading in time stops that server: none is left running (probe EE: an orphan kept loading)', async (ctx) => {
  const dataDir = temp(ctx, 'load-limit');
  await seedData(ctx, dataDir, 40);
  const bin = slowLoadingRedis(ctx, 100_000);
  const err = await withPath(bin, () => resolveEmbedded(ctx, dataDir, { host: '127.0.0.1', port: 1 }, { limits: { loadMs: 500 } })).catch((e: Error) => e);
  assert.match(String((err as Error)?.message ?? err), /did not finish loading its data within 0\.5 s/);
  assert.is(serversOf(dataDir).length, 0, serversOf(dataDir).join('\n'));
});

embedded('no second server is spawned on a data folder whose redis-server runs without answering on the socket: the start says so', async (ctx) => {
  const dataDir = temp(ctx, 'unanswering');
  const dir = join(dataDir, 'redis');
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  // the folder's server, its socket file removed
  const other = spawn('redis-server', ['--port', '0', '--unixsocket', join(dir, 'redis.sock'), '--pidfile', join(dir, 'redis.pid'), '--save', '', '--appendonly', 'no', '--dir', dir], { stdio: 'ignore' });
  try {
    await waitFor('its pid file and socket', async () => existsSync(join(dir, 'redis.pid')) && existsSync(join(dir, 'redis.sock')), 10_000, 20);
    rmSync(join(dir, 'redis.sock'));
    const err = await resolveEmbedded(ctx, dataDir, await nobody(), { limits: { answerMs: 300 } }).catch((e: Error) => e);
    assert.instance(err, ConfigError);
    assert.match((err as Error).message, new RegExp(`^a redis-server \\(pid ${other.pid}, .*redis\\.pid\\) runs on .* but does not answer on .*redis\\.sock: stop it`));
    assert.not.ok(existsSync(join(dir, 'redis.sock')), 'no server was started on the socket');
  } finally {
    other.kill('SIGKILL');
  }
});

embedded('the data folder is its owner\'s alone: made (or tightened) to 0700, and redis-server writes its files 0600 (probe EE: 0755 and 0644, the whole database readable by any local user)', async (ctx) => {
  const dataDir = temp(ctx, 'private');
  const dir = join(dataDir, 'redis');
  mkdirSync(dir, { recursive: true });
  chmodSync(dir, 0o755); // as an earlier version left it
  const resolved = await resolveEmbedded(ctx, dataDir, await nobody());
  const redis = connectRedis(resolved.target);
  try {
    await redis.set('secret', 'whsec_x');
  } finally {
    redis.disconnect();
  }
  await resolved.stop();
  assert.is(statSync(dir).mode & 0o777, 0o700);
  const files = ['redis.log', ...readdirSync(join(dir, 'appendonlydir')).map((f) => join('appendonlydir', f))];
  for (const file of files) assert.is(statSync(join(dir, file)).mode & 0o077, 0, `${file}: ${(statSync(join(dir, file)).mode & 0o777).toString(8)}`);
  assert.is(statSync(join(dir, 'appendonlydir')).mode & 0o077, 0);
});

embedded('a watched server that dies is started again on the same data, told in a warning, and the restarted one is stopped with the service (probe EE: 503 for good)', async (ctx) => {
  const dataDir = temp(ctx, 'restart');
  const log = keptLog();
  const resolved = await resolveEmbedded(ctx, dataDir, await nobody(), { log, watch: true, limits: { watchMs: 100 } }, { EMBEDDED_REDIS_APPENDFSYNC: 'always' });
  const socket = (resolved.target as { path: string }).path;
  const redis = connectRedis(resolved.target);
  redis.on('error', () => undefined); // refused while the server is gone
  try {
    await redis.set('kept', 'yes');
    const pid = Number(/process_id:(\d+)/.exec(await redis.info('server'))![1]);
    process.kill(pid, 'SIGKILL');
    await waitFor('a new server', async () => (await pingReply(socket)) === '+PONG' && serversOf(dataDir)[0]?.split(' ')[0] !== String(pid), 15_000, 50);
    assert.is(await redis.get('kept'), 'yes', 'the client reconnects to the new server, whose data is the old one\'s');
    assert.ok(log.lines.some((line) => line.startsWith('warn the embedded redis-server is gone: starting it again') && line.includes(`"redisPid":${pid}`)), log.lines.join('\n'));
  } finally {
    redis.disconnect();
  }
  await resolved.stop();
  assert.is(serversOf(dataDir).length, 0, 'the restarted server is stopped with the service');
});

embedded('a watched server that cannot be started again is lost: `lost` says why, after the bounded attempts', async (ctx) => {
  const dataDir = temp(ctx, 'lost');
  const log = keptLog();
  const resolved = await resolveEmbedded(ctx, dataDir, await nobody(), { log, watch: true, limits: { watchMs: 100, restarts: 2, restartBackoffMs: 50 } });
  const pid = Number((await serversOf(dataDir))[0]!.split(' ')[0]);
  const path = process.env.PATH;
  process.env.PATH = temp(ctx, 'no-redis'); // nothing to start it with
  try {
    process.kill(pid, 'SIGKILL');
    const lost = await Promise.race([resolved.lost!, new Promise<string>((r) => setTimeout(() => r('not lost after 10 s'), 10_000))]);
    assert.instance(lost, Error);
    assert.is((lost as Error).message, `the embedded redis-server (pid ${pid}) is gone and did not start again after 2 attempts: ${INSTALL_HINT}`);
    assert.is(log.lines.filter((line) => line.startsWith('warn the embedded redis-server is gone')).length, 2, log.lines.join('\n'));
  } finally {
    process.env.PATH = path;
  }
  await resolved.stop();
});

embedded('a redis.pid naming a live process that is not the folder\'s redis-server (a reused pid, a tail of its log) does not stop a start (probe EJ: refused every start, naming that process)', async (ctx) => {
  const dataDir = temp(ctx, 'reused-pid');
  const dir = join(dataDir, 'redis');
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  writeFileSync(join(dir, 'redis.log'), '');
  const tail = spawn('tail', ['-f', join(dir, 'redis.log')], { stdio: 'ignore' });
  try {
    writeFileSync(join(dir, 'redis.pid'), `${tail.pid}\n`);
    const resolved = await resolveEmbedded(ctx, dataDir, await nobody(), { limits: { answerMs: 3_000 } });
    assert.is(await pingReply((resolved.target as { path: string }).path), '+PONG');
    await resolved.stop();
  } finally {
    tail.kill('SIGKILL');
  }
});

embedded('a data folder of another user is refused, not used (probe EJ: taken over silently, its owner could read every key)', async (ctx) => {
  if (process.getuid?.() !== 0) return; // only root can give a folder away (CI runs as root)
  const dataDir = temp(ctx, 'foreign');
  const dir = join(dataDir, 'redis');
  mkdirSync(dir, { recursive: true, mode: 0o777 });
  chownSync(dir, 65534, 65534);
  const err = await resolveEmbedded(ctx, dataDir, await nobody()).catch((e: Error) => e);
  assert.instance(err, ConfigError);
  assert.match((err as Error).message, /^the embedded Redis folder .*redis belongs to another user \(uid 65534\)/);
  assert.is(serversOf(dataDir).length, 0);
});

embedded('a service told to stop while its watcher restarts the server makes no more attempts (probe EJ: each spawned a server and killed it, and the stop ran into its 15 s limit)', async (ctx) => {
  const dataDir = temp(ctx, 'restart-stop');
  const log = keptLog();
  const abort = new AbortController();
  const resolved = await resolveEmbedded(ctx, dataDir, await nobody(), { log, watch: true, abort: abort.signal, limits: { watchMs: 50, restarts: 5, restartBackoffMs: 100 } });
  const pid = Number(serversOf(dataDir)[0]!.split(' ')[0]);
  const path = process.env.PATH;
  process.env.PATH = temp(ctx, 'no-redis-2'); // every attempt fails
  try {
    process.kill(pid, 'SIGKILL');
    await waitFor('the first attempt', async () => log.lines.some((line) => line.startsWith('warn the embedded redis-server is gone')), 5_000, 20);
    abort.abort(); // the service's signal
    await new Promise((r) => setTimeout(r, 1_600)); // the four other attempts would be made by now
    assert.is(log.lines.filter((line) => line.startsWith('warn the embedded redis-server is gone')).length, 1, log.lines.join('\n'));
  } finally {
    process.env.PATH = path;
  }
  await resolved.stop();
});

embedded('a start waiting for a server another process spawned, which that process then stops mid-load, starts one of its own (probe EJ: it failed, one of the Procfile roles restarted during a long load)', async (ctx) => {
  const dataDir = temp(ctx, 'load-gone');
  const local = await nobody();
  await seedData(ctx, dataDir, 30);
  const bin = slowLoadingRedis(ctx, 100_000); // 30 keys: 3 s of loading
  const socket = join(dataDir, 'redis', 'redis.sock');
  const first = await loadingElsewhere(dataDir, local, bin, socket);
  try {
    const log = keptLog();
    const waiting = withPath(bin, () => resolveEmbedded(ctx, dataDir, local, { log }));
    await waitFor('the second start to wait', async () => log.lines.some((line) => line.startsWith('info waiting for the embedded redis-server')), 10_000, 20);
    // the first process stops, and its loading server with it
    first.kill('SIGKILL');
    for (const line of serversOf(dataDir)) process.kill(Number(line.split(' ')[0]), 'SIGKILL');
    const next = await waiting;
    assert.is(await pingReply(socket), '+PONG');
    assert.is(serversOf(dataDir).length, 1, serversOf(dataDir).join('\n'));
    const redis = connectRedis(next.target);
    try {
      assert.is(await redis.dbsize(), 30, 'the same data');
    } finally {
      redis.disconnect();
    }
    await next.stop();
  } finally {
    first.kill('SIGKILL');
  }
});

embedded.run();
