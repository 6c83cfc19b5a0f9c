import { now } from '../lib/clock.js';
import type { RoleContext, Stop } from '../streams/role-context.js';

const SWEEP_EVERY_MS = 60_000;
/** Dedupe entries forgotten per command; a partition's expired ones go in up to DEDUPE_ROUNDS of them per sweep. */
const DEDUPE_PER_SWEEP = 5_000;
/**
 * Bounds one sweep's work per partition: 100,000 expired dedupe entries a minute, what ~107,000
 * events/s carrying ids leave at 64 partitions (13,000/s at 8), well past what ingest takes; a
 * backlog beyond it (a long outage of the workers) goes over the next sweeps.
 */
const DEDUPE_ROUNDS = 20;
const TENANTS_PER_SWEEP = 10_000;

/**
 * Makes expired data really go: every minute one worker (a short lock) trims each partition's
 * tenant logs to the retention window and forgets dedupe keys older than it. Timelines, volume
 * buckets and HyperLogLogs expire by themselves (PEXPIREAT set when written).
 */
export async function sweepRetention(ctx: RoleContext): Promise<{ dedupeRemoved: number }> {
  const { redis, keys, config } = ctx;
  const cutoff = now() - config.retentionMs;
  let dedupeRemoved = 0;
  for (let p = 0; p < config.partitions; p++) {
    const tenants = await redis.zrange(keys.partitionTenants(p), 0, TENANTS_PER_SWEEP - 1);
    const pipeline = redis.pipeline();
    for (const t of tenants) pipeline.xtrim(keys.tenantLog(p, t), 'MINID', cutoff);
    await pipeline.exec();
    for (let round = 0; round < DEDUPE_ROUNDS; round++) {
      const old = await redis.zrangebyscore(keys.dedupeAge(p), '-inf', cutoff, 'LIMIT', 0, DEDUPE_PER_SWEEP);
      if (old.length) {
        await redis.pipeline().hdel(keys.dedupe(p), ...old).zrem(keys.dedupeAge(p), ...old).exec();
        dedupeRemoved += old.length;
      }
      if (old.length < DEDUPE_PER_SWEEP) break;
    }
  }
  return { dedupeRemoved };
}

export async function startRetentionSweeper(ctx: RoleContext): Promise<Stop> {
  const lockKey = ctx.keys.lock('retention-sweep');
  const timer = setInterval(async () => {
    try {
      if ((await ctx.redis.set(lockKey, String(process.pid), 'PX', SWEEP_EVERY_MS - 1_000, 'NX')) !== 'OK') return;
      await sweepRetention(ctx);
    } catch (err) {
      ctx.log.warn('retention sweep failed', { err: (err as Error).message });
    }
  }, SWEEP_EVERY_MS);
  timer.unref();
  return async () => clearInterval(timer);
}
