import { hostname } from 'node:os';
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { CHUNKS_IN_FLIGHT } from '../../actors/fanout.js';
import { partitionOf } from '../../lib/partition.js';
import { client } from '../helpers/api.js';
import type { ApnsPeer } from '../helpers/apns-peer.js';
import { startRoleProcess, stopRoleProcess, type RoleProcess } from '../helpers/processes.js';
import { apnsCredentials, pushSetup } from '../helpers/push-setup.js';
import { bootstrapWorkspace, startTestService, type TestService } from '../helpers/service.js';
import { inboxEvents } from '../helpers/inbox.js';
import { waitFor } from '../helpers/wait.js';

type Ctx = { service: TestService; peer: ApnsPeer; env: Record<string, string>; dispatchers: RoleProcess[] };
const kill = suite<Ctx>('fan-out survives a dispatcher SIGKILL');

const MEMBERS = 400;

/** The message once completed (by the dispatcher started after the kill). */
const completed = (api: ReturnType<typeof client>, key: string, id: string) => waitFor('the next dispatcher to complete the message', async () => {
  const m = (await api.get(`/v1/messages/${id}`, key)).body.data;
  return m.status === 'completed' ? m : null;
}, 30_000, 50);

/** The settings of a dispatcher process on the test service's Redis and key prefix. */
const dispatcherEnv = (ctx: Ctx) => ({ ...ctx.env, REDIS_URL: ctx.service.env.REDIS_URL!, REDIS_KEY_PREFIX: ctx.service.env.REDIS_KEY_PREFIX!, HERALD_PARTITIONS: ctx.service.env.HERALD_PARTITIONS! });

kill.before(async (ctx) => {
  const { peer, key, env } = await pushSetup();
  ctx.peer = peer;
  // a held push stays unanswered until the kill, however slow the machine: the request timeout
  // (default 5 s) would otherwise retry and complete it first, closing the window a test waits for
  ctx.env = { ...env, FANOUT_CHUNK_SIZE: '25', DISPATCHER_CLAIM_IDLE_MS: '1000', APNS_REQUEST_TIMEOUT_MS: '60000' };
  ctx.service = await startTestService('fanout-kill', ctx.env, ['web']);
  ctx.dispatchers = [];
  const api = client(ctx.service.url);
  const boot = await bootstrapWorkspace(ctx.service, 'kill');
  await api.call('PUT', '/v1/apps/apns', { key: boot.keys.tenant, body: apnsCredentials(key) });
  (ctx as any).boot = boot;
});
// each test starts with no dispatcher: one left running would read the next test's messages and,
// with a claim idle of 1 s, take over the entry a test holds in flight on purpose
kill.after.each(async (ctx) => {
  for (const d of ctx.dispatchers) await stopRoleProcess(d);
  ctx.dispatchers = [];
});
kill.after(async (ctx) => {
  for (const d of ctx.dispatchers) await stopRoleProcess(d);
  await ctx.service.stop();
  await ctx.peer.close();
});

