import type { Redis } from 'ioredis';
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { now, setClockOffset } from '../../lib/clock.js';
import { ingestEvents } from '../../streams/ingest.js';
import { createKeys, type Keys } from '../../streams/keys.js';
import { applyEvents } from '../../streams/apply-events.js';
import { connectRedis } from '../../streams/redis.js';
import { testRedisUrl, uniquePrefix } from '../helpers/redis.js';

/**
 * lua/applyEvents-4.lua called directly (one partition), on entries written by the ingest script:
 * what a batch leaves in every read model when its effects are gathered per key, and that a
 * redelivered or partly requested batch applies each event exactly once.
 */
type Ctx = { redis: Redis; keys: Keys };
const apply = suite<Ctx>('applyEvents: one atomic step per batch of inbox entries');

const HOUR = 3_600_000;
const DAY = 86_400_000;
const RETENTION = 30 * DAY;
const T = 'tnt_apply';
const scope = { workspaceId: 'ws_apply', tenantId: T, partitions: 1, maxBacklog: 1_000_000 };

apply.before.each(async (ctx) => {
  ctx.redis ??= connectRedis({ url: await testRedisUrl() });
  ctx.keys = createKeys(uniquePrefix('apply'));
});
apply.after.each(() => setClockOffset(0));
apply.after(async (ctx) => ctx.redis.disconnect());

const event = (externalId: string, name: string, timestampMs = now()) => ({ externalId, name, source: 'server' as const, timestampMs, data: '{"n":1}', callerId: null, provider: null, runId: null, messageId: null, step: null });

async function inboxIds({ redis, keys }: Ctx): Promise<string[]> {
  return ((await redis.xrange(keys.inbox(0), '-', '+')) as [string, string[]][]).map(([id]) => id);
}

function applyIds({ redis, keys }: Ctx, ids: string[], retentionMs = RETENTION): Promise<number> {
  return applyEvents(redis, keys, 0, retentionMs, now(), ids, null);
}

