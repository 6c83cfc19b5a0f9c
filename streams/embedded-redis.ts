import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { chmodSync, mkdirSync, readFileSync, statSync, writeFileSync } from 'node:fs';
import { createConnection } from 'node:net';
import { basename, join, resolve } from 'node:path';
import { ConfigError, type Config } from '../lib/config.js';
import type { Logger } from '../lib/log.js';
import { stopChild } from '../lib/stop-child.js';
import { alive, ownerOf, withStartLock } from './pid-files.js';
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

/**
 * What the server on `path` answers PING: `ready` (PONG), `loading` (LOADING: it still reads its
 * append-only file, and takes no commands yet), `other` (another error: a server is there), or null
 * (nothing answers).
 */
async function serverAnswer(path: string, timeoutMs = 500): Promise<'ready' | 'loading' | 'other' | null> {
  const reply = await inlineCommand({ path }, 'PING', timeoutMs);
  if (reply?.startsWith('+PONG')) return 'ready';
  if (reply?.startsWith('-LOADING')) return 'loading';
  return reply?.match(/^[+-]/) ? 'other' : null;
}

/** Connections to the server on `path` other than the one asking; null when it does not answer. */
async function otherClients(path: string): Promise<number | null> {
  const info = await inlineCommand({ path }, 'INFO clients');
  const match = info && /connected_clients:(\d+)/.exec(info);
  return match ? Number(match[1]) - 1 : null;
}

/**
 * `lost`, with a watched embedded server only: resolves with the reason once the server died and
 * could not be started again (the service then stops: README).
 */
export type ResolvedRedis = { target: RedisTarget; embedded: boolean; stop: () => Promise<void>; lost?: Promise<Error> };

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

/** Waits until the spawned server answers on `path`, ready or still loading its data (probe EE: a loading one failed the start); fails when it exits, or is silent for `limitMs`. */
function waitForAnswer(path: string, child: ChildProcess, limitMs: number, logFile: string): Promise<void> {
  const deadline = Date.now() + limitMs;
  return new Promise((done, fail) => {
    let exited = false;
    child.once('exit', (code, signal) => {
      exited = true;
      fail(new Error(`redis-server exited with code ${code ?? signal} before it was ready${lastLogLine(logFile)}`));
    });
    const poll = async () => {
      if (exited) return;
      if (await serverAnswer(path, 200)) return done();
      if (Date.now() > deadline) return fail(new Error(`redis-server did not answer on ${path} within ${limitMs} ms${lastLogLine(logFile)}`));
      setTimeout(poll, 50);
    };
    void poll();
  });
}

/** The limits of the embedded server's start and watch; tests shorten them. */
export type EmbeddedLimits = {
  /** A server this process spawned must answer (PONG, or LOADING while it reads its data) within this. */
  answerMs: number;
  /** How long a server loading its data is waited for (a few GB of append-only file take minutes). */
  loadMs: number;
  /** How many times a server that died while the service runs is started again before the service gives up. */
  restarts: number;
  /** The pause before the second restart attempt, doubled for each one after. */
  restartBackoffMs: number;
  /** How often a watched server's process is checked. */
  watchMs: number;
};

export const EMBEDDED_LIMITS: EmbeddedLimits = { answerMs: 10_000, loadMs: 600_000, restarts: 5, restartBackoffMs: 1_000, watchMs: 500 };

export type ResolveOptions = {
  /** Where waits (a server loading its data) and restarts are told. */
  log?: Logger;
  /**
   * Watch the embedded server while this process runs (the service; not the CLI): one that dies
   * is started again; `lost` resolves when that fails.
   */
  watch?: boolean;
  limits?: Partial<EmbeddedLimits>;
  /** Ends the wait for a server loading its data (the service was asked to stop while it starts). */
  abort?: AbortSignal;
};

const quiet: Logger = { debug: () => undefined, info: () => undefined, warn: () => undefined, error: () => undefined };

/**
 * The Redis of the operator contract: `REDIS_URL` when set; else 127.0.0.1:6379 when it answers;
 * (`local`, overridable for tests) else a private `redis-server` with append-only persistence under `<dataDir>/redis`, reached
 * through a unix socket (reused when one from an earlier run still answers, or is still loading its
 * data, and taken over, to be stopped by this process, when the process that started it is gone). Throws a
 * `ConfigError` with an install hint when no `redis-server` is on the machine.
 */