kill('a dispatcher killed mid-fan-out is resumed by another: every device gets the message, none twice', async (ctx) => {
  const boot = (ctx as any).boot;
  const api = client(ctx.service.url);
  const ids = Array.from({ length: MEMBERS }, (_, i) => `k-${i}`);
  const tokens = new Set<string>();
  for (const id of ids) {
    const token = (0x5000 + tokens.size).toString(16).padStart(64, 'c');
    tokens.add(token);
    await api.post('/v1/client/subscriptions', boot.keys.client, { externalId: id, channel: 'push', token, platform: 'ios' });
  }
  await api.post('/v1/topics', boot.keys.tenant, { slug: 'kill-all' });
  await api.post('/v1/topics/kill-all/subscribers', boot.keys.tenant, { externalIds: ids });
  ctx.peer.respondWith({ delayMs: 15 }); // slow answers: the kill lands with pushes in flight
  const env = dispatcherEnv(ctx);
  const first = startRoleProcess('dispatcher', env);
  ctx.dispatchers.push(first);
  const sent = await api.post('/v1/messages', boot.keys.tenant, { to: { topic: 'kill-all' }, title: 'Survive', body: 'a SIGKILL' });
  const id = sent.body.data.id;
  await waitFor('the first dispatcher to be mid-fan-out', async () => {
    const m = (await api.get(`/v1/messages/${id}`, boot.keys.tenant)).body.data;
    return m.counts.sent >= 60;
  }, 30_000, 5);
  first.child.kill('SIGKILL');
  await first.exited;
  const atKill = (await api.get(`/v1/messages/${id}`, boot.keys.tenant)).body.data;
  assert.ok(atKill.counts.sent < MEMBERS, `killed before the end (${atKill.counts.sent} sent)`);
  ctx.dispatchers.push(startRoleProcess('dispatcher', env));
  const done = await waitFor('the second dispatcher to finish', async () => {
    const m = (await api.get(`/v1/messages/${id}`, boot.keys.tenant)).body.data;
    return m.status === 'completed' ? m : null;
  }, 60_000, 100);
  assert.equal(done.counts, { total: MEMBERS, pending: 0, sent: MEMBERS, failed: 0, skipped: 0, canceled: 0 });
  const received = ctx.peer.requests.filter((r) => (r.payload as any)?.herald?.messageId === id);
  const byToken = new Map<string, Set<string>>();
  for (const r of received) {
    const seen = byToken.get(r.token) ?? new Set<string>();
    seen.add(`${r.apnsId}|${r.headers['apns-collapse-id']}`);
    byToken.set(r.token, seen);
  }
  assert.equal(new Set(byToken.keys()), tokens, 'every device got the message');
  for (const [token, seen] of byToken) assert.is(seen.size, 1, `${token}: one apns-id and collapse id, so the device shows it once`);
  const resent = received.length - MEMBERS;
  // at most the chunks in flight (25 subscribers each) were unsettled at the kill
  assert.ok(resent <= CHUNKS_IN_FLIGHT * 25, `only pushes in flight at the kill are sent again (${resent})`);
  if (process.env.HERALD_TEST_VERBOSE) console.log(`killed at ${atKill.counts.sent} sent; ${resent} in-flight pushes sent again`);
});

/**
 * A topic of 50 devices and a message to it, sent by a dispatcher while the peer holds the push to
 * device 7 unanswered: once the other 49 are recorded sent (its chunk of 25 unsettled, the stored
 * cursor before it), that dispatcher is SIGKILLed.
 */
async function killedHoldingOne(ctx: Ctx, name: string, fill: string): Promise<{ api: ReturnType<typeof client>; boot: any; id: string; tokenOf: (i: number) => string; env: Record<string, string> }> {
  const boot = (ctx as any).boot;
  const api = client(ctx.service.url);
  const ids = Array.from({ length: 50 }, (_, i) => `${name}-${i}`);
  const tokenOf = (i: number) => (0x7000 + i).toString(16).padStart(64, fill);
  for (const [i, id] of ids.entries()) await api.post('/v1/client/subscriptions', boot.keys.client, { externalId: id, channel: 'push', token: tokenOf(i), platform: 'ios' });
  await api.post('/v1/topics', boot.keys.tenant, { slug: name });
  await api.post(`/v1/topics/${name}/subscribers`, boot.keys.tenant, { externalIds: ids });
  ctx.peer.reset();
  ctx.peer.respondWith({ token: tokenOf(7), delayMs: 60_000, times: 1 }); // held: its chunk never finishes before the kill
  const env = dispatcherEnv(ctx);
  const first = startRoleProcess('dispatcher', env);
  ctx.dispatchers.push(first);
  const id = (await api.post('/v1/messages', boot.keys.tenant, { to: { topic: name }, title: 'Held', body: 'one push' })).body.data.id;
  // every push answered but the held one is recorded, its chunk (25) unfinished included (the wait
  // covers the dispatcher process's start, as the other tests' 30 s do)
  await waitFor('49 of 50 pushes recorded as sent', async () => (await api.get(`/v1/messages/${id}`, boot.keys.tenant)).body.data.counts.sent === 49, 30_000, 20);
  first.child.kill('SIGKILL');
  await first.exited;
  return { api, boot, id, tokenOf, env };
}

