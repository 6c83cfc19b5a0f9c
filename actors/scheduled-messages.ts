import { now } from '../lib/clock.js';
import { moveMessage } from '../streams/messages.js';
import type { RoleContext, Stop } from '../streams/role-context.js';

const DUE_EVERY_MS = 250;
const PER_TENANT = 100;
const TENANTS_PER_TICK = 10_000;

/**
 * Releases scheduled messages (`sendAt`) when due, in the scheduler role. A message record lives in
 * its tenant's slot, so its due time is kept in the tenant's `msg-due` set (written atomically with
 * the message by lua/createMessage) rather than in a partition's timers. Every tick one scheduler
 * process (a short lock) moves each due message from `scheduled` to `queued` (lua/moveMessage, a
 * compare-and-set, which also queues it for fan-out and drops it from the due set): a message
 * released twice by a process killed mid-tick is queued once.
 */
export async function startScheduledMessages(ctx: RoleContext): Promise<Stop> {
  const { redis, keys, log } = ctx;
  const lockKey = keys.lock('scheduled-messages');
  let stopped = false;
  let timer: NodeJS.Timeout | null = null;
  let running: Promise<void> = Promise.resolve();
  const release = async () => {
    if ((await redis.set(lockKey, String(process.pid), 'PX', DUE_EVERY_MS * 4, 'NX')) !== 'OK') return;
    try {
      const tenants = await redis.zrange(keys.messageTenants, 0, TENANTS_PER_TICK - 1);
      const at = now();
      const pipeline = redis.pipeline();
      for (const member of tenants) pipeline.zrangebyscore(keys.messageDue(member.split('|')[0]!), '-inf', at, 'LIMIT', 0, PER_TENANT);
      const replies = (await pipeline.exec()) ?? [];
      for (let i = 0; i < tenants.length && !stopped; i++) {
        const tenantId = tenants[i]!.split('|')[0]!;
        for (const id of (replies[i]?.[1] as string[] | undefined) ?? []) await moveMessage(redis, keys, tenantId, id, ['scheduled'], 'queued');
      }
    } finally {
      await redis.del(lockKey);
    }
  };
  const tick = () => {
    if (stopped) return;
    running = release()
      .catch((err) => log.warn('releasing scheduled messages failed', { err: (err as Error).message }))
      .finally(() => {
        if (!stopped) timer = setTimeout(tick, DUE_EVERY_MS);
      });
  };
  tick();
  return async () => {
    stopped = true;
    if (timer) clearTimeout(timer);
    await running;
  };
}
