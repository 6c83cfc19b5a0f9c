import { createServer, ServerResponse, type IncomingMessage, type Server } from 'node:http';
import { createServer as createNetServer, type AddressInfo, type Socket } from 'node:net';
import type { Duplex } from 'node:stream';
import type { Redis } from 'ioredis';
import { ConfigError, type Config, type Role } from '../lib/config.js';
import { createLogger, type Logger } from '../lib/log.js';
import { createApp } from '../http/app.js';
import { answerUnparsedRequest, cutLingering } from '../http/middleware/errors.js';
import { resolveRedis, type ResolvedRedis } from '../streams/embedded-redis.js';
import { startHeartbeat } from '../streams/heartbeat.js';
import { checkPartitionCount } from '../streams/partition-leases.js';
import { KeyCache } from '../streams/key-cache.js';
import { createKeys, type Keys } from '../streams/keys.js';
import { checkDatabase, coalesceWrites, connectRedis, describeTarget, isRedisUnavailable } from '../streams/redis.js';
import { auditsSettled } from '../streams/audit-outbox.js';
import { eventsTokenSecret, keepEventsTokenSecret } from '../streams/secrets.js';
import { ROLE_ACTORS } from './role-actors.js';
import type { RoleContext, Stop } from '../streams/role-context.js';

/** How long a stopping process waits for the audit settles of the writes it answered (messages, subscriber writes: streams/audit-outbox.ts auditsSettled). */
const AUDITS_GRACE_MS = 2_000;
/**
 * Whether a command connection auto-pipelines (ioredis): it holds each turn's commands to the turn's
 * end and keeps one such batch in flight per connection, so a process and Redis take turns on whole
 * batches, each idle while the other works, and it costs CPU per command. Measured (bench/README.md,
 * session 29): the web role without it, registrations 2,391–2,691 → 3,223–3,339/s and sends
 * 2,835–2,843 → 3,378–3,409/s; the worker without it, segments bench 11.0–11.1k → 11.5k events/s
 * with segments (28.4k → 30.9–31.5k without) and pipeline lag p99 0.9–2.6 s → 0.24–0.28 s. The
 * dispatcher keeps it: without it its drain was faster but it took the CPU sends are accepted with
 * (3,667–3,817 → 3,060–3,232 sends/s); fan-out did not move. A process running the dispatcher with
 * other roles shares its connection with them; the web role always has one of its own, whose
 * commands of one event-loop turn leave in one socket write (`coalesceWrites`; session 31, alternating
 * runs: web CPU per registration 209/195/236 against 247/216/305 µs, per message sent ~187 against
 * ~205 µs). The worker's connection does not: its chains of awaited commands each waited for the
 * turn's end, and the segments bench fell (8.1–8.8k against 9.0–9.4k events/s with segments).
 */
const commandsOf = (roles: readonly Role[]) => ({
  enableAutoPipelining: roles.includes('dispatcher'),
  // A command whose reply a dropped connection lost is not sent again after the reconnect (ioredis
  // resends by default): a write without the caller's id (events without `id`, a message without
  // Idempotency-Key) would be applied twice under one 202 (probe X2: 34 events answered `duplicate`
  // on their first and only send, after Redis was killed mid-load). Such a command fails instead
  // (ioredis 5 leaves it to `commandTimeout`, which rejects it), and the request answers 503: the
  // client retries, exactly with ids (spec 4.3.5). The other roles' writes are idempotent (applied
  // sequences, claim checks), so their resends stay.
  ...(roles.length === 1 && roles[0] === 'web' ? { commandTimeout: WEB_COMMAND_TIMEOUT_MS, autoResendUnfulfilledCommands: false } : {}),
});
/**
 * Longest wait for one Redis reply on the web role's connection: a Redis that stalls with its
 * connection open (paused, swapping, a network partition) answers requests 503 `unavailable` after
 * this (clients retry 5xx, spec Part 7) instead of holding them for the whole stall. The web's
 * commands take milliseconds; the workers' (long scripts, blocking reads) have no such limit.
 */
const WEB_COMMAND_TIMEOUT_MS = 5_000;
const WEB_COMMANDS = commandsOf(['web']);
/**
 * Longest wait for Redis's first answers at the start (the ping and the checks after it): a little
 * over what the retries of a refused connection take (~11 s), whose own reason is the line printed.
 */