apply('a batch of several subscribers and names: every read model counts each event once', async (ctx) => {
  const { redis, keys } = ctx;
  const ts = now();
  // a: 3 events (2 names), b: 2 events (1 name); each subscriber's first event also writes $subscriber.created
  await ingestEvents(redis, keys, scope, [event('a', 'open', ts - 5_000), event('b', 'open', ts - 1_000), event('a', 'buy', ts - 3_000), event('a', 'open', ts), event('b', 'open', ts - 2_000)]);
  const ids = await inboxIds(ctx);
  assert.is(ids.length, 7);
  assert.is(await applyIds(ctx, ids), 7);

  assert.is(await redis.xlen(keys.tenantLog(0, T)), 7, 'the tenant log holds each event once');
  const timelineOf = async (x: string) => (await redis.zrange(keys.timeline(0, T, x), 0, -1, 'WITHSCORES')).filter((_, i) => i % 2 === 1).map(Number);
  assert.equal(await timelineOf('a'), [1, 2, 3, 4], 'a: sequences 1..4 ($subscriber.created first)');
  assert.equal(await timelineOf('b'), [1, 2, 3]);
  assert.ok((await redis.pttl(keys.timeline(0, T, 'a'))) > RETENTION - 60_000, 'the timeline expires a retention after its last write');
  assert.equal(await redis.hgetall(keys.applied(0)), { [`${T}|a`]: '4', [`${T}|b`]: '3' });

  const catalog = await redis.hgetall(keys.catalog(0, T));
  assert.is(catalog['open|all'], '4');
  assert.is(catalog['buy|all'], '1');
  assert.is(catalog['open|first'], String(ts - 5_000), 'first seen: the smallest timestamp, whatever the order');
  assert.is(catalog['open|last'], String(ts));
  assert.is(catalog['open|src:server'], '1');
  assert.is(catalog['$subscriber.created|all'], '2');

  const hour = ts - (ts % HOUR);
  const day = ts - (ts % DAY);
  // hourly counts stay 32 days (the catalog's oldest day is read by the hour), hourly HyperLogLogs 48 hours
  for (const [unit, bucket, until, uniquesUntil] of [['h', hour, hour + 32 * DAY, hour + 48 * HOUR], ['d', day, day + RETENTION + 2 * DAY, day + RETENTION + 2 * DAY]] as const) {
    // events 5 s apart may straddle an hour: count what fell in this bucket
    const inBucket = [ts - 5_000, ts - 1_000, ts - 3_000, ts, ts - 2_000].filter((t) => t - (t % (unit === 'h' ? HOUR : DAY)) === bucket).length;
    const volume = await redis.hgetall(keys.volume(0, T, unit, bucket));
    assert.is(Number(volume.open ?? 0) + Number(volume.buy ?? 0), inBucket, `${unit}: one count per event`);
    const expiry = await redis.pexpiretime(keys.volume(0, T, unit, bucket));
    assert.is(expiry, until, `${unit}: the bucket expires at its fixed time`);
    if (inBucket === 5) {
      assert.is(await redis.pfcount(keys.uniques(0, T, unit, bucket, 'open')), 2, 'distinct subscribers of a name');
      assert.is(await redis.pfcount(keys.uniques(0, T, unit, bucket, '*')), 2, 'distinct subscribers of all names');
      assert.is(await redis.pexpiretime(keys.uniques(0, T, unit, bucket, 'open')), uniquesUntil);
      assert.is(await redis.pexpiretime(keys.uniques(0, T, unit, bucket, '*')), uniquesUntil);
    }
  }
  const samples = await redis.lrange(keys.samples(0, T, 'open'), 0, -1);
  assert.is(samples.length, 4);
  assert.equal(samples, [...samples].sort().reverse(), 'samples newest first');
  // an active tenant's samples of a name it stopped sending went nowhere (probe Z: one list per name
  // and partition for good); they expire a retention after the last write, when every id they hold is trimmed
  const ttl = await redis.pttl(keys.samples(0, T, 'open'));
  assert.ok(ttl > RETENTION - 60_000 && ttl <= RETENTION, `the samples expire a retention after their last write (pttl ${ttl})`);
});

apply('redelivered entries change nothing; a later bucket write keeps the bucket\'s expiry', async (ctx) => {
  const { redis, keys } = ctx;
  await ingestEvents(redis, keys, scope, [event('c', 'open'), event('c', 'open')]);
  const ids = await inboxIds(ctx);
  assert.is(await applyIds(ctx, ids), 3);
  const before = { log: await redis.xlen(keys.tenantLog(0, T)), catalog: await redis.hgetall(keys.catalog(0, T)) };
  assert.is(await applyIds(ctx, ids), 0, 'the same ids again: nothing applied');
  assert.is(await applyIds(ctx, [ids[2]!, ids[1]!]), 0);
  assert.is(await redis.xlen(keys.tenantLog(0, T)), before.log);
  assert.equal(await redis.hgetall(keys.catalog(0, T)), before.catalog);

  await ingestEvents(redis, keys, scope, [event('d', 'open')]);
  const ts = now();
  const day = ts - (ts % DAY);
  const expiry = await redis.pexpiretime(keys.volume(0, T, 'd', day));
  assert.is(await applyIds(ctx, (await inboxIds(ctx)).slice(3)), 2);
  assert.is(await redis.pexpiretime(keys.volume(0, T, 'd', day)), expiry);
  assert.is(await redis.pfcount(keys.uniques(0, T, 'd', day, '*')), 2);
});

