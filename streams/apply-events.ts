import type { Redis } from 'ioredis';
import type { Keys } from './keys.js';
import { callScript } from './lua-scripts.js';

/**
 * Applies the inbox entries `ids` (in stream order) of partition `p` to its read models, exactly
 * once per sequence (lua/applyEvents-3.lua); resolves to how many were applied now. Only ids travel:
 * the script reads the entries from the inbox itself. Sending their fields instead cost Redis less
 * (no XRANGE reply turned into Lua tables) but the worker as much more, and the read-model lag grew
 * (pipeline bench, docs/events.md).
 */
export function applyEvents(redis: Redis, keys: Keys, p: number, retentionMs: number, nowMs: number, ids: readonly string[]): Promise<number> {
  return callScript<number>(redis, 'applyEvents', [keys.applied(p), keys.partitionTenants(p), keys.inbox(p)], [keys.partitionBase(p), retentionMs, nowMs, ids.length, ...ids]);
}
