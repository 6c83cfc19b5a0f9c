import type { Redis } from 'ioredis';
import type { Keys } from './keys.js';
import { callScript } from './lua-scripts.js';
import type { StreamEntry } from './stream-consumer.js';

/** The inbox fields lua/applyEvents reads, in the order it reads them after each entry's id. */
const APPLIED_FIELDS = ['t', 'id', 'q', 'x', 'u', 'n', 'o', 'ts', 'r', 'd', 'c', 'ru', 'm', 'st'] as const;

/**
 * Applies inbox entries of partition `p` to its read models, exactly once per sequence
 * (lua/applyEvents-2.lua); resolves to how many were applied now. The entries travel with their
 * fields as the caller read them: the script used to read them again from the inbox by id, which
 * cost Redis as much as all the read-model writes but the tenant log's (docs/events.md).
 */
export function applyEvents(redis: Redis, keys: Keys, p: number, retentionMs: number, nowMs: number, entries: readonly StreamEntry[]): Promise<number> {
  const args: (string | number)[] = [keys.partitionBase(p), retentionMs, nowMs, entries.length];
  for (const { id, fields } of entries) {
    args.push(id);
    for (const name of APPLIED_FIELDS) args.push(fields[name] ?? '');
  }
  return callScript<number>(redis, 'applyEvents', [keys.applied(p), keys.partitionTenants(p)], args);
}