kill('a dispatcher killed while one push of a chunk is unanswered sends again only that push: the chunk\'s answered pushes were recorded as they came', async (ctx) => {
  const { api, boot, id, tokenOf, env } = await killedHoldingOne(ctx, 'hold-one', 'e');
  ctx.dispatchers.push(startRoleProcess('dispatcher', env));
  const done = await completed(api, boot.keys.tenant, id);
  assert.equal(done.counts, { total: 50, pending: 0, sent: 50, failed: 0, skipped: 0, canceled: 0 });
  const received = ctx.peer.requests.filter((r) => (r.payload as any)?.herald?.messageId === id);
  assert.is(received.length, 51, 'the 50 pushes, and the held one again');
  assert.is(received.filter((r) => r.token === tokenOf(7)).length, 2);
});

kill('a topic deleted while its dispatcher lies dead mid-fan-out: the next one sends the deliveries left pending and completes the message (probe AB: it stayed sending for good)', async (ctx) => {
  const { api, boot, id, tokenOf, env } = await killedHoldingOne(ctx, 'gone-mid-way', 'f');
  assert.is((await api.del('/v1/topics/gone-mid-way', boot.keys.tenant)).status, 200);
  ctx.dispatchers.push(startRoleProcess('dispatcher', env));
  const done = await completed(api, boot.keys.tenant, id);
  assert.equal([done.error, done.counts], ['topic_deleted', { total: 50, pending: 0, sent: 50, failed: 0, skipped: 0, canceled: 0 }]);
  assert.is(ctx.peer.requests.filter((r) => (r.payload as any)?.herald?.messageId === id && r.token === tokenOf(7)).length, 2, 'the held push sent again');
});

/** The subscription id of the device `token` of `externalId`. */
async function subscriptionOf(api: ReturnType<typeof client>, key: string, externalId: string): Promise<string> {
  const list = await api.get(`/v1/subscribers/${externalId}/subscriptions`, key);
  assert.is(list.status, 200, list.text);
  return list.body.data.items[0].id;
}

const heldDelivery = async (api: ReturnType<typeof client>, key: string, id: string, externalId: string) =>
  (await api.get(`/v1/messages/${id}/deliveries?limit=100`, key)).body.data.items.filter((d: any) => d.externalId === externalId);

