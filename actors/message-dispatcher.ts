import { randomBytes } from 'node:crypto';
import { hostname } from 'node:os';
import { connectRedis } from '../streams/redis.js';
import type { RoleContext, Stop } from '../streams/role-context.js';
import { StreamConsumer, type StreamEntry } from '../streams/stream-consumer.js';
import { fanOut, type Pusher } from './fanout.js';

export const FANOUT_GROUP = 'fanout';
const REFRESH_TENANTS_MS = 2_000;
/** Messages one dispatcher process fans out at once (a batch read from a queue is worked by this many lanes). */
const MESSAGES_IN_FLIGHT = 32;

/**
 * The messages side of the dispatcher role: every dispatcher process reads every tenant's message
 * queue through the consumer group `fanout` (each message goes to one of them; one that dies
 * mid-fan-out leaves its entry pending and another claims it after `DISPATCHER_CLAIM_IDLE_MS`).
 * Scheduled messages are released by the scheduler role (actors/scheduled-messages.ts).
 */
export async function startMessageDispatcher(ctx: RoleContext, makePusher: (ctx: RoleContext) => Pusher & { close?: () => Promise<void> }): Promise<Stop> {
  const { redis, keys, config, log } = ctx;
  const owner = `dispatcher:${hostname()}:${process.pid}:${randomBytes(4).toString('hex')}`;
  const pusher = makePusher(ctx);
  let tenants: { tenantId: string; workspaceId: string }[] = [];
  const refresh = async () => {
    const members = await redis.zrange(keys.messageTenants, 0, -1);
    tenants = members.map((m) => {
      const [tenantId, workspaceId] = m.split('|') as [string, string];
      return { tenantId, workspaceId };
    });
  };
  await refresh();
  const tenantOfStream = () => new Map(tenants.map((t) => [keys.messageQueue(t.tenantId), t]));
  let streams = tenantOfStream();
  const refreshTimer = setInterval(() => void refresh().then(() => (streams = tenantOfStream())).catch(() => undefined), REFRESH_TENANTS_MS);

  const handle = async (stream: string, entries: StreamEntry[]) => {
    const tenant = streams.get(stream);
    if (!tenant) return;
    // messages are independent: up to MESSAGES_IN_FLIGHT fan out at once (each resumable on its own)
    let next = 0;
    const lane = async () => {
      for (let entry = entries[next++]; entry; entry = entries[next++]) {
        const id = entry.id;
        await fanOut(
          {
            redis, keys, partitions: config.partitions, maxBacklog: config.inboxMaxBacklog, pusher, log, chunkSize: config.fanoutChunkSize,
            touch: () => redis.xclaim(stream, FANOUT_GROUP, owner, 0, id, 'JUSTID'),
          },
          { tenantId: tenant.tenantId, workspaceId: tenant.workspaceId, partitions: config.partitions },
          entry.fields.m!,
        );
      }
    };
    await Promise.all(Array.from({ length: Math.min(MESSAGES_IN_FLIGHT, entries.length) }, lane));
  };
  const blocking = connectRedis(ctx.target, { maxRetriesPerRequest: null });
  blocking.on('error', () => undefined);
  const source = { mode: 'shared' as const, claimIdleMs: config.dispatcherClaimIdleMs, streams: () => [...streams.keys()] };
  const consumer = new StreamConsumer({ redis, blocking, source, group: FANOUT_GROUP, consumer: owner, handle, log, batchSize: MESSAGES_IN_FLIGHT * 2 });
  consumer.start();

  log.info('message dispatcher started', { owner });
  return async () => {
    clearInterval(refreshTimer);
    await consumer.stop();
    await pusher.close?.();
  };
}
