import { randomBytes } from 'node:crypto';
import { hostname } from 'node:os';
import type { MessageLane } from '../streams/keys.js';
import { connectRedis } from '../streams/redis.js';
import { readRegistry } from '../streams/registry.js';
import type { RoleContext, Stop } from '../streams/role-context.js';
import { StreamConsumer, type StreamEntry } from '../streams/stream-consumer.js';
import { fanOut, type Pusher } from './fanout.js';
import { IdentityRefs } from '../streams/identity.js';

export const FANOUT_GROUP = 'fanout';
const REFRESH_TENANTS_MS = 2_000;
/**
 * Messages of one tenant's queue one dispatcher process fans out at once, per lane (a batch read
 * from a queue is worked at once, and that queue's next read waits for the whole batch). One-subscriber messages are fanned out in
 * chunks of ONE_SUBSCRIBER_CHUNK that run side by side: a chunk makes the same few script calls as
 * one message did (start, audience, deliveries, `$send`, settle), so their fixed costs are shared.
 * An audience walk holds up to three chunks of deliveries in memory (actors/fanout.ts), so few run
 * at once.
 */
export const MESSAGES_IN_FLIGHT: Record<MessageLane, number> = { one: 256, audience: 4 };
export const ONE_SUBSCRIBER_CHUNK = 64;
/**
 * Tenants whose batches one dispatcher process works at once, per lane, without its next read
 * waiting for them (the consumer runtime's `overlapStreams`): a tenant whose batch is slow (its push
 * provider cold, throttling or unreachable) holds up its own queue only. Until session 42 a read's
 * batches were all worked before the next read, so one slow tenant held up every other (probe D:
 * 1,500 tenants' first messages started in three waves, 2, 20 and 32 s after they were sent).
 */
export const TENANTS_IN_FLIGHT: Record<MessageLane, number> = { one: 16, audience: 4 };
/**
 * Batches of one tenant's queue one dispatcher process works at once, per lane (the consumer
 * runtime's `batchesPerStream`). One-user messages are independent, so a batch held by one push
 * that is retried for long (a device that never answers: five attempts of the request timeout, about
 * 30 s; probe V) no longer holds up the tenant's later messages: they are read and sent beside it.
 * Audience batches likewise: a send to a segment whose backfill has not completed waits for it in
 * its batch (actors/fanout.ts `backfilled`, up to a minute), and with one batch at a time it held
 * every later broadcast of the tenant as long (probe BL: a `where` message queued 9 s and more
 * behind it); a long walk no longer holds up the tenant's next ones either.
 * A queue is read again only once its latest batch has run SLOW_BATCH_MS: batches that end quickly
 * keep it one at a time. Reading every busy queue again at once moved the 2-core machine's CPU from
 * the web role to the dispatcher (send bench, alternating, acceptance ÷ hello-world: 0.072–0.102
 * against 0.124–0.146 with one batch); with the threshold 0.107 and 0.123 against 0.108 and 0.150,
 * within the noise of that spell (hello-world 11–21k req/s), web and dispatcher CPU unchanged.
 */
export const BATCHES_PER_TENANT: Record<MessageLane, number> = { one: 4, audience: 4 };
export const SLOW_BATCH_MS = 1_000;

/**
 * Waits for every one of `work`, then throws the first failure: a batch worked again or given back
 * while a sibling chunk still sends would have its pending deliveries sent twice (review of session 52).
 */
async function settledAll(work: Promise<unknown>[]): Promise<void> {
  const failed = (await Promise.allSettled(work)).find((r): r is PromiseRejectedResult => r.status === 'rejected');
  if (failed) throw failed.reason;
}

/**
 * The messages side of the dispatcher role: every dispatcher process reads every tenant's message
 * queues through the consumer group `fanout` (each message goes to one of them; one that dies
 * mid-fan-out leaves its entry pending and another claims it after `DISPATCHER_CLAIM_IDLE_MS`; a live
 * one keeps the claims of the batch it works fresh, however long the fan-out, streams/stream-consumer.ts).
 * A dispatcher that stops cuts its fan-outs short at their next chunk (the pushes in flight answered and
 * recorded) and gives their entries back to the queue's end, where a live dispatcher goes on at once.
 * The two lanes (streams/keys.ts `messageQueue`) have a consumer each, so a broadcast being walked
 * never holds up the one-user messages queued after it. Scheduled messages are released by the
 * scheduler role (actors/scheduled-messages.ts).
 */
