import { Redis, type RedisOptions } from 'ioredis';
import { ConfigError } from '../lib/config.js';
import { defineScripts } from './lua-scripts.js';

/**
 * Where Redis is: a URL (`verifyTls: false` accepts a `rediss://` server's certificate unverified,
 * REDIS_TLS_REJECT_UNAUTHORIZED), or the unix socket of the embedded server.
 */
export type RedisTarget = { url: string; verifyTls?: boolean } | { path: string };

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
  return url.toString();
}

/** True when `err` says Redis could not be reached (as opposed to a command or script error). */
export function isRedisUnavailable(err: unknown): boolean {
  return (err as { code?: string })?.code === 'ECONNREFUSED' || /Connection is closed|max retries|ECONNRESET|ETIMEDOUT|LOADING|READONLY/i.test(String((err as Error)?.message));
}
