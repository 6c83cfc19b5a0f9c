import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { sweepRetention } from '../../actors/retention-sweeper.js';
import { ACTOR_GROUP } from '../../actors/subscriber-actor.js';
import { setClockOffset } from '../../lib/clock.js';
import { partitionOf } from '../../lib/partition.js';
import { callScript } from '../../streams/lua-scripts.js';
import { client } from '../helpers/api.js';
import { bootstrapWorkspace, holdRetentionSweeps, startTestService, type TestService } from '../helpers/service.js';
import { waitFor } from '../helpers/wait.js';

// A deleted (or merged-away) subscriber's sequences and automation state live on in its partition
// until its last events are through the actors; the retention sweeper forgets them once the
// retention has passed, the timeline has expired, everything issued was applied and handled, and
// no pending inbox entry from before the deletion could be delivered again. A subscriber created
// again under the same externalId starts afresh.

const DAY = 86_400_000;
const HOUR = 3_600_000;

type Ctx = { service: TestService; api: ReturnType<typeof client>; key: string; clientKey: string; tenantId: string };
const gone = suite<Ctx>('state of deleted subscribers');

gone.before(async (ctx) => {
  ctx.service = await startTestService('deleted-state', {}, ['web', 'worker']);
  await holdRetentionSweeps(ctx.service); // the tests' sweeps count what they forget
  ctx.api = client(ctx.service.url);
  const boot = await bootstrapWorkspace(ctx.service, 'deleted-state');
  ctx.key = boot.keys.tenant;
  ctx.clientKey = boot.keys.client;
  ctx.tenantId = boot.tenant.id;
});
gone.after(async (ctx) => {
  setClockOffset(0);
  await ctx.service.stop();
});

const sweep = (service: TestService) => sweepRetention({ config: service.config, redis: service.redis, keys: service.keys, log: console as any, target: { url: '' } });

/** Where a subscriber's per-partition state is, and what of it is there now. */
async function stateOf(service: TestService, tenantId: string, externalId: string) {
  const { redis, keys } = service;
  const p = partitionOf(tenantId, externalId, service.config.partitions);
  const field = `${tenantId}|${externalId}`;
  const [issued, applied, auto, listed, timeline] = await Promise.all([
    redis.hget(keys.sequences(p), field),
    redis.hget(keys.applied(p), field),
    redis.hget(keys.automation(p, tenantId, externalId), 'seq'),
    redis.zscore(keys.deletedSubscribers(p), field),
    redis.exists(keys.timeline(p, tenantId, externalId)),
  ]);
  return { p, field, issued, applied, auto, listed: listed === null ? null : Number(listed), timeline: timeline === 1 };
}

gone('a deleted subscriber is forgotten after the retention once its events are through, and can start afresh', async ({ service, api, key, tenantId }) => {
  const x = 'leaver-1';
  assert.is((await api.post('/v1/events', key, { events: [{ externalId: x, name: 'a.one' }, { externalId: x, name: 'a.two' }] })).status, 202);
  const before = Date.now();
  assert.is((await api.del(`/v1/subscribers/${x}`, key)).status, 200);
  // $subscriber.created, two events, $subscriber.deleted: all applied (no definition acts on them:
  // the automation step keeps no state for this subscriber)
  await waitFor('the delete to be through the actors', async () => {
    const s = await stateOf(service, tenantId, x);
    return s.issued === '4' && s.applied === '4';
  });
  const listed = await stateOf(service, tenantId, x);
  assert.ok(listed.listed !== null && listed.listed >= before, 'the delete lists it with its time');

  // within the retention: kept
  assert.is((await sweep(service)).deletedForgotten, 0);
  assert.is((await stateOf(service, tenantId, x)).issued, '4');

  // past the retention but its timeline has not expired: kept, and looked at again an hour later
  setClockOffset(31 * DAY);
  assert.is((await sweep(service)).deletedForgotten, 0);
  const postponed = await stateOf(service, tenantId, x);
  assert.is(postponed.issued, '4');
  assert.ok(postponed.timeline);
  assert.ok(postponed.listed! > listed.listed!, 'rescored');

  // the timeline expires (Redis keeps its real clock: the test stands in for it)
  await service.redis.del(service.keys.timeline(postponed.p, tenantId, x));
  assert.is((await sweep(service)).deletedForgotten, 0, 'not again before the hour is up');
  setClockOffset(31 * DAY + 2 * HOUR);
  assert.is((await sweep(service)).deletedForgotten, 1);
  const after = await stateOf(service, tenantId, x);
  assert.equal([after.issued, after.applied, after.auto, after.listed], [null, null, null, null]);
  assert.is(await service.redis.exists(service.keys.automation(after.p, tenantId, x)), 0);
  setClockOffset(0);

  // the same externalId again: a new subscriber, its events applied from sequence 1
  assert.is((await api.post('/v1/events', key, { externalId: x, name: 'b.one' })).status, 202);
  await waitFor('the new subscriber\'s events', async () => (await api.get(`/v1/subscribers/${x}/timeline`, key)).body.data?.items?.length === 2);
  const timeline = (await api.get(`/v1/subscribers/${x}/timeline`, key)).body.data.items.map((e: any) => e.name);
  assert.equal(timeline, ['b.one', '$subscriber.created']);
  const fresh = await stateOf(service, tenantId, x);
  assert.equal([fresh.issued, fresh.applied, fresh.listed], ['2', '2', null]);
});

