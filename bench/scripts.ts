import { parseArgs } from 'node:util';
import type { Redis } from 'ioredis';
import { now } from '../lib/clock.js';
import { applyEvents } from '../streams/apply-events.js';
import { ingestEvents } from '../streams/ingest.js';
import { createKeys, type Keys } from '../streams/keys.js';
import { connectRedis } from '../streams/redis.js';
import { numberOption } from './lib/args.js';
import { redisBenchmark, startRedis } from './lib/redis.js';
import { ratioOf, round, type BenchResult } from './lib/result.js';

export const description = 'Redis CPU per event of the event scripts (ingestEvents, applyEvents) by batch size';
export const usage = 'scripts [--subscribers 50000] [--events 3000] [--batches 1,4,16,32] [--xadd-requests 500000]';

const TENANT = 'tnt_bench';
const NAMES = ['page.viewed', 'item.added', 'checkout.started', 'order.completed', 'app.opened', 'search.performed'];
const RETENTION = 30 * 86_400_000;

/** Redis's own time (µs) spent in EVALSHA so far: the scripts and the commands they run. */
async function evalshaUsec(redis: Redis): Promise<number> {
  const m = /cmdstat_evalsha:calls=\d+,usec=(\d+)/.exec(await redis.info('commandstats'));
  return Number(m?.[1] ?? 0);
}

const newEvent = (n: number, subscribers: number) => ({
  externalId: `sub-${(n * 7919) % subscribers}`, name: NAMES[n % NAMES.length]!, source: 'server' as const,
  timestampMs: now(), data: '{"plan":"pro","amount":42,"currency":"EUR"}', callerId: null, provider: null, runId: null, messageId: null, step: null,
});

/**
 * The Redis side of the event path, alone: one partition on a private Redis, the subscribers
 * created first. For each batch size, `--events` events are ingested in calls of that many
 * (`ingestEvents`, the web role's script), then applied in calls of that many (`applyEvents`, the
 * worker's); Redis time per event is Δ`INFO commandstats` usec of EVALSHA ÷ events, which counts
 * the scripts' own work and the commands they run, not the network. Baseline: raw `redis-benchmark
 * -P 32 XADD` in the same run, as µs per XADD (its Redis time per op, the cheapest write an event
 * could cost); `ratio` is that ÷ the apply cost at the largest batch.
 */
export async function run(args: string[]): Promise<BenchResult> {
  const { values } = parseArgs({ args, options: { subscribers: { type: 'string' }, events: { type: 'string' }, batches: { type: 'string' }, 'xadd-requests': { type: 'string' } } });
  const subscribers = numberOption(values.subscribers, 'subscribers', 50_000, 100, 1_000_000);
  const events = numberOption(values.events, 'events', 3_000, 100, 100_000);
  const xaddRequests = numberOption(values['xadd-requests'], 'xadd-requests', 500_000, 10_000, 10_000_000);
  const batches = (values.batches ?? '1,4,16,32').split(',').map((b) => numberOption(b, 'batches', 0, 1, 100));

  const server = await startRedis();
  const redis = connectRedis({ url: server.url });
  try {
    await redis.config('RESETSTAT');
    const xadd = await redisBenchmark({ port: server.port, requests: xaddRequests, command: ['XADD', 'bench:xadd', '*', 'f', 'v'] });
    await redis.del('bench:xadd');
    const xaddUsec = Number(/cmdstat_xadd:calls=\d+,usec=\d+,usec_per_call=([\d.]+)/.exec(await redis.info('commandstats'))?.[1] ?? 0);
    await redis.config('RESETSTAT');
    const keys = createKeys('bench:');
    const scope = { workspaceId: 'ws_bench', tenantId: TENANT, partitions: 1, maxBacklog: 100_000_000 };
    // every subscriber exists and has been applied once (their timelines and buckets exist)
    for (let i = 0; i < subscribers; i += 100) {
      await ingestEvents(redis, keys, scope, Array.from({ length: Math.min(100, subscribers - i) }, (_, k) => ({ ...newEvent(0, 1), externalId: `sub-${i + k}` })));
    }
    await applyAll(redis, keys, 100);
    console.log(`scripts: one partition, ${subscribers.toLocaleString('en-US')} subscribers (created and applied first), ${events.toLocaleString('en-US')} events per batch size, ${NAMES.length} names; private redis`);
    console.log(`baseline: redis-benchmark -P 32 -n ${xaddRequests.toLocaleString('en-US')} XADD bench:xadd * f v: ${Math.round(xadd.opsPerSec).toLocaleString('en-US')} ops/s, ${xaddUsec} µs of Redis time per XADD`);
    console.log('');
    console.log('events per call   ingestEvents µs/event   applyEvents µs/event   applyEvents µs/call');
    const rows: { batch: number; ingest: number; apply: number }[] = [];
    let n = 1;
    for (const batch of batches) {
      let at = await evalshaUsec(redis);
      for (let i = 0; i < events; i += batch) {
        const size = Math.min(batch, events - i);
        await ingestEvents(redis, keys, scope, Array.from({ length: size }, () => newEvent(n++, subscribers)));
      }
      const ingest = ((await evalshaUsec(redis)) - at) / events;
      at = await evalshaUsec(redis);
      const applied = await applyAll(redis, keys, batch);
      const apply = ((await evalshaUsec(redis)) - at) / applied;
      rows.push({ batch, ingest, apply });
      console.log(`${String(batch).padStart(15)}   ${ingest.toFixed(1).padStart(21)}   ${apply.toFixed(1).padStart(20)}   ${(apply * batch).toFixed(1).padStart(19)}`);
    }
    const last = rows[rows.length - 1]!;
    return {
      bench: 'scripts', metric: 'apply_redis_us_per_event', value: round(last.apply, 2), unit: 'µs/event',
      baseline: { name: 'redis-benchmark XADD -P 32 (µs per XADD)', value: xaddUsec }, ratio: ratioOf(xaddUsec, last.apply), target: 0,
      target_kind: 'none: context for the pipeline bench (lower is better)', batch: last.batch,
      per_batch: Object.fromEntries(rows.map((r) => [r.batch, { ingest_us_per_event: round(r.ingest, 2), apply_us_per_event: round(r.apply, 2) }])),
      subscribers, events, xadd_ops_per_s: Math.round(xadd.opsPerSec),
    };
  } finally {
    redis.disconnect();
    await server.stop();
  }
}

/** Applies everything in the inbox in calls of `batch` entries, as the worker would; returns the entries applied. */
async function applyAll(redis: Redis, keys: Keys, batch: number): Promise<number> {
  const ids = ((await redis.xrange(keys.inbox(0), '-', '+')) as [string, string[]][]).map(([id]) => id);
  let applied = 0;
  for (let i = 0; i < ids.length; i += batch) applied += await applyEvents(redis, keys, 0, RETENTION, now(), ids.slice(i, i + batch), null);
  await redis.xtrim(keys.inbox(0), 'MAXLEN', 0);
  return applied;
}