kill('a device muted, or removed, or its subscriber deleted, while the dispatcher lies dead with its push pending: the next one settles it skipped and completes the message (probe AF: it stayed sending for good)', async (ctx) => {
  // the held device's deliveries afterwards ([status, reason], sorted): a removed device's subscriber
  // is walked again (its chunk was unsettled) and, with no device left, gets a no_subscription one;
  // a deleted subscriber left the topic, so only the pending delivery remains, settled
  type Change = (api: ReturnType<typeof client>, key: string, externalId: string) => Promise<void>;
  const cases: [string, string, Change, string[][]][] = [
    ['muted', '1', async (api, key, x) => void assert.is((await api.patch(`/v1/subscribers/${x}/subscriptions/${await subscriptionOf(api, key, x)}`, key, { enabled: false })).status, 200), [['skipped', 'subscription_disabled']]],
    ['removed', '2', async (api, key, x) => void assert.is((await api.del(`/v1/subscribers/${x}/subscriptions/${await subscriptionOf(api, key, x)}`, key)).status, 200), [['skipped', 'no_subscription'], ['skipped', 'subscription_removed']]],
    ['deleted', '3', async (api, key, x) => void assert.is((await api.del(`/v1/subscribers/${x}`, key)).status, 200), [['skipped', 'subscriber_not_found']]],
  ];
  for (const [name, fill, change, expected] of cases) {
    const { api, boot, id, tokenOf, env } = await killedHoldingOne(ctx, `left-${name}`, fill);
    await change(api, boot.keys.tenant, `left-${name}-7`);
    const dispatcher = startRoleProcess('dispatcher', env);
    ctx.dispatchers.push(dispatcher);
    const done = await completed(api, boot.keys.tenant, id);
    assert.is(done.error, null, name);
    const deliveries = await heldDelivery(api, boot.keys.tenant, id, `left-${name}-7`);
    assert.equal(deliveries.map((d: any) => [d.status, d.reason]).sort(), expected, name);
    assert.equal(done.counts, { total: 49 + expected.length, pending: 0, sent: 49, failed: 0, skipped: expected.length, canceled: 0 }, name);
    assert.is(ctx.peer.requests.filter((r) => (r.payload as any)?.herald?.messageId === id && r.token === tokenOf(7)).length, 1, `${name}: the held push is not sent again`);
    await stopRoleProcess(dispatcher);
  }
});

kill('a topic deleted and created again under its slug while the dispatcher lies dead mid-fan-out: the next one does not walk the new topic, and completes with topic_deleted (probe AF)', async (ctx) => {
  const { api, boot, id, tokenOf, env } = await killedHoldingOne(ctx, 'reslug', '4');
  const others = Array.from({ length: 10 }, (_, i) => `reslug-new-${i}`);
  const newTokens = others.map((_, i) => (0x7100 + i).toString(16).padStart(64, '5'));
  for (const [i, x] of others.entries()) await api.post('/v1/client/subscriptions', boot.keys.client, { externalId: x, channel: 'push', token: newTokens[i], platform: 'ios' });
  assert.is((await api.del('/v1/topics/reslug', boot.keys.tenant)).status, 200);
  assert.is((await api.post('/v1/topics', boot.keys.tenant, { slug: 'reslug' })).status, 201);
  await api.post('/v1/topics/reslug/subscribers', boot.keys.tenant, { externalIds: others });
  ctx.dispatchers.push(startRoleProcess('dispatcher', env));
  const done = await completed(api, boot.keys.tenant, id);
  assert.equal([done.error, done.counts], ['topic_deleted', { total: 50, pending: 0, sent: 50, failed: 0, skipped: 0, canceled: 0 }]);
  const received = ctx.peer.requests.filter((r) => (r.payload as any)?.herald?.messageId === id);
  assert.is(received.filter((r) => r.token === tokenOf(7)).length, 2, 'the held push sent again');
  assert.is(received.filter((r) => newTokens.includes(r.token)).length, 0, 'nobody of the new topic');
});