export async function resolveRedis(config: Config, local: { host: string; port: number } = { host: '127.0.0.1', port: 6379 }, options: ResolveOptions = {}): Promise<ResolvedRedis> {
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
  const place: Place = { config, dir, socket, ownerFile: join(dir, 'owner.pid'), log: options.log ?? quiet, limits: { ...EMBEDDED_LIMITS, ...options.limits }, abort: options.abort };
  const server: Server = { owns: false, child: null, pid: null, stopping: false };
  await obtainServerAgain(place, server);
  const lost = options.watch ? watchServer(place, server) : null;
  return {
    target: { path: socket },
    embedded: true,
    stop: async () => {
      server.stopping = true;
      await lost?.stop();
      await lastOneOut(place, server)();
    },
    ...(lost ? { lost: lost.lost } : {}),
  };
}

/** A server another process started, waited for while it loaded, is gone (that process stopped it, or it died). */
class ServerGone extends Error {}

/** Starts a server of its own after one it waited for went (ServerGone) at most this many times. */
const OBTAIN_ATTEMPTS = 3;

/**
 * `obtainServer`, again when the server it waited for while it loaded went: the process that
 * spawned it stopped it (one of the Procfile's roles restarted during a long load), and this start
 * failed with it (probe EJ); it now starts one of its own.
 */
async function obtainServerAgain(place: Place, server: Server): Promise<void> {
  for (let attempt = 1; ; attempt++) {
    try {
      return await obtainServer(place, server);
    } catch (err) {
      if (!(err instanceof ServerGone) || attempt >= OBTAIN_ATTEMPTS || place.abort?.aborted) throw err;
      place.log.warn('the embedded redis-server waited for went while it loaded: starting one', { attempt });
    }
  }
}

/** Where the embedded server lives, and how this process treats it. */
type Place = { config: Config; dir: string; socket: string; ownerFile: string; log: Logger; limits: EmbeddedLimits; abort: AbortSignal | undefined };

/**
 * The embedded server as this process sees it: whether it stops it (`owns`: it started it, or took
 * it over from a process that is gone), the process when it spawned it, and its pid (for the watch).
 */
type Server = { owns: boolean; child: ChildProcess | null; pid: number | null; stopping: boolean };

/**
 * Makes `server` the embedded server, ready (its data loaded): the one running on the socket, even
 * while it loads (probe EE: a loading server answered -LOADING, was taken for none, and a second
 * one was spawned on the same append-only file), or a new one. One this process spawned is stopped
 * when it fails to get ready; one it found running is left alone.
 */
async function obtainServer(place: Place, server: Server): Promise<void> {
  const { dir, socket } = place;
  if (await serverAnswer(socket)) {
    keepPrivate(dir);
    await adoptServer(place, server);
  } else {
    if (spawnSync('redis-server', ['--version'], { stdio: 'ignore' }).error) throw new ConfigError(INSTALL_HINT);
    mkdirSync(place.config.dataDir, { recursive: true });
    mkdirSync(dir, { recursive: true, mode: 0o700 });
    keepPrivate(dir);
    // Processes of one folder started at once (the Procfile's roles, two `npm start`) would each start
    // a server on the same socket and append-only file: one starts it, the others wait and use it.
    await withStartLock(join(dir, 'start.lock'), async () => {
      if (await serverAnswer(socket)) return adoptServer(place, server);
      if (await awaitLiveServer(place)) return adoptServer(place, server);
      return spawnServer(place, server);
    });
  }
  try {
    await untilLoaded(place, server);
  } catch (err) {
    if (server.child) await stopChild(server.child, 2_000);
    throw err;
  }
  // taken over: this process's setting holds from now on, as if it had started the server
  if (server.owns && !server.child) await inlineCommand({ path: socket }, `CONFIG SET appendfsync ${place.config.embeddedAppendFsync}`);
}

/**
 * Makes the data folder readable by its owner alone (probe EE: it was 0755 under a usual umask, and
 * the append-only files, with every secret and subscriber in them, 0644). A folder of another user
 * is refused: its owner could read the data, or run the server on its socket and read everything
 * Herald writes to it (probe EJ: taken over silently, the other user read every key).
 */
function keepPrivate(dir: string): void {
  let stat;
  try {
    stat = statSync(dir);
  } catch {
    return; // not there yet
  }
  const uid = process.getuid?.();
  if (uid === undefined) return;
  if (stat.uid !== uid) {
    throw new ConfigError(`the embedded Redis folder ${dir} belongs to another user (uid ${stat.uid}): its data would not be private; set HERALD_DATA_DIR to a folder of this user (uid ${uid}), or set REDIS_URL`);
  }
  if ((stat.mode & 0o077) !== 0) chmodSync(dir, stat.mode & 0o700);
}