const START_ANSWER_MS = 12_000;
/** How long a stopping web role waits for the requests in flight before cutting their connections. */
const SHUTDOWN_GRACE_MS = 5_000;
/**
 * How long a whole stop may take: the web role's grace and, beside it, the other roles' own stops
 * (a webhook request's 5 s, a push's answer), then the audit settles and the Redis clients' QUIT, each cut short at this deadline. With Redis unreachable,
 * those wait on commands ioredis holds until it reconnects: the stop then drops the connections
 * (what was not acked is read again by the next process; at-least-once, docs/architecture.md)
 * instead of waiting for Redis to come back.
 */
const STOP_LIMIT_MS = SHUTDOWN_GRACE_MS + 3_000;

/** `step`, or nothing once `deadline` (ms) has passed: false when it was cut short. */
async function until(deadline: number, step: Promise<unknown>): Promise<boolean> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<false>((done) => (timer = setTimeout(() => done(false), Math.max(0, deadline - Date.now()))));
  try {
    return await Promise.race([step.then(() => true), late]);
  } finally {
    clearTimeout(timer);
  }
}

/** Closes a client: QUIT when it is connected (commands sent before it are answered first), else, or past `deadline`, drops it. */
async function closeRedis(redis: Redis, deadline: number): Promise<void> {
  if (redis.status === 'ready' && (await until(deadline, redis.quit().catch(() => undefined)))) return;
  redis.disconnect();
}

/** `lost`: resolves with the reason when the embedded Redis died and could not be started again (the process then stops: bin/run.ts). */
export type Service = { url: string | null; redis: Redis; keys: Keys; config: Config; stop: () => Promise<void>; lost: Promise<Error> };

/** The error a port the web role cannot listen on is told by, or `err` itself. */
function listenError(err: NodeJS.ErrnoException, port: number): Error {
  if (err.code === 'EADDRINUSE') return new ConfigError(`PORT ${port} is already in use: stop what listens on it, or set PORT to a free port`);
  if (err.code === 'EACCES') return new ConfigError(`PORT ${port} needs privileges this process lacks: set PORT to 1024 or above`);
  return err;
}

/** How long a start waits for its port to be released (a service killed a moment ago may hold it still). */
const PORT_RELEASE_WAIT_MS = 3_000;

/**
 * Whether the web role will be able to listen on `port`, tried before anything starts: a port in
 * use (a second `npm start` beside a running one) stopped the start only once Redis, an embedded
 * server and the other roles' actors had started, and they had taken work (leases, fan-outs) to
 * give back (probe BG). One in use is tried again for up to PORT_RELEASE_WAIT_MS: a restart right
 * after a kill of `npm start` lost the race with the old service releasing it (probe EE). The
 * listen itself still tells a port taken in between.
 */
async function checkPort(port: number): Promise<void> {
  if (port === 0) return;
  for (const deadline = Date.now() + PORT_RELEASE_WAIT_MS; ; await new Promise((r) => setTimeout(r, 100))) {
    const err = await tryListen(port);
    if (err === null) return;
    if (err.code !== 'EADDRINUSE' || Date.now() > deadline) throw listenError(err, port);
  }
}

/** Listens on `port` and closes it again: null, or the error the listen failed with. */
function tryListen(port: number): Promise<NodeJS.ErrnoException | null> {
  return new Promise((done) => {
    const probe = createNetServer();
    probe.once('error', (err: NodeJS.ErrnoException) => done(err));
    probe.listen(port, () => probe.close(() => done(null)));
  });
}

/**
 * Starts `roles` in this process: one Redis client for commands, the web server when `web` is
 * among them, and the long-running actors of the other roles. `stop` ends them in reverse order,
 * except the actors, whose stops begin at once. `abort` ends a wait for the embedded Redis loading its
 * data (a server the start spawned is then stopped).
 */
