import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { client } from '../helpers/api.js';
import type { ApnsPeer } from '../helpers/apns-peer.js';
import { apnsCredentials, pushSetup } from '../helpers/push-setup.js';
import { bootstrapWorkspace, startTestService, type TestService } from '../helpers/service.js';
import { waitFor } from '../helpers/wait.js';

type Ctx = { service: TestService; api: ReturnType<typeof client>; key: string; client: string; peer: ApnsPeer };
const audience = suite<Ctx>('messages to a segment or an inline expression');

audience.before(async (ctx) => {
  const { peer, key, env } = await pushSetup();
  ctx.peer = peer;
  ctx.service = await startTestService('audience', { ...env, PARTITION_LEASE_MS: '1000', FANOUT_CHUNK_SIZE: '7' }, ['web', 'worker', 'scheduler', 'dispatcher']);
  ctx.api = client(ctx.service.url);
  const boot = await bootstrapWorkspace(ctx.service, 'audience');
  ctx.key = boot.keys.tenant;
  ctx.client = boot.keys.client;
  await ctx.api.call('PUT', '/v1/apps/apns', { key: ctx.key, body: apnsCredentials(key) });
  // 24 subscribers with a device each; every third one is on the pro plan, every fourth bought twice
  for (let i = 0; i < 24; i++) {
    const externalId = `aud-${i}`;
    await ctx.api.post('/v1/subscribers', ctx.key, { externalId, properties: { plan: i % 3 === 0 ? 'pro' : 'free', score: i } });
    await ctx.api.post('/v1/client/subscriptions', ctx.client, { externalId, channel: 'push', token: (0xa000 + i).toString(16).padStart(64, 'd'), platform: 'ios' });
    if (i % 4 === 0) await ctx.api.post('/v1/events', ctx.key, { events: [1, 2].map(() => ({ externalId, name: 'bought', data: { total: 10 } })) });
  }
});
audience.after(async (ctx) => {
  await ctx.service.stop();
  await ctx.peer.close();
});

const tokenOf = (i: number) => (0xa000 + i).toString(16).padStart(64, 'd');
const delivered = (ctx: Ctx, messageId: string) => new Set(ctx.peer.requests.filter((r) => (r.payload as any)?.herald?.messageId === messageId).map((r) => r.token));
const completed = (ctx: Ctx, id: string) => waitFor(`message ${id} to complete`, async () => {
  const m = (await ctx.api.get(`/v1/messages/${id}`, ctx.key)).body.data;
  return m.status === 'completed' ? m : null;
}, 20_000, 100);

audience('to: { segment } reaches the segment members, each device once', async (ctx) => {
  const { api, key } = ctx;
  await api.post('/v1/segments', key, { slug: 'pro-plan', where: { attribute: 'plan', eq: 'pro' } });
  await waitFor('the backfill', async () => (await api.get('/v1/segments/pro-plan', key)).body.data.backfill.status === 'completed', 20_000, 100);
  const sent = await api.post('/v1/messages', key, { to: { segment: 'pro-plan' }, title: 'Pro news', body: 'for pros' });
  assert.is(sent.status, 202, sent.text);
  const message = await completed(ctx, sent.body.data.id);
  const pros = Array.from({ length: 24 }, (_, i) => i).filter((i) => i % 3 === 0);
  assert.is(message.counts.sent, pros.length);
  assert.equal(delivered(ctx, message.id), new Set(pros.map(tokenOf)));
});

audience('to: { where } is evaluated over the tenant in chunks: attributes and event counts', async (ctx) => {
  const { api, key } = ctx;
  const where = { all: [{ attribute: 'score', gte: 4 }, { event: 'bought', count: { gte: 2 }, where: [{ property: 'total', eq: 10 }] }] };
  await waitFor('the purchases to be applied', async () => (await api.get('/v1/events?name=bought&limit=100', key)).body.data.items.length === 12, 10_000);
  const sent = await api.post('/v1/messages', key, { to: { where }, title: 'Buyers', body: 'thanks' });
  assert.is(sent.status, 202, sent.text);
  const message = await completed(ctx, sent.body.data.id);
  const buyers = Array.from({ length: 24 }, (_, i) => i).filter((i) => i % 4 === 0 && i >= 4);
  assert.equal(delivered(ctx, message.id), new Set(buyers.map(tokenOf)));
  assert.is(message.counts.sent, buyers.length);
});

audience('bad targets: unknown segment, invalid expression with its path', async (ctx) => {
  const { api, key } = ctx;
  const unknown = await api.post('/v1/messages', key, { to: { segment: 'no-such-segment' }, title: 't', body: 'b' });
  assert.is(unknown.status, 400);
  assert.is(unknown.body.error.details[0].param, 'to.segment');
  const bad = await api.post('/v1/messages', key, { to: { where: { all: [{ attribute: 'plan', eq: 'pro' }, { attribute: 'plan', between: [1, 2] }] } }, title: 't', body: 'b' });
  assert.is(bad.status, 400);
  assert.is(bad.body.error.code, 'validation');
  assert.ok(bad.body.error.details.some((d: any) => d.param.startsWith('to.where.all[1]')), JSON.stringify(bad.body.error.details));
});

audience('a window sharing its counter with a shorter kept one counts every event in it: to: { where } and a new segment', async (ctx) => {
  const { api, key } = ctx;
  // 1m and 3h windows both have 1-minute buckets, so they share one counter; the segment keeps only its minute of it
  await api.post('/v1/segments', key, { slug: 'knocked-1m', where: { any: [{ event: 'knock', within: '1m' }, { event: 'knock.done' }] } });
  await api.post('/v1/client/subscriptions', ctx.client, { externalId: 'kim', channel: 'push', token: tokenOf(100), platform: 'ios' });
  await api.post('/v1/events', key, { externalId: 'kim', name: 'knock', data: {}, timestamp: new Date(Date.now() - 10 * 60_000).toISOString() });
  await api.post('/v1/events', key, { externalId: 'kim', name: 'knock.done', data: {} });
  await waitFor('kim handled by the actors', async () => (await api.get('/v1/segments/knocked-1m/members', key)).body.data.items.length === 1, 10_000, 100);
  const where = { all: [{ attribute: 'externalId', eq: 'kim' }, { event: 'knock', within: '3h' }] };
  const sent = await api.post('/v1/messages', key, { to: { where }, title: 'Knock', body: 'in the last 3 hours' });
  assert.is(sent.status, 202, sent.text);
  const message = await completed(ctx, sent.body.data.id);
  assert.equal(delivered(ctx, message.id), new Set([tokenOf(100)]), 'the 10-minute-old knock counts in a 3h window');
  await api.post('/v1/segments', key, { slug: 'knocked-3h', where: { event: 'knock', within: '3h' } });
  await waitFor('the backfill', async () => (await api.get('/v1/segments/knocked-3h', key)).body.data.backfill.status === 'completed', 20_000, 100);
  const members = (await api.get('/v1/segments/knocked-3h/members', key)).body.data.items.map((m: any) => m.externalId);
  assert.equal(members, ['kim'], 'a new segment with the longer window counts the knock too');
});

audience.run();
