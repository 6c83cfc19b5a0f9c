import { randomBytes } from 'node:crypto';
import type { Redis } from 'ioredis';
import type { Config } from '../lib/config.js';
import type { Keys } from './keys.js';

/** The events-token signing secret: `HERALD_TOKEN_SECRET`, else one generated once and shared through Redis. */
export async function eventsTokenSecret(redis: Redis, keys: Keys, config: Config): Promise<Uint8Array> {
  if (config.tokenSecret) return new TextEncoder().encode(config.tokenSecret);
  await redis.set(keys.eventsTokenSecret, randomBytes(32).toString('base64'), 'NX');
  return Buffer.from((await redis.get(keys.eventsTokenSecret))!, 'base64');
}
