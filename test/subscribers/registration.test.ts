import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { identityHash } from '../../lib/identity-hash.js';
import { partitionOf } from '../../lib/partition.js';
import { createApiKey, createTenant, rotateIdentitySecret, setIdentityRequired, tenantIdentity } from '../../streams/identity.js';
import { connectRedis } from '../../streams/redis.js';
import { GuardFailed, writeSubscriber, type TenantScope } from '../../streams/subscriber-writes.js';
import { MAX_SUBSCRIPTIONS_PER_SUBSCRIBER } from '../../streams/subscriptions.js';
import { client, registerAsApp } from '../helpers/api.js';
import { inboxEvents, names } from '../helpers/inbox.js';
import { BY_TEST, bootstrapWorkspace, startServicePair, stopServicePair, type ServicePair } from '../helpers/service.js';
import { waitFor } from '../helpers/wait.js';
import { auditEntries } from '../helpers/audit.js';

type Api = ReturnType<typeof client>;
type Ctx = ServicePair & {
  boot: Awaited<ReturnType<typeof bootstrapWorkspace>>;
};

const r = suite<Ctx>('client registration and identity settings across processes');

const token = (n: number) => `reg${n}`.padStart(64, '0');

r.before(async (ctx) => {
  Object.assign(ctx, await startServicePair('registration'));
  ctx.boot = await bootstrapWorkspace(ctx.service, 'registration');
});
r.after((ctx) => stopServicePair(ctx));

const identify = (api: Api, pk: string, externalId: string, hash?: string) => api.post('/v1/client/identify', pk, { externalId, source: 'ios', ...(hash === undefined ? {} : { identityHash: hash }) });

r('a rotated identity secret is refused at once in every process, and the new one accepted (key-cache invalidation, not the TTL)', async ({ service, peer, api, peerApi, boot }) => {
  assert.is(peer.config.keyCacheTtlMs, 30_000);
  const pk = boot.keys.client;
  const old = (await tenantIdentity(service.redis, service.keys, boot.tenant)).secret;
  // required verification, so that a hash that no longer verifies is refused (an optional tenant proceeds unverified)
  await setIdentityRequired(service.redis, service.keys, boot.workspace, boot.tenant, true, BY_TEST);
  for (const each of [api, peerApi]) await waitFor('required verification', async () => (await identify(each, pk, 'rot-user')).status === 403, 2_000, 20);
  // both processes verify (and so cache) the current secret
  assert.is((await identify(api, pk, 'rot-user', identityHash(old, 'rot-user'))).status, 200);
  assert.is((await identify(peerApi, pk, 'rot-user', identityHash(old, 'rot-user'))).status, 200);
  // control: the stored secret changed WITHOUT the announcement: the peer still verifies with its cached one
  const key = service.keys.tenant(boot.workspace.id, boot.tenant.id);
  await service.redis.hset(key, 'identitySecret', 'f'.repeat(64));
  assert.is((await identify(peerApi, pk, 'rot-user', identityHash(old, 'rot-user'))).status, 200, 'the settings are cached');
  await service.redis.hset(key, 'identitySecret', old);

  // rotate from another connection, as the CLI does
  const cli = connectRedis({ url: service.env.REDIS_URL! });
  try {
    const started = Date.now();
    const secret = await rotateIdentitySecret(cli, service.keys, boot.workspace, boot.tenant, BY_TEST);
    for (const each of [api, peerApi]) {
      await waitFor('the old hash to be refused', async () => (await identify(each, pk, 'rot-user', identityHash(old, 'rot-user'))).status === 403, 2_000, 20);
      const refused = await identify(each, pk, 'rot-user', identityHash(old, 'rot-user'));
      assert.equal([refused.body.error.code, refused.body.error.param], ['forbidden', 'identityHash']);
    }
    assert.ok(Date.now() - started < 2_000);
    for (const each of [api, peerApi]) assert.is((await identify(each, pk, 'rot-user', identityHash(secret, 'rot-user'))).body.data.verified, true);
  } finally {
    cli.disconnect();
    await setIdentityRequired(service.redis, service.keys, boot.workspace, boot.tenant, false, BY_TEST);
  }
});

