import { messageTimerPartition, releaseDueMessages } from '../streams/messages.js';
import type { RoleContext, Stop } from '../streams/role-context.js';

/** Scheduled messages released from one partition at once (a round); a tick runs rounds while one comes back full. */
const RELEASE_BATCH = 500;
const ROUNDS_PER_TICK = 20;
/** How often the repair pass walks the tenants' due sets (and once at start). */
const REPAIR_EVERY_MS = 10 * 60_000;
/** How long a pass holds its lock at most (one whose process died is taken over after it). */
const RUN_LOCK_MS = 5 * 60_000;
const TENANTS_PER_READ = 500;
const DUE_PER_READ = 1_000;

/**
 * Releases the scheduled messages (`sendAt`) of the partitions this scheduler holds, due at `atMs`
 * (called by the timer scheduler's tick, under its partition leases). A message's release time is
 * a member of a partition's `messageTimers` set (streams/messages.ts createMessage), so the work
 * per tick is one read per partition whatever the number of tenants, and a burst due at once is
 * released RELEASE_BATCH per partition and round.
 */
export async function releaseScheduledMessages(ctx: RoleContext, partitions: readonly number[], atMs: number, stopped: () => boolean): Promise<void> {
  let pending = [...partitions];
  for (let round = 0; round < ROUNDS_PER_TICK && pending.length && !stopped(); round++) {
    const taken = await Promise.all(pending.map((p) => releaseDueMessages(ctx.redis, ctx.keys, p, atMs, RELEASE_BATCH)));
    pending = pending.filter((_, i) => taken[i]! >= RELEASE_BATCH);
  }
}

/**
 * The repair pass of the scheduler role: every scheduled message is also in its tenant's due set
 * (`{t:<id>}:msg-due`, written atomically with the message by lua/createMessage, left by
 * lua/moveMessage). One process (a lock) walks every tenant that ever sent (`messageTenants`), a
 * chunk at a time, and puts each due-set member into its partition's `messageTimers` set unless it
 * is there (ZADD NX). It finds what no partition set holds: messages scheduled by an earlier
 * version (which kept only the tenant sets and read at most 10,000 tenants per tick) or by a web
 * process of that version during an upgrade. At every scheduler's start, then every REPAIR_EVERY_MS
 * (skipped while another process's pass is younger); its cost is one read per tenant and per
 * scheduled message, not per tick.
 */
export async function startScheduledMessages(ctx: RoleContext): Promise<Stop> {
  const { redis, keys, config, log } = ctx;
  // one pass at a time (held while it runs, no longer than RUN_LOCK_MS if its process dies), and a
  // periodic pass only when no pass ran in the last REPAIR_EVERY_MS; a scheduler starting runs one
  // whatever the last one (it may be the first of a new version, with web processes of the old one)
  const runLock = keys.lock('scheduled-messages-repair');
  const lastPass = keys.lock('scheduled-messages-repaired');
  const owner = `${process.pid}:${Math.random().toString(36).slice(2)}`;
  let stopped = false;
  let timer: NodeJS.Timeout | null = null;
  let running: Promise<void> = Promise.resolve();
  let first = true;
  const repair = async () => {
    const atStart = first;
    first = false;
    if (!atStart && (await redis.exists(lastPass))) return;
    if ((await redis.set(runLock, owner, 'PX', RUN_LOCK_MS, 'NX')) !== 'OK') return;
    try {
      await repairPass();
      if (!stopped) await redis.set(lastPass, owner, 'PX', REPAIR_EVERY_MS);
    } finally {
      if ((await redis.get(runLock)) === owner) await redis.del(runLock);
    }
  };
  const repairPass = async () => {
    let restored = 0;
    for (let from = 0; !stopped; from += TENANTS_PER_READ) {
      const tenants = (await redis.zrange(keys.messageTenants, from, from + TENANTS_PER_READ - 1)).map((member) => member.split('|')[0]!);
      for (const tenantId of tenants) {
        for (let at = 0; !stopped; at += DUE_PER_READ) {
          const flat = await redis.zrange(keys.messageDue(tenantId), at, at + DUE_PER_READ - 1, 'WITHSCORES');
          const pipeline = redis.pipeline();
          for (let i = 0; i < flat.length; i += 2) {
            const id = flat[i]!;
            pipeline.zadd(keys.messageTimers(messageTimerPartition(tenantId, id, config.partitions)), 'NX', flat[i + 1]!, `${tenantId}|${id}`);
          }
          for (const [err, added] of (await pipeline.exec()) ?? []) if (!err) restored += Number(added);
          if (flat.length < 2 * DUE_PER_READ) break;
        }
      }
      if (tenants.length < TENANTS_PER_READ) break;
    }
    if (restored > 0) log.info('scheduled messages restored to their partitions\' release sets', { restored });
  };
  const tick = () => {
    if (stopped) return;
    running = repair()
      .catch((err) => log.warn('the scheduled messages repair pass failed', { err: (err as Error).message }))
      .finally(() => {
        if (!stopped) timer = setTimeout(tick, REPAIR_EVERY_MS);
      });
  };
  tick();
  return async () => {
    stopped = true;
    if (timer) clearTimeout(timer);
    await running;
  };
}
