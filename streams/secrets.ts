import { randomBytes } from 'node:crypto';
import type { Redis } from 'ioredis';
import type { Config } from '../lib/config.js';
import type { Keys } from './keys.js';

/** The events-token signing secret a web process uses; `key` may be replaced (`keepEventsTokenSecret`). */
export type TokenSecret = { key: Uint8Array };

/** How often a web process checks that Redis still holds the secret it signs with. */
export const TOKEN_SECRET_CHECK_MS = 5_000;

/** The events-token signing secret: `HERALD_TOKEN_SECRET`, else one generated once and shared through Redis. */
export async function eventsTokenSecret(redis: Redis, keys: Keys, config: Config): Promise<TokenSecret> {
  if (config.tokenSecret) return { key: new TextEncoder().encode(config.tokenSecret) };
  await redis.set(keys.eventsTokenSecret, randomBytes(32).toString('base64'), 'NX');
  return { key: Buffer.from((await redis.get(keys.eventsTokenSecret))!, 'base64') };
}

/**
 * Keeps a generated secret shared by every web process after Redis lost its data: every
 * TOKEN_SECRET_CHECK_MS the process stores its secret again unless one is there (`SET NX GET`), and
 * takes the stored one when it differs. Read once at start, a process kept its own while a process
 * started after the loss stored a new one, and each refused the other's tokens (401) until
 * restarted (probe CB). With `HERALD_TOKEN_SECRET` there is nothing to keep. Returns the stop.
 */
export function keepEventsTokenSecret(redis: Redis, keys: Keys, config: Config, secret: TokenSecret, everyMs = TOKEN_SECRET_CHECK_MS): () => void {
  if (config.tokenSecret) return () => undefined;
  const check = async () => {
    const mine = Buffer.from(secret.key).toString('base64');
    const stored = await redis.call('SET', keys.eventsTokenSecret, mine, 'NX', 'GET') as string | null;
    if (stored !== null && stored !== mine) secret.key = Buffer.from(stored, 'base64');
  };
  const timer = setInterval(() => void check().catch(() => undefined), everyMs);
  timer.unref();
  return () => clearInterval(timer);
}