kill('a message queued while no dispatcher runs goes to the topic its slug named when it was accepted: one deleted and made again under the slug meanwhile fails it topic_not_found, nobody of the new topic pushed (probe DW)', async (ctx) => {
  const boot = (ctx as any).boot;
  const api = client(ctx.service.url);
  const oldToken = 'e1'.repeat(32);
  const newToken = 'e2'.repeat(32);
  await api.post('/v1/client/subscriptions', boot.keys.client, { externalId: 'queued-old', channel: 'push', token: oldToken, platform: 'ios' });
  await api.post('/v1/client/subscriptions', boot.keys.client, { externalId: 'queued-new', channel: 'push', token: newToken, platform: 'ios' });
  await api.post('/v1/topics', boot.keys.tenant, { slug: 'queued-re' });
  await api.post('/v1/topics/queued-re/subscribers', boot.keys.tenant, { externalIds: ['queued-old'] });
  const sent = await api.post('/v1/messages', boot.keys.tenant, { to: { topic: 'queued-re' }, title: 'Old', body: 'topic' });
  assert.is(sent.status, 202);
  assert.is((await api.del('/v1/topics/queued-re', boot.keys.tenant)).status, 200);
  assert.is((await api.post('/v1/topics', boot.keys.tenant, { slug: 'queued-re' })).status, 201);
  await api.post('/v1/topics/queued-re/subscribers', boot.keys.tenant, { externalIds: ['queued-new'] });
  ctx.dispatchers.push(startRoleProcess('dispatcher', dispatcherEnv(ctx)));
  const done = await waitFor('the dispatcher to end the message', async () => {
    const m = (await api.get(`/v1/messages/${sent.body.data.id}`, boot.keys.tenant)).body.data;
    return m.status === 'failed' || m.status === 'completed' ? m : null;
  }, 30_000, 50);
  assert.equal([done.status, done.error, done.counts.total], ['failed', 'topic_not_found', 0]);
  assert.is(ctx.peer.requests.filter((r) => (r.payload as any)?.herald?.messageId === sent.body.data.id).length, 0, 'nobody pushed');
});

kill('a one-subscriber push in flight at the kill whose subscriber is deleted before the next dispatcher: settled skipped, the message completes (probe AF)', async (ctx) => {
  const boot = (ctx as any).boot;
  const api = client(ctx.service.url);
  await api.post('/v1/client/subscriptions', boot.keys.client, { externalId: 'one-gone', channel: 'push', token: 'd2'.repeat(32), platform: 'ios' });
  ctx.peer.reset();
  ctx.peer.respondWith({ delayMs: 60_000, times: 1 });
  const env = dispatcherEnv(ctx);
  const first = startRoleProcess('dispatcher', env);
  ctx.dispatchers.push(first);
  const id = (await api.post('/v1/messages', boot.keys.tenant, { to: 'one-gone', title: 'Gone', body: 'meanwhile' })).body.data.id;
  await waitFor('the push to reach the peer', async () => ctx.peer.requests.some((r) => (r.payload as any)?.herald?.messageId === id), 30_000, 5);
  first.child.kill('SIGKILL');
  await first.exited;
  assert.is((await api.del('/v1/subscribers/one-gone', boot.keys.tenant)).status, 200);
  ctx.dispatchers.push(startRoleProcess('dispatcher', env));
  const done = await completed(api, boot.keys.tenant, id);
  // the pending delivery to the device, and the one the resumed chunk made for a subscriber it did not find
  assert.equal(done.counts, { total: 2, pending: 0, sent: 0, failed: 0, skipped: 2, canceled: 0 });
  const deliveries = (await api.get(`/v1/messages/${id}/deliveries`, boot.keys.tenant)).body.data.items;
  assert.equal(deliveries.map((d: any) => [d.status, d.reason, d.subscriptionId === null]).sort(), [['skipped', 'subscriber_not_found', false], ['skipped', 'subscriber_not_found', true]]);
  assert.is(ctx.peer.requests.filter((r) => (r.payload as any)?.herald?.messageId === id).length, 1, 'not sent again');
});

