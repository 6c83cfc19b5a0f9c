import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { identityHash } from '../../lib/identity-hash.js';
import { partitionOf } from '../../lib/partition.js';
import { setIdentityRequired, tenantIdentity } from '../../streams/identity.js';
import { invalidateSubscription, registerSubscription } from '../../streams/subscriptions.js';
import { client, registerAsApp } from '../helpers/api.js';
import { inboxEvents, names } from '../helpers/inbox.js';
import { BY_TEST, bootstrapWorkspace, startTestService, type TestService } from '../helpers/service.js';
import { waitFor } from '../helpers/wait.js';

type Ctx = { service: TestService; api: ReturnType<typeof client>; key: string; pk: string; boot: Awaited<ReturnType<typeof bootstrapWorkspace>> };
const c = suite<Ctx>('client API and subscriptions');

const token = (n: number) => n.toString(16).padStart(64, 'a');

c.before(async (ctx) => {
  ctx.service = await startTestService('client');
  ctx.api = client(ctx.service.url);
  ctx.boot = await bootstrapWorkspace(ctx.service, 'client');
  ctx.key = ctx.boot.keys.tenant;
  ctx.pk = ctx.boot.keys.client;
});
c.after(async (ctx) => ctx.service.stop());

c('registering a device creates the subscriber and the subscription with every field of 4.4', async ({ api, pk, service, boot }) => {
  const res = await api.post('/v1/client/subscriptions', pk, {
    externalId: 'dev-1', channel: 'push', token: token(1), platform: 'ios', environment: 'sandbox', authorizationStatus: 'provisional',
    device: { appVersion: '2.1.0', appBuild: '210', sdkVersion: '1.0.0', osVersion: '18.1', model: 'iPhone16,2', locale: 'en_US', installedAt: '2026-11-01T00:00:00Z' },
  });
  assert.is(res.status, 201);
  const s = res.body.data;
  assert.match(s.id, /^scr_/);
  assert.is(s.externalId, 'dev-1');
  assert.is(s.environment, 'sandbox');
  assert.is(s.authorizationStatus, 'provisional');
  assert.is(s.enabled, true);
  assert.is(s.device.model, 'iPhone16,2');
  assert.equal(names(await inboxEvents(service, boot.tenant.id, 'dev-1')), ['$subscriber.created', '$subscription.registered']);
  const listed = await api.get('/v1/subscribers/dev-1/subscriptions', boot.keys.tenant);
  assert.is(listed.body.data.total, 1);
});

c('a subscriber\'s subscriptions list newest first, paginated by limit and cursor, with total', async ({ api, pk, boot }) => {
  const ids: string[] = [];
  for (let i = 0; i < 5; i++) ids.push((await api.post('/v1/client/subscriptions', pk, { externalId: 'many-devices', channel: 'push', token: token(100 + i), platform: 'ios' })).body.data.id);
  const path = '/v1/subscribers/many-devices/subscriptions';
  const first = (await api.get(`${path}?limit=2`, boot.keys.tenant)).body.data;
  assert.is(first.total, 5);
  assert.is(first.hasMore, true);
  const seen = [...first.items];
  let cursor = first.nextCursor;
  while (cursor) {
    const next = (await api.get(`${path}?limit=2&cursor=${cursor}`, boot.keys.tenant)).body.data;
    seen.push(...next.items);
    cursor = next.nextCursor;
  }
  assert.equal(seen.map((s: any) => s.id), [...ids].reverse());
  for (const bad of ['limit=0', 'limit=101', 'limit=abc', 'cursor=zz', 'foo=1']) {
    assert.is((await api.get(`${path}?${bad}`, boot.keys.tenant)).status, 400, bad);
  }
});

c('registering an existing token updates it instead of duplicating it', async ({ api, pk, service, boot }) => {
  const first = await api.post('/v1/client/subscriptions', pk, { externalId: 'dev-2', channel: 'push', token: token(2), platform: 'ios', device: { appVersion: '1.0' } });
  const again = await api.post('/v1/client/subscriptions', pk, { externalId: 'dev-2', channel: 'push', token: token(2), platform: 'ios', device: { appVersion: '1.1' } });
  assert.is(again.status, 200);
  assert.is(again.body.data.id, first.body.data.id);
  assert.is(again.body.data.device.appVersion, '1.1');
  assert.is((await api.get('/v1/subscribers/dev-2/subscriptions', boot.keys.tenant)).body.data.total, 1);
  assert.equal(names(await inboxEvents(service, boot.tenant.id, 'dev-2')), ['$subscriber.created', '$subscription.registered']);
  // fields left out keep their stored values; those given replace them (device whole)
  const sandbox = await api.post('/v1/client/subscriptions', pk, { externalId: 'dev-2', channel: 'push', token: token(2), environment: 'sandbox', authorizationStatus: 'provisional' });
  assert.equal([sandbox.status, sandbox.body.data.platform, sandbox.body.data.environment, sandbox.body.data.authorizationStatus, sandbox.body.data.device], [200, 'ios', 'sandbox', 'provisional', { appVersion: '1.1' }]);
  const bare = await api.post('/v1/client/subscriptions', pk, { externalId: 'dev-2', channel: 'push', token: token(2) });
  assert.equal([bare.body.data.environment, bare.body.data.authorizationStatus, bare.body.data.device, bare.body.data.updatedAt], ['sandbox', 'provisional', { appVersion: '1.1' }, sandbox.body.data.updatedAt], 'nothing changed');
  const device = await api.post('/v1/client/subscriptions', pk, { externalId: 'dev-2', channel: 'push', token: token(2), device: { osVersion: '18.2' } });
  assert.equal([device.body.data.device, device.body.data.environment], [{ osVersion: '18.2' }, 'sandbox']);
  const stored = (await api.get('/v1/subscribers/dev-2/subscriptions', boot.keys.tenant)).body.data.items[0];
  assert.equal([stored.environment, stored.authorizationStatus, stored.device], ['sandbox', 'provisional', { osVersion: '18.2' }]);
});

c('a token registered by another user moves to the new subscriber', async ({ api, pk, service, boot }) => {
  const first = await api.post('/v1/client/subscriptions', pk, { externalId: 'old-user', channel: 'push', token: token(3), platform: 'ios' });
  const moved = await api.post('/v1/client/subscriptions', pk, { externalId: 'new-user', channel: 'push', token: token(3), platform: 'ios' });
  assert.is(moved.status, 201);
  assert.is(moved.body.data.id, first.body.data.id, 'one subscription, same id');
  assert.is((await api.get('/v1/subscribers/old-user/subscriptions', boot.keys.tenant)).body.data.total, 0);
  assert.is((await api.get('/v1/subscribers/new-user/subscriptions', boot.keys.tenant)).body.data.total, 1);
  assert.equal(names(await inboxEvents(service, boot.tenant.id, 'old-user')), ['$subscriber.created', '$subscription.registered', '$subscription.removed']);
  assert.equal(names(await inboxEvents(service, boot.tenant.id, 'new-user')), ['$subscriber.created', '$subscription.registered']);
});

c('a moved token keeps the device fields the new registration leaves out (a sandbox token stays sandbox); those it gives replace them', async ({ api, pk }) => {
  const device = { model: 'iPhone15,2', osVersion: '18.1' };
  await api.post('/v1/client/subscriptions', pk, { externalId: 'carry-a', token: token(40), platform: 'ios', environment: 'sandbox', authorizationStatus: 'provisional', device });
  const moved = await api.post('/v1/client/subscriptions', pk, { externalId: 'carry-b', token: token(40) });
  assert.is(moved.status, 201, moved.text);
  const s = moved.body.data;
  assert.equal([s.externalId, s.platform, s.environment, s.authorizationStatus, s.device], ['carry-b', 'ios', 'sandbox', 'provisional', device]);
  const again = await api.post('/v1/client/subscriptions', pk, { externalId: 'carry-c', token: token(40), environment: 'production', device: { model: 'iPad' } });
  assert.equal([again.body.data.platform, again.body.data.environment, again.body.data.device], ['ios', 'production', { model: 'iPad' }]);
});

c('50 parallel registrations of the same token end with exactly one subscription', async ({ api, pk, service, boot }) => {
  const replies = await Promise.all(Array.from({ length: 50 }, () => registerAsApp(api, pk, { externalId: 'racer', channel: 'push', token: token(4), platform: 'ios' })));
  assert.ok(replies.every((r) => r.status === 200 || r.status === 201), JSON.stringify(replies.map((r) => r.status)));
  assert.is(new Set(replies.map((r) => r.body.data.id)).size, 1);
  assert.is(replies.filter((r) => r.status === 201).length, 1);
  assert.is((await api.get('/v1/subscribers/racer/subscriptions', boot.keys.tenant)).body.data.total, 1);
  assert.is(names(await inboxEvents(service, boot.tenant.id, 'racer')).filter((n) => n === '$subscription.registered').length, 1);
});

/** `count` externalIds starting with `prefix`, all in one partition (`same`) or each in another one than `of`. */
function placed(service: TestService, tenantId: string, prefix: string, count: number, of: string, same: boolean): string[] {
  const target = partitionOf(tenantId, of, service.config.partitions);
  const out: string[] = [];
  for (let i = 0; out.length < count; i++) {
    const x = `${prefix}-${i}`;
    if ((partitionOf(tenantId, x, service.config.partitions) === target) === same) out.push(x);
  }
  return out;
}

c('at the 50-subscription limit a device APNs declared gone makes room, the longest gone first; live ones never do (probe B1: dead tokens filled the 50 for good)', async ({ api, pk, service, boot }) => {
  const full = 'full-with-dead';
  const ids: string[] = [];
  for (let i = 0; i < 50; i++) ids.push((await api.post('/v1/client/subscriptions', pk, { externalId: full, channel: 'push', token: token(0xe000 + i), platform: 'ios' })).body.data.id);
  const scope = { tenantId: boot.tenant.id, workspaceId: boot.workspace.id, partitions: service.config.partitions };
  // all live: the 51st is refused, as before
  assert.is((await api.post('/v1/client/subscriptions', pk, { externalId: full, channel: 'push', token: token(0xe100), platform: 'ios' })).status, 409);
  // APNs answered 410 for two of them (the fan-out's invalidation), the 8th first
  await invalidateSubscription(service.redis, service.keys, scope, full, ids[7]!, 'Unregistered', { claim: Number.MAX_SAFE_INTEGER, unregisteredAt: null });
  await new Promise((r) => setTimeout(r, 5));
  await invalidateSubscription(service.redis, service.keys, scope, full, ids[3]!, 'BadDeviceToken', { claim: Number.MAX_SAFE_INTEGER, unregisteredAt: null });
  const added = await api.post('/v1/client/subscriptions', pk, { externalId: full, channel: 'push', token: token(0xe100), platform: 'ios' });
  assert.is(added.status, 201, added.text);
  const held = (await api.get(`/v1/subscribers/${full}/subscriptions?limit=100`, boot.keys.tenant)).body.data;
  assert.is(held.total, 50);
  assert.ok(!held.items.some((x: any) => x.id === ids[7]), 'the longest gone made room');
  assert.ok(held.items.some((x: any) => x.id === ids[3]), 'the other dead one is still there');
  const removed = (await inboxEvents(service, boot.tenant.id, full)).filter((e) => e.name === '$subscription.removed');
  assert.equal(removed.map((e) => e.data.subscription.id), [ids[7]]);
  // the next one takes the other dead one's place; then the limit holds again
  assert.is((await api.post('/v1/client/subscriptions', pk, { externalId: full, channel: 'push', token: token(0xe101), platform: 'ios' })).status, 201);
  assert.is((await api.post('/v1/client/subscriptions', pk, { externalId: full, channel: 'push', token: token(0xe102), platform: 'ios' })).status, 409);
});

