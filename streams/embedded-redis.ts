import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { mkdirSync } from 'node:fs';
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
 * through a unix socket (reused when one from an earlier run still answers). Throws a
 * `ConfigError` with an install hint when no `redis-server` is on the machine.
 */
export async function resolveRedis(config: Config, local: { host: string; port: number } = { host: '127.0.0.1', port: 6379 }): Promise<ResolvedRedis> {
  const none = async () => {};
  if (config.redisUrl) return { target: { url: config.redisUrl }, embedded: false, stop: none };
  if (await answersPing(local)) {
    return { target: { url: `redis://${local.host}:${local.port}` }, embedded: false, stop: none };
  }
  const dir = resolve(config.dataDir, 'redis');
  const socket = join(dir, 'redis.sock');
  if (await answersPing({ path: socket })) return { target: { path: socket }, embedded: true, stop: none };
  if (spawnSync('redis-server', ['--version'], { stdio: 'ignore' }).error) throw new ConfigError(INSTALL_HINT);
  mkdirSync(dir, { recursive: true });
  const child = spawn(
    'redis-server',
    ['--port', '0', '--unixsocket', socket, '--unixsocketperm', '700', '--dir', dir, '--appendonly', 'yes', '--appendfsync', 'everysec', '--save', '', '--logfile', join(dir, 'redis.log')],
    // A process group of its own: Ctrl-C in a terminal signals the whole foreground group, and the
    // service, stopping gracefully, still needs Redis; `stop` below ends the server last.
    { stdio: 'ignore', detached: true },
  );
  await waitForSocket(socket, child, 10_000);
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
