import { hostname } from 'node:os';
import type { Redis } from 'ioredis';
import { now } from '../lib/clock.js';
import type { Role } from '../lib/config.js';
import type { Keys } from './keys.js';

export const HEARTBEAT_EVERY_MS = 5_000;
export const HEARTBEAT_LIVE_MS = 15_000;

/** Beats between two sweeps of the entries killed processes left (about a minute). */
const SWEEP_EVERY_BEATS = 12;

/**
 * Announces the roles of this process every few seconds; returns a stop function that removes them.
 * About once a minute it also removes the stale entries of processes that died without a stop
 * (`liveRoles`), so they do not pile up where nothing reads the health route. Each beat also records
 * the deployment's partition count again when it is gone (a Redis restarted empty: probe M), so a
 * process started later with another `HERALD_PARTITIONS` is still refused (checkPartitionCount).
 */
export function startHeartbeat(redis: Redis, keys: Keys, roles: Role[], partitions: number): () => Promise<void> {
  const fields = roles.map((role) => `${role}:${hostname()}:${process.pid}`);
  let beats = 0;
  const beat = async () => {
    await redis.pipeline()
      .hset(keys.processes, Object.fromEntries(fields.map((f) => [f, String(now())])))
      .set(keys.partitionCount, String(partitions), 'NX')
      .exec().catch(() => undefined);
    if (beats++ % SWEEP_EVERY_BEATS === 0) await liveRoles(redis, keys).catch(() => undefined);
  };
  void beat();
  const timer = setInterval(beat, HEARTBEAT_EVERY_MS);
  timer.unref();
  return async () => {
    clearInterval(timer);
    await redis.hdel(keys.processes, ...fields).catch(() => undefined);
  };
}

/** Live processes per role; stale entries (older than a minute) are removed on the way. */
export async function liveRoles(redis: Redis, keys: Keys): Promise<Record<string, number>> {
  const all = await redis.hgetall(keys.processes);
  const counts: Record<string, number> = {};
  const stale: string[] = [];
  for (const [field, at] of Object.entries(all)) {
    const age = now() - Number(at);
    if (age > 60_000) stale.push(field);
    if (age > HEARTBEAT_LIVE_MS) continue;
    const role = field.split(':')[0]!;
    counts[role] = (counts[role] ?? 0) + 1;
  }
  if (stale.length) await redis.hdel(keys.processes, ...stale);
  return counts;
}