c('at the limit, registrations at once each take a gone device\'s place while one is left (probe Y1: 4 at once with 4 gone got two 409s)', async ({ api, pk, service, boot }) => {
  const full = 'full-racing';
  const ids: string[] = [];
  for (let i = 0; i < 50; i++) ids.push((await api.post('/v1/client/subscriptions', pk, { externalId: full, channel: 'push', token: token(0xe200 + i), platform: 'ios' })).body.data.id);
  const scope = { tenantId: boot.tenant.id, workspaceId: boot.workspace.id, partitions: service.config.partitions };
  for (const i of [2, 9, 17, 30]) await invalidateSubscription(service.redis, service.keys, scope, full, ids[i]!, 'Unregistered', { claim: Number.MAX_SAFE_INTEGER, unregisteredAt: null });
  // six new devices at once: four find room, the two beyond it are refused; no live device goes
  const statuses = await Promise.all([0, 1, 2, 3, 4, 5].map((i) => registerAsApp(api, pk, { externalId: full, channel: 'push', token: token(0xe300 + i), platform: 'ios' }).then((r) => r.status)));
  assert.equal(statuses.filter((x) => x === 201).length, 4, JSON.stringify(statuses));
  assert.equal(statuses.filter((x) => x === 409).length, 2, JSON.stringify(statuses));
  const held = (await api.get(`/v1/subscribers/${full}/subscriptions?limit=100`, boot.keys.tenant)).body.data;
  assert.is(held.total, 50);
  assert.equal(held.items.filter((x: any) => x.invalidatedAt !== null).length, 0, 'every gone device made room');
  for (const [i, id] of ids.entries()) if (![2, 9, 17, 30].includes(i)) assert.ok(held.items.some((x: any) => x.id === id), `live device ${i} kept`);
});

for (const same of [false, true]) {
  const where = same ? 'in one partition' : 'in two partitions';
  c(`a registration refused at the 50-subscription limit changes nothing: a token owned by another subscriber stays with it (${where})`, async ({ api, pk, service, boot }) => {
    const full = `full-${same}`;
    const [third, fourth] = placed(service, boot.tenant.id, `third-${same}`, 2, full, same);
    const base = same ? 0xa000 : 0xb000;
    for (let i = 0; i < 50; i++) assert.is((await api.post('/v1/client/subscriptions', pk, { externalId: full, channel: 'push', token: token(base + i), platform: 'ios' })).status, 201);
    const owned = await api.post('/v1/client/subscriptions', pk, { externalId: third, channel: 'push', token: token(base + 0x100), platform: 'ios' });
    const before = names(await inboxEvents(service, boot.tenant.id, third!));
    const refused = await api.post('/v1/client/subscriptions', pk, { externalId: full, channel: 'push', token: token(base + 0x100), platform: 'ios' });
    assert.is(refused.status, 409);
    assert.is(refused.body.error.code, 'conflict');
    const held = (await api.get(`/v1/subscribers/${third}/subscriptions`, boot.keys.tenant)).body.data;
    assert.equal(held.items.map((s: any) => s.id), [owned.body.data.id], 'the device stays with its owner');
    assert.equal(names(await inboxEvents(service, boot.tenant.id, third!)), before, 'no $subscription.removed');
    assert.is((await api.get(`/v1/subscribers/${full}/subscriptions?limit=100`, boot.keys.tenant)).body.data.total, 50);
    // the owner index still names the owner: its app can mute the device, the refused subscriber's cannot
    assert.is((await api.patch(`/v1/client/subscriptions/${owned.body.data.id}?externalId=${third}`, pk, { enabled: false })).status, 200);
    assert.is((await api.patch(`/v1/client/subscriptions/${owned.body.data.id}?externalId=${full}`, pk, { enabled: false })).status, 404);
    // a token new to the tenant refused the same way is not left claimed
    const fresh = await api.post('/v1/client/subscriptions', pk, { externalId: full, channel: 'push', token: token(base + 0x200), platform: 'ios' });
    assert.is(fresh.status, 409);
    assert.is(await service.redis.hget(service.keys.tokens(boot.tenant.id), `push:${token(base + 0x200)}`), null);
    const later = await api.post('/v1/client/subscriptions', pk, { externalId: fourth, channel: 'push', token: token(base + 0x200), platform: 'ios' });
    assert.is(later.status, 201);
    assert.equal(names(await inboxEvents(service, boot.tenant.id, fourth!)), ['$subscriber.created', '$subscription.registered']);
    // once the full subscriber has room, the same registration moves the device
    const first = (await api.get(`/v1/subscribers/${full}/subscriptions?limit=1`, boot.keys.tenant)).body.data.items[0];
    await api.del(`/v1/subscribers/${full}/subscriptions/${first.id}`, boot.keys.tenant);
    const moved = await api.post('/v1/client/subscriptions', pk, { externalId: full, channel: 'push', token: token(base + 0x100), platform: 'ios' });
    assert.is(moved.status, 201);
    assert.is(moved.body.data.id, owned.body.data.id);
    assert.is(moved.body.data.enabled, true);
    assert.is((await api.get(`/v1/subscribers/${third}/subscriptions`, boot.keys.tenant)).body.data.total, 0);
    assert.is((await api.get(`/v1/subscribers/${full}/subscriptions?limit=100`, boot.keys.tenant)).body.data.total, 50);
    assert.is(names(await inboxEvents(service, boot.tenant.id, third!)).at(-1), '$subscription.removed');
    // deleting the previous owner leaves the moved device alone
    await api.del(`/v1/subscribers/${third}`, boot.keys.tenant);
    assert.is((await api.get(`/v1/subscribers/${full}/subscriptions/${owned.body.data.id}`, boot.keys.tenant)).status, 200);
    assert.is((await api.patch(`/v1/client/subscriptions/${owned.body.data.id}?externalId=${full}`, pk, { enabled: false })).status, 200);
  });

  c(`a subscription is reachable under its own subscriber only (${where})`, async ({ api, pk, service, boot }) => {
    const [owner, other] = placed(service, boot.tenant.id, `reach-${same}`, 2, `reach-${same}-0`, same);
    const mine = await api.post('/v1/client/subscriptions', pk, { externalId: owner, channel: 'push', token: token(same ? 0xc000 : 0xc001), platform: 'ios' });
    await api.post('/v1/subscribers', boot.keys.tenant, { externalId: other });
    const path = `/v1/subscribers/${other}/subscriptions/${mine.body.data.id}`;
    assert.is((await api.get(path, boot.keys.tenant)).status, 404);
    assert.is((await api.patch(path, boot.keys.tenant, { enabled: false })).status, 404);
    assert.is((await api.del(path, boot.keys.tenant)).status, 404);
    const still = await api.get(`/v1/subscribers/${owner}/subscriptions/${mine.body.data.id}`, boot.keys.tenant);
    assert.is(still.status, 200);
    assert.is(still.body.data.enabled, true);
    assert.equal(names(await inboxEvents(service, boot.tenant.id, other!)), ['$subscriber.created']);
  });
}

for (const same of [false, true]) {
  c(`two users registering one device at once leave it with exactly one of them (${same ? 'in one partition' : 'in two partitions'})`, async ({ api, pk, service, boot }) => {
    const [a, b] = placed(service, boot.tenant.id, `twin-${same}`, 2, `twin-${same}-0`, same);
    for (let t = 0; t < 6; t++) {
      const handle = token((same ? 0x7100 : 0x7000) + t);
      const replies = await Promise.all(Array.from({ length: 12 }, (_, i) =>
        registerAsApp(api, pk, { externalId: i % 2 ? a : b, channel: 'push', token: handle, platform: 'ios' })));
      assert.ok(replies.every((r) => r.status === 200 || r.status === 201), JSON.stringify(replies.map((r) => r.status)));
      const holders: string[] = [];
      for (const who of [a!, b!]) {
        const items = (await api.get(`/v1/subscribers/${who}/subscriptions`, boot.keys.tenant)).body.data.items as { token: string }[];
        holders.push(...items.filter((s) => s.token === handle).map(() => who));
      }
      assert.is(holders.length, 1, `token ${t} is held by exactly one subscriber: ${holders.join(', ')}`);
      const owner = await service.redis.hget(service.keys.subscriptionOwners(boot.tenant.id), replies[0]!.body.data.id);
      assert.is(owner, holders[0], 'the holder is the owner the token index names');
    }
  });
}

c('50 parallel identical enabled:false updates write exactly one $subscription.muted', async ({ api, pk, service, boot }) => {
  const { body } = await api.post('/v1/client/subscriptions', pk, { externalId: 'muter', channel: 'push', token: token(5), platform: 'ios' });
  const replies = await Promise.all(Array.from({ length: 50 }, () => api.patch(`/v1/client/subscriptions/${body.data.id}`, pk, { enabled: false })));
  assert.ok(replies.every((r) => r.status === 200 && r.body.data.enabled === false));
  await api.patch(`/v1/client/subscriptions/${body.data.id}`, pk, { enabled: true });
  await api.patch(`/v1/subscribers/muter/subscriptions/${body.data.id}`, boot.keys.tenant, { enabled: true });
  const events = names(await inboxEvents(service, boot.tenant.id, 'muter'));
  assert.is(events.filter((n) => n === '$subscription.muted').length, 1);
  assert.is(events.filter((n) => n === '$subscription.unmuted').length, 1);
});

c('a push token of nothing but spaces and angle brackets is 400 on token: no device (probe Y1: registered, then failed at the first push)', async ({ api, pk }) => {
  for (const junk of [' '.repeat(8), '<      >', '< ab  cd >']) {
    const refused = await api.post('/v1/client/subscriptions', pk, { externalId: 'junk-token', channel: 'push', token: junk, platform: 'ios' });
    assert.equal([refused.status, refused.body.error?.code, refused.body.error?.param], [400, 'validation', 'token'], JSON.stringify(junk));
  }
  assert.is((await api.post('/v1/client/subscriptions', pk, { externalId: 'junk-token', channel: 'push', token: '<ab12cd34 ef56>', platform: 'ios' })).status, 201);
});