r('a hash under a just-rotated secret verifies even before the invalidation arrives (a mismatch re-reads the stored secret)', async ({ service, api, peerApi, boot }) => {
  const pk = boot.keys.client;
  const { secret: current } = await tenantIdentity(service.redis, service.keys, boot.tenant);
  await setIdentityRequired(service.redis, service.keys, boot.workspace, boot.tenant, true, BY_TEST);
  for (const each of [api, peerApi]) await waitFor('required verification', async () => (await identify(each, pk, 'early-user')).status === 403, 2_000, 20);
  for (const each of [api, peerApi]) assert.is((await identify(each, pk, 'early-user', identityHash(current, 'early-user'))).status, 200);
  // a new secret stored without the announcement: only the re-read can find it
  const key = service.keys.tenant(boot.workspace.id, boot.tenant.id);
  const next = 'e'.repeat(64);
  await service.redis.hset(key, 'identitySecret', next);
  try {
    for (const each of [api, peerApi]) assert.is((await identify(each, pk, 'early-user', identityHash(next, 'early-user'))).body.data.verified, true);
    // and the re-read refreshed the cache: the replaced secret no longer verifies there
    for (const each of [api, peerApi]) assert.is((await identify(each, pk, 'early-user', identityHash(current, 'early-user'))).status, 403);
  } finally {
    await rotateIdentitySecret(service.redis, service.keys, boot.workspace, boot.tenant, BY_TEST);
    await setIdentityRequired(service.redis, service.keys, boot.workspace, boot.tenant, false, BY_TEST);
  }
});

r('requiring identity verification takes effect at once in every process, and so does turning it off', async ({ service, api, peerApi, boot }) => {
  const pk = boot.keys.client;
  // both processes have the settings cached (optional verification)
  assert.is((await identify(api, pk, 'req-user')).status, 200);
  assert.is((await identify(peerApi, pk, 'req-user')).status, 200);
  const cli = connectRedis({ url: service.env.REDIS_URL! });
  try {
    await setIdentityRequired(cli, service.keys, boot.workspace, boot.tenant, true, BY_TEST);
    for (const each of [api, peerApi]) {
      await waitFor('a call without identityHash to be refused', async () => (await identify(each, pk, 'req-user')).status === 403, 2_000, 20);
      const refused = await each.post('/v1/client/subscriptions', pk, { externalId: 'req-user', channel: 'push', token: token(1), platform: 'ios' });
      assert.is(refused.status, 403);
      assert.equal([refused.body.error.code, refused.body.error.param], ['forbidden', 'identityHash']);
    }
    const { secret } = await tenantIdentity(service.redis, service.keys, boot.tenant);
    assert.is((await peerApi.post('/v1/client/subscriptions', pk, { externalId: 'req-user', identityHash: identityHash(secret, 'req-user'), channel: 'push', token: token(1), platform: 'ios' })).status, 201);
    await setIdentityRequired(cli, service.keys, boot.workspace, boot.tenant, false, BY_TEST);
    for (const each of [api, peerApi]) await waitFor('a call without identityHash to be accepted again', async () => (await identify(each, pk, 'req-user')).status === 200, 2_000, 20);
  } finally {
    await setIdentityRequired(cli, service.keys, boot.workspace, boot.tenant, false, BY_TEST);
    cli.disconnect();
  }
});

r('a tenant without an identity secret gets exactly one, made on first use, whichever process makes it', async ({ service, api, peerApi, boot }) => {
  const { tenant } = await createTenant(service.redis, service.keys, boot.workspace, 'lazy', BY_TEST);
  const pk = (await createApiKey(service.redis, service.keys, { workspace: boot.workspace, tenant, kind: 'client', scopes: ['client'], expiresAt: null, name: null }, BY_TEST)).key;
  assert.is(await service.redis.hget(service.keys.tenant(boot.workspace.id, tenant.id), 'identitySecret'), null);
  // both processes make it concurrently on their first client call
  const first = await Promise.all([identify(api, pk, 'lazy-user'), identify(peerApi, pk, 'lazy-user'), identify(api, pk, 'lazy-user-2'), identify(peerApi, pk, 'lazy-user-2')]);
  assert.ok(first.every((res) => res.status === 200));
  const { secret } = await tenantIdentity(service.redis, service.keys, tenant);
  assert.match(secret, /^[0-9a-f]{64}$/);
  for (const each of [api, peerApi]) {
    assert.is((await identify(each, pk, 'lazy-user', identityHash(secret, 'lazy-user'))).body.data.verified, true);
    assert.is((await identify(each, pk, 'lazy-user-2', identityHash(secret, 'someone-else'))).body.data.verified, false, 'a hash of another id verifies nothing');
  }
});

