import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { SYSTEM_WRITER } from '../../streams/identity.js';
import { expireMessages } from '../../actors/message-retention.js';
import { sweepRetention } from '../../actors/retention-sweeper.js';
import { writeScope } from '../../streams/audit-outbox.js';
import { setClockOffset } from '../../lib/clock.js';
import { createMessage, moveMessage, runStepIdempotencyKey } from '../../streams/messages.js';
import { callScript } from '../../streams/lua-scripts.js';
import { startPushService } from '../helpers/push-setup.js';
import { waitFor } from '../helpers/wait.js';

type Ctx = Awaited<ReturnType<typeof startPushService>>;
const r = suite<Ctx>('message retention');
const DAY = 86_400_000;

let tokenCounter = 9_000;
const nextToken = () => (tokenCounter++).toString(16).padStart(64, '0');

r.before(async (ctx) => { try {
  Object.assign(ctx, await startPushService('message-retention', {}, ['web', 'dispatcher', 'scheduler']));
  } catch (err) {
    console.error('setup failed', err);
    throw err;
  }
});
r.after.each(() => setClockOffset(0));
r.after(async (ctx) => {
  setClockOffset(0);
  await ctx.service.stop();
  await ctx.peer.close();
});

const sweep = (ctx: Ctx) => sweepRetention({ config: ctx.service.config, redis: ctx.service.redis, keys: ctx.service.keys, log: console as any, target: { url: '' } });

async function device(ctx: Ctx, externalId: string) {
  const res = await ctx.api.post('/v1/client/subscriptions', ctx.pk, { externalId, channel: 'push', token: nextToken(), platform: 'ios' });
  assert.ok(res.status === 201 || res.status === 200, JSON.stringify(res.body));
}

const finished = (ctx: Ctx, id: string) => waitFor(`message ${id} to finish`, async () => {
  const res = await ctx.api.get(`/v1/messages/${id}`, ctx.key);
  return ['completed', 'failed', 'canceled'].includes(res.body.data.status) ? res.body.data : null;
}, 15_000);

/** The tenant's Redis keys of one message and its deliveries that still exist. */
async function keysLeft(ctx: Ctx, messageId: string, deliveryIds: string[]): Promise<string[]> {
  const k = ctx.service.keys;
  const names = [k.message(ctx.tenantId, messageId), k.messageDeliveries(ctx.tenantId, messageId), ...['pending', 'sent', 'failed', 'skipped', 'canceled'].map((s) => k.messageDeliveriesByStatus(ctx.tenantId, messageId, s)), ...deliveryIds.map((d) => k.delivery(ctx.tenantId, d))];
  const pipeline = ctx.service.redis.pipeline();
  for (const name of names) pipeline.exists(name);
  return ((await pipeline.exec()) ?? []).flatMap(([, n], i) => (n === 1 ? [names[i]!] : []));
}

