import type { Redis } from 'ioredis';
import type { Keys } from './keys.js';
import { callScript } from './lua-scripts.js';
import { WORKER_LEASES } from './partition-leases.js';

/**
 * Who applies a worker's batch: `owner` must hold the partition's worker lease, and nothing older
 * than `firstId` (the batch's first entry) may be pending in `group` (lua/applyEvents-4.lua).
 */
export type ApplyGuard = { owner: string; group: string; firstId: string };

/** The worker does not hold the partition's lease any more: it must stop working the partition. */
export class LeaseLost extends Error {
  constructor(readonly partition: number) {
    super(`the lease of partition ${partition} was lost`);
  }
}

/** An entry older than the batch is pending (read by a worker that lost the lease, or failed): it goes first. */
export class OlderEntriesPending extends Error {
  constructor(readonly partition: number) {
    super(`older entries of partition ${partition} are pending`);
  }
}

/**
 * Applies the inbox entries `ids` (in stream order) of partition `p` to its read models, exactly
 * once per sequence (lua/applyEvents-4.lua); resolves to how many were applied now. Only ids travel:
 * the script reads the entries from the inbox itself. Sending their fields instead cost Redis less
 * (no XRANGE reply turned into Lua tables) but the worker as much more, and the read-model lag grew
 * (pipeline bench, docs/events.md). A worker's batch carries its `guard`: `LeaseLost` or
 * `OlderEntriesPending` when it does not hold (nothing applied then); null for tools and tests that
 * apply outside a consumer group.
 */
export async function applyEvents(redis: Redis, keys: Keys, p: number, retentionMs: number, nowMs: number, ids: readonly string[], guard: ApplyGuard | null): Promise<number> {
  const applied = await callScript<number>(redis, 'applyEvents', [keys.applied(p), keys.partitionTenants(p), keys.inbox(p), keys.lease(p, WORKER_LEASES)],
    [keys.partitionBase(p), retentionMs, nowMs, ids.length, ...ids, guard?.owner ?? '', guard?.group ?? '', guard?.firstId ?? '']);
  if (applied === -1) throw new LeaseLost(p);
  if (applied === -2) throw new OlderEntriesPending(p);
  return applied;
}