r('one device registered at once by two app users through two processes: one subscription, created once, its createdAt kept, the ledger a chain of owner changes ending at its holder', async ({ service, api, peerApi, boot }) => {
  const pk = boot.keys.client;
  const partition = (externalId: string) => partitionOf(boot.tenant.id, externalId, service.config.partitions);
  // two app users of different partitions: each holds its own copy of the record while the device moves
  const y = Array.from({ length: 64 }, (_, i) => `tug-y${i}`).find((id) => partition(id) !== partition('tug-x'))!;
  for (let round = 0; round < 20; round++) {
    const device = token(500 + round);
    const first = await api.post('/v1/client/subscriptions', pk, { externalId: 'tug-x', channel: 'push', token: device, platform: 'ios' });
    assert.is(first.status, 201);
    const id = first.body.data.id;
    const replies = await Promise.all(Array.from({ length: 30 }, (_, i) => registerAsApp(i % 2 ? peerApi : api, pk, { externalId: i % 2 ? y : 'tug-x', channel: 'push', token: device, platform: 'ios' })));
    assert.ok(replies.every((res) => res.status === 200 || res.status === 201), `round ${round}: ${replies.map((res) => res.status)}`);
    assert.ok(replies.every((res) => res.body.data.id === id && res.body.data.createdAt === first.body.data.createdAt), `round ${round}: one subscription, created once ${first.body.data.createdAt} ${JSON.stringify(replies.map((res, i) => [i % 2, res.status, res.body.data.id === id, res.body.data.createdAt]))}`);
    const holders = [];
    for (const externalId of ['tug-x', y]) {
      const items = (await api.get(`/v1/subscribers/${externalId}/subscriptions?limit=100`, boot.keys.tenant)).body.data.items.filter((s: any) => s.id === id);
      for (const s of items) holders.push([externalId, s.createdAt]);
    }
    assert.is(holders.length, 1, `round ${round}: one holder, got ${JSON.stringify(holders)}`);
    assert.is(holders[0]![1], first.body.data.createdAt);
    const entries = (await auditEntries(service, boot.workspace.id)).filter((e) => e.target?.id === id);
    assert.equal(entries.filter((e) => e.type === 'subscription.created').length, 1, `round ${round}: ${entries.map((e) => e.type)}`);
    assert.is(entries[0]!.type, 'subscription.created');
    assert.ok(entries.every((e) => e.type !== 'subscription.deleted'));
    for (let k = 1; k < entries.length; k++) {
      const owner = entries[k]!.data.object.externalId;
      if (owner !== entries[k - 1]!.data.object.externalId) assert.is(entries[k]!.previousAttributes?.externalId, entries[k - 1]!.data.object.externalId, `round ${round}: entry ${k} follows the one before`);
    }
    assert.is(entries.at(-1)!.data.object.externalId, holders[0]![0], `round ${round}: the ledger ends at the holder ${JSON.stringify(entries.map((e) => [e.type, e.data.object.externalId, e.previousAttributes, e.createdAt ?? e.created]))}`);
  }
});

r('a subscriber holds at most 50 subscriptions: a new token beyond is 409, a known one still updates', async ({ api, service, boot }) => {
  const pk = boot.keys.client;
  const replies = await Promise.all(Array.from({ length: MAX_SUBSCRIPTIONS_PER_SUBSCRIBER }, (_, i) => api.post('/v1/client/subscriptions', pk, { externalId: 'full', channel: 'push', token: token(100 + i), platform: 'ios' })));
  assert.ok(replies.every((res) => res.status === 201));
  const over = await api.post('/v1/client/subscriptions', pk, { externalId: 'full', channel: 'push', token: token(999), platform: 'ios' });
  assert.is(over.status, 409);
  assert.is(over.body.error.code, 'conflict');
  const again = await api.post('/v1/client/subscriptions', pk, { externalId: 'full', channel: 'push', token: token(100), platform: 'android' });
  assert.is(again.status, 200);
  assert.is(again.body.data.platform, 'android');
  assert.is((await api.get('/v1/subscribers/full/subscriptions?limit=100', boot.keys.tenant)).body.data.total, MAX_SUBSCRIPTIONS_PER_SUBSCRIBER);
  const registered = names(await inboxEvents(service, boot.tenant.id, 'full')).filter((n) => n === '$subscription.registered');
  assert.is(registered.length, MAX_SUBSCRIPTIONS_PER_SUBSCRIBER + 1, 'one per device, and once more for the platform the update changed (conditions read it)');
});