/** Uses the server answering on the socket; takes it over when the process that started it is gone. */
async function adoptServer(place: Place, server: Server): Promise<void> {
  const owner = ownerOf(place.ownerFile);
  server.owns = owner === null || !alive(owner);
  server.child = null;
  if (server.owns) writeFileSync(place.ownerFile, `${process.pid}\n`);
  server.pid = await serverPid(place.socket);
}

/**
 * Whether a redis-server of this folder runs without answering on its socket (just started, or its
 * socket file removed): waited for up to `answerMs`, then refused, as a second server on the same
 * append-only file would corrupt it. False when none runs.
 */
async function awaitLiveServer(place: Place): Promise<boolean> {
  const pidFile = join(place.dir, 'redis.pid');
  const pid = ownerOf(pidFile);
  if (pid === null || !alive(pid) || !isFolderServer(pid, place.socket)) return false;
  for (const deadline = Date.now() + place.limits.answerMs; Date.now() < deadline; await sleep(100)) {
    if (await serverAnswer(place.socket)) return true;
    if (!alive(pid)) return false;
  }
  throw new ConfigError(`a redis-server (pid ${pid}, ${pidFile}) runs on ${place.dir} but does not answer on ${place.socket}: stop it before starting Herald (or, if pid ${pid} is not that server, delete ${pidFile})`);
}

/**
 * Whether the process `pid` is this folder's redis-server: a pid file's pid may have been reused
 * by another program since (a reboot), another folder's redis-server, or a `tail -f` of the folder's
 * log, which a match of `redis` in its arguments took for it and refused every start (probe EJ). Its
 * program is redis-server, and its arguments (or the title it gives itself, `unixsocket:<path>`) name
 * this folder's socket.
 */
function isFolderServer(pid: number, socket: string): boolean {
  const ps = (field: string) => spawnSync('ps', ['-o', `${field}=`, '-p', String(pid)], { encoding: 'utf8' });
  const comm = ps('comm');
  // without ps, a live pid is taken to be the server: refusing to start is safer than a second server
  if (comm.error) return true;
  return namesFolderServer(comm.stdout.trim(), ps('args').stdout.trim(), socket);
}

/**
 * Whether a process whose `ps` `comm` and `args` are these is a redis-server naming `socket`. Linux's
 * ps prints the program's name as `comm`, macOS's (BSD) its whole path
 * (`/opt/homebrew/bin/redis-server`, perhaps with spaces), which the name alone never matched
 * (probes EN, EW): there, a live server still loading would have been taken for none.
 */
export function namesFolderServer(comm: string, args: string, socket: string): boolean {
  return /^redis-server\b/.test(basename(comm)) && args.includes(socket);
}