export async function startMessageDispatcher(ctx: RoleContext, makePusher: (ctx: RoleContext) => Pusher & { close?: () => Promise<void> }): Promise<Stop> {
  const { redis, keys, config, log } = ctx;
  const owner = `dispatcher:${hostname()}:${process.pid}:${randomBytes(4).toString('hex')}`;
  const pusher = makePusher(ctx);
  const refs = new IdentityRefs(redis, keys);
  let tenants: { tenantId: string; workspaceId: string }[] = [];
  const refresh = async () => {
    const members = await readRegistry(redis, keys.messageTenants);
    tenants = members.map((m) => {
      const [tenantId, workspaceId] = m.split('|') as [string, string];
      return { tenantId, workspaceId };
    });
  };
  await refresh();
  const lanes: MessageLane[] = ['one', 'audience'];
  const queuesOf = (lane: MessageLane) => new Map(tenants.map((t) => [keys.messageQueue(t.tenantId, lane), t]));
  const queues = new Map(lanes.map((lane) => [lane, queuesOf(lane)]));
  const refreshTimer = setInterval(() => void refresh().then(() => lanes.forEach((lane) => queues.set(lane, queuesOf(lane)))).catch(() => undefined), REFRESH_TENANTS_MS);

  const consumers = lanes.map((lane) => {
    const inFlight = MESSAGES_IN_FLIGHT[lane];
    const handle = async (stream: string, entries: StreamEntry[], signal: AbortSignal) => {
      const tenant = queues.get(lane)!.get(stream);
      if (!tenant) return;
      const scope = { tenantId: tenant.tenantId, workspaceId: tenant.workspaceId, partitions: config.partitions };
      const context = () => ({
        redis, keys, partitions: config.partitions, maxBacklog: config.inboxMaxBacklog, pusher, log, chunkSize: config.fanoutChunkSize, refs, signal,
      });
      if (lane === 'one') {
        const chunks: string[][] = [];
        for (let i = 0; i < entries.length; i += ONE_SUBSCRIBER_CHUNK) chunks.push(entries.slice(i, i + ONE_SUBSCRIBER_CHUNK).map((entry) => entry.fields.m!));
        await settledAll(chunks.map((ids) => fanOut(context(), scope, ids)));
        return;
      }
      // audiences are independent: up to `inFlight` fan out at once (each resumable on its own)
      let next = 0;
      const worker = async () => {
        for (let entry = entries[next++]; entry && !signal.aborted; entry = entries[next++]) await fanOut(context(), scope, [entry.fields.m!]);
      };
      await settledAll(Array.from({ length: Math.min(inFlight, entries.length) }, worker));
    };
    const blocking = connectRedis(ctx.target, { maxRetriesPerRequest: null });
    blocking.on('error', () => undefined);
    const source = { mode: 'shared' as const, claimIdleMs: config.dispatcherClaimIdleMs, streams: () => [...queues.get(lane)!.keys()] };
    // an audience batch is read no larger than it is worked: an entry waiting behind a long walk is
    // kept claimed (the consumer keeps a batch's claims fresh) but waits, where another dispatcher
    // could have walked it
    const batchSize = inFlight;
    return new StreamConsumer({ redis, blocking, source, group: FANOUT_GROUP, consumer: owner, handle, log, batchSize, overlapStreams: TENANTS_IN_FLIGHT[lane], batchesPerStream: BATCHES_PER_TENANT[lane], slowBatchMs: SLOW_BATCH_MS, giveBackOnStop: true });
  });
  for (const consumer of consumers) consumer.start();

  log.info('message dispatcher started', { owner });
  return async () => {
    clearInterval(refreshTimer);
    await Promise.all(consumers.map((c) => c.stop()));
    await pusher.close?.();
  };
}