c('an internationalized email address (RFC 6531) registers; one that is no address is 400 on address', async ({ api, pk, service }) => {
  // the document says so: `idn-email`, not `email` (ASCII only), which a client built from it checked (probe F1)
  const doc = (await (await fetch(`${service.url}/v1/openapi.json`)).json()) as any;
  assert.is(doc.components.schemas.SubscriptionRegister.properties.address.format, 'idn-email');
  assert.is(doc.components.schemas.SubscriberUpsert.properties.email.format, 'idn-email');
  const idn = await api.post('/v1/client/subscriptions', pk, { externalId: 'idn-mail', channel: 'email', address: 'Ünï@exämple.com' });
  assert.is(idn.status, 201, idn.text);
  assert.is(idn.body.data.address, 'ünï@exämple.com');
  assert.is((await api.post('/v1/client/subscriptions', pk, { externalId: 'idn-mail', channel: 'email', address: '用户@例子.广告' })).status, 201);
  // a local part of 64 bytes is the most (RFC 5321); 33 × 'ü' is 66 bytes
  assert.is((await api.post('/v1/client/subscriptions', pk, { externalId: 'idn-mail', channel: 'email', address: `${'a'.repeat(64)}@example.com` })).status, 201);
  for (const address of ['ünï@exämple', 'ü ï@x.de', 'ü..ï@x.de', 'ünï@', 'plain-text', `${'a'.repeat(65)}@example.com`, `${'ü'.repeat(33)}@example.com`]) {
    const bad = await api.post('/v1/client/subscriptions', pk, { externalId: 'idn-mail', channel: 'email', address });
    assert.equal([bad.status, bad.body.error?.details?.[0]?.param], [400, 'address'], address);
  }
});

c('backend routes disable and remove a subscription; removal writes $subscription.removed', async ({ api, pk, service, boot }) => {
  const { body } = await api.post('/v1/client/subscriptions', pk, { externalId: 'backend', channel: 'email', address: 'Backend@Example.com' });
  assert.is(body.data.address, 'backend@example.com');
  const off = await api.patch(`/v1/subscribers/backend/subscriptions/${body.data.id}`, boot.keys.tenant, { enabled: false });
  assert.is(off.body.data.enabled, false);
  const removed = await api.del(`/v1/subscribers/backend/subscriptions/${body.data.id}`, boot.keys.tenant);
  assert.is(removed.status, 200);
  assert.is((await api.del(`/v1/subscribers/backend/subscriptions/${body.data.id}`, boot.keys.tenant)).status, 404);
  assert.is((await api.get(`/v1/subscribers/backend/subscriptions/scr_nope`, boot.keys.tenant)).status, 404);
  assert.equal(names(await inboxEvents(service, boot.tenant.id, 'backend')), ['$subscriber.created', '$subscription.registered', '$subscription.muted', '$subscription.removed']);
});

c('channel may be left out: a token registers a push subscription, an address an email one (spec 4.4 requires only externalId)', async ({ api, pk }) => {
  const push = await api.post('/v1/client/subscriptions', pk, { externalId: 'no-channel', token: token(71), platform: 'ios' });
  assert.is(push.status, 201, JSON.stringify(push.body));
  assert.is(push.body.data.channel, 'push');
  const email = await api.post('/v1/client/subscriptions', pk, { externalId: 'no-channel', address: 'no-channel@example.com' });
  assert.is(email.status, 201, JSON.stringify(email.body));
  assert.is(email.body.data.channel, 'email');
  assert.is(email.body.data.address, 'no-channel@example.com');
});

c('an APNs token in upper case or in NSData\'s <… …> form is the same device: one subscription, kept in lowercase hex; an android token is kept as sent', async ({ api, pk, key }) => {
  const hex = 'ab12cd34'.repeat(8);
  const first = await api.post('/v1/client/subscriptions', pk, { externalId: 'token-case', token: hex.toUpperCase(), platform: 'ios' });
  assert.is(first.status, 201, first.text);
  assert.is(first.body.data.token, hex);
  const spaced = `<${hex.match(/.{8}/g)!.join(' ').toUpperCase()}>`;
  for (const sent of [hex, spaced]) {
    const again = await api.post('/v1/client/subscriptions', pk, { externalId: 'token-case', token: sent, platform: 'ios' });
    assert.equal([again.status, again.body.data.id, again.body.data.token], [200, first.body.data.id, hex], sent);
  }
  const fcm = 'dGVzdA:APA91bH-Xy_ZMixedCase';
  const android = await api.post('/v1/client/subscriptions', pk, { externalId: 'token-case', token: fcm, platform: 'android' });
  assert.is(android.body.data.token, fcm);
  const listed = await api.get('/v1/subscribers/token-case/subscriptions', key);
  assert.equal(listed.body.data.items.map((x: any) => x.token).sort(), [hex, fcm].sort(), 'two devices, not four');
});

c('an address stored with an authorizationStatus (before it was refused on email) merges: registered anew for the identified user without it', async ({ api, pk, service, boot }) => {
  const made = await api.post('/v1/client/subscriptions', pk, { externalId: 'anon-legacy', address: 'legacy@example.com' });
  assert.is(made.status, 201);
  const p = partitionOf(boot.tenant.id, 'anon-legacy', service.config.partitions);
  await service.redis.hset(service.keys.subscription(p, boot.tenant.id, made.body.data.id), 'authorizationStatus', 'denied');
  const merged = await api.post('/v1/client/identify', pk, { externalId: 'user-legacy', anonymousId: 'anon-legacy', source: 'ios' });
  assert.is(merged.status, 200, merged.text);
  const held = (await api.get('/v1/subscribers/user-legacy/subscriptions', boot.keys.tenant)).body.data.items;
  assert.equal(held.map((x: any) => [x.channel, x.address, x.authorizationStatus]), [['email', 'legacy@example.com', null]]);
  assert.is((await api.get('/v1/subscribers/anon-legacy', boot.keys.tenant)).status, 404);
});

c('every bound of 4.4 is a validation error naming the field', async ({ api, pk }) => {
  const base = { externalId: 'bounds', channel: 'push', platform: 'ios' };
  const cases: [unknown, string][] = [
    [{ ...base, token: 'short' }, 'token'],
    [{ ...base, token: 'a'.repeat(1025) }, 'token'],
    [{ externalId: 'bounds', channel: 'email', address: `${'a'.repeat(250)}@x.io` }, 'address'],
    [{ ...base, token: token(6), channel: 'sms' }, 'channel'],
    [{ ...base, token: token(6), platform: 'windows' }, 'platform'],
    [{ ...base, token: token(6), environment: 'staging' }, 'environment'],
    [{ ...base, token: token(6), authorizationStatus: 'maybe' }, 'authorizationStatus'],
    [{ ...base, token: token(6), device: { model: 'x'.repeat(129) } }, 'device.model'],
    [{ ...base, token: token(6), device: { color: 'red' } }, 'device.color'],
    [{ ...base, token: token(6), extra: true }, 'extra'],
    [{ ...base, token: token(6), externalId: '' }, 'externalId'],
    [{ ...base, token: token(6), anonymousId: 'x'.repeat(257) }, 'anonymousId'],
    [{ ...base }, 'token'],
    [{ externalId: 'bounds', channel: 'email', token: token(6) }, 'address'],
    // what describes a push token is refused on an address, as it was not for authorizationStatus (probe J)
    [{ externalId: 'bounds', address: 'b@x.io', environment: 'sandbox' }, 'environment'],
    [{ externalId: 'bounds', address: 'b@x.io', authorizationStatus: 'denied' }, 'authorizationStatus'],
    // no channel: it follows from exactly one of token and address, else it is required
    [{ externalId: 'bounds', platform: 'ios' }, 'channel'],
    [{ externalId: 'bounds', token: token(6), address: 'a@x.io' }, 'channel'],
  ];
  for (const [body, param] of cases) {
    const res = await api.post('/v1/client/subscriptions', pk, body);
    assert.is(res.status, 400, JSON.stringify(body).slice(0, 80));
    assert.is(res.body.error.code, 'validation');
    assert.ok(res.body.error.details.some((d: any) => d.param === param), `${param}: ${JSON.stringify(res.body.error.details)}`);
  }
  assert.is((await api.patch('/v1/client/subscriptions/scr_x', pk, { enabled: 'no' })).body.error.details[0].param, 'enabled');
});

/** APNs answering 410 for subscription `id` of `externalId` (the fan-out's call, about a push that read the subscription before now). */
const invalidate = (ctx: Ctx, externalId: string, id: string) =>
  invalidateSubscription(ctx.service.redis, ctx.service.keys, { tenantId: ctx.boot.tenant.id, workspaceId: ctx.boot.workspace.id, partitions: ctx.service.config.partitions }, externalId, id, 'Unregistered', { claim: Number.MAX_SAFE_INTEGER, unregisteredAt: null });

c('a device its user muted, before or after APNs invalidated its token, is still muted when the app registers the token again; one never muted, or unmuted while invalidated (it stays off until then), comes back on (probe J: it came back on)', async (ctx) => {
  const { api, pk, service, boot } = ctx;
  const cases = [
    { who: 'mute-then-410', muteBefore: true, muteAfter: false, enabled: false },
    { who: '410-then-mute', muteBefore: false, muteAfter: true, enabled: false },
    { who: '410-mute-unmute', muteBefore: false, muteAfter: true, unmuteAfter: true, enabled: true },
    { who: '410-only', muteBefore: false, muteAfter: false, enabled: true },
  ];
  for (const [i, k] of cases.entries()) {
    const reg = { externalId: k.who, channel: 'push', token: token(0xf100 + i), platform: 'ios' };
    const id = (await api.post('/v1/client/subscriptions', pk, reg)).body.data.id;
    const patch = (enabled: boolean) => api.patch(`/v1/client/subscriptions/${id}?externalId=${k.who}`, pk, { enabled });
    if (k.muteBefore) assert.is((await patch(false)).body.data.enabled, false);
    await invalidate(ctx, k.who, id);
    if (k.muteAfter) {
      // enabled is false already: no change to see, no event, but the user's word is kept
      const muted = await patch(false);
      assert.is(muted.status, 200, muted.text);
      assert.is(muted.body.data.enabled, false);
    }
    if (k.unmuteAfter) {
      // the user's word again, kept: the device stays off while its token is dead (no event), and is on once registered again
      const unmuted = await patch(true);
      assert.equal([unmuted.status, unmuted.body.data.enabled, Boolean(unmuted.body.data.invalidatedAt)], [200, false, true], unmuted.text);
    }
    const back = await api.post('/v1/client/subscriptions', pk, reg);
    assert.is(back.status, 200, back.text);
    assert.equal([back.body.data.enabled, back.body.data.invalidatedAt], [k.enabled, null], k.who);
    const stored = (await api.get(`/v1/subscribers/${k.who}/subscriptions`, boot.keys.tenant)).body.data.items[0];
    assert.equal([stored.enabled, stored.invalidatedAt], [k.enabled, null], k.who);
    const events = (await inboxEvents(service, boot.tenant.id, k.who)).map((e) => e.name);
    assert.equal(events.filter((n) => n === '$subscription.muted').length, k.muteBefore ? 1 : 0, `${k.who}: ${events}`);
    assert.equal(events.filter((n) => n === '$subscription.unmuted').length, 0, `${k.who}: ${events}`);
    assert.is(events.at(-1), '$subscription.registered', k.who);
  }
  // a mute of the revived device, registered again after another 410, stays too (the field is cleared with each revival)
  const id = (await api.get('/v1/subscribers/410-only/subscriptions', boot.keys.tenant)).body.data.items[0].id;
  await invalidate(ctx, '410-only', id);
  assert.is((await api.post('/v1/client/subscriptions', pk, { externalId: '410-only', channel: 'push', token: token(0xf103), platform: 'ios' })).body.data.enabled, true);
});