kill('subscribers created after a where message started sending are not in its audience, however far the walk is (probe AF: one deleted and created again mid-walk was pushed twice)', async (ctx) => {
  const boot = (ctx as any).boot;
  const api = client(ctx.service.url);
  const partitions = Number(ctx.service.env.HERALD_PARTITIONS);
  const ids = Array.from({ length: 150 }, (_, i) => `walk-${i}`);
  const tokenOf = (i: number) => (0xb000 + i).toString(16).padStart(64, '6');
  for (const [i, id] of ids.entries()) await api.post('/v1/client/subscriptions', boot.keys.client, { externalId: id, channel: 'push', token: tokenOf(i), platform: 'ios' });
  // a push of the first partition's page is held: the walk stops with three pages in flight, the
  // later partitions unread
  const first = ids.findIndex((x) => partitionOf(boot.tenant.id, x, partitions) === 0);
  ctx.peer.reset();
  ctx.peer.respondWith({ token: tokenOf(first), delayMs: 4_000, times: 1 });
  ctx.dispatchers.push(startRoleProcess('dispatcher', dispatcherEnv(ctx)));
  const id = (await api.post('/v1/messages', boot.keys.tenant, { to: { where: { attribute: 'externalId', startsWith: 'walk-' } }, title: 'Walk', body: 'then' })).body.data.id;
  await waitFor('the held push to reach the peer', async () => ctx.peer.requests.some((r) => r.token === tokenOf(first)), 30_000, 5);
  const late = Array.from({ length: 20 }, (_, i) => (0xc000 + i).toString(16).padStart(64, '6'));
  for (const [i, token] of late.entries()) await api.post('/v1/client/subscriptions', boot.keys.client, { externalId: `walk-late-${i}`, channel: 'push', token, platform: 'ios' });
  const done = await completed(api, boot.keys.tenant, id);
  assert.equal(done.counts, { total: 150, pending: 0, sent: 150, failed: 0, skipped: 0, canceled: 0 });
  const received = ctx.peer.requests.filter((r) => (r.payload as any)?.herald?.messageId === id);
  assert.is(received.filter((r) => late.includes(r.token)).length, 0, 'no subscriber created after the start');
  assert.is(new Set(received.map((r) => r.token)).size, 150);
});

kill('a dispatcher killed with a one-subscriber push in flight: the next one sends it again under the same apns-id and completes the message once', async (ctx) => {
  const boot = (ctx as any).boot;
  const api = client(ctx.service.url);
  const token = 'd1'.repeat(32);
  await api.post('/v1/client/subscriptions', boot.keys.client, { externalId: 'one-kill', channel: 'push', token, platform: 'ios' });
  ctx.peer.reset();
  ctx.peer.respondWith({ delayMs: 5_000, times: 1 }); // the first push is held: the kill lands before its answer
  const env = dispatcherEnv(ctx);
  const first = startRoleProcess('dispatcher', env);
  ctx.dispatchers.push(first);
  const sent = await api.post('/v1/messages', boot.keys.tenant, { to: 'one-kill', title: 'Once', body: 'after a SIGKILL' });
  const id = sent.body.data.id;
  await waitFor('the push to reach the peer', async () => ctx.peer.requests.some((r) => (r.payload as any)?.herald?.messageId === id), 30_000, 5);
  first.child.kill('SIGKILL');
  await first.exited;
  // killed between the deliveries' creation (the fan-out marked done with it) and the settling
  const atKill = (await api.get(`/v1/messages/${id}`, boot.keys.tenant)).body.data;
  assert.is(atKill.status, 'sending');
  assert.equal(atKill.counts, { total: 1, pending: 1, sent: 0, failed: 0, skipped: 0, canceled: 0 });
  ctx.dispatchers.push(startRoleProcess('dispatcher', env));
  const done = await completed(api, boot.keys.tenant, id);
  assert.equal(done.counts, { total: 1, pending: 0, sent: 1, failed: 0, skipped: 0, canceled: 0 });
  const deliveries = (await api.get(`/v1/messages/${id}/deliveries`, boot.keys.tenant)).body.data.items;
  assert.is(deliveries.length, 1);
  assert.is(deliveries[0].status, 'sent');
  const received = ctx.peer.requests.filter((r) => (r.payload as any)?.herald?.messageId === id);
  assert.is(received.length, 2, 'sent once before the kill, once after');
  assert.is(new Set(received.map((r) => `${r.apnsId}|${r.headers['apns-collapse-id']}`)).size, 1, 'same apns-id and collapse id: the device shows it once');
});

