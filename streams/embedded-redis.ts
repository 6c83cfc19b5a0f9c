import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { createConnection } from 'node:net';
import { join, resolve } from 'node:path';
import { ConfigError, type Config } from '../lib/config.js';
import type { RedisTarget } from './redis.js';

export const INSTALL_HINT =
  'redis-server is not installed and nothing answers on 127.0.0.1:6379: install Redis 7 (Debian/Ubuntu: apt-get install -y redis-server; macOS: brew install redis) or set REDIS_URL';

/** Resolves when something at `target` answers PING with PONG within `timeoutMs`. */
export function answersPing(target: { host: string; port: number } | { path: string }, timeoutMs = 500): Promise<boolean> {
  return new Promise((done) => {
    const socket = 'path' in target ? createConnection(target.path) : createConnection(target.port, target.host);
    let reply = '';
    const finish = (ok: boolean) => {
      socket.destroy();
      clearTimeout(timer);
      done(ok);
    };
    const timer = setTimeout(() => finish(false), timeoutMs);
    socket.on('connect', () => socket.write('PING\r\n'));
    socket.on('data', (chunk) => {
      reply += chunk.toString();
      if (reply.includes('\r\n')) finish(reply.startsWith('+PONG'));
    });
    socket.on('error', () => finish(false));
  });
}

export type ResolvedRedis = { target: RedisTarget; embedded: boolean; stop: () => Promise<void> };

/** True while a process with this pid exists. */
function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'EPERM';
  }
}

/** The pid written in `file`, or null. */
function ownerOf(file: string): number | null {
  try {
    const pid = Number(readFileSync(file, 'utf8').trim());
    return Number.isInteger(pid) && pid > 0 ? pid : null;
  } catch {
    return null;
  }
}

/** Asks the server on `path` to shut down (it flushes its append-only file first) and waits until it is gone. */
async function shutdownServer(path: string, limitMs = 5_000): Promise<void> {
  await new Promise<void>((done) => {
    const socket = createConnection(path);
    const timer = setTimeout(() => socket.destroy(), 1_000);
    socket.on('connect', () => socket.write('SHUTDOWN\r\n'));
    socket.on('close', () => {
      clearTimeout(timer);
      done();
    });
    socket.on('error', () => undefined);
  });
  for (const deadline = Date.now() + limitMs; Date.now() < deadline && (await answersPing({ path }, 200)); ) await new Promise((r) => setTimeout(r, 50));
}

function waitForSocket(path: string, child: ChildProcess, limitMs: number): Promise<void> {
  const deadline = Date.now() + limitMs;
  return new Promise((done, fail) => {
    let exited = false;
    child.once('exit', (code) => {
      exited = true;
      fail(new Error(`redis-server exited with code ${code} before it was ready`));
    });
    const poll = async () => {
      if (exited) return;
      if (await answersPing({ path }, 200)) return done();
      if (Date.now() > deadline) return fail(new Error(`redis-server did not answer on ${path} within ${limitMs} ms`));
      setTimeout(poll, 50);
    };
    void poll();
  });
}

/**
 * The Redis of the operator contract: `REDIS_URL` when set; else 127.0.0.1:6379 when it answers;
 * (`local`, overridable for tests) else a private `redis-server` with append-only persistence under `<dataDir>/redis`, reached
 * through a unix socket (reused when one from an earlier run still answers, and taken over, to be
 * stopped by this process, when the process that started it is gone). Throws a
 * `ConfigError` with an install hint when no `redis-server` is on the machine.
 */
export async function resolveRedis(config: Config, local: { host: string; port: number } = { host: '127.0.0.1', port: 6379 }): Promise<ResolvedRedis> {
  const none = async () => {};
  if (config.redisUrl) return { target: { url: config.redisUrl, verifyTls: config.redisTlsRejectUnauthorized }, embedded: false, stop: none };
  if (await answersPing(local)) {
    return { target: { url: `redis://${local.host}:${local.port}` }, embedded: false, stop: none };
  }
  const dir = resolve(config.dataDir, 'redis');
  const socket = join(dir, 'redis.sock');
  // The process that starts the server owns it (its pid in `owner.pid`) and stops it. A server whose
  // owner is gone (SIGKILLed) is taken over by the next process that finds it, so it still stops
  // with a service; while its owner runs, other processes (the CLI) only use it.
  const ownerFile = join(dir, 'owner.pid');
  if (await answersPing({ path: socket })) {
    const owner = ownerOf(ownerFile);
    if (owner !== null && alive(owner)) return { target: { path: socket }, embedded: true, stop: none };
    writeFileSync(ownerFile, `${process.pid}\n`);
    let stopped = false;
    const stop = async () => {
      if (stopped) return;
      stopped = true;
      await shutdownServer(socket);
    };
    return { target: { path: socket }, embedded: true, stop };
  }
  if (spawnSync('redis-server', ['--version'], { stdio: 'ignore' }).error) throw new ConfigError(INSTALL_HINT);
  mkdirSync(dir, { recursive: true });
  const child = spawn(
    'redis-server',
    ['--port', '0', '--unixsocket', socket, '--unixsocketperm', '700', '--dir', dir, '--appendonly', 'yes', '--appendfsync', config.embeddedAppendFsync, '--save', '', '--logfile', join(dir, 'redis.log')],
    // A process group of its own: Ctrl-C in a terminal signals the whole foreground group, and the
    // service, stopping gracefully, still needs Redis; `stop` below ends the server last.
    { stdio: 'ignore', detached: true },
  );
  await waitForSocket(socket, child, 10_000);
  writeFileSync(ownerFile, `${process.pid}\n`);
  const stop = () =>
    new Promise<void>((done) => {
      if (child.exitCode !== null) return done();
      const timer = setTimeout(() => child.kill('SIGKILL'), 5_000);
      child.once('exit', () => {
        clearTimeout(timer);
        done();
      });
      child.kill('SIGTERM'); // redis-server flushes the append-only file on SIGTERM
    });
  return { target: { path: socket }, embedded: true, stop };
}