c('a merge moves an invalidated device as it is: still invalidated, its user\'s mute kept, and on again only when the app registers its token (it was a live device muted for good)', async (ctx) => {
  const { api, pk, boot } = ctx;
  const dead = { channel: 'push', token: token(0xf200), platform: 'ios' };
  const muted = { channel: 'push', token: token(0xf201), platform: 'ios' };
  const a = (await api.post('/v1/client/subscriptions', pk, { externalId: 'anon-dead', ...dead })).body.data.id;
  const b = (await api.post('/v1/client/subscriptions', pk, { externalId: 'anon-dead', ...muted })).body.data.id;
  assert.is((await api.patch(`/v1/client/subscriptions/${b}?externalId=anon-dead`, pk, { enabled: false })).status, 200);
  await invalidate(ctx, 'anon-dead', a);
  await invalidate(ctx, 'anon-dead', b);
  assert.is((await api.post('/v1/client/identify', pk, { externalId: 'user-dead', anonymousId: 'anon-dead' })).status, 200);
  const moved = (await api.get('/v1/subscribers/user-dead/subscriptions', boot.keys.tenant)).body.data.items;
  assert.equal(moved.map((s: any) => [s.id, s.enabled, Boolean(s.invalidatedAt)]).sort(), [[a, false, true], [b, false, true]].sort());
  // the app registers both tokens again: each is as its user left it
  const again = await Promise.all([dead, muted].map((d) => api.post('/v1/client/subscriptions', pk, { externalId: 'user-dead', ...d })));
  assert.equal(again.map((r) => [r.status, r.body.data.id, r.body.data.enabled, r.body.data.invalidatedAt]), [[200, a, true, null], [200, b, false, null]]);
});

c('a merge moves each device as its copy is when moved, not as the merge listed it before: a mute made meanwhile holds, a token registered again meanwhile is on (probe O: 6 of 20 raced merges pushed to a muted device, 5 of 20 left one off for good)', async (ctx) => {
  const { api, pk, service, boot } = ctx;
  const scope = { tenantId: boot.tenant.id, workspaceId: boot.workspace.id, partitions: service.config.partitions };
  const device = (n: number) => ({ channel: 'push' as const, token: token(0xf300 + n), platform: 'ios' as const });
  const muted = (await api.post('/v1/client/subscriptions', pk, { externalId: 'anon-raced', ...device(0) })).body.data.id;
  const revived = (await api.post('/v1/client/subscriptions', pk, { externalId: 'anon-raced', ...device(1) })).body.data.id;
  // what the merge listed: the first on, the second invalidated (off)
  await invalidate(ctx, 'anon-raced', revived);
  // then, before it moved them, the user muted the first and the app registered the second again
  assert.is((await api.patch(`/v1/client/subscriptions/${muted}?externalId=anon-raced`, pk, { enabled: false })).body.data.enabled, false);
  assert.is((await api.post('/v1/client/subscriptions', pk, { externalId: 'anon-raced', ...device(1) })).body.data.enabled, true);
  // the merge's moves, with the flags it listed
  await registerSubscription(service.redis, service.keys, scope, 'user-raced', device(0), { enabled: true, merging: true });
  await registerSubscription(service.redis, service.keys, scope, 'user-raced', device(1), { enabled: false, merging: true });
  const held = (await api.get('/v1/subscribers/user-raced/subscriptions', boot.keys.tenant)).body.data.items;
  assert.equal(held.map((x: any) => [x.id, x.enabled, x.invalidatedAt]).sort(), [[muted, false, null], [revived, true, null]].sort());
});

c('a device a merge moved is invalidated by a 410 that speaks of a time after the app last registered it, though before the merge: a merge is no registration (probe O: it stayed on, every push failing)', async (ctx) => {
  const { api, pk, boot, service } = ctx;
  const reg = { channel: 'push', token: token(0xf400), platform: 'ios' };
  const id = (await api.post('/v1/client/subscriptions', pk, { externalId: 'anon-gone', ...reg })).body.data.id;
  await new Promise((r) => setTimeout(r, 20));
  const uninstalledAt = Date.now();
  await new Promise((r) => setTimeout(r, 20));
  assert.is((await api.post('/v1/client/identify', pk, { externalId: 'user-gone', anonymousId: 'anon-gone' })).status, 200);
  const scope = { tenantId: boot.tenant.id, workspaceId: boot.workspace.id, partitions: service.config.partitions };
  await invalidateSubscription(service.redis, service.keys, scope, 'user-gone', id, 'Unregistered', { claim: Number.MAX_SAFE_INTEGER, unregisteredAt: uninstalledAt });
  const stored = (await api.get('/v1/subscribers/user-gone/subscriptions', boot.keys.tenant)).body.data.items[0];
  assert.equal([stored.id, stored.enabled, Boolean(stored.invalidatedAt)], [id, false, true]);
});

c('identify writes $identify, sets attributes and merges the anonymous subscriber', async ({ api, pk, service, boot }) => {
  const anon = await api.post('/v1/client/subscriptions', pk, { externalId: 'anon-123', channel: 'push', token: token(7), platform: 'ios' });
  await api.post('/v1/subscribers', boot.keys.tenant, { externalId: 'anon-123', locale: 'de', properties: { seenOnboarding: true } });
  const res = await api.post('/v1/client/identify', pk, { externalId: 'user-42', anonymousId: 'anon-123', attributes: { email: 'u42@example.com' } });
  assert.is(res.status, 200);
  assert.is(res.body.data.email, 'u42@example.com');
  assert.is(res.body.data.locale, 'de', 'missing attributes come from the anonymous subscriber');
  assert.equal(res.body.data.properties, { seenOnboarding: true });
  const subs = await api.get('/v1/subscribers/user-42/subscriptions', boot.keys.tenant);
  assert.equal(subs.body.data.items.map((s: any) => s.id), [anon.body.data.id]);
  assert.is((await api.get('/v1/subscribers/anon-123', boot.keys.tenant)).status, 404);
  assert.ok(names(await inboxEvents(service, boot.tenant.id, 'user-42')).includes('$identify'));
  assert.is(names(await inboxEvents(service, boot.tenant.id, 'anon-123')).at(-1), '$subscriber.deleted');
});

c('a merge keeps the anonymous subscriber\'s properties named like Object\'s own members', async ({ api, pk, boot }) => {
  await api.post('/v1/subscribers', boot.keys.tenant, { externalId: 'anon-builtins', properties: { constructor: 'c', toString: 't', valueOf: 1, plan: 'pro' } });
  const res = await api.post('/v1/client/identify', pk, { externalId: 'user-builtins', anonymousId: 'anon-builtins' });
  assert.is(res.status, 200, JSON.stringify(res.body.error));
  assert.equal(res.body.data.properties, { constructor: 'c', toString: 't', valueOf: 1, plan: 'pro' });
});

c('a merge moves the anonymous subscriber\'s topics too, and deletes it', async ({ api, pk, boot }) => {
  await api.post('/v1/client/subscriptions', pk, { externalId: 'anon-topic', channel: 'push', token: token(70), platform: 'ios' });
  await api.post('/v1/topics', boot.keys.tenant, { slug: 'merge-news' });
  await api.post('/v1/topics/merge-news/subscribers', boot.keys.tenant, { externalIds: ['anon-topic'] });
  const res = await api.post('/v1/client/identify', pk, { externalId: 'user-topic', anonymousId: 'anon-topic' });
  assert.is(res.status, 200, JSON.stringify(res.body.error));
  assert.is((await api.get('/v1/subscribers/anon-topic', boot.keys.tenant)).status, 404);
  const members = (await api.get('/v1/topics/merge-news/subscribers', boot.keys.tenant)).body.data.items.map((m: any) => m.externalId);
  assert.equal(members, ['user-topic']);
});

c('a client key cannot change another subscriber\'s subscription', async ({ api, pk }) => {
  const { body } = await api.post('/v1/client/subscriptions', pk, { externalId: 'owner', channel: 'push', token: token(8), platform: 'ios' });
  const res = await api.call('PATCH', `/v1/client/subscriptions/${body.data.id}?externalId=intruder`, { key: pk, body: { enabled: false } });
  assert.is(res.status, 404);
  assert.is((await api.patch('/v1/client/subscriptions/scr_unknown', pk, { enabled: false })).status, 404);
  assert.is((await api.del(`/v1/client/subscriptions/${body.data.id}?externalId=intruder`, pk)).status, 404);
});

