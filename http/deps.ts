import type { Redis } from 'ioredis';
import type { Config } from '../lib/config.js';
import type { Logger } from '../lib/log.js';
import type { KeyCache } from '../streams/key-cache.js';
import type { Keys } from '../streams/keys.js';
import type { TokenSecret } from '../streams/secrets.js';

/** What the HTTP layer is given: configuration, one Redis client, the key builder, the key cache, a logger, the events-token secret. */
export type AppDeps = { config: Config; redis: Redis; keys: Keys; keyCache: KeyCache; log: Logger; tokenSecret: TokenSecret };
