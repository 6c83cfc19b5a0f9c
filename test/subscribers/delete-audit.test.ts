import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { setWebhookResolver } from '../../lib/webhook-resolver.js';
import { client } from '../helpers/api.js';
import { auditEntries, eventIdsByTarget, killUnderLoad, oneEntryEach, outboxesEmptied, startSweeper, startWebProcess, killSuite } from '../helpers/audit.js';
import { bootstrapWorkspace, startTestService, type TestService } from '../helpers/service.js';
import { startReceiver, type Receiver } from '../helpers/webhook-receiver.js';
import { waitFor } from '../helpers/wait.js';

// Deleting a subscriber removes the subscriptions it held: the audit ledger says so with one
// subscription.deleted each, recorded by the delete's own write (one outbox intent, before the
// subscriber.deleted), so a webhook endpoint on subscription.deleted learns the devices went away;
// a merge's delete, whose devices moved, records none; a delete killed mid-way still ends with one
// entry per subscription.

type Api = ReturnType<typeof client>;
type Boot = Awaited<ReturnType<typeof bootstrapWorkspace>>;
type Ctx = { service: TestService; api: Api; boot: Boot };

const token = (n: number) => n.toString(16).padStart(64, 'd');

/** Registers a device (push) or an address (email) for `externalId` through the client API; the subscription as answered. */
async function register(ctx: Ctx, externalId: string, body: Record<string, unknown>) {
  const res = await ctx.api.post('/v1/client/subscriptions', ctx.boot.keys.client, { externalId, ...body });
  assert.is(res.status, 201, res.text);
  return res.body.data;
}

/** The subscriptions of `externalId` as GET /v1/subscribers/{externalId}/subscriptions shows them. */
async function shown(ctx: Ctx, externalId: string): Promise<any[]> {
  const res = await ctx.api.get(`/v1/subscribers/${externalId}/subscriptions`, ctx.boot.keys.tenant);
  assert.is(res.status, 200, res.text);
  return res.body.data.items;
}

/**
 * `externalId` (created by POST /v1/subscribers) with 2 push devices (one muted) and 1 email
 * address; answers its subscriptions as the API shows them, oldest first.
 */
async function subscriberWithThree(ctx: Ctx, externalId: string, n: number): Promise<any[]> {
  assert.is((await ctx.api.post('/v1/subscribers', ctx.boot.keys.tenant, { externalId, email: `${externalId}@example.com` })).status, 201);
  await register(ctx, externalId, { channel: 'push', token: token(n), platform: 'ios', device: { model: 'iPhone15,2' } });
  const muted = await register(ctx, externalId, { channel: 'push', token: token(n + 1), platform: 'android' });
  assert.is((await ctx.api.patch(`/v1/client/subscriptions/${muted.id}`, ctx.boot.keys.client, { enabled: false })).status, 200);
  await register(ctx, externalId, { channel: 'email', address: `Mail-${externalId}@Example.com` });
  const subscriptions = await shown(ctx, externalId);
  assert.is(subscriptions.length, 3);
  return subscriptions.sort((a, b) => (a.id < b.id ? -1 : 1));
}

const deletion = suite<Ctx>('the audit entries of a deleted subscriber\'s subscriptions');

deletion.before(async (ctx) => {
  ctx.service = await startTestService('delete-audit');
  ctx.api = client(ctx.service.url);
  ctx.boot = await bootstrapWorkspace(ctx.service, 'delete-audit');
});
deletion.after(async (ctx) => ctx.service.stop());

deletion('DELETE /v1/subscribers records one subscription.deleted per subscription held (2 devices, 1 address), oldest first, then subscriber.deleted, with the same actor and request', async (ctx) => {
  const { api, boot, service } = ctx;
  const before = await subscriberWithThree(ctx, 'leaving', 1);
  // a subscriber that stays, with its own device
  const staying = await register(ctx, 'staying', { channel: 'push', token: token(100), platform: 'ios' });

  const res = await api.del('/v1/subscribers/leaving', boot.keys.tenant);
  assert.is(res.status, 200, res.text);
  const requestId = res.headers.get('request-id');

  const entries = (await auditEntries(service, boot.workspace.id)).filter((e) => e.type === 'subscription.deleted' || e.type === 'subscriber.deleted');
  assert.equal(entries.map((e) => [e.type, e.target.id]), [...before.map((s) => ['subscription.deleted', s.id]), ['subscriber.deleted', res.body.data.id]]);
  for (const [i, s] of before.entries()) {
    assert.equal(entries[i]!.target, { type: 'subscription', id: s.id });
    assert.equal(entries[i]!.data.object, s, 'the subscription as the API showed it');
  }
  const last = entries.at(-1)!;
  assert.is(last.actor.type, 'api_key');
  assert.is(last.request?.id, requestId, 'the request of the DELETE');
  for (const e of entries) assert.equal([e.actor, e.request, e.workspace, e.tenant, e.createdAt], [last.actor, last.request, last.workspace, last.tenant, last.createdAt]);
  assert.equal((await shown(ctx, 'staying')).map((s) => s.id), [staying.id], 'the other subscriber keeps its device');
  const pending = await Promise.all(Array.from({ length: service.config.partitions }, (_, p) => service.redis.hlen(service.keys.partitionOutbox(p))));
  assert.equal(pending.filter((n) => n > 0), [], 'the request settled its intent');
});