c('client preferences read and change the app user\'s own preferences', async ({ api, pk, service, boot }) => {
  const res = await api.patch('/v1/client/preferences', pk, { externalId: 'pref-app', channels: { push: false } });
  assert.equal(res.body.data.channels, { push: false, email: true });
  const read = await api.get('/v1/client/preferences?externalId=pref-app', pk);
  assert.equal(read.body.data.channels, { push: false, email: true });
  assert.is((await api.get('/v1/client/preferences?externalId=nobody-here', pk)).status, 404);
  assert.equal(names(await inboxEvents(service, boot.tenant.id, 'pref-app')), ['$subscriber.created', '$preferences.updated']);
  // an update naming nothing is 400, as on the backend route, and creates nobody (probe J: 200, subscriber created)
  const empty = await api.patch('/v1/client/preferences', pk, { externalId: 'pref-nothing' });
  assert.equal([empty.status, empty.body.error.code, empty.body.error.param], [400, 'validation', 'body']);
  assert.is((await api.get('/v1/client/preferences?externalId=pref-nothing', pk)).status, 404);
  assert.equal(await inboxEvents(service, boot.tenant.id, 'pref-nothing'), []);
  // an update that creates the subscriber and changes nothing (a default value, or removing a category it lacks) writes no $preferences.updated
  for (const [externalId, update] of [['pref-same-1', { channels: { push: true } }], ['pref-same-2', { categories: { promo: null } }]] as const) {
    const same = await api.patch('/v1/client/preferences', pk, { externalId, ...update });
    assert.is(same.status, 200);
    assert.equal(same.body.data.channels, { push: true, email: true });
    assert.is((await api.get(`/v1/client/preferences?externalId=${externalId}`, pk)).status, 200, 'the subscriber is created');
    assert.equal(names(await inboxEvents(service, boot.tenant.id, externalId)), ['$subscriber.created'], externalId);
  }
});

c('widgets: register, list own, delete answers the widget then null', async ({ api, pk }) => {
  const made = await api.post('/v1/client/widgets', pk, { externalId: 'w-user', kind: 'com.example.Orders', family: 'systemSmall', configuration: { orderId: 7 } });
  assert.is(made.status, 201);
  assert.match(made.body.data.id, /^wdg_/);
  const list = await api.get('/v1/client/widgets?externalId=w-user', pk);
  assert.equal(list.body.data.items.map((w: any) => w.id), [made.body.data.id]);
  assert.is((await api.get('/v1/client/widgets?externalId=other', pk)).body.data.total, 0);
  assert.is((await api.del(`/v1/client/widgets/${made.body.data.id}?externalId=other`, pk)).status, 404);
  const deleted = await api.del(`/v1/client/widgets/${made.body.data.id}?externalId=w-user`, pk);
  assert.is(deleted.status, 200);
  assert.is(deleted.body.data.id, made.body.data.id);
  const again = await api.del(`/v1/client/widgets/${made.body.data.id}?externalId=w-user`, pk);
  assert.is(again.status, 200);
  assert.is(again.body.data, null);
  assert.is((await api.del('/v1/client/widgets/not-an-id?externalId=w-user', pk)).status, 404);
  assert.is((await api.post('/v1/client/widgets', pk, { externalId: 'w-user', kind: 'k', configuration: { pad: 'x'.repeat(5000) } })).body.error.details[0].param, 'configuration');
});

c('client preferences that create the subscriber: its audit subscriber.created carries the preferences written (probe BJ: an endpoint on subscriber.* never learnt push was off)', async ({ api, pk, service, boot }) => {
  const res = await api.patch('/v1/client/preferences', pk, { externalId: 'pref-new', channels: { push: false } });
  assert.is(res.status, 200, res.text);
  const created = await waitFor('subscriber.created of pref-new in the ledger', async () => {
    const entries = await service.redis.xrange(service.keys.ledger(boot.workspace.id), '-', '+');
    for (const [, fields] of entries) {
      const payload = JSON.parse(fields[fields.indexOf('payload') + 1]!);
      if (payload.type === 'subscriber.created' && payload.data.object.externalId === 'pref-new') return payload;
    }
    return null;
  }, 10_000, 50);
  assert.equal(created.data.object.preferences, res.body.data);
  assert.is(created.data.object.preferences.channels.push, false);
});

c('widgets: an id of another tenant or one never issued is 404 on DELETE (spec 2.3), and the widget stays', async ({ api, pk, service }) => {
  const other = await bootstrapWorkspace(service, 'client-other');
  const theirs = await api.post('/v1/client/widgets', other.keys.client, { externalId: 'w-user', kind: 'com.example.Orders' });
  assert.is(theirs.status, 201);
  const foreign = await api.del(`/v1/client/widgets/${theirs.body.data.id}?externalId=w-user`, pk);
  assert.is(foreign.status, 404);
  assert.is(foreign.body.error.code, 'not_found');
  const neverIssued = await api.del(`/v1/client/widgets/${theirs.body.data.id.slice(0, -4)}zzzz?externalId=w-user`, pk);
  assert.is(neverIssued.status, 404);
  assert.is((await api.get('/v1/client/widgets?externalId=w-user', other.keys.client)).body.data.total, 1, 'the other tenant keeps its widget');
  // without externalId (spec 4.4 names only the path id): unknown, malformed or foreign ids are 404 all the same
  for (const id of [theirs.body.data.id, 'not-an-id', `${theirs.body.data.id.slice(0, -4)}zzzz`]) {
    const bare = await api.del(`/v1/client/widgets/${id}`, pk);
    assert.equal([bare.status, bare.body.error?.code], [404, 'not_found'], id);
  }
  // deleted in its own tenant, without externalId (for its subscriber; 400 until probe BC): 200 with the
  // widget, then 200 null, with or without it; the other tenant still gets 404
  const bareOwn = await api.del(`/v1/client/widgets/${theirs.body.data.id}`, other.keys.client);
  assert.equal([bareOwn.status, bareOwn.body.data?.id, bareOwn.body.data?.externalId], [200, theirs.body.data.id, 'w-user']);
  const bareAgain = await api.del(`/v1/client/widgets/${theirs.body.data.id}`, other.keys.client);
  assert.equal([bareAgain.status, bareAgain.body.data], [200, null]);
  assert.is((await api.get('/v1/client/widgets?externalId=w-user', other.keys.client)).body.data.total, 0, 'gone');
  assert.is((await api.del(`/v1/client/widgets/${theirs.body.data.id}?externalId=w-user`, other.keys.client)).body.data, null);
  assert.is((await api.del(`/v1/client/widgets/${theirs.body.data.id}?externalId=w-user`, pk)).status, 404);
  assert.is((await api.del(`/v1/client/widgets/${theirs.body.data.id}?externalId=someone-else`, other.keys.client)).status, 404, 'a tombstone of another subscriber is 404 too');
});

c('identity verification: a valid hash marks verified, a wrong one verifies nothing (or is refused where the tenant requires it)', async ({ api, pk, service, boot }) => {
  const { secret } = await tenantIdentity(service.redis, service.keys, boot.tenant);
  const good = identityHash(secret, 'verified-user');
  const ok = await api.post('/v1/client/identify', pk, { externalId: 'verified-user', identityHash: good });
  assert.is(ok.body.data.verified, true);
  // optional verification: a wrong hash is as if none were sent, for a new subscriber as for a verified one
  const bad = await api.post('/v1/client/identify', pk, { externalId: 'unproved-user', identityHash: identityHash(secret, 'someone-else') });
  assert.is(bad.status, 200);
  assert.is(bad.body.data.verified, false);
  const garbage = await api.post('/v1/client/events', pk, { externalId: 'unproved-user', identityHash: 'not-a-hash', source: 'ios', events: [{ name: '$app.opened' }] });
  assert.is(garbage.status, 202);
  const again = await api.post('/v1/client/identify', pk, { externalId: 'verified-user', identityHash: identityHash(secret, 'someone-else') });
  assert.is(again.body.data.verified, true, 'a wrong hash does not take verification away');
  await setIdentityRequired(service.redis, service.keys, boot.workspace, boot.tenant, true, BY_TEST);
  try {
    const missing = await api.post('/v1/client/events', pk, { externalId: 'verified-user', source: 'ios', events: [{ name: '$app.opened' }] });
    assert.is(missing.status, 403);
    assert.equal([missing.body.error.code, missing.body.error.param], ['forbidden', 'identityHash']);
    assert.match(missing.body.error.message, /missing/);
    const wrong = await api.post('/v1/client/events', pk, { externalId: 'verified-user', identityHash: identityHash(secret, 'someone-else'), source: 'ios', events: [{ name: '$app.opened' }] });
    assert.equal([wrong.status, wrong.body.error.code, wrong.body.error.param], [403, 'forbidden', 'identityHash']);
    assert.match(wrong.body.error.message, /does not match/);
    const with_ = await api.post('/v1/client/events', pk, { externalId: 'verified-user', identityHash: good.toUpperCase(), source: 'ios', events: [{ name: '$app.opened' }] });
    assert.is(with_.status, 202);
    assert.is((await api.get('/v1/client/preferences?externalId=verified-user', pk)).body.error.code, 'forbidden');
    const filtered = await api.get('/v1/subscribers?limit=100', boot.keys.tenant);
    assert.ok(filtered.body.data.items.find((s: any) => s.externalId === 'verified-user').verified);
  } finally {
    await setIdentityRequired(service.redis, service.keys, boot.workspace, boot.tenant, false, BY_TEST);
  }
});

c('an app\'s own $identify event carries what its call proved: verified from its hash, merged false, whatever the app wrote (probe DD)', async ({ api, pk, service, boot }) => {
  const { secret } = await tenantIdentity(service.redis, service.keys, boot.tenant);
  const forged = { name: '$identify', data: { anonymousId: 'someone', merged: true, verified: true, note: 'kept' } };
  const unproven = await api.post('/v1/client/events', pk, { externalId: 'forger', source: 'ios', events: [forged] });
  assert.is(unproven.status, 202, JSON.stringify(unproven.body));
  assert.equal(unproven.body.data.items[0].data, { anonymousId: 'someone', merged: false, verified: false, note: 'kept' });
  const proven = await api.post('/v1/client/events', pk, { externalId: 'forger', identityHash: identityHash(secret, 'forger'), source: 'ios', events: [{ name: '$app.opened' }, forged] });
  assert.is(proven.status, 202);
  assert.equal(proven.body.data.items.map((e: any) => e.data), [{}, { anonymousId: 'someone', merged: false, verified: true, note: 'kept' }]);
  const stored = (await inboxEvents(service, boot.tenant.id, 'forger')).filter((e) => e.name === '$identify').map((e) => [e.data.verified, e.data.merged]);
  assert.equal(stored, [[false, false], [true, false]]);
  // the two fields may not take the data over 8 KB
  const full = await api.post('/v1/client/events', pk, { externalId: 'forger', source: 'ios', events: [{ name: '$identify', data: { pad: 'x'.repeat(8_192 - 12) } }] });
  assert.equal([full.status, full.body.error?.code, full.body.error?.param], [400, 'event_data_too_large', 'events[0].data']);
});