kill('a dispatcher killed mid-batch of one-subscriber messages: the next one sends only the unanswered push again, and every message completes once', async (ctx) => {
  const boot = (ctx as any).boot;
  const api = client(ctx.service.url);
  const ids = Array.from({ length: 40 }, (_, i) => `b-${i}`);
  const tokenOf = (i: number) => (0x9000 + i).toString(16).padStart(64, 'c');
  for (const [i, id] of ids.entries()) await api.post('/v1/client/subscriptions', boot.keys.client, { externalId: id, channel: 'push', token: tokenOf(i), platform: 'ios' });
  ctx.peer.reset();
  ctx.peer.respondWith({ token: tokenOf(7), delayMs: 60_000, times: 1 }); // held: the batch never finishes before the kill
  // queued with no dispatcher running, so the first one reads them as one batch; b-3 gets two messages
  const targets = [...ids, 'b-3'];
  const messageIds: string[] = [];
  for (const [i, to] of targets.entries()) messageIds.push((await api.post('/v1/messages', boot.keys.tenant, { to, title: 'Batch', body: `message ${i}` })).body.data.id);
  const env = dispatcherEnv(ctx);
  const first = startRoleProcess('dispatcher', env);
  ctx.dispatchers.push(first);
  const status = async (id: string) => (await api.get(`/v1/messages/${id}`, boot.keys.tenant)).body.data;
  await waitFor('every message but the held one completed', async () => {
    const all = await Promise.all(messageIds.map(status));
    return all.filter((m) => m.status === 'completed').length === targets.length - 1;
  }, 30_000, 20);
  first.child.kill('SIGKILL');
  await first.exited;
  const held = messageIds[7]!;
  assert.equal((await status(held)).counts, { total: 1, pending: 1, sent: 0, failed: 0, skipped: 0, canceled: 0 });
  ctx.dispatchers.push(startRoleProcess('dispatcher', env));
  await completed(api, boot.keys.tenant, held);
  for (const id of messageIds) {
    const m = await status(id);
    assert.is(m.status, 'completed', id);
    assert.equal(m.counts, { total: 1, pending: 0, sent: 1, failed: 0, skipped: 0, canceled: 0 }, id);
  }
  const received = ctx.peer.requests.filter((r) => messageIds.includes((r.payload as any)?.herald?.messageId));
  assert.is(received.length, targets.length + 1, 'one push per message, and the held one again');
  const heldPushes = received.filter((r) => (r.payload as any).herald.messageId === held);
  assert.is(heldPushes.length, 2);
  assert.is(new Set(heldPushes.map((r) => r.apnsId)).size, 1, 'under the same apns-id');
  assert.is(received.filter((r) => r.token === tokenOf(3)).length, 2, 'the subscriber named twice got both messages');
});

/**
 * Probe K2: with two dispatchers alive, a fan-out that took longer than DISPATCHER_CLAIM_IDLE_MS (a
 * slow push provider) had its queue entry claimed by the other dispatcher, which walked the message
 * again: 500 devices got 644 pushes, 150 one-subscriber messages 230. The dispatcher working a batch
 * keeps its claims fresh (the consumer runtime), so the other never takes a live one's work.
 */