export async function startService(config: Config, roles: Role[], log: Logger = createLogger(config.logLevel, { roles }), abort?: AbortSignal): Promise<Service> {
  if (roles.includes('web')) await checkPort(config.port);
  const resolved: ResolvedRedis = await resolveRedis(config, undefined, { log, watch: true, abort });
  const webOnly = roles.length === 1 && roles[0] === 'web';
  const redis = connectRedis(resolved.target, commandsOf(roles));
  // Until Redis first answers, its connection errors are debug lines: a Redis that never answers is
  // told once, by the one line the start's failure prints (README), not by a warning per retry.
  const seen: { error?: Error; ready?: boolean } = {};
  redis.on('error', (err: Error) => {
    seen.error = err;
    if (seen.ready) log.warn('redis connection error', { err: err.message });
    else log.debug('redis connection error while starting', { err: err.message });
  });
  const keys = createKeys(config.keyPrefix);
  let silence: NodeJS.Timeout | undefined;
  try {
    const checks = (async () => {
      // ioredis's own message after its retries ("Reached the max retries per request limit") says
      // neither what nor why: the connection's last error does
      await redis.ping().catch((err: Error) => {
        // a web role alone times its commands out (5 s): said as the other roles say it at 12 s (probe BG)
        const why = !seen.error && /Command timed out/.test(err.message)
          ? `no answer within ${WEB_COMMAND_TIMEOUT_MS / 1000} s (the connection is open, nothing replies)`
          : (isRedisUnavailable(err) && seen.error ? seen.error : err).message;
        throw new ConfigError(`cannot reach Redis at ${describeTarget(resolved.target)}: ${why}`);
      });
      await checkDatabase(redis, resolved.target);
      await checkPartitionCount(redis, keys, config.partitions);
    })();
    // a server that takes the connection and never replies (paused, a TLS endpoint given as redis://,
    // a stalled proxy) stops the start as one that refuses it does: only the web role's commands have
    // a timeout, so the other roles waited for it forever, saying nothing (probe AP)
    const unanswered = new Promise<never>((_, reject) => {
      silence = setTimeout(() => reject(new ConfigError(`cannot reach Redis at ${describeTarget(resolved.target)}: ${seen.error?.message ?? `no answer within ${START_ANSWER_MS / 1000} s (the connection is open, nothing replies)`}`)), START_ANSWER_MS);
    });
    await Promise.race([checks, unanswered]);
  } catch (err) {
    clearTimeout(silence);
    redis.disconnect();
    await resolved.stop();
    throw err;
  }
  clearTimeout(silence);
  seen.ready = true;
  log.info('redis ready', { redis: describeTarget(resolved.target), embedded: resolved.embedded });
  const stops: Stop[] = [];
  let url: string | null = null;

  const context: RoleContext = { config, redis, keys, log, target: resolved.target };
  // the roles' actors stop together, so one's wait (a webhook request in flight, a push's answer, a
  // fan-out giving its message back) does not use up another's share of the stop's limit (review of
  // session 52: the webhook dispatcher's 5 s left the message dispatcher 3 s)
  // They also begin at once when the stop begins, beside the web role's grace: a role that went on
  // taking work (webhook attempts, fan-outs) while the web role drained left what it took then
  // less time than its own stop gives it (probe BE: a 4 s receiver answered past the limit got the
  // event twice in `npm start`)
  const actorStops: Stop[] = [];
  let actorsStopping: Promise<void> | undefined;
  const stopActors = (): Promise<void> => (actorsStopping ??= Promise.all(actorStops.map((stop) => stop().catch((err: Error) => log.warn('stop failed', { err: err.message })))).then(() => undefined));
  stops.push(stopActors);
  for (const role of roles) {
    if (role === 'web') continue;
    for (const start of ROLE_ACTORS[role]) actorStops.push(await start(context));
  }

  // registered before the web role, so stopped after it: with Redis unreachable its last write waits
  // out the stop's deadline, and the web server must stop taking connections before that
  stops.push(startHeartbeat(redis, keys, roles, config.partitions));

  if (roles.includes('web')) {
    // the web role's own command client (the roles' shared one when it runs alone)
    const webRedis = coalesceWrites(webOnly ? redis : connectRedis(resolved.target, WEB_COMMANDS));
    if (webRedis !== redis) {
      webRedis.on('error', (err: Error) => log.warn('redis connection error', { err: err.message }));
      stops.push(async () => {
        await auditsSettled(AUDITS_GRACE_MS);
        await closeRedis(webRedis, Date.now() + AUDITS_GRACE_MS);
      });
    }
    const keyCache = new KeyCache(webRedis, keys, config.keyCacheTtlMs, log);
    await keyCache.start();
    stops.push(() => keyCache.stop());
    const tokenSecret = await eventsTokenSecret(webRedis, keys, config);
    const stopKeepingSecret = keepEventsTokenSecret(webRedis, keys, config, tokenSecret);
    stops.push(async () => stopKeepingSecret());
    const app = createApp({ config, redis: webRedis, keys, keyCache, log, tokenSecret });
    // Stopping answers the requests in flight (each with `Connection: close`) and closes idle
    // keep-alive connections; only what is still open after SHUTDOWN_GRACE_MS is cut. Cutting a
    // request the service had taken (events stored, a message created) would lose its answer.
    // The header is added as an answer's head is written once stopping began: no per-request
    // bookkeeping on the way (a listener, a set of responses) while the service runs.
    let closing = false;
    class Response extends ServerResponse {
      override writeHead(statusCode: number, ...rest: unknown[]): this {
        if (closing && !this.headersSent) this.setHeader('Connection', 'close');
        return (super.writeHead as (code: number, ...r: unknown[]) => this)(statusCode, ...rest);
      }
    }
    const handle = app.callback();
    const server: Server = await new Promise<Server>((done, fail) => {
      // A request must arrive whole within HTTP_REQUEST_TIMEOUT_MS (Node's default is 300 s, checked
      // every 30 s): a stalled sender or a Content-Length longer than its body is answered 400 by
      // answerUnparsedRequest about a second after the limit, and the connection goes.
      const s = createServer({
        requestTimeout: config.requestTimeoutMs,
        headersTimeout: config.requestTimeoutMs,
        connectionsCheckingInterval: Math.min(1000, config.requestTimeoutMs),
        // a missing Host is answered by the envelope middleware (Node's own 400 has no body and no Request-Id)
        requireHostHeader: false,
        ServerResponse: Response,
      }, handle);
      s.listen(config.port, () => {
        s.off('error', fail);
        done(s);
      });
      s.once('error', fail);
    }).catch(async (err: NodeJS.ErrnoException) => {
      // what started already (the other roles, Redis, an embedded server) stops before the error is told
      for (const stop of stops.reverse()) await stop().catch(() => undefined);
      await redis.quit().catch(() => redis.disconnect());
      await resolved.stop();
      throw listenError(err, config.port);
    });
    server.keepAliveTimeout = 65_000;
    // A client that half-closes after its request (`shutdown(SHUT_WR)`, a raw socket's `end()`) still
    // gets its answers, and the connection closes after the last: Node's default drops the requests
    // still being handled when it reads the FIN (an empty answer to anything slower than the FIN).
    (server as Server & { httpAllowHalfOpen: boolean }).httpAllowHalfOpen = true;
    server.on('clientError', answerUnparsedRequest);
    // Node answers these itself, outside the envelope, unless told otherwise: an `Expect` other than
    // 100-continue (a bare 417; HTTP lets a server ignore it, so the request is answered as usual)
    // and CONNECT (the socket closed unanswered; the app answers 405 or 404, then the connection closes).
    server.on('checkExpectation', handle);
    server.on('connect', (req: IncomingMessage, socket: Duplex) => {
      const res = new Response(req);
      res.shouldKeepAlive = false;
      res.assignSocket(socket as Socket);
      res.on('finish', () => socket.end());
      socket.on('error', () => socket.destroy());
      void handle(req, res);
    });
    const { port } = server.address() as AddressInfo;
    url = `http://127.0.0.1:${port}`;
    log.info('web listening', { port });
    stops.push(() => new Promise<void>((done) => {
      closing = true;
      cutLingering(app);
      const force = setTimeout(() => server.closeAllConnections(), SHUTDOWN_GRACE_MS);
      server.close(() => {
        clearTimeout(force);
        done();
      });
      server.closeIdleConnections();
    }));
  }

  let stopped = false;
  return {
    url, redis, keys, config,
    lost: resolved.lost ?? new Promise<Error>(() => undefined),
    stop: async () => {
      if (stopped) return;
      stopped = true;
      const deadline = Date.now() + STOP_LIMIT_MS;
      void stopActors();
      for (const stop of stops.reverse()) {
        const done = await until(deadline, stop().catch((err: Error) => log.warn('stop failed', { err: err.message })));
        // Redis not answering is one cause; a push or webhook request still out is another (probe V)
        if (!done) log.warn('stop cut short: a role\'s work in flight (Redis commands, pushes, webhook requests) did not end in time', { limitMs: STOP_LIMIT_MS, redis: redis.status });
      }
      // the ledger appends of messages answered before the stop (web, and a worker's workflow sends)
      await until(deadline, auditsSettled(AUDITS_GRACE_MS));
      await closeRedis(redis, deadline);
      await resolved.stop();
    },
  };
}