c('a valid identityHash marks the subscriber verified on every client call, reads and deletes included; one that reads a subscriber that does not exist creates nothing (probe H)', async ({ api, pk, key, service, boot }) => {
  const { secret } = await tenantIdentity(service.redis, service.keys, boot.tenant);
  const verified = async (externalId: string) => (await api.get(`/v1/subscribers/${externalId}`, key)).body.data.verified;
  // each made unverified (no hash), then one call with a valid hash
  const calls: [string, (externalId: string) => Promise<{ status: number }>][] = [
    ['mute', async (x) => {
      const sub = await api.post('/v1/client/subscriptions', pk, { externalId: x, token: token(9100 + x.length) });
      return api.patch(`/v1/client/subscriptions/${sub.body.data.id}?identityHash=${identityHash(secret, x)}`, pk, { enabled: false });
    }],
    ['read-preferences', async (x) => {
      await api.post('/v1/client/identify', pk, { externalId: x });
      return api.get(`/v1/client/preferences?externalId=${x}&identityHash=${identityHash(secret, x)}`, pk);
    }],
    ['list-widgets', async (x) => {
      await api.post('/v1/client/identify', pk, { externalId: x });
      return api.get(`/v1/client/widgets?externalId=${x}&identityHash=${identityHash(secret, x)}`, pk);
    }],
    ['delete-widget', async (x) => {
      const widget = await api.post('/v1/client/widgets', pk, { externalId: x, kind: 'com.example.Orders' });
      return api.del(`/v1/client/widgets/${widget.body.data.id}?externalId=${x}&identityHash=${identityHash(secret, x)}`, pk);
    }],
    ['delete-widget-by-id', async (x) => {
      const widget = await api.post('/v1/client/widgets', pk, { externalId: x, kind: 'com.example.Orders' });
      return api.del(`/v1/client/widgets/${widget.body.data.id}?identityHash=${identityHash(secret, x)}`, pk);
    }],
  ];
  for (const [name, call] of calls) {
    const externalId = `verify-by-${name}`;
    const res = await call(externalId);
    assert.is(res.status, 200, name);
    assert.is(await verified(externalId), true, name);
  }
  const nobody = await api.get(`/v1/client/widgets?externalId=never-seen&identityHash=${identityHash(secret, 'never-seen')}`, pk);
  assert.equal([nobody.status, nobody.body.data.items], [200, []]);
  assert.is((await api.get('/v1/subscribers/never-seen', key)).status, 404, 'a read created no subscriber');
});

c('validation errors name the field as the caller wrote it: attributes.timezone, attributes.properties, categories.<name>', async ({ api, pk, boot }) => {
  const zone = await api.post('/v1/client/identify', pk, { externalId: 'params-1', attributes: { timezone: 'Mars/Olympus' } });
  assert.is(zone.status, 400);
  assert.is(zone.body.error.param, 'attributes.timezone');
  assert.equal(zone.body.error.details.map((d: any) => d.param), ['attributes.timezone']);
  const big = await api.post('/v1/client/identify', pk, { externalId: 'params-1', attributes: { properties: { b: 'x'.repeat(9000) } } });
  assert.is(big.status, 400);
  assert.is(big.body.error.param, 'attributes.properties');
  const backend = await api.post('/v1/subscribers', boot.keys.tenant, { externalId: 'params-1', timezone: 'Mars/Olympus' });
  assert.is(backend.body.error.param, 'timezone', 'the backend body has the attributes at its top level');
  const category = await api.patch('/v1/client/preferences', pk, { externalId: 'params-1', categories: { 'Bad Name': { push: true } } });
  assert.is(category.status, 400);
  assert.is(category.body.error.param, 'categories.Bad Name');
  const backendCategory = await api.patch('/v1/subscribers/params-1/preferences', boot.keys.tenant, { categories: { ok: { push: true }, 'UPPER': { push: false } } });
  assert.is(backendCategory.body.error.param, 'categories.UPPER');
});

c('identify: properties that would go over 8 KB merged with the stored ones are 400 on attributes.properties, nothing stored', async ({ api, pk, service, boot }) => {
  const half = 'x'.repeat(5000);
  assert.is((await api.post('/v1/client/identify', pk, { externalId: 'grow-app', attributes: { properties: { a: half } } })).status, 200);
  const over = await api.post('/v1/client/identify', pk, { externalId: 'grow-app', attributes: { email: 'g@example.com', properties: { b: half } } });
  assert.is(over.status, 400);
  assert.is(over.body.error.code, 'validation');
  assert.is(over.body.error.param, 'attributes.properties');
  const stored = (await api.get('/v1/subscribers/grow-app', boot.keys.tenant)).body.data;
  assert.equal(Object.keys(stored.properties), ['a']);
  assert.is(stored.email, null, 'the rest of the refused update is not stored either');
  assert.equal(names(await inboxEvents(service, boot.tenant.id, 'grow-app')), ['$subscriber.created', '$identify']);
});

c('preferences hold at most 100 categories in total: an update that would store more is 400 bad_request, nothing stored', async ({ api, pk, service, boot }) => {
  const hundred = Object.fromEntries(Array.from({ length: 100 }, (_, i) => [`d${i}`, { push: false }]));
  assert.is((await api.patch('/v1/client/preferences', pk, { externalId: 'pref-cap', categories: hundred })).status, 200);
  const over = await api.patch('/v1/client/preferences', pk, { externalId: 'pref-cap', channels: { email: false }, categories: { extra1: { push: false } } });
  assert.is(over.status, 400);
  assert.is(over.body.error.code, 'bad_request');
  assert.is(over.body.error.param, 'categories');
  const backend = await api.patch('/v1/subscribers/pref-cap/preferences', boot.keys.tenant, { categories: { extra2: { email: false } } });
  assert.is(backend.status, 400);
  assert.is(backend.body.error.code, 'bad_request');
  const stored = (await api.get('/v1/subscribers/pref-cap/preferences', boot.keys.tenant)).body.data;
  assert.is(Object.keys(stored.categories).length, 100);
  assert.is(stored.channels.email, true, 'the rest of the refused update is not stored either');
  // changing a stored category, or swapping one for another, stays within the bound
  assert.is((await api.patch('/v1/client/preferences', pk, { externalId: 'pref-cap', categories: { d0: { email: false } } })).status, 200);
  assert.is((await api.patch('/v1/client/preferences', pk, { externalId: 'pref-cap', categories: { d1: null, extra1: { push: true } } })).status, 200);
  assert.equal(names(await inboxEvents(service, boot.tenant.id, 'pref-cap')), ['$subscriber.created', '$preferences.updated', '$preferences.updated', '$preferences.updated']);
  // one request names at most 100 categories: more is a validation error of the request's shape (docs/client.md)
  const hundredAndOne = Object.fromEntries(Array.from({ length: 101 }, (_, i) => [`d${i}`, null]));
  const wide = await api.patch('/v1/client/preferences', pk, { externalId: 'pref-cap', categories: hundredAndOne });
  assert.equal([wide.status, wide.body.error.code, wide.body.error.param], [400, 'validation', 'categories']);
});

c('widget registration is idempotent: the same pushToken updates in place, the same kind/family/configuration is the same widget', async ({ api, pk }) => {
  const body = { externalId: 'wdup-1', kind: 'com.example.OrderStatus', family: 'systemSmall', pushToken: 'ptok-same-1', configuration: { orderId: 7, shop: 'a' } };
  const first = await api.post('/v1/client/widgets', pk, body);
  assert.is(first.status, 201);
  const again = await api.post('/v1/client/widgets', pk, body);
  assert.is(again.status, 200);
  assert.equal(again.body.data, first.body.data);
  const changed = await api.post('/v1/client/widgets', pk, { ...body, family: 'systemMedium', configuration: { orderId: 8 } });
  assert.is(changed.status, 200);
  assert.is(changed.body.data.id, first.body.data.id);
  assert.is(changed.body.data.family, 'systemMedium');
  assert.equal(changed.body.data.configuration, { orderId: 8 });
  assert.is(changed.body.data.createdAt, first.body.data.createdAt);
  // without a push token: kind + family + configuration, whatever the key order
  const plain = { externalId: 'wdup-1', kind: 'com.example.Weather', family: 'systemSmall', configuration: { city: 'Oslo', units: 'metric' } };
  const p1 = await api.post('/v1/client/widgets', pk, plain);
  assert.is(p1.status, 201);
  const p2 = await api.post('/v1/client/widgets', pk, { ...plain, configuration: { units: 'metric', city: 'Oslo' } });
  assert.is(p2.status, 200);
  assert.is(p2.body.data.id, p1.body.data.id);
  assert.is((await api.post('/v1/client/widgets', pk, { ...plain, family: 'systemLarge' })).status, 201, 'another family is another widget');
  assert.is((await api.post('/v1/client/widgets', pk, { ...plain, configuration: { city: 'Bergen', units: 'metric' } })).status, 201, 'another configuration is another widget');
  assert.is((await api.post('/v1/client/widgets', pk, { externalId: 'wdup-2', ...{ kind: plain.kind, family: plain.family, configuration: plain.configuration } })).status, 201, 'per subscriber');
  assert.is((await api.get('/v1/client/widgets?externalId=wdup-1', pk)).body.data.total, 4);
  // 60 launches re-registering the same widgets never reach the limit
  for (let i = 0; i < 60; i++) assert.is((await api.post('/v1/client/widgets', pk, plain)).status, 200);
  const parallel = await Promise.all(Array.from({ length: 20 }, () => api.post('/v1/client/widgets', pk, { externalId: 'wdup-3', kind: 'k', pushToken: 'ptok-parallel' })));
  assert.is(parallel.filter((r) => r.status === 201).length, 1);
  assert.is(new Set(parallel.map((r) => r.body.data.id)).size, 1);
  // a hex (APNs) push token in upper case is the same token, kept in lowercase
  const hex = 'cd34ab12'.repeat(8);
  const lower = await api.post('/v1/client/widgets', pk, { externalId: 'wdup-4', kind: 'k', pushToken: hex.toUpperCase() });
  assert.equal([lower.status, lower.body.data.pushToken], [201, hex]);
  const upper = await api.post('/v1/client/widgets', pk, { externalId: 'wdup-4', kind: 'k', pushToken: hex });
  assert.equal([upper.status, upper.body.data.id], [200, lower.body.data.id]);
});

c('a subscriber holds at most 50 widgets: the 51st is 409 conflict and stores nothing', async ({ api, pk }) => {
  for (let i = 0; i < 50; i++) assert.is((await api.post('/v1/client/widgets', pk, { externalId: 'wlim-1', kind: `k${i}` })).status, 201);
  const over = await api.post('/v1/client/widgets', pk, { externalId: 'wlim-1', kind: 'k50' });
  assert.is(over.status, 409);
  assert.is(over.body.error.code, 'conflict');
  assert.is((await api.get('/v1/client/widgets?externalId=wlim-1', pk)).body.data.total, 50);
  assert.is((await api.post('/v1/client/widgets', pk, { externalId: 'wlim-1', kind: 'k7' })).status, 200, 'a known widget still answers');
});

