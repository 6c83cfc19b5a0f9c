import { randomBytes } from 'node:crypto';
import { hostname } from 'node:os';
import { now } from '../lib/clock.js';
import type { RoleContext, Stop } from '../streams/role-context.js';
import { applyEvents, LeaseLost } from '../streams/apply-events.js';
import { READ_BUDGET, StreamConsumer, type StreamEntry } from '../streams/stream-consumer.js';
import { PartitionLeases, WORKER_LEASES } from '../streams/partition-leases.js';
import { connectRedis } from '../streams/redis.js';
import { forwardingWorkspaces, forwardToLedger } from '../streams/stream-ledger.js';
import { Automation } from './automation.js';
import { orderTimers } from './timer-order.js';

export const ACTOR_GROUP = 'actors';
/**
 * The actors read their partitions at most every ACTOR_LINGER_MS unless a read comes back at least
 * half full, or one partition's batch full (a backlog): an applyEvents call costs Redis ~45 µs however few events it carries plus
 * ~20 µs per event, so a batch of 16 costs 40 % per event of a batch of one (`npm run bench --
 * scripts`). It adds at most this much to the read-model lag.
 */
export const ACTOR_LINGER_MS = 50;

/**
 * Event read loops per worker, each over its share of the worker's partitions (p mod READ_LOOPS)
 * with its share of the read budget. A loop handles the batches of one read together and reads
 * again when the slowest is done, so with one loop every partition goes through the same round
 * trips at the same moments and the worker and Redis take turns (each ~0.6 core on the segments
 * bench, 2 cores free). Two loops drift apart, so one's Redis work overlaps the other's: segments
 * bench 9,934 / 10,169 → 10,919 / 11,297 events/s (alternating runs, same machine); four were no
 * better than two (bench/README.md).
 */
export const READ_LOOPS = 2;

/**
 * The subscriber actors of the worker role. The worker leases partitions; for each batch read
 * from a partition inbox it applies every event in order in one atomic script (read models plus
 * the subscriber's last applied sequence, so a redelivered event changes nothing), then forwards
 * the batch to the ledgers of workspaces that have (or had) webhook endpoints, then acks. Between the two, the
 * automation step (actors/automation.ts) keeps segments and workflow runs. The timers the scheduler
 * fires arrive in each partition's timer inbox, read by a second consumer so that a due timer is not
 * held up by the event backlog; those that must follow their subscriber's waiting events are moved
 * to the event inbox (actors/timer-order.ts), the others handled at once.
 */
export async function startSubscriberActors(ctx: RoleContext): Promise<Stop> {
  const { config, redis, keys, log } = ctx;
  const owner = `worker:${hostname()}:${process.pid}:${randomBytes(4).toString('hex')}`;
  const leases = new PartitionLeases(redis, keys, { group: WORKER_LEASES, owner, partitions: config.partitions, leaseMs: config.leaseMs, tickMs: Math.max(100, Math.floor(config.leaseMs / 5)), log });
  await leases.start();

  const partitionOfStream = new Map(Array.from({ length: config.partitions }, (_, p) => [keys.inbox(p), p]));
  const partitionOfTimerStream = new Map(Array.from({ length: config.partitions }, (_, p) => [keys.timerInbox(p), p]));
  // a partition's event and timer batches are handled one at a time, in the order they were read:
  // both work on the same subscribers' automation state (compare-and-set, lua/commitAutomation)
  const tails = new Map<number, Promise<void>>();
  const oneAtATime = (p: number, work: (p: number) => Promise<void>): Promise<void> => {
    const run = (tails.get(p) ?? Promise.resolve()).then(() => work(p));
    const tail = run.catch(() => undefined);
    tails.set(p, tail);
    void tail.then(() => tails.get(p) === tail && tails.delete(p));
    return run;
  };
  const automation = new Automation(redis, keys, log, owner);
  // The batches of one read are handed over in the same tick: they share one read of the
  // forwarding workspaces, made after their entries were read.
  let workspaces: Promise<Set<string>> | null = null;
  const workspacesOfThisRead = () => {
    if (!workspaces) {
      workspaces = forwardingWorkspaces(redis, keys);
      setImmediate(() => (workspaces = null));
    }
    return workspaces;
  };
  // partitions with an event batch that failed here (perhaps after applyEvents, before its automation
  // step): until one of their event batches succeeds (the failed one, claimed again first), their
  // applied sequences may run ahead of their automation, so no timer goes ahead of the event inbox
  const failedEvents = new Set<number>();
  const handle = (stream: string, entries: StreamEntry[]) => oneAtATime(partitionOfStream.get(stream)!, async (p) => {
    try {
      const forwarding = workspacesOfThisRead();
      forwarding.catch(() => undefined); // awaited below; a failure fails the batch there
      const events = entries.filter((entry) => entry.fields.k !== 'timer');
      if (events.length) {
        // fenced by the lease, and in stream order: nothing applied while an older entry is pending
        await applyEvents(redis, keys, p, config.retentionMs, now(), events.map((e) => e.id), { owner, group: ACTOR_GROUP, firstId: entries[0]!.id });
      }
      await automation.handle(p, entries);
      if (events.length) await forwardToLedger(redis, keys, events, await forwarding);
    } catch (err) {
      failedEvents.add(p);
      if (err instanceof LeaseLost) leases.lose(p);
      throw err;
    }
    failedEvents.delete(p);
  });
  // fired timers, read by a consumer of their own so they do not wait for the event backlog's reads;
  // while the partition's event inbox is not caught up (not adopted yet, so entries a dead worker
  // applied without their automation step may be pending there, or a batch failed here) every timer
  // follows the event inbox
  const handleTimers = (stream: string, entries: StreamEntry[]) => oneAtATime(partitionOfTimerStream.get(stream)!, async (p) => {
    const eventsOwed = failedEvents.has(p) || !consumers[p % READ_LOOPS]!.caughtUp(keys.inbox(p));
    try {
      await automation.handle(p, await orderTimers(redis, keys, p, entries, eventsOwed));
    } catch (err) {
      if (err instanceof LeaseLost) leases.lose(p);
      throw err;
    }
  });

  // a dedicated connection for each blocking read: the event read loops' and the timer consumer's
  const blocking = Array.from({ length: READ_LOOPS + 1 }, () => {
    const connection = connectRedis(ctx.target, { maxRetriesPerRequest: null });
    connection.on('error', () => undefined);
    return connection;
  });
  const consumers = Array.from({ length: READ_LOOPS }, (_, loop) => {
    const source = { mode: 'exclusive' as const, streams: () => leases.owned().filter((p) => p % READ_LOOPS === loop).map((p) => keys.inbox(p)) };
    return new StreamConsumer({
      redis, blocking: blocking[loop]!, source, group: ACTOR_GROUP, consumer: owner, handle, log, lingerMs: ACTOR_LINGER_MS, readBudget: Math.ceil(READ_BUDGET / READ_LOOPS),
    });
  });
  const timerSource = { mode: 'exclusive' as const, streams: () => leases.owned().map((p) => keys.timerInbox(p)) };
  const timerConsumer = new StreamConsumer({ redis, blocking: blocking[READ_LOOPS]!, source: timerSource, group: ACTOR_GROUP, consumer: owner, handle: handleTimers, log });
  for (const c of consumers) c.start();
  timerConsumer.start();
  log.info('subscriber actors started', { owner });
  return async () => {
    await Promise.all([...consumers.map((c) => c.stop()), timerConsumer.stop()]);
    await leases.stop();
  };
}
