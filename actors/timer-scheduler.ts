import { randomBytes } from 'node:crypto';
import { hostname } from 'node:os';
import { now } from '../lib/clock.js';
import { callScript } from '../streams/lua-scripts.js';
import { PartitionLeases } from '../streams/partition-leases.js';
import { releaseScheduledMessages } from './scheduled-messages.js';
import type { RoleContext, Stop } from '../streams/role-context.js';

/** How often the scheduler looks for due timers: the bound on firing lag (plus the worker's own). */
export const TIMER_TICK_MS = 200;
const FIRE_BATCH = 500;
const ROUNDS_PER_TICK = 20;

/**
 * The scheduler role: partitions are leased (group `scheduler`, one holder each) and every tick the
 * holder fires each owned partition's due timers (lua/fireTimers: removed from `{pN}:timers` and
 * appended to the timer inbox `{pN}:tin` atomically, so each fires once), then releases its due
 * scheduled messages (actors/scheduled-messages.ts). A timer costs a sorted-set member until it
 * is due and nothing else: there is one loop per process, not one per timer.
 */
export async function startTimerScheduler(ctx: RoleContext): Promise<Stop> {
  const { redis, keys, config, log } = ctx;
  const owner = `scheduler:${hostname()}:${process.pid}:${randomBytes(4).toString('hex')}`;
  const leases = new PartitionLeases(redis, keys, { group: 'scheduler', owner, partitions: config.partitions, leaseMs: config.leaseMs, tickMs: Math.max(100, Math.floor(config.leaseMs / 5)), log });
  await leases.start();
  let stopped = false;
  let timer: NodeJS.Timeout | null = null;
  let running: Promise<void> = Promise.resolve();

  const fire = async () => {
    let pending = leases.owned();
    for (let round = 0; round < ROUNDS_PER_TICK && pending.length && !stopped; round++) {
      const at = now();
      const pipeline = redis.pipeline();
      for (const p of pending) callScript(pipeline, 'fireTimers', [keys.timers(p), keys.timerInbox(p)], [at, FIRE_BATCH]);
      const replies = (await pipeline.exec()) ?? [];
      pending = pending.filter((_, i) => Number(replies[i]?.[1] ?? 0) >= FIRE_BATCH);
    }
    await releaseScheduledMessages(ctx, leases.owned(), now(), () => stopped);
  };
  const tick = () => {
    if (stopped) return;
    running = fire()
      .catch((err) => log.warn('firing timers failed', { err: (err as Error).message }))
      .finally(() => {
        if (!stopped) timer = setTimeout(tick, TIMER_TICK_MS);
      });
  };
  tick();
  log.info('timer scheduler started', { owner });
  return async () => {
    stopped = true;
    if (timer) clearTimeout(timer);
    await running;
    await leases.stop();
  };
}
