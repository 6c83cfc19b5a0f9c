import { now } from '../lib/clock.js';
import { callScript } from '../streams/lua-scripts.js';
import type { RoleContext, Stop } from '../streams/role-context.js';
import { expireMessages } from './message-retention.js';
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
/**
 * Tenant logs trimmed per partition per sweep, TENANTS_PER_PAGE at a time; a partition holding more
 * tenants goes on where the last sweep of this process stopped (`tenantCursors`), so every tenant's
 * log is trimmed within a few sweeps however many there are.
 */
const TENANTS_PER_SWEEP = 10_000;
const TENANTS_PER_PAGE = 1_000;
/** Where each partition's next sweep starts in its tenant list, by the list's key (a rank; a new process starts at 0). */
const tenantCursors = new Map<string, number>();
/** Deleted subscribers looked at per script call, and calls per partition per sweep (a backlog goes over the next sweeps). */
const DELETED_PER_CALL = 1_000;
const DELETED_ROUNDS = 10;
/** A deleted subscriber whose state cannot go yet is looked at again this much later. */
const DELETED_RETRY_MS = 3_600_000;
/** Ended workflow runs expired per script call, and calls per partition per sweep (a backlog goes over the next sweeps). */
const RUNS_PER_CALL = 1_000;
const RUN_ROUNDS = 20;
/** How far web and Redis clocks may differ (a deletion's ms against inbox entry ids). */
const CLOCK_MARGIN_MS = 600_000;

/**
 * Makes expired data really go: every minute one worker (a short lock) trims each partition's
 * tenant logs to the retention window (and forgets a tenant that wrote nothing here within it: its
 * empty log and sample lists, not its catalog), forgets dedupe keys older than it, and forgets the sequences
 * and automation state of subscribers deleted longer than it ago once their events are through
 * (lua/forgetDeletedSubscribers), expires the workflow runs that ended before it (lua/expireRuns)
 * and the messages that ended before it with their
 * deliveries (actors/message-retention.ts). Timelines, volume buckets and HyperLogLogs expire by
 * themselves (PEXPIREAT set when written).
 */
export async function sweepRetention(ctx: RoleContext): Promise<{ dedupeRemoved: number; deletedForgotten: number; idleTenantsForgotten: number; messagesExpired: number; deliveriesDeleted: number; runsExpired: number }> {
  const { redis, keys, config } = ctx;
  const cutoff = now() - config.retentionMs;
  let dedupeRemoved = 0;
  let deletedForgotten = 0;
  let idleTenantsForgotten = 0;
  let runsExpired = 0;
  for (let p = 0; p < config.partitions; p++) {
    idleTenantsForgotten += await trimTenantLogs(ctx, p, cutoff);
    for (let round = 0; round < DEDUPE_ROUNDS; round++) {
      const old = await redis.zrangebyscore(keys.dedupeAge(p), '-inf', cutoff, 'LIMIT', 0, DEDUPE_PER_SWEEP);
      if (old.length) {
        await redis.pipeline().hdel(keys.dedupe(p), ...old).zrem(keys.dedupeAge(p), ...old).exec();
        dedupeRemoved += old.length;
      }
      if (old.length < DEDUPE_PER_SWEEP) break;
    }
    for (let round = 0; round < RUN_ROUNDS; round++) {
      const expired = await callScript<number>(redis, 'expireRuns', [keys.runsEnded(p)], [keys.partitionBase(p), cutoff, RUNS_PER_CALL]);
      runsExpired += expired;
      if (expired < RUNS_PER_CALL) break;
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
  const { messagesExpired, deliveriesDeleted } = await expireMessages(redis, keys, cutoff);
  return { dedupeRemoved, deletedForgotten, idleTenantsForgotten, messagesExpired, deliveriesDeleted, runsExpired };
}

/**
 * Trims the tenant logs of partition `p` to the retention window, up to TENANTS_PER_SWEEP of its
 * tenants from where the last sweep stopped, and forgets the tenants whose last apply here is older
 * than the window once their log is empty (lua/forgetIdleTenants). Returns how many it forgot.
 */
async function trimTenantLogs({ redis, keys }: RoleContext, p: number, cutoff: number): Promise<number> {
  const list = keys.partitionTenants(p);
  let rank = tenantCursors.get(list) ?? 0;
  let forgotten = 0;
  for (let done = 0; done < TENANTS_PER_SWEEP; done += TENANTS_PER_PAGE) {
    const page = await redis.zrange(list, rank, rank + TENANTS_PER_PAGE - 1, 'WITHSCORES');
    const idle: string[] = [];
    const pipeline = redis.pipeline();
    for (let i = 0; i < page.length; i += 2) {
      pipeline.xtrim(keys.tenantLog(p, page[i]!), 'MINID', cutoff);
      if (Number(page[i + 1]) < cutoff) idle.push(page[i]!);
    }
    await pipeline.exec();
    const gone = idle.length ? await callScript<number>(redis, 'forgetIdleTenants', [list], [keys.partitionBase(p), cutoff, ...idle]) : 0;
    forgotten += gone;
    // the forgotten ranked before the page's end: the next page starts that much sooner
    rank += page.length / 2 - gone;
    if (page.length / 2 < TENANTS_PER_PAGE) {
      rank = 0;
      break;
    }
  }
  tenantCursors.set(list, rank);
  return forgotten;
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