deletion('identify merging an anonymous subscriber that held a device and an address: the device one subscription.updated (moved); the address one subscription.created for the identified user and one subscription.deleted of the anonymous one\'s (addresses never move)', async (ctx) => {
  const { api, boot, service } = ctx;
  const device = await register(ctx, 'anon-m', { channel: 'push', token: token(200), platform: 'ios' });
  const address = await register(ctx, 'anon-m', { channel: 'email', address: 'anon-m@example.com' });
  const res = await api.post('/v1/client/identify', boot.keys.client, { externalId: 'user-m', anonymousId: 'anon-m', source: 'ios' });
  assert.ok(res.status === 200 || res.status === 201, res.text);
  assert.is((await api.get('/v1/subscribers/anon-m', boot.keys.tenant)).status, 404, 'the anonymous subscriber is deleted');
  const own = (await api.get('/v1/subscribers/user-m/subscriptions', boot.keys.tenant)).body.data.items.find((s: any) => s.channel === 'email');
  assert.is(own.address, 'anon-m@example.com');
  assert.is.not(own.id, address.id);
  const entries = (await auditEntries(service, boot.workspace.id)).filter((e) => [device.id, address.id, own.id].includes(e.target?.id) || e.data?.object?.externalId === 'anon-m');
  assert.equal(entries.filter((e) => e.type === 'subscription.deleted').map((e) => e.target.id), [address.id]);
  assert.equal(entries.filter((e) => e.type === 'subscription.created').map((e) => e.target.id).sort(), [device.id, address.id, own.id].sort(), 'the anonymous one\'s two, then the identified one\'s address');
  assert.equal(entries.filter((e) => e.type === 'subscription.updated').map((e) => [e.target.id, e.changes.externalId]), [[device.id, 'user-m']]);
  assert.is(entries.filter((e) => e.type === 'subscriber.deleted').length, 1);
});

deletion.run();

type HookCtx = Ctx & { receiver: Receiver };
const ENV = { WEBHOOK_ALLOW_PRIVATE_NETWORKS: '127.0.0.0/8,::1/128', WEBHOOK_RETRY_SCHEDULE: '1s', WEBHOOK_ATTEMPT_TIMEOUT_MS: '1000' };
const hook = suite<HookCtx>('a webhook endpoint on subscription.deleted and a subscriber delete');

hook.before(async (ctx) => {
  ctx.service = await startTestService('delete-audit-hook', ENV, ['web', 'worker', 'dispatcher']);
  ctx.api = client(ctx.service.url);
  ctx.boot = await bootstrapWorkspace(ctx.service, 'delete-audit-hook');
  ctx.receiver = await startReceiver();
});
hook.after(async (ctx) => {
  await ctx.receiver.close();
  setWebhookResolver(null);
  await ctx.service.stop();
});

hook('DELETE /v1/subscribers: the endpoint receives exactly three subscription.deleted (2 devices, 1 address), the subscriptions as the API showed them', async (ctx) => {
  const { api, boot, receiver } = ctx;
  const created = await api.post(`/v1/workspaces/${boot.workspace.slug}/webhooks`, boot.keys.workspace, { url: `${receiver.url}/hook`, events: ['subscription.deleted'] });
  assert.is(created.status, 201, created.text);
  receiver.secrets.push(created.body.data.secret);
  const before = await subscriberWithThree(ctx, 'leaving', 1);
  await register(ctx, 'staying', { channel: 'push', token: token(100), platform: 'ios' });

  const res = await api.del('/v1/subscribers/leaving', boot.keys.tenant);
  assert.is(res.status, 200, res.text);
  await waitFor('three deliveries', async () => receiver.requests.length >= 3, 15_000, 50);
  await new Promise((r) => setTimeout(r, 1_000)); // nothing more arrives
  assert.is(receiver.requests.length, 3, 'exactly three deliveries');
  for (const r of receiver.requests) assert.equal(r.failures, [], 'verified with the endpoint secret');
  const bodies = receiver.requests.map((r) => r.body).sort((a, b) => (a.target.id < b.target.id ? -1 : 1));
  assert.equal(bodies.map((b) => [b.type, b.target]), before.map((s) => ['subscription.deleted', { type: 'subscription', id: s.id }]));
  assert.equal(bodies.map((b) => b.data.object), before, 'the subscriptions as the API showed them');
  assert.equal(new Set(receiver.requests.map((r) => r.id)).size, 3, 'three events');
  for (const b of bodies) assert.equal([b.actor.type, b.request?.id], ['api_key', res.headers.get('request-id')]);
});

