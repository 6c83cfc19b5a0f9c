import { Command, Redis, type RedisOptions } from 'ioredis';
import { ConfigError } from '../lib/config.js';
import { defineScripts } from './lua-scripts.js';

/**
 * Where Redis is: a URL (`verifyTls: false` accepts a `rediss://` server's certificate unverified,
 * REDIS_TLS_REJECT_UNAUTHORIZED), or the unix socket of the embedded server.
 */
export type RedisTarget = { url: string; verifyTls?: boolean } | { path: string };

/**
 * ioredis's `commandTimeout` (the web role's, bin/service.ts) rejects a command from a timer. A
 * process stopped past the limit (SIGSTOP, a frozen VM, a long GC pause) runs its timers first when it
 * resumes, before it reads the replies that arrived meanwhile, so commands Redis had carried out were
 * rejected and their requests answered 503 (probe N: 15 event batches stored whole and answered 503;
 * retried without caller ids, they would be stored twice). The rejection is checked again after the
 * turn's I/O (`setImmediate`): a reply read meanwhile resolved the command, which is then left alone.
 */
function checkTimeoutsAfterIo(): void {
  type Timed = { isResolved: boolean; reject: (err: Error) => void; _commandTimeoutTimer?: NodeJS.Timeout };
  const proto = Command.prototype as unknown as Timed & { setTimeout(ms: number): void };
  proto.setTimeout = function setTimeout(this: Timed, ms: number) {
    if (this._commandTimeoutTimer) return;
    this._commandTimeoutTimer = globalThis.setTimeout(() => setImmediate(() => {
      if (!this.isResolved) this.reject(new Error('Command timed out'));
    }), ms);
  };
}
checkTimeoutsAfterIo();

/**
 * A new ioredis client with every Lua script defined. Commands wait for the connection
 * (offline queue) and fail after `maxRetriesPerRequest` reconnect attempts instead of hanging.
 */
export function connectRedis(target: RedisTarget, options: RedisOptions = {}): Redis {
  // Auto-pipelining unless the caller says otherwise: bin/service.ts decides it per role (commandsOf),
  // the CLI and benches keep it.
  const base: RedisOptions = { maxRetriesPerRequest: 20, enableAutoPipelining: true, ...options };
  const unverified = 'url' in target && target.verifyTls === false && target.url.startsWith('rediss://');
  const redis = 'url' in target ? new Redis(target.url, unverified ? { ...base, tls: { ...base.tls, rejectUnauthorized: false } } : base) : new Redis({ ...base, path: target.path });
  defineScripts(redis);
  return redis;
}

/**
 * Makes the commands a client issues during one turn of the event loop leave in one socket write:
 * on each (re)connection the socket is corked at the first write of a turn and uncorked once the
 * turn's I/O callbacks are done (`setImmediate`), so Node writes them with one `writev`. Unlike
 * ioredis auto-pipelining it never holds commands back until earlier replies are in, and the order
 * of the connection's commands is unchanged.
 */
export function coalesceWrites(redis: Redis): Redis {
  const patched = new WeakSet<object>();
  const patch = () => {
    const stream = redis.stream as typeof redis.stream | undefined;
    if (!stream || patched.has(stream)) return;
    patched.add(stream);
    const write = stream.write.bind(stream) as (...args: unknown[]) => boolean;
    let corked = false;
    stream.write = ((...args: unknown[]) => {
      if (!corked) {
        corked = true;
        stream.cork();
        setImmediate(() => {
          corked = false;
          stream.uncork();
        });
      }
      return write(...args);
    }) as typeof stream.write;
  };
  redis.on('connect', patch);
  patch();
  return redis;
}

/**
 * Checks that a connected client is in the database its URL names (`redis://host/5`). ioredis
 * reports a failed `SELECT` on connect (a number past the server's `databases`) only as an 'error'
 * event and goes on in database 0, so a deployment would silently share another one's data.
 * Throws a ConfigError naming the URL when the database is not there.
 */
export async function checkDatabase(redis: Redis, target: RedisTarget): Promise<void> {
  const db = redis.options.db ?? 0;
  if (!db) return;
  await redis.select(db).catch((err: Error) => {
    throw new ConfigError(`cannot use Redis at ${describeTarget(target)}: it has no database ${db} (${err.message})`);
  });
}

/** Human form of a target for logs (credentials removed). */
export function describeTarget(target: RedisTarget): string {
  if ('path' in target) return `unix:${target.path}`;
  const url = new URL(target.url);
  url.password = '';
  url.username = '';
  url.hash = '';
  url.search = '';
  return url.toString();
}

/** Redis's and ioredis's messages for "not now" (`isRedisUnavailable`). */
const UNAVAILABLE = /Connection is closed|Command aborted due to connection close|max retries|ECONNRESET|ETIMEDOUT|LOADING|READONLY|Command timed out|OOM command not allowed|MISCONF|NOREPLICAS|MASTERDOWN|BUSY Redis is busy/i;

/**
 * True when `err` says Redis could not be reached or cannot take writes for now (as opposed to a
 * command or script error): its memory is full (`maxmemory` with `noeviction`: `OOM`), its snapshots
 * fail (`MISCONF`), it has fewer replicas than `min-replicas-to-write` (`NOREPLICAS`), it is a replica
 * (`READONLY`), one cut off from its primary (`MASTERDOWN`), loading, or running a script past its
 * time limit (`BUSY`). Answered 503 `unavailable`, retried. (Until session 48 `NOREPLICAS` was a
 * 500 on every write, probe O.)
 */
export function isRedisUnavailable(err: unknown): boolean {
  return (err as { code?: string })?.code === 'ECONNREFUSED' || UNAVAILABLE.test(String((err as Error)?.message));
}

/**
 * Runs `write` again while Redis answers it as unavailable (`isRedisUnavailable`: memory full,
 * NOREPLICAS, a failover, a dropped connection), after 100 ms and then twice as long each time up to
 * 2 s, for at most `withinMs` in all; then (or at once, for any other error) throws. For a write that
 * records what cannot be had again, a push provider's or a webhook receiver's answers: until session
 * 48 a refusal of one second left them to a claim or lease, which sent them again a minute later
 * (probe P: 200 pushes APNs had accepted, 32 webhook deliveries).
 */
export async function retryWhileUnavailable<T>(write: () => Promise<T>, withinMs: number): Promise<T> {
  const until = Date.now() + withinMs;
  for (let wait = 100; ; wait = Math.min(wait * 2, 2_000)) {
    try {
      return await write();
    } catch (err) {
      if (!isRedisUnavailable(err) || Date.now() + wait > until) throw err;
      await new Promise((r) => setTimeout(r, wait));
    }
  }
}