apply('only the requested ids are applied, wherever they are in the inbox', async (ctx) => {
  const { redis, keys } = ctx;
  // 150 subscribers: 300 entries ($subscriber.created then the event, each); request the first
  // entries of three subscribers far apart (a span wider than one read of the span)
  await ingestEvents(redis, keys, scope, Array.from({ length: 100 }, (_, i) => event(`e${i}`, 'open')));
  await ingestEvents(redis, keys, scope, Array.from({ length: 50 }, (_, i) => event(`e${100 + i}`, 'open')));
  const ids = await inboxIds(ctx);
  assert.is(ids.length, 300);
  const wanted = [ids[0]!, ids[150]!, ids[298]!];
  assert.is(await applyIds(ctx, wanted), 3);
  assert.is(await redis.xlen(keys.tenantLog(0, T)), 3);
  const applied = await redis.hgetall(keys.applied(0));
  assert.equal(Object.keys(applied).length, 3, 'three subscribers applied, no other');
  // the rest later, in order: each is applied once
  assert.is(await applyIds(ctx, ids.filter((id) => !wanted.includes(id))), 297);
  assert.is(await redis.xlen(keys.tenantLog(0, T)), 300);
});

apply('every 8th event of a subscriber drops its timeline entries older than the retention', async (ctx) => {
  const { redis, keys } = ctx;
  await ingestEvents(redis, keys, scope, Array.from({ length: 3 }, () => event('f', 'open'))); // q 1..4
  assert.is(await applyIds(ctx, await inboxIds(ctx)), 4);
  setClockOffset(2 * DAY);
  await ingestEvents(redis, keys, scope, Array.from({ length: 3 }, () => event('f', 'open'))); // q 5..7: no trim yet
  assert.is(await applyIds(ctx, (await inboxIds(ctx)).slice(4), DAY), 3);
  assert.is(await redis.zcard(keys.timeline(0, T, 'f')), 7);
  await ingestEvents(redis, keys, scope, [event('f', 'open')]); // q 8
  assert.is(await applyIds(ctx, (await inboxIds(ctx)).slice(7), DAY), 1);
  const left = (await redis.zrange(keys.timeline(0, T, 'f'), 0, -1, 'WITHSCORES')).filter((_, i) => i % 2 === 1).map(Number);
  assert.equal(left, [5, 6, 7, 8], 'the four entries older than a day are gone');
});

apply('each tenant\'s backlog in the partition: ordinals stamped at ingest, the highest processed recorded, never lowered, skipped entries counted as processed', async (ctx) => {
  const { redis, keys } = ctx;
  const U = 'tnt_other';
  const backlog = async () => redis.hgetall(keys.tenantBacklog(0));
  // T: 3 events (plus $subscriber.created entries, not counted), U: 2
  await ingestEvents(redis, keys, scope, [event('f', 'open'), event('g', 'open'), event('f', 'buy')]);
  await ingestEvents(redis, keys, { ...scope, tenantId: U }, [event('f', 'open'), event('f', 'open')]);
  assert.equal(await backlog(), { [`i|${T}`]: '3', [`i|${U}`]: '2' }, 'only the callers\' events are numbered');
  const entries = (await redis.xrange(keys.inbox(0), '-', '+')) as [string, string[]][];
  const tcs = entries.map(([, f]) => f[f.indexOf('tc') + 1]);
  assert.equal(tcs, ['', '1', '', '2', '3', '', '1', '2'], 'stamped on each entry ($subscriber.created: none)');
  const ids = entries.map(([id]) => id);
  // the first four entries: T's ordinals 1 and 2 processed
  assert.is(await applyIds(ctx, ids.slice(0, 4)), 4);
  assert.equal(await backlog(), { [`i|${T}`]: '3', [`i|${U}`]: '2', [`d|${T}`]: '2' });
  // the same batch again (a redelivery after a crash): nothing applied, nothing lowered
  assert.is(await applyIds(ctx, ids.slice(0, 2)), 0);
  assert.is((await backlog())[`d|${T}`], '2');
  // entries skipped as already applied still count as processed: U's subscriber f applied past them by hand
  await redis.hset(keys.applied(0), `${U}|f`, '10');
  assert.is(await applyIds(ctx, ids.slice(4)), 1, 'T\'s last event applied, U\'s skipped');
  assert.equal(await backlog(), { [`i|${T}`]: '3', [`i|${U}`]: '2', [`d|${T}`]: '3', [`d|${U}`]: '2' });
});

apply.run();
