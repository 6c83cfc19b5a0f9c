import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { mkdirSync, readFileSync, statSync, unlinkSync, writeFileSync } from 'node:fs';
import { createConnection } from 'node:net';
import { join, resolve } from 'node:path';
import { ConfigError, type Config } from '../lib/config.js';
import type { RedisTarget } from './redis.js';

export const INSTALL_HINT =
  'redis-server is not installed and nothing answers on 127.0.0.1:6379: install Redis 7 (Debian/Ubuntu: apt-get install -y redis-server; macOS: brew install redis) or set REDIS_URL';

/** Sends one inline command to the server at `target` and resolves its first reply line, or null (no answer within `timeoutMs`). */
function inlineCommand(target: { host: string; port: number } | { path: string }, line: string, timeoutMs = 500): Promise<string | null> {
  return new Promise((done) => {
    const socket = 'path' in target ? createConnection(target.path) : createConnection(target.port, target.host);
    let reply = '';
    const finish = (answer: string | null) => {
      socket.destroy();
      clearTimeout(timer);
      done(answer);
    };
    const timer = setTimeout(() => finish(null), timeoutMs);
    socket.on('connect', () => socket.write(`${line}\r\n`));
    socket.on('data', (chunk) => {
      reply += chunk.toString();
      // a bulk reply ($<length>) is read whole; a status, error or integer is one line
      const bulk = /^\$(\d+)\r\n/.exec(reply);
      if (bulk ? reply.length >= bulk[0].length + Number(bulk[1]) : reply.includes('\r\n')) finish(reply);
    });
    socket.on('error', () => finish(null));
    socket.on('close', () => finish(null)); // closed without a (whole) reply: SHUTDOWN's answer
  });
}

/** Resolves when something at `target` answers PING with PONG within `timeoutMs`. */
export async function answersPing(target: { host: string; port: number } | { path: string }, timeoutMs = 500): Promise<boolean> {
  return (await inlineCommand(target, 'PING', timeoutMs))?.startsWith('+PONG') ?? false;
}

