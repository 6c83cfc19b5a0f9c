import { Redis, type RedisOptions } from 'ioredis';
import { defineScripts } from './lua-scripts.js';

/** Where Redis is: a URL, or the unix socket of the embedded server. */
export type RedisTarget = { url: string } | { path: string };

/**
 * A new ioredis client with every Lua script defined. Commands wait for the connection
 * (offline queue) and fail after `maxRetriesPerRequest` reconnect attempts instead of hanging.
 */
export function connectRedis(target: RedisTarget, options: RedisOptions = {}): Redis {
  // Auto-pipelining sends the commands of concurrent requests in one write: fewer syscalls per request.
  const base: RedisOptions = { maxRetriesPerRequest: 20, enableAutoPipelining: true, ...options };
  const redis = 'url' in target ? new Redis(target.url, base) : new Redis({ ...base, path: target.path });
  defineScripts(redis);
  return redis;
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
