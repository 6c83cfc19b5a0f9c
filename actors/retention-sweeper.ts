import { now } from '../lib/clock.js';
import { callScript } from '../streams/lua-scripts.js';
import type { RoleContext, Stop } from '../streams/role-context.js';
import { ACTOR_GROUP } from './subscriber-actor.js';

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
/** Deleted subscribers looked at per script call, and calls per partition per sweep (a backlog goes over the next sweeps). */
const DELETED_PER_CALL = 1_000;
const DELETED_ROUNDS = 10;
/** A deleted subscriber whose state cannot go yet is looked at again this much later. */
const DELETED_RETRY_MS = 3_600_000;
/** How far web and Redis clocks may differ (a deletion's ms against inbox entry ids). */
const CLOCK_MARGIN_MS = 600_000;

/**
 * Makes expired data really go: every minute one worker (a short lock) trims each partition's
 * tenant logs to the retention window, forgets dedupe keys older than it, and forgets the sequences
 * and automation state of subscribers deleted longer than it ago once their events are through
 * (lua/forgetDeletedSubscribers). Timelines, volume buckets and HyperLogLogs expire by themselves
 * (PEXPIREAT set when written).
 */
export async function sweepRetention(ctx: RoleContext): Promise<{ dedupeRemoved: number; deletedForgotten: number }> {
  const { redis, keys, config } = ctx;
  const cutoff = now() - config.retentionMs;
  let dedupeRemoved = 0;
  let deletedForgotten = 0;
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
    for (let round = 0; round < DELETED_ROUNDS; round++) {
      const [forgotten, unlisted, postponed] = await callScript<[number, number, number]>(
        redis, 'forgetDeletedSubscribers',
        [keys.deletedSubscribers(p), keys.subscribers(p), keys.sequences(p), keys.applied(p), keys.inbox(p)],
        [keys.partitionBase(p), cutoff, DELETED_PER_CALL, ACTOR_GROUP, CLOCK_MARGIN_MS, DELETED_RETRY_MS],
      );
      deletedForgotten += forgotten;
      if (forgotten + unlisted + postponed < DELETED_PER_CALL) break;
    }
  }
  return { dedupeRemoved, deletedForgotten };
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