/** Connections to the server on `path` other than the one asking; null when it does not answer. */
async function otherClients(path: string): Promise<number | null> {
  const info = await inlineCommand({ path }, 'INFO clients');
  const match = info && /connected_clients:(\d+)/.exec(info);
  return match ? Number(match[1]) - 1 : null;
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

/** `: <the last line of redis-server's log>` (its reason for exiting, such as a socket path too long), or ''. */
function lastLogLine(file: string): string {
  try {
    const line = readFileSync(file, 'utf8').trim().split('\n').at(-1) ?? '';
    // `<pid>:M <date> # <message>`: the message
    const message = line.replace(/^\d+:[A-Z] .*? [#*.-] /, '').trim();
    return message ? `: ${message} (${file})` : '';
  } catch {
    return '';
  }
}

/** Asks the server on `path` to shut down (it flushes its append-only file first) and waits until it is gone. */
async function shutdownServer(path: string, limitMs = 5_000): Promise<void> {
  await inlineCommand({ path }, 'SHUTDOWN', 1_000);
  for (const deadline = Date.now() + limitMs; Date.now() < deadline && (await answersPing({ path }, 200)); ) await new Promise((r) => setTimeout(r, 50));
}

function waitForSocket(path: string, child: ChildProcess, limitMs: number, logFile: string): Promise<void> {
  const deadline = Date.now() + limitMs;
  return new Promise((done, fail) => {
    let exited = false;
    child.once('exit', (code) => {
      exited = true;
      fail(new Error(`redis-server exited with code ${code} before it was ready${lastLogLine(logFile)}`));
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
  // any Redis reply counts as an answer: one that wants a password (-NOAUTH) or is loading is the
  // operator's Redis, and the start then says why it cannot use it, rather than passing it over for a
  // private server whose data the operator never meant to use (probe BG)
  if ((await inlineCommand(local, 'PING'))?.match(/^[+-]/)) {
    return { target: { url: `redis://${local.host}:${local.port}` }, embedded: false, stop: none };
  }
  const dir = resolve(config.dataDir, 'redis');
  const socket = join(dir, 'redis.sock');
  // A unix socket path longer than the system's limit (107 bytes on Linux, 103 on macOS) makes
  // redis-server exit at start: said here, with the setting that decides it.
  if (Buffer.byteLength(socket) > MAX_SOCKET_PATH_BYTES) {
    throw new ConfigError(`the embedded Redis socket ${socket} is ${Buffer.byteLength(socket)} bytes, over the ${MAX_SOCKET_PATH_BYTES} a unix socket path may have: set HERALD_DATA_DIR to a shorter folder, or set REDIS_URL`);
  }
  // The process that starts the server owns it (its pid in `owner.pid`). A server whose owner is
  // gone (SIGKILLed) is taken over by the next process that finds it; while its owner runs, other
  // processes (the CLI, a second `npm start`) only use it. The last one out stops it: a process
  // that owns it (or finds its owner gone) stops it only when no other process is connected.
  const ownerFile = join(dir, 'owner.pid');
  const useRunning = async (): Promise<ResolvedRedis> => {
    const owner = ownerOf(ownerFile);
    const takeOver = owner === null || !alive(owner);
    if (takeOver) {
      writeFileSync(ownerFile, `${process.pid}\n`);
      // taken over: this process's setting holds from now on, as if it had started the server
      await inlineCommand({ path: socket }, `CONFIG SET appendfsync ${config.embeddedAppendFsync}`);
    }
    return { target: { path: socket }, embedded: true, stop: lastOneOut(socket, ownerFile, takeOver, () => shutdownServer(socket)) };
  };
  if (await answersPing({ path: socket })) return useRunning();
  if (spawnSync('redis-server', ['--version'], { stdio: 'ignore' }).error) throw new ConfigError(INSTALL_HINT);
  mkdirSync(dir, { recursive: true });
  // Processes of one folder started at once (the Procfile's roles, two `npm start`) would each start
  // a server on the same socket and append-only file: one starts it, the others wait and use it.
  return withStartLock(join(dir, 'start.lock'), async () => (await answersPing({ path: socket }) ? useRunning() : startServer(config, dir, socket, ownerFile)));
}

/** The longest a process may hold the start lock (starting redis-server waits up to 10 s for it); an older lock is stale. */
const START_LOCK_STALE_MS = 20_000;

/**
 * Runs `fn` holding the lock file `lock` (created exclusively, holding this pid); waits while
 * another live process holds it, for at most START_LOCK_STALE_MS plus a margin. A lock whose
 * holder is gone (SIGKILLed while starting) or older than START_LOCK_STALE_MS is removed.
 */
async function withStartLock<T>(lock: string, fn: () => Promise<T>): Promise<T> {
  const deadline = Date.now() + START_LOCK_STALE_MS + 5_000;
  for (;;) {
    if (Date.now() > deadline) throw new Error(`the embedded redis-server's start lock ${lock} was not released within ${(START_LOCK_STALE_MS + 5_000) / 1000} s`);
    try {
      writeFileSync(lock, `${process.pid}\n`, { flag: 'wx' });
      break;
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
    }
    const holder = ownerOf(lock);
    let age = 0;
    try {
      age = Date.now() - statSync(lock).mtimeMs;
    } catch {
      continue; // released meanwhile
    }
    // a holder that is gone, or a lock too old (an empty one: its writer died between creating and writing it)
    if ((holder !== null && !alive(holder)) || age > START_LOCK_STALE_MS || (holder === null && age > 1_000)) {
      // only while it still names that holder: another waiter may have removed it and taken the lock since
      if (ownerOf(lock) === holder) {
        try {
          unlinkSync(lock);
        } catch {
          // removed by another waiter
        }
      }
      continue;
    }
    await new Promise((r) => setTimeout(r, 50));
  }
  try {
    return await fn();
  } finally {
    try {
      unlinkSync(lock);
    } catch {
      // nothing to release
    }
  }
}

/** Starts the embedded redis-server under `dir`, owned by this process (`owner.pid`). */
async function startServer(config: Config, dir: string, socket: string, ownerFile: string): Promise<ResolvedRedis> {
  const logFile = join(dir, 'redis.log');
  const child = spawn(
    'redis-server',
    ['--port', '0', '--unixsocket', socket, '--unixsocketperm', '700', '--dir', dir, '--appendonly', 'yes', '--appendfsync', config.embeddedAppendFsync, '--save', '', '--logfile', logFile],
    // A process group of its own: Ctrl-C in a terminal signals the whole foreground group, and the
    // service, stopping gracefully, still needs Redis; `stop` below ends the server last.
    { stdio: 'ignore', detached: true },
  );
  await waitForSocket(socket, child, 10_000, logFile);
  writeFileSync(ownerFile, `${process.pid}\n`);
  const stopChild = () =>
    new Promise<void>((done) => {
      // gone already: exited, or killed by a signal (the OOM killer, kill -9), which leaves exitCode
      // null and signalCode set; its 'exit' has fired, so waiting for it hung the stop (probe V)
      if (child.exitCode !== null || child.signalCode !== null) return done();
      const timer = setTimeout(() => child.kill('SIGKILL'), 5_000);
      child.once('exit', () => {
        clearTimeout(timer);
        done();
      });
      child.kill('SIGTERM'); // redis-server flushes the append-only file on SIGTERM
    });
  return { target: { path: socket }, embedded: true, stop: lastOneOut(socket, ownerFile, true, stopChild, () => child.unref()) };
}

/** Longest unix socket path, in bytes, that every system Herald runs on accepts (macOS: 104 with the final NUL). */
const MAX_SOCKET_PATH_BYTES = 103;

/**
 * The `stop` of a resolve that uses the embedded server: for one that found it owned (`owns`
 * false), nothing while its owner lives; otherwise `shutdown`, unless other processes are still
 * connected (a stopping process has closed its own connections; a closing one is given up to
 * 500 ms), in which case the server is left to them (`leave`) and the last of them stops it.
 */
function lastOneOut(socket: string, ownerFile: string, owns: boolean, shutdown: () => Promise<void>, leave: () => void = () => undefined): () => Promise<void> {
  let stopped = false;
  return async () => {
    if (stopped) return;
    stopped = true;
    const owner = ownerOf(ownerFile);
    if (!owns && owner !== null && alive(owner)) return;
    for (const deadline = Date.now() + 500; ; await new Promise((r) => setTimeout(r, 50))) {
      const others = await otherClients(socket);
      if (others === null || others === 0) return shutdown();
      if (Date.now() > deadline) return leave();
    }
  };
}