r('messages that ended before the retention go with their deliveries; one a caller\'s Idempotency-Key names keeps its record and still replays', async (ctx) => {
  await device(ctx, 'ret-a');
  await device(ctx, 'ret-a');
  const plain = (await ctx.api.post('/v1/messages', ctx.key, { to: 'ret-a', title: 'Plain', body: 'no key' })).body.data;
  const body = { to: 'ret-a', title: 'Keyed', body: 'with a key' };
  const keyed = (await ctx.api.post('/v1/messages', ctx.key, body, { 'Idempotency-Key': 'ret-order-1' })).body.data;
  const scheduled = (await ctx.api.post('/v1/messages', ctx.key, { to: 'ret-a', title: 'Later', body: 'canceled', sendAt: new Date(Date.now() + DAY).toISOString() })).body.data;
  assert.is((await ctx.api.post(`/v1/messages/${scheduled.id}/cancel`, ctx.key)).status, 200);
  const plainDone = await finished(ctx, plain.id);
  const keyedDone = await finished(ctx, keyed.id);
  assert.is(plainDone.counts.sent, 2);
  const deliveriesOf = async (id: string) => (await ctx.api.get(`/v1/messages/${id}/deliveries`, ctx.key)).body.data.items.map((d: any) => d.id as string);
  const plainDeliveries = await deliveriesOf(plain.id);
  const keyedDeliveries = await deliveriesOf(keyed.id);
  assert.is(plainDeliveries.length, 2);
  const listed = async () => (await ctx.api.get('/v1/messages?limit=100', ctx.key)).body.data;
  const before = await listed();

  // ended just now, and 29 days later: within the retention (30 days), nothing goes
  assert.is((await sweep(ctx)).messagesExpired, 0);
  setClockOffset(29 * DAY);
  assert.is((await sweep(ctx)).messagesExpired, 0);
  setClockOffset(0);
  assert.is((await ctx.api.get(`/v1/deliveries/${plainDeliveries[0]}`, ctx.key)).status, 200);

  setClockOffset(31 * DAY);
  const swept = await sweep(ctx);
  setClockOffset(0);
  assert.ok(swept.messagesExpired >= 3, JSON.stringify(swept));
  assert.ok(swept.deliveriesDeleted >= 4, JSON.stringify(swept));

  // without a key: gone, from the API and from Redis
  assert.is((await ctx.api.get(`/v1/messages/${plain.id}`, ctx.key)).status, 404);
  assert.is((await ctx.api.get(`/v1/messages/${scheduled.id}`, ctx.key)).status, 404);
  assert.is((await ctx.api.get(`/v1/deliveries/${plainDeliveries[0]}`, ctx.key)).status, 404);
  assert.equal(await keysLeft(ctx, plain.id, plainDeliveries), []);
  assert.equal(await keysLeft(ctx, scheduled.id, []), []);
  const after = await listed();
  assert.is(after.total, before.total - 2);
  assert.ok(!after.items.some((m: any) => m.id === plain.id || m.id === scheduled.id));
  for (const status of ['completed', 'canceled']) {
    const ids = (await ctx.api.get(`/v1/messages?status=${status}&limit=100`, ctx.key)).body.data.items.map((m: any) => m.id);
    assert.ok(!ids.includes(plain.id) && !ids.includes(scheduled.id), status);
  }

  // with a caller's key: the message stays (its counts too) without its deliveries, and the key still replays it
  const kept = await ctx.api.get(`/v1/messages/${keyed.id}`, ctx.key);
  assert.is(kept.status, 200);
  assert.equal(kept.body.data.counts, keyedDone.counts);
  const keptDeliveries = (await ctx.api.get(`/v1/messages/${keyed.id}/deliveries`, ctx.key)).body.data;
  assert.is(keptDeliveries.total, 0);
  assert.equal(keptDeliveries.items, []);
  assert.is((await ctx.api.get(`/v1/deliveries/${keyedDeliveries[0]}`, ctx.key)).status, 404);
  assert.equal(await keysLeft(ctx, keyed.id, keyedDeliveries), [ctx.service.keys.message(ctx.tenantId, keyed.id)]);
  const replay = await ctx.api.post('/v1/messages', ctx.key, body, { 'Idempotency-Key': 'ret-order-1' });
  assert.is(replay.status, 202);
  assert.is(replay.headers.get('idempotent-replayed'), 'true');
  assert.is(replay.body.data.id, keyed.id);
  assert.is((await ctx.api.post('/v1/messages', ctx.key, { ...body, title: 'Other' }, { 'Idempotency-Key': 'ret-order-1' })).status, 409);
  assert.is(await ctx.service.redis.zcard(ctx.service.keys.messagesEnded(ctx.tenantId)), 0, 'nothing left to expire');
});

r('a workflow step\'s message takes its engine idempotency key with it', async (ctx) => {
  const run = { runId: 'run_retentiontest0000000001', step: '2', workflowId: 'wfl_x', workflow: 'x', versionId: 'wfv_x' };
  const engineKey = runStepIdempotencyKey(run.runId, run.step);
  const { message } = await createMessage(ctx.service.redis, ctx.service.keys, { workspaceId: ctx.workspaceId, tenantId: ctx.tenantId },
    { to: { externalId: 'ret-nobody' }, content: { title: 't', body: 'b' }, sendAt: null, run }, { key: engineKey, request: { run: run.runId, step: run.step } },
    writeScope({ workspace: { id: ctx.workspaceId, slug: 'message-retention' }, tenant: { id: ctx.tenantId, slug: 'default' } }, SYSTEM_WRITER), console);
  await finished(ctx, message.id);
  assert.ok(await ctx.service.redis.hexists(ctx.service.keys.idempotency(ctx.tenantId), engineKey));
  setClockOffset(31 * DAY);
  await sweep(ctx);
  setClockOffset(0);
  assert.is((await ctx.api.get(`/v1/messages/${message.id}`, ctx.key)).status, 404);
  assert.is(await ctx.service.redis.hexists(ctx.service.keys.idempotency(ctx.tenantId), engineKey), 0);
});