/** The pid of the server on `socket` (INFO answers while it loads), or null. */
async function serverPid(socket: string): Promise<number | null> {
  const match = /process_id:(\d+)/.exec((await inlineCommand({ path: socket }, 'INFO server')) ?? '');
  return match ? Number(match[1]) : null;
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/**
 * Spawns the embedded redis-server, owned by this process (`owner.pid`, written at once), and waits
 * until it answers, loading or ready; stopped when it does not (probe EE: one left loading after a
 * failed start was found by the next start).
 */
async function spawnServer(place: Place, server: Server): Promise<void> {
  const { dir, socket, config } = place;
  const logFile = join(dir, 'redis.log');
  const args = ['--port', '0', '--unixsocket', socket, '--unixsocketperm', '700', '--dir', dir, '--pidfile', join(dir, 'redis.pid'), '--appendonly', 'yes', '--appendfsync', config.embeddedAppendFsync, '--save', '', '--logfile', logFile];
  const child = spawn(
    // under umask 077 its files (append-only, log) are its owner's alone (probe EE); exec keeps the pid
    '/bin/sh', ['-c', 'umask 077 && exec redis-server "$@"', 'redis-server', ...args],
    // A process group of its own: Ctrl-C in a terminal signals the whole foreground group, and the
    // service, stopping gracefully, still needs Redis; `stop` ends the server last.
    { stdio: 'ignore', detached: true },
  );
  writeFileSync(place.ownerFile, `${process.pid}\n`);
  Object.assign(server, { owns: true, child, pid: child.pid ?? null });
  try {
    await waitForAnswer(socket, child, place.limits.answerMs, logFile);
  } catch (err) {
    await stopChild(child, 2_000);
    throw err;
  }
}

/** Waits until the server answers PONG (its data loaded), saying once in a while what it waits for; at most `loadMs`. */
async function untilLoaded(place: Place, server: Server): Promise<void> {
  const { socket, limits, log } = place;
  const started = Date.now();
  let told = 0;
  for (;;) {
    const answer = await serverAnswer(socket, 1_000);
    if (answer === 'ready') return;
    const { child } = server;
    if (child && (child.exitCode !== null || child.signalCode !== null)) throw new Error(`redis-server exited with code ${child.exitCode ?? child.signalCode} before it was ready${lastLogLine(join(place.dir, 'redis.log'))}`);
    if (!child && answer === null && (server.pid === null || !alive(server.pid))) throw new ServerGone(`the embedded redis-server on ${socket} stopped answering while it loaded its data`);
    if (server.stopping || place.abort?.aborted) throw new Error('stopping');
    const waited = Date.now() - started;
    if (waited > limits.loadMs) throw new Error(`the embedded redis-server on ${socket} did not finish loading its data within ${limits.loadMs / 1000} s${lastLogLine(join(place.dir, 'redis.log'))}`);
    if (answer === 'loading' && (told === 0 || Date.now() - told >= 15_000)) {
      told = Date.now();
      log.info('waiting for the embedded redis-server to load its data', { socket, redisPid: server.pid, waitedS: Math.round(waited / 1000), limitS: limits.loadMs / 1000 });
    }
    await sleep(100);
  }
}

/**
 * Watches the embedded server's process while the service runs (probe EE: one killed left every
 * request answering 503 for good): when it is gone, it is started again on the same data (or the one
 * another process started meanwhile is used), up to `restarts` attempts with a doubling pause, each
 * told in a warning. `lost` resolves with the reason when they all fail.
 */
function watchServer(place: Place, server: Server): { lost: Promise<Error>; stop: () => Promise<void> } {
  const { log, limits } = place;
  let tell: (err: Error) => void = () => undefined;
  const lost = new Promise<Error>((done) => (tell = done));
  let restarting: Promise<void> | null = null;
  // the service stopping: set at once by its signal (`abort`), `server.stopping` only once the roles
  // have stopped, up to 8 s later; meanwhile each attempt spawned a server and killed it again (probe EJ)
  const stopping = () => server.stopping || place.abort?.aborted === true;
  const restart = async (pid: number) => {
    let last: Error | null = null;
    for (let attempt = 1; attempt <= limits.restarts && !stopping(); attempt++) {
      if (attempt > 1) await sleep(limits.restartBackoffMs * 2 ** (attempt - 2));
      if (stopping()) return;
      log.warn('the embedded redis-server is gone: starting it again', { redisPid: pid, attempt, of: limits.restarts, socket: place.socket });
      try {
        await obtainServer(place, server);
        log.info('the embedded redis-server runs again', { redisPid: server.pid, owns: server.owns });
        return;
      } catch (err) {
        last = err as Error;
        log.warn('the embedded redis-server did not start again', { attempt, err: last.message });
      }
    }
    if (stopping()) return;
    clearInterval(timer); // given up: the service stops (bin/run.ts)
    tell(new Error(`the embedded redis-server (pid ${pid}) is gone and did not start again after ${limits.restarts} attempts: ${last?.message}`));
  };
  const timer = setInterval(() => {
    if (restarting || stopping() || server.pid === null || alive(server.pid)) return;
    const gone = server.pid;
    server.child = null;
    restarting = restart(gone).finally(() => (restarting = null));
  }, limits.watchMs);
  timer.unref();
  return {
    lost,
    stop: async () => {
      clearInterval(timer);
      await restarting; // a restart under way ends (its wait for the data to load gives up at once), stopping a server it spawned
    },
  };
}

/** Longest unix socket path, in bytes, that every system Herald runs on accepts (macOS: 104 with the final NUL). */
const MAX_SOCKET_PATH_BYTES = 103;

/**
 * The `stop` of a resolve that uses the embedded server: for one that found it owned (`owns`
 * false), nothing while its owner lives; otherwise a shutdown (of the process it spawned, or over the
 * socket), unless other processes are still connected (a stopping process has closed its own
 * connections; a closing one is given up to 500 ms), in which case the server is left to them and the
 * last of them stops it.
 */
function lastOneOut(place: Place, server: Server): () => Promise<void> {
  let stopped = false;
  return async () => {
    if (stopped) return;
    stopped = true;
    const owner = ownerOf(place.ownerFile);
    if (!server.owns && owner !== null && alive(owner)) return;
    for (const deadline = Date.now() + 500; ; await sleep(50)) {
      const others = await otherClients(place.socket);
      if (others === null || others === 0) return server.child ? stopChild(server.child) : shutdownServer(place.socket);
      if (Date.now() > deadline) return void server.child?.unref();
    }
  };
}