r('a new registration answers what it stored and announces it once, with the subscriber created first', async ({ api, service, boot }) => {
  const pk = boot.keys.client;
  const res = await api.post('/v1/client/subscriptions', pk, {
    externalId: 'fresh', channel: 'push', token: token(7), platform: 'ios', authorizationStatus: 'authorized',
    device: { model: 'iPhone16,2', appVersion: '2.1.0' },
  });
  assert.is(res.status, 201);
  const listed = (await api.get('/v1/subscribers/fresh/subscriptions', boot.keys.tenant)).body.data.items[0];
  assert.equal(res.body.data, listed);
  assert.equal(Object.keys(res.body.data.device), ['appVersion', 'model']);
  const events = await inboxEvents(service, boot.tenant.id, 'fresh');
  assert.equal(names(events), ['$subscriber.created', '$subscription.registered']);
  assert.equal(events[1]!.data, { subscription: { id: res.body.data.id, channel: 'push', platform: 'ios', enabled: true } });
  const email = await api.post('/v1/client/subscriptions', pk, { externalId: 'fresh', channel: 'email', address: 'Ada@Example.com' });
  assert.is(email.status, 201);
  assert.is(email.body.data.address, 'ada@example.com');
  assert.is(email.body.data.environment, null);
  assert.is(email.body.data.token, null);
  // the bound holds for what is stored: İ lowercases to two characters (probe S2: 254 sent, 318 stored)
  const domain = `${'b'.repeat(63)}.${'c'.repeat(63)}.${'d'.repeat(57)}.com`;
  const growing = await api.post('/v1/client/subscriptions', pk, { externalId: 'fresh', channel: 'email', address: `${'İ'.repeat(64)}@${domain}` });
  assert.equal([growing.status, growing.body.error?.code, growing.body.error?.param], [400, 'validation', 'address'], JSON.stringify(growing.body));
  const fits = await api.post('/v1/client/subscriptions', pk, { externalId: 'fresh', channel: 'email', address: `${'A'.repeat(64)}@${domain}` });
  assert.is(fits.status, 201, JSON.stringify(fits.body));
  assert.is([...fits.body.data.address].length, 254);
});

r('writeSubscriber: a guard that does not hold writes nothing; runs of hset on one key go as one hmset, stored as sent; an index member $SUB|x gets the subscriber id', async ({ service, boot }) => {
  const { redis, keys } = service;
  const scope: TenantScope = { workspaceId: boot.workspace.id, tenantId: boot.tenant.id, partitions: service.config.partitions };
  const p = partitionOf(scope.tenantId, 'guarded', scope.partitions);
  const record = keys.subscriber(p, scope.tenantId, 'guarded');
  const set = keys.subscriberSubscriptions(p, scope.tenantId, 'guarded');
  const written = await writeSubscriber(redis, keys, scope, 'guarded', {
    create: true, expected: null, events: [{ name: '$subscriber.updated', data: { changes: {}, previousAttributes: {} } }],
    ops: [['hset', record, 'a', 'x-$SUB'], ['hset', record, 'b', '2'], ['sadd', set, 'm1'], ['hset', record, 'c', '$SUB|c'], ['zadd', keys.subscriberVerifiedIndex(p, scope.tenantId), 0, '$SUB|guarded']],
    guards: [['absent', keys.subscription(p, scope.tenantId, 'scr_none')], ['scardBelow', set, 1]],
  });
  assert.is(written.created, true);
  const h = await redis.hgetall(record);
  // only an index member's leading `$SUB|` is the placeholder: values are the caller's text
  assert.is(h.a, 'x-$SUB');
  assert.is(h.b, '2');
  assert.is(h.c, '$SUB|c');
  // (the index is the partition's: other tests' subscribers may share it)
  const members = await redis.zrange(keys.subscriberVerifiedIndex(p, scope.tenantId), 0, -1);
  assert.ok(members.includes(`${written.subscriberId}|guarded`), members.join());
  assert.not.ok(members.includes('$SUB|guarded'));
  const before = await inboxEvents(service, boot.tenant.id, 'guarded');
  for (const [guards, index] of [[[['scardBelow', set, 1]], 0], [[['scardBelow', set, 5], ['absent', record]], 1]] as const) {
    try {
      await writeSubscriber(redis, keys, scope, 'guarded', { create: true, expected: null, events: [{ name: '$subscriber.updated', data: {} }], ops: [['hset', record, 'b', '3']], guards: guards as never });
      assert.unreachable('the guard held');
    } catch (err) {
      assert.instance(err, GuardFailed);
      assert.is((err as GuardFailed).index, index);
    }
  }
  assert.is(await redis.hget(record, 'b'), '2');
  assert.is((await inboxEvents(service, boot.tenant.id, 'guarded')).length, before.length);
});

r.run();
