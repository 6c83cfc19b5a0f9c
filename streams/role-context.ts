import type { Redis } from 'ioredis';
import type { Config } from '../lib/config.js';
import type { Logger } from '../lib/log.js';
import type { Keys } from './keys.js';
import type { RedisTarget } from './redis.js';

export type Stop = () => Promise<void>;
/** What every actor starts with; actors open their own blocking connections from `target`. */
export type RoleContext = { config: Config; redis: Redis; keys: Keys; log: Logger; target: RedisTarget };
export type StartActor = (ctx: RoleContext) => Promise<Stop>;