/** A completed broadcast of `count` sent deliveries, written straight to Redis (sending them would take the test's time). */
async function endedBroadcast(ctx: Ctx, id: string, count: number): Promise<string[]> {
  const { redis, keys } = ctx.service;
  const ids = Array.from({ length: count }, (_, i) => `dlv_${id.slice(4, 16)}${String(i).padStart(16, '0')}`);
  await redis.hset(keys.message(ctx.tenantId, id), { id, status: 'queued', lane: 'audience', to: '{"topic":"all"}', content: '{"title":"t","body":"b"}', createdAt: new Date().toISOString(), idem: '0', 'n:total': ids.length, 'n:sent': ids.length });
  await redis.zadd(keys.messageIndex(ctx.tenantId), 0, id);
  await redis.zadd(keys.messagesByStatus(ctx.tenantId, 'queued'), 0, id);
  for (let i = 0; i < ids.length; i += 1_000) {
    const pipeline = redis.pipeline();
    for (const d of ids.slice(i, i + 1_000)) pipeline.hset(keys.delivery(ctx.tenantId, d), { id: d, messageId: id, status: 'sent' });
    pipeline.zadd(keys.messageDeliveries(ctx.tenantId, id), ...ids.slice(i, i + 1_000).flatMap((d) => [0, d]));
    pipeline.zadd(keys.messageDeliveriesByStatus(ctx.tenantId, id, 'sent'), ...ids.slice(i, i + 1_000).flatMap((d) => [0, d]));
    await pipeline.exec();
  }
  // ends the way every message ends: through the status index script (here lua/moveMessage)
  assert.ok((await moveMessage(redis, keys, ctx.tenantId, id, ['queued'], 'completed')).moved);
  return ids;
}

r('a broadcast\'s deliveries go over short calls; a sweep cut short is finished by the next', async (ctx) => {
  const { redis, keys } = ctx.service;
  const id = 'msg_retentionbroadcast000001';
  const ids = await endedBroadcast(ctx, id, 5_000);
  const cutoff = Date.now() + DAY;
  // a process killed after its first call: 1,500 deliveries gone, the message still listed as ended
  const [expired, deleted, more] = await callScript<[number, number, number]>(redis, 'expireMessages', [keys.messagesEnded(ctx.tenantId)], [keys.tenantBase(ctx.tenantId), cutoff, 1_500, 100]);
  assert.equal([expired, deleted, more], [0, 1_500, 1]);
  assert.is(await redis.zcard(keys.messageDeliveries(ctx.tenantId, id)), 3_500);
  assert.is(await redis.zcard(keys.messageDeliveriesByStatus(ctx.tenantId, id, 'sent')), 3_500);
  setClockOffset(31 * DAY);
  const swept = await sweep(ctx);
  setClockOffset(0);
  assert.is(swept.deliveriesDeleted, 3_500);
  assert.equal(await keysLeft(ctx, id, ids.slice(0, 10).concat(ids.slice(-10))), []);
  assert.is(await redis.zscore(keys.messageIndex(ctx.tenantId), id), null);
  assert.is(await redis.zscore(keys.messagesByStatus(ctx.tenantId, 'completed'), id), null);
});

r('a sweep whose delivery budget runs out in a tenant starts the next sweep in that tenant', async (ctx) => {
  const { redis, keys } = ctx.service;
  const id = 'msg_retentionbudget000000001';
  const ids = await endedBroadcast(ctx, id, 5_000);
  const cutoff = Date.now() + DAY;
  const limits = { deliveriesPerCall: 1_000, deliveriesPerSweep: 2_500 };
  assert.equal(await expireMessages(redis, keys, cutoff, limits), { messagesExpired: 0, deliveriesDeleted: 2_500 });
  assert.is(await redis.zcard(keys.messageDeliveries(ctx.tenantId, id)), 2_500);
  assert.equal(await expireMessages(redis, keys, cutoff, limits), { messagesExpired: 1, deliveriesDeleted: 2_500 });
  assert.equal(await keysLeft(ctx, id, ids.slice(0, 10).concat(ids.slice(-10))), []);
  assert.equal(await expireMessages(redis, keys, cutoff, limits), { messagesExpired: 0, deliveriesDeleted: 0 });
});

r.run();
