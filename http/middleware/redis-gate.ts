import type { Context, Next } from 'koa';
import type { Redis } from 'ioredis';
import { ApiError } from '../../lib/errors.js';

/** Routes that answer without Redis, or bound their own wait on it (health pings with a 1 s timeout). */
const UNGATED = new Set(['/v1/health', '/v1/openapi.json']);

/**
 * Answers 503 `unavailable` at once while the Redis connection is down (reconnecting after Redis
 * stopped or failed over), instead of letting the request's commands wait in ioredis's offline
 * queue until its reconnect loop next flushes it: 11 s into an outage, then every 42 s. Clients
 * retry 5xx (spec Part 7); the connection comes back by itself and requests pass again.
 */
export function redisGate(redis: Redis) {
  // not async: on the path of every request, it hands on next()'s promise instead of wrapping it in another
  return function gate(ctx: Context, next: Next): Promise<void> {
    if (redis.status !== 'ready' && !UNGATED.has(ctx.path)) throw new ApiError(503, 'unavailable', 'The service is temporarily unavailable; retry later');
    return next();
  };
}