hook.run();

const SUBSCRIBERS = 240;
const CLIENTS = 24;

const kill = killSuite('subscription.deleted of a subscriber delete survives a web process killed mid-delete', 'delete-audit-kill');

kill('deletes of subscribers holding 2 devices and 1 address, SIGKILLed under load, then retried: exactly one subscription.deleted (one event id) per subscription, none for the survivors', async (ctx) => {
  const { service } = ctx;
  const boot = await bootstrapWorkspace(service, 'kill');
  const api = client(service.url);
  const held = new Map<string, string[]>();
  for (let i = 0; i < SUBSCRIBERS; i++) {
    const x = `k-${i}`;
    const ids: string[] = [];
    for (const body of [{ channel: 'push', token: token(1000 + 2 * i), platform: 'ios' }, { channel: 'push', token: token(1001 + 2 * i), platform: 'android' }, { channel: 'email', address: `${x}@example.com` }]) {
      const res = await api.post('/v1/client/subscriptions', boot.keys.client, { externalId: x, ...body });
      assert.is(res.status, 201, res.text);
      ids.push(res.body.data.id);
    }
    held.set(x, ids);
  }
  // one survivor keeps its subscriptions throughout
  const survivor = 'k-survivor';
  const kept = (await api.post('/v1/client/subscriptions', boot.keys.client, { externalId: survivor, channel: 'push', token: token(9999), platform: 'ios' })).body.data.id;

  const partitionOutboxes = Array.from({ length: service.config.partitions }, (_, p) => service.keys.partitionOutbox(p));
  const names = [...held.keys()];
  let next = 0, deleted = 0;
  const { web, api: webApi } = await startWebProcess(service);
  ctx.web = web;
  await killUnderLoad(web, CLIENTS, async () => {
    const x = names[next++];
    if (x === undefined) throw new Error('every delete was answered before the kill');
    const res = await webApi.del(`/v1/subscribers/${x}`, boot.keys.tenant);
    assert.is(res.status, 200, res.text);
    deleted++;
  }, async () => deleted >= SUBSCRIBERS / 3);
  ctx.web = undefined;
  const left = (await Promise.all(partitionOutboxes.map((k) => service.redis.hlen(k)))).reduce((a, b) => a + b, 0);
  ctx.worker = startSweeper(service);
  await outboxesEmptied(service, partitionOutboxes);

  // the deletes the kill interrupted (or never sent) are retried on a new process: a subscriber the
  // killed delete removed answers 404 and records nothing more
  const retry = await startWebProcess(service);
  ctx.web = retry.web;
  for (const x of names) {
    const res = await retry.api.del(`/v1/subscribers/${x}`, boot.keys.tenant);
    assert.ok(res.status === 200 || res.status === 404, res.text);
  }
  await outboxesEmptied(service, partitionOutboxes);

  const entries = await auditEntries(service, boot.workspace.id);
  const all = new Set([...held.values()].flat());
  assert.equal(oneEntryEach(entries, 'subscription.deleted', all, 'subscriptions'), [], `${left} intents left by the killed process`);
  assert.not.ok(eventIdsByTarget(entries, 'subscription.deleted').has(kept), 'the survivor\'s device is not deleted');
  const subscriberDeletes = eventIdsByTarget(entries, 'subscriber.deleted');
  assert.is(subscriberDeletes.size, SUBSCRIBERS, 'a subscriber.deleted per subscriber');
  assert.ok([...subscriberDeletes.values()].every((ids) => ids.size === 1), 'one event id each');
  // each subscription.deleted names the subscriber it went with
  for (const e of entries.filter((e) => e.type === 'subscription.deleted')) assert.ok(held.get(e.data.object.externalId)?.includes(e.target.id), `${e.target.id} went with ${e.data.object.externalId}`);
  console.log(`  killed after ${deleted} deletes answered; ${left} intents left for the sweeper`);
});

kill.run();