c('the widget list pages by limit and cursor like every list (spec 2.2)', async ({ api, pk }) => {
  const ids: string[] = [];
  for (let i = 0; i < 5; i++) ids.push((await api.post('/v1/client/widgets', pk, { externalId: 'w-pages', kind: `com.example.K${i}` })).body.data.id);
  const first = (await api.get('/v1/client/widgets?externalId=w-pages&limit=2', pk)).body.data;
  assert.is(first.total, 5);
  assert.is(first.hasMore, true);
  const seen = [...first.items];
  let cursor = first.nextCursor;
  while (cursor) {
    const next = (await api.get(`/v1/client/widgets?externalId=w-pages&limit=2&cursor=${cursor}`, pk)).body.data;
    seen.push(...next.items);
    cursor = next.nextCursor;
  }
  assert.equal(seen.map((w: any) => w.id), [...ids].reverse());
  const whole = (await api.get('/v1/client/widgets?externalId=w-pages', pk)).body.data;
  assert.is(whole.items.length, 5);
  assert.is(whole.hasMore, false);
  for (const bad of ['limit=0', 'limit=101', 'cursor=zz', 'foo=1']) {
    const res = await api.get(`/v1/client/widgets?externalId=w-pages&${bad}`, pk);
    assert.is(res.status, 400, bad);
    assert.is(res.body.error.code, 'validation');
  }
});

c('a widget list cursor is its subscriber\'s: another subscriber\'s list refuses it (probe BN: it read as a position there and skipped the widget)', async ({ api, pk }) => {
  for (const kind of ['c1', 'c2']) assert.is((await api.post('/v1/client/widgets', pk, { externalId: 'wc-owner', kind })).status, 201);
  const other = (await api.post('/v1/client/widgets', pk, { externalId: 'wc-other', kind: 'a1' })).body.data.id;
  const cursor = (await api.get('/v1/client/widgets?externalId=wc-owner&limit=1', pk)).body.data.nextCursor;
  const refused = await api.get(`/v1/client/widgets?externalId=wc-other&cursor=${cursor}`, pk);
  assert.equal([refused.status, refused.body.error?.code, refused.body.error?.param], [400, 'validation', 'cursor']);
  const own = await api.get(`/v1/client/widgets?externalId=wc-owner&cursor=${cursor}`, pk);
  assert.equal([own.status, own.body.data.items.length], [200, 1], 'the owner\'s own walk goes on');
  assert.equal((await api.get('/v1/client/widgets?externalId=wc-other', pk)).body.data.items.map((w: any) => w.id), [other]);
});

/** What a subscriber is, everything a merge would change: record, subscriptions, widgets, events. */
async function stateOf(api: ReturnType<typeof client>, ctx: Ctx, externalId: string) {
  const record = await api.get(`/v1/subscribers/${encodeURIComponent(externalId)}`, ctx.boot.keys.tenant);
  const subscriptions = await api.get(`/v1/subscribers/${encodeURIComponent(externalId)}/subscriptions?limit=100`, ctx.boot.keys.tenant);
  const widgetIds = await ctx.service.redis.zrange(ctx.service.keys.subscriberWidgets(ctx.boot.tenant.id, externalId), 0, -1);
  const widgets = await Promise.all(widgetIds.map((id) => ctx.service.redis.hgetall(ctx.service.keys.widget(ctx.boot.tenant.id, id))));
  return { status: record.status, record: record.body.data, subscriptions: subscriptions.body.data?.items ?? null, widgets, events: names(await inboxEvents(ctx.service, ctx.boot.tenant.id, externalId)) };
}

c('anonymousId needs proof: a required tenant refuses a merge without anonymousIdentityHash or with a wrong one, and the victim is untouched', async (ctx) => {
  const { api, pk, service, boot } = ctx;
  const { secret } = await tenantIdentity(service.redis, service.keys, boot.tenant);
  const hash = (x: string) => identityHash(secret, x);
  const victim = 'victim-1';
  await api.post('/v1/client/identify', pk, { externalId: victim, identityHash: hash(victim), attributes: { email: 'victim@corp.com', properties: { ssn: 'secret' } } });
  await api.post('/v1/client/subscriptions', pk, { externalId: victim, identityHash: hash(victim), channel: 'push', token: token(0xd000), platform: 'ios' });
  await api.post('/v1/client/widgets', pk, { externalId: victim, identityHash: hash(victim), kind: 'com.example.Victim' });
  const before = await stateOf(api, ctx, victim);
  await setIdentityRequired(service.redis, service.keys, boot.workspace, boot.tenant, true, BY_TEST);
  try {
    for (const route of ['/v1/client/identify', '/v1/client/subscriptions']) {
      const extra = route.endsWith('subscriptions') ? { channel: 'push', token: token(0xd001), platform: 'ios' } : {};
      const attacker = `attacker-${route.length}`;
      const missing = await api.post(route, pk, { externalId: attacker, identityHash: hash(attacker), anonymousId: victim, ...extra });
      assert.is(missing.status, 403, route);
      assert.is(missing.body.error.code, 'forbidden');
      assert.is(missing.body.error.param, 'anonymousIdentityHash');
      const wrong = await api.post(route, pk, { externalId: attacker, identityHash: hash(attacker), anonymousId: victim, anonymousIdentityHash: hash(attacker), ...extra });
      assert.is(wrong.status, 403, route);
      assert.is(wrong.body.error.code, 'forbidden');
      assert.is(wrong.body.error.param, 'anonymousIdentityHash');
      assert.is((await api.get(`/v1/subscribers/${attacker}`, boot.keys.tenant)).status, 404, 'a refused call writes nothing, not even the caller');
      assert.equal(await stateOf(api, ctx, victim), before, `${route}: the victim is untouched`);
    }
    // with the proof the merge is allowed, also in a required tenant
    const anon = 'anon-proved';
    await api.post('/v1/client/subscriptions', pk, { externalId: anon, identityHash: hash(anon), channel: 'push', token: token(0xd002), platform: 'ios' });
    const ok = await api.post('/v1/client/identify', pk, { externalId: 'user-proved', identityHash: hash('user-proved'), anonymousId: anon, anonymousIdentityHash: hash(anon).toUpperCase() });
    assert.is(ok.status, 200);
    assert.is((await api.get(`/v1/subscribers/${anon}`, boot.keys.tenant)).status, 404);
    assert.equal((await api.get('/v1/subscribers/user-proved/subscriptions', boot.keys.tenant)).body.data.items.map((x: any) => x.token), [token(0xd002)]);
  } finally {
    await setIdentityRequired(service.redis, service.keys, boot.workspace, boot.tenant, false, BY_TEST);
  }
});

c('a tenant that requires verification answers an unproven call on a subscription id alike whether the id exists or not (probe B1: 403 against 404)', async (ctx) => {
  const { api, pk, service, boot } = ctx;
  const { secret } = await tenantIdentity(service.redis, service.keys, boot.tenant);
  const hash = (x: string) => identityHash(secret, x);
  const holder = 'sub-holder-1';
  const real = (await api.post('/v1/client/subscriptions', pk, { externalId: holder, identityHash: hash(holder), channel: 'push', token: token(0xd100), platform: 'ios' })).body.data.id as string;
  const unknown = `${real.slice(0, -4)}zzzz`;
  await setIdentityRequired(service.redis, service.keys, boot.workspace, boot.tenant, true, BY_TEST);
  try {
    const answer = async (method: 'patch' | 'del', id: string, query: string) => {
      const path = `/v1/client/subscriptions/${id}${query}`;
      const res = method === 'patch' ? await api.patch(path, pk, { enabled: false }) : await api.del(path, pk);
      return [res.status, res.body.error?.code, res.body.error?.param, res.body.error?.message];
    };
    for (const method of ['patch', 'del'] as const) {
      for (const query of ['', `?identityHash=${hash('someone-else')}`]) {
        assert.equal(await answer(method, unknown, query), await answer(method, real, query), `${method} ${query || 'without a hash'}: the same answer for a real and an unknown id`);
        assert.is((await answer(method, real, query))[0], 403);
      }
      // a caller proving its own externalId learns 404 for an id not its own, whoever holds it
      const prover = 'sub-prover-1';
      const own = `?externalId=${prover}&identityHash=${hash(prover)}`;
      assert.is((await answer(method, unknown, own))[0], 404);
      assert.is((await answer(method, real, own))[0], 404);
      assert.is((await answer(method, real, `?externalId=${prover}&identityHash=${hash('x')}`))[0], 403);
    }
    const still = (await api.get(`/v1/subscribers/${holder}/subscriptions`, boot.keys.tenant)).body.data.items;
    assert.equal(still.map((x: any) => [x.id, x.enabled]), [[real, true]], 'nothing refused changed the device');
    // the holder's own proof works, by id alone or with its externalId
    assert.is((await api.patch(`/v1/client/subscriptions/${real}?identityHash=${hash(holder)}`, pk, { enabled: false })).status, 200);
    assert.is((await api.del(`/v1/client/subscriptions/${real}?externalId=${holder}&identityHash=${hash(holder)}`, pk)).status, 200);
  } finally {
    await setIdentityRequired(service.redis, service.keys, boot.workspace, boot.tenant, false, BY_TEST);
  }
});

c('anonymousId in an optional tenant: a verified subscriber is merged only with anonymousIdentityHash (403 forbidden otherwise), a never-verified one without', async (ctx) => {
  const { api, pk, service, boot } = ctx;
  const { secret } = await tenantIdentity(service.redis, service.keys, boot.tenant);
  const victim = 'victim-2';
  await api.post('/v1/client/identify', pk, { externalId: victim, identityHash: identityHash(secret, victim), attributes: { properties: { ssn: 'secret' } } });
  await api.post('/v1/client/subscriptions', pk, { externalId: victim, channel: 'push', token: token(0xd100), platform: 'ios' });
  const before = await stateOf(api, ctx, victim);
  for (const [route, extra] of [['/v1/client/identify', {}], ['/v1/client/subscriptions', { channel: 'push', token: token(0xd101), platform: 'ios' }]] as const) {
    const refused = await api.post(route, pk, { externalId: 'attacker-2', anonymousId: victim, ...extra });
    assert.is(refused.status, 403, route);
    assert.is(refused.body.error.code, 'forbidden');
    assert.is(refused.body.error.param, 'anonymousId');
    assert.match(refused.body.error.message, /verified/);
    assert.is(JSON.stringify(refused.body).includes('secret'), false, 'nothing of the victim is answered');
    assert.equal(await stateOf(api, ctx, victim), before, `${route}: the victim is untouched`);
    assert.is((await api.get('/v1/subscribers/attacker-2', boot.keys.tenant)).status, 404);
  }
  // a wrong proof is no proof: the verified subscriber is still refused
  const wrong = await api.post('/v1/client/identify', pk, { externalId: 'attacker-2', anonymousId: victim, anonymousIdentityHash: identityHash(secret, 'attacker-2') });
  assert.equal([wrong.status, wrong.body.error.code, wrong.body.error.param], [403, 'forbidden', 'anonymousId']);
  assert.equal(await stateOf(api, ctx, victim), before, 'the victim is untouched');
  // the owner of the anonymous id proves it: merged
  const proved = await api.post('/v1/client/identify', pk, { externalId: 'owner-2', anonymousId: victim, anonymousIdentityHash: identityHash(secret, victim) });
  assert.is(proved.status, 200);
  assert.equal(proved.body.data.properties, { ssn: 'secret' });
  assert.is((await api.get(`/v1/subscribers/${victim}`, boot.keys.tenant)).status, 404);
  // a never-verified anonymous subscriber needs no proof in an optional tenant
  await api.post('/v1/client/subscriptions', pk, { externalId: 'anon-2', channel: 'push', token: token(0xd102), platform: 'ios' });
  const merged = await api.post('/v1/client/subscriptions', pk, { externalId: 'user-2', anonymousId: 'anon-2', channel: 'push', token: token(0xd103), platform: 'ios' });
  assert.is(merged.status, 201);
  assert.equal((await api.get('/v1/subscribers/user-2/subscriptions', boot.keys.tenant)).body.data.items.map((x: any) => x.token).sort(), [token(0xd102), token(0xd103)].sort());
  assert.is((await api.get('/v1/subscribers/anon-2', boot.keys.tenant)).status, 404);
});