gone('a merge lists the anonymous subscriber it deletes; one created again is unlisted, its state kept', async ({ service, api, key, clientKey, tenantId }) => {
  assert.is((await api.post('/v1/events', key, { externalId: 'anon-77', name: 'browsed' })).status, 202);
  assert.is((await api.post('/v1/client/identify', clientKey, { externalId: 'user-77', anonymousId: 'anon-77' })).status, 200);
  await waitFor('the merge', async () => (await api.get('/v1/subscribers/anon-77', key)).status === 404);
  assert.ok((await stateOf(service, tenantId, 'anon-77')).listed !== null, 'listed by the merge');

  assert.is((await api.post('/v1/events', key, { externalId: 'anon-77', name: 'came.back' })).status, 202);
  await waitFor('anon-77 again', async () => (await api.get('/v1/subscribers/anon-77', key)).status === 200);
  setClockOffset(31 * DAY);
  try {
    await sweep(service);
  } finally {
    setClockOffset(0);
  }
  const s = await stateOf(service, tenantId, 'anon-77');
  assert.is(s.listed, null, 'unlisted');
  assert.ok(Number(s.issued) >= 4, 'its sequences go on');
});

gone('the state stays while anything of the subscriber may still come through the actors', async ({ service, tenantId }) => {
  // a partition of its own (beyond the service's), so the worker never reads it: every condition set by hand
  const { redis, keys } = service;
  const p = 900;
  const deletedAt = Date.now() - 40 * DAY;
  const cutoff = Date.now() - 30 * DAY;
  const member = (x: string) => `${tenantId}|${x}`;
  const setUp = async (x: string, issued: number, applied: number, handled: number) => {
    await redis.pipeline()
      .zadd(keys.deletedSubscribers(p), deletedAt, member(x))
      .hset(keys.sequences(p), member(x), issued)
      .hset(keys.applied(p), member(x), applied)
      .hset(keys.automation(p, tenantId, x), 'seq', handled, 'v', 3)
      .exec();
  };
  const run = () => callScript<[number, number, number]>(redis, 'forgetDeletedSubscribers',
    [keys.deletedSubscribers(p), keys.subscribers(p), keys.sequences(p), keys.applied(p), keys.inbox(p)],
    [keys.partitionBase(p), cutoff, 100, ACTOR_GROUP, 600_000, HOUR]);

  await setUp('done', 5, 5, 5);
  await setUp('not-applied', 6, 5, 5);
  await setUp('recreated', 6, 6, 6);
  await redis.hset(keys.subscribers(p), member('recreated'), 'sub_x');
  // no consumer group on the inbox yet: nothing is known to be through; one created again is unlisted
  assert.equal(await run(), [0, 1, 2]);
  assert.is(await redis.hget(keys.sequences(p), member('recreated')), '6');

  // an entry from before the deletion read by the group and not acked: it would be delivered again
  await redis.zadd(keys.deletedSubscribers(p), deletedAt, member('done'));
  const old = `${deletedAt - 1_000}-0`;
  await redis.xadd(keys.inbox(p), old, 't', tenantId, 'x', 'done', 'q', '5');
  await redis.xgroup('CREATE', keys.inbox(p), ACTOR_GROUP, '0');
  await redis.xreadgroup('GROUP', ACTOR_GROUP, 'someone', 'COUNT', 10, 'STREAMS', keys.inbox(p), '>');
  assert.equal(await run(), [0, 0, 1]);
  assert.is(await redis.hget(keys.applied(p), member('done')), '5');

  // once acked: forgotten; the two whose events are not through stay listed, their state whole
  await redis.xack(keys.inbox(p), ACTOR_GROUP, old);
  await redis.zadd(keys.deletedSubscribers(p), deletedAt, member('done'), deletedAt, member('not-applied'));
  assert.equal(await run(), [1, 0, 1]);
  assert.equal(await redis.hmget(keys.sequences(p), member('done'), member('not-applied')), [null, '6']);
  assert.equal(await redis.hmget(keys.applied(p), member('done'), member('not-applied')), [null, '5']);
  assert.is(await redis.exists(keys.automation(p, tenantId, 'done')), 0);
  assert.is(await redis.hget(keys.automation(p, tenantId, 'not-applied'), 'seq'), '5');
  assert.equal(await redis.zrange(keys.deletedSubscribers(p), 0, -1), [member('not-applied')]);
  // postponed by an hour: the same cutoff finds nothing due
  assert.equal(await run(), [0, 0, 0]);
});

gone.run();