kill('two live dispatchers and fan-outs longer than the claim idle limit: every device gets each message once', async (ctx) => {
  const boot = (ctx as any).boot;
  const api = client(ctx.service.url);
  const ids = Array.from({ length: 100 }, (_, i) => `slow-${i}`);
  const tokenOf = (i: number) => (0xa000 + i).toString(16).padStart(64, 'f');
  for (const [i, id] of ids.entries()) await api.post('/v1/client/subscriptions', boot.keys.client, { externalId: id, channel: 'push', token: tokenOf(i), platform: 'ios' });
  await api.post('/v1/topics', boot.keys.tenant, { slug: 'slow-all' });
  await api.post('/v1/topics/slow-all/subscribers', boot.keys.tenant, { externalIds: ids });
  ctx.peer.reset();
  ctx.peer.respondWith({ delayMs: 1_200 }); // each chunk of 25 takes longer than the claim idle limit (1 s)
  const env = dispatcherEnv(ctx);
  ctx.dispatchers.push(startRoleProcess('dispatcher', env), startRoleProcess('dispatcher', env));
  const topic = (await api.post('/v1/messages', boot.keys.tenant, { to: { topic: 'slow-all' }, title: 'Slow', body: 'topic' })).body.data.id;
  const ones: string[] = [];
  for (const id of ids.slice(0, 10)) ones.push((await api.post('/v1/messages', boot.keys.tenant, { to: id, title: 'Slow', body: 'one' })).body.data.id);
  for (const id of [topic, ...ones]) await completed(api, boot.keys.tenant, id);
  await new Promise((r) => setTimeout(r, 1_500)); // a second walk would still be sending
  const received = ctx.peer.requests.filter((r) => [topic, ...ones].includes((r.payload as any)?.herald?.messageId));
  const perMessageToken = new Map<string, number>();
  for (const r of received) {
    const k = `${(r.payload as any).herald.messageId}|${r.token}`;
    perMessageToken.set(k, (perMessageToken.get(k) ?? 0) + 1);
  }
  const twice = [...perMessageToken].filter(([, n]) => n > 1);
  ctx.peer.reset();
  assert.is(received.length, 110, `one push per device and message (${twice.length} sent more than once)`);
});

kill('a dispatcher stopped between a message\'s $send and its deliveries leaves the next one both to write: a message whose deliveries are all skipped still gets its $send, once', async (ctx) => {
  // The first dispatcher cannot write `$send`: its INBOX_MAX_BACKLOG is below the backlog of the
  // subscriber's partition (no worker runs here), so ingest refuses it, as it would refuse any
  // write of a dispatcher killed at that point. Deliveries were made first, and a one-subscriber
  // message with no device completed there: the next dispatcher had nothing left to resume.
  const boot = (ctx as any).boot;
  const api = client(ctx.service.url);
  const externalId = 'no-device-send';
  for (let i = 0; i < 2; i++) {
    const res = await api.post('/v1/events', boot.keys.tenant, { events: Array.from({ length: 100 }, () => ({ externalId, name: 'fill.up' })) });
    assert.is(res.status, 202, res.text);
  }
  const sent = await api.post('/v1/messages', boot.keys.tenant, { to: externalId, title: 'Hi', body: 'no device' });
  assert.is(sent.status, 202, sent.text);
  const messageId = sent.body.data.id as string;
  const sends = async () => (await inboxEvents(ctx.service, boot.tenant.id, externalId)).filter((e) => e.name === '$send');
  const first = startRoleProcess('dispatcher', { ...dispatcherEnv(ctx), INBOX_MAX_BACKLOG: '100' });
  ctx.dispatchers.push(first);
  await waitFor('the first dispatcher to start', async () => (await ctx.service.redis.hexists(ctx.service.keys.processes, `dispatcher:${hostname()}:${first.child.pid}`)) === 1, 45_000, 50);
  await new Promise((r) => setTimeout(r, 2_000)); // it reads the message and is refused
  first.child.kill('SIGKILL');
  await first.exited;
  assert.equal(await sends(), [], 'no $send yet');
  ctx.dispatchers.push(startRoleProcess('dispatcher', dispatcherEnv(ctx)));
  const m = await completed(api, boot.keys.tenant, messageId);
  assert.equal(m.counts, { total: 1, pending: 0, sent: 0, failed: 0, skipped: 1, canceled: 0 });
  const written = await waitFor('the $send', async () => { const found = await sends(); return found.length ? found : null; }, 10_000, 50);
  await new Promise((r) => setTimeout(r, 500));
  assert.is((await sends()).length, 1, 'once');
  assert.is(written[0]!.data.messageId, messageId);
});

kill.run();
