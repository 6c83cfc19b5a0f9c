import type { Redis } from 'ioredis';
import type { Keys } from '../streams/keys.js';
import { callScript } from '../streams/lua-scripts.js';

/** Sending tenants looked at per sweep, a page at a time; more go on where the last sweep of this process stopped. */
const TENANTS_PER_SWEEP = 10_000;
const TENANTS_PER_PAGE = 500;
/** Deliveries deleted per script call (a few ms of Redis), and per sweep over every tenant (a backlog goes over the next sweeps). */
const DELIVERIES_PER_CALL = 2_000;
const DELIVERIES_PER_SWEEP = 200_000;
/** Ended messages a script call looks at. */
const MESSAGES_PER_CALL = 100;
/** Where the next sweep starts in `messageTenants`, by the list's key (a rank; a new process starts at 0). */
const tenantCursors = new Map<string, number>();

/**
 * Expires what messages leave behind (docs/messages.md, "Retention"): for each tenant that ever
 * sent (`messageTenants`), the messages that ended before `cutoff` lose their deliveries, and
 * their own record unless a caller's Idempotency-Key names them (lua/expireMessages). Bounded:
 * at most TENANTS_PER_SWEEP tenants and DELIVERIES_PER_SWEEP deliveries per call; the rest goes
 * over the next sweeps (`limits` smaller in tests). Resolves with the messages expired and the deliveries deleted.
 */
export async function expireMessages(
  redis: Redis, keys: Keys, cutoff: number, limits = { deliveriesPerCall: DELIVERIES_PER_CALL, deliveriesPerSweep: DELIVERIES_PER_SWEEP },
): Promise<{ messagesExpired: number; deliveriesDeleted: number }> {
  const list = keys.messageTenants;
  let rank = tenantCursors.get(list) ?? 0;
  let budget = limits.deliveriesPerSweep;
  let messagesExpired = 0;
  let deliveriesDeleted = 0;
  for (let done = 0; done < TENANTS_PER_SWEEP && budget > 0; done += TENANTS_PER_PAGE) {
    const tenants = (await redis.zrange(list, rank, rank + TENANTS_PER_PAGE - 1)).map((member) => member.slice(0, member.indexOf('|')));
    // one round trip finds the tenants with a message to expire
    const pipeline = redis.pipeline();
    for (const tenantId of tenants) pipeline.zrangebyscore(keys.messagesEnded(tenantId), '-inf', cutoff, 'LIMIT', 0, 1);
    const due = ((await pipeline.exec()) ?? []).flatMap(([, ids], i) => ((ids as string[] | null)?.length ? [tenants[i]!] : []));
    let stopped = -1;
    for (let i = 0; i < due.length; i++) {
      const tenantId = due[i]!;
      let more = 1;
      while (more === 1 && budget > 0) {
        const [expired, deleted, left] = await callScript<[number, number, number]>(
          redis, 'expireMessages', [keys.messagesEnded(tenantId)],
          [keys.tenantBase(tenantId), cutoff, Math.min(limits.deliveriesPerCall, budget), MESSAGES_PER_CALL],
        );
        messagesExpired += expired;
        deliveriesDeleted += deleted;
        budget -= Math.max(deleted, 1); // a call that deleted nothing still counts: the loop ends
        more = left;
      }
      if (more === 1) {
        stopped = tenants.indexOf(tenantId);
        break;
      }
    }
    if (stopped >= 0) {
      // the budget ran out in this tenant: the next sweep starts with it
      rank += stopped;
      break;
    }
    rank += tenants.length;
    if (tenants.length < TENANTS_PER_PAGE) {
      rank = 0;
      break;
    }
  }
  tenantCursors.set(list, rank);
  return { messagesExpired, deliveriesDeleted };
}