c('a merge that would give the subscriber more than 50 subscriptions is 409 and changes nothing (identify, and registration counting its own device)', async (ctx) => {
  const { api, pk } = ctx;
  for (let i = 0; i < 48; i++) await api.post('/v1/client/subscriptions', pk, { externalId: 'mfull-1', channel: 'push', token: token(0xe000 + i), platform: 'ios' });
  for (let i = 0; i < 3; i++) await api.post('/v1/client/subscriptions', pk, { externalId: 'manon-1', channel: 'push', token: token(0xe100 + i), platform: 'ios' });
  await api.post('/v1/client/widgets', pk, { externalId: 'manon-1', kind: 'k' });
  const user = await stateOf(api, ctx, 'mfull-1');
  const anon = await stateOf(api, ctx, 'manon-1');
  const refused = await api.post('/v1/client/identify', pk, { externalId: 'mfull-1', anonymousId: 'manon-1', attributes: { email: 'x@example.com' } });
  assert.is(refused.status, 409);
  assert.is(refused.body.error.code, 'conflict');
  assert.equal(await stateOf(api, ctx, 'mfull-1'), user, 'the identified subscriber is unchanged (its attributes too)');
  assert.equal(await stateOf(api, ctx, 'manon-1'), anon, 'no subscription of the anonymous one is lost');
  // 48 + 1 anonymous = 49, plus the device this registration adds = 50: fits; one more anonymous device would not
  await api.del(`/v1/subscribers/manon-1/subscriptions/${anon.subscriptions[0].id}`, ctx.boot.keys.tenant);
  const anon2 = await stateOf(api, ctx, 'manon-1');
  const over = await api.post('/v1/client/subscriptions', pk, { externalId: 'mfull-1', anonymousId: 'manon-1', channel: 'push', token: token(0xe200), platform: 'ios' });
  assert.is(over.status, 409);
  assert.equal(await stateOf(api, ctx, 'manon-1'), anon2);
  assert.is((await api.get('/v1/subscribers/mfull-1/subscriptions?limit=100', ctx.boot.keys.tenant)).body.data.total, 48);
  // re-registering a device the anonymous subscriber holds adds nothing: 48 + 2 = 50 fits
  const fits = await api.post('/v1/client/subscriptions', pk, { externalId: 'mfull-1', anonymousId: 'manon-1', channel: 'push', token: token(0xe101), platform: 'ios' });
  assert.is(fits.status, 200);
  assert.is((await api.get('/v1/subscribers/mfull-1/subscriptions?limit=100', ctx.boot.keys.tenant)).body.data.total, 50);
  assert.is((await api.get('/v1/subscribers/manon-1', ctx.boot.keys.tenant)).status, 404);
  assert.is((await api.get('/v1/client/widgets?externalId=mfull-1', pk)).body.data.total, 1, 'its widget moved');
});

c('widgets: removed with their subscriber, moved by a merge (the user\'s own kept on a duplicate), and a merge beyond 50 widgets is 409 with nothing changed', async (ctx) => {
  const { api, pk, boot } = ctx;
  const gone = await api.post('/v1/client/widgets', pk, { externalId: 'wdx-1', kind: 'k', pushToken: 'ptok12345' });
  assert.is((await api.del('/v1/subscribers/wdx-1', boot.keys.tenant)).status, 200);
  const after = await api.get('/v1/client/widgets?externalId=wdx-1', pk);
  assert.is(after.body.data.total, 0);
  assert.is(await ctx.service.redis.exists(ctx.service.keys.widget(boot.tenant.id, gone.body.data.id)), 0);
  await api.post('/v1/subscribers', boot.keys.tenant, { externalId: 'wdx-1' });
  assert.is((await api.get('/v1/client/widgets?externalId=wdx-1', pk)).body.data.total, 0, 'a new subscriber of the same externalId starts clean');

  const moved = await api.post('/v1/client/widgets', pk, { externalId: 'anon-w', kind: 'com.x.W' });
  const dupAnon = await api.post('/v1/client/widgets', pk, { externalId: 'anon-w', kind: 'com.x.P', pushToken: 'ptok-shared' });
  const own = await api.post('/v1/client/widgets', pk, { externalId: 'user-w', kind: 'com.x.Q', pushToken: 'ptok-shared' });
  assert.is((await api.post('/v1/client/identify', pk, { externalId: 'user-w', anonymousId: 'anon-w' })).status, 200);
  const list = (await api.get('/v1/client/widgets?externalId=user-w', pk)).body.data.items;
  assert.equal(list.map((w: any) => w.id).sort(), [moved.body.data.id, own.body.data.id].sort());
  assert.is(list.find((w: any) => w.id === moved.body.data.id).externalId, 'user-w');
  assert.is(list.find((w: any) => w.id === own.body.data.id).kind, 'com.x.Q', 'the user\'s widget wins over the anonymous duplicate');
  assert.is(await ctx.service.redis.exists(ctx.service.keys.widget(boot.tenant.id, dupAnon.body.data.id)), 0);
  assert.is((await api.get('/v1/client/widgets?externalId=anon-w', pk)).body.data.total, 0);
  assert.is((await api.del(`/v1/client/widgets/${moved.body.data.id}?externalId=user-w`, pk)).body.data.id, moved.body.data.id, 'the moved widget is the user\'s now');

  for (let i = 0; i < 49; i++) await api.post('/v1/client/widgets', pk, { externalId: 'wfull', kind: `k${i}` });
  for (let i = 0; i < 2; i++) await api.post('/v1/client/widgets', pk, { externalId: 'wanon', kind: `a${i}` });
  const user = await stateOf(api, ctx, 'wfull');
  const anon = await stateOf(api, ctx, 'wanon');
  const refused = await api.post('/v1/client/identify', pk, { externalId: 'wfull', anonymousId: 'wanon' });
  assert.is(refused.status, 409);
  assert.is(refused.body.error.code, 'conflict');
  assert.match(refused.body.error.message, /widgets/);
  assert.equal(await stateOf(api, ctx, 'wfull'), user);
  assert.equal(await stateOf(api, ctx, 'wanon'), anon);
  // a duplicate does not count: once the user has one of the two (49 widgets still), it fits
  await api.del(`/v1/client/widgets/${user.widgets[0]!.id}?externalId=wfull`, pk);
  await api.post('/v1/client/widgets', pk, { externalId: 'wfull', kind: 'a0' });
  assert.is((await api.post('/v1/client/identify', pk, { externalId: 'wfull', anonymousId: 'wanon' })).status, 200);
  assert.is((await api.get('/v1/client/widgets?externalId=wfull&limit=100', pk)).body.data.total, 50);
});

c('a merge keeps the user\'s properties and adds the anonymous ones only while the result stays within 8 KB', async ({ api, pk, boot, service }) => {
  await api.post('/v1/subscribers', boot.keys.tenant, { externalId: 'pm-anon', properties: { plan: 'free', big: 'a'.repeat(5000), small: 1, later: 'x' } });
  await api.post('/v1/subscribers', boot.keys.tenant, { externalId: 'pm-user', properties: { plan: 'pro', own: 'u'.repeat(4000), off: false } });
  const res = await api.post('/v1/client/identify', pk, { externalId: 'pm-user', anonymousId: 'pm-anon' });
  assert.is(res.status, 200);
  // plan: the user's wins; big: would go over 8 KB, left out; small and later: added
  assert.equal(res.body.data.properties, { plan: 'pro', own: 'u'.repeat(4000), off: false, small: 1, later: 'x' });
  assert.ok(Buffer.byteLength(JSON.stringify(res.body.data.properties)) <= 8192);
  const updated = (await inboxEvents(service, boot.tenant.id, 'pm-user')).filter((e) => e.name === '$subscriber.updated').at(-1)!;
  assert.equal(updated.data, { changes: { properties: { small: 1, later: 'x' } }, previousAttributes: { properties: { small: null, later: null } } });
});

c('the OpenAPI document declares the statuses the client routes answer (409 at the limits, 404 for unknown preferences, 200/201 widgets)', async ({ api }) => {
  const doc = (await api.get('/v1/openapi.json')).body;
  const declared = (path: string, method: string) => Object.keys(doc.paths[path][method].responses);
  for (const [path, method, statuses] of [
    ['/v1/client/identify', 'post', ['200', '400', '401', '403', '409', '413']],
    ['/v1/client/subscriptions', 'post', ['200', '201', '400', '401', '403', '409', '413']],
    ['/v1/client/widgets', 'post', ['200', '201', '400', '401', '403', '409', '413']],
    ['/v1/client/widgets', 'get', ['200', '400', '401', '403']],
    ['/v1/client/preferences', 'get', ['200', '400', '401', '403', '404']],
    ['/v1/client/preferences', 'patch', ['200', '400', '401', '403']],
  ] as const) {
    for (const status of statuses) assert.ok(declared(path, method).includes(status), `${method} ${path} declares ${status}: ${declared(path, method)}`);
  }
  const widgetList = doc.paths['/v1/client/widgets'].get.parameters.map((p: any) => p.name ?? p.$ref);
  assert.ok(widgetList.includes('#/components/parameters/limit') && widgetList.includes('#/components/parameters/cursor'));
  for (const schema of ['Identify', 'SubscriptionRegister']) assert.ok(doc.components.schemas[schema].properties.anonymousIdentityHash, schema);
});

c.run();
