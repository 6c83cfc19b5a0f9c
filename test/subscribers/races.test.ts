import type { Redis } from 'ioredis';
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { ApiError } from '../../lib/errors.js';
import { partitionOf } from '../../lib/partition.js';
import { changeSubscriber } from '../../streams/subscriber-writes.js';
import { commandName } from '../../streams/lua-scripts.js';
import { mergeLockTiming, mergeSubscriber, planMerge } from '../../streams/subscriber-merge.js';
import { topicsOfSubscriber } from '../../streams/topic-members.js';
import { deleteSubscriber, getSubscriber, upsertSubscriber } from '../../streams/subscribers.js';
import { updatePreferences } from '../../streams/preferences.js';
import { listSubscriptions, MAX_SUBSCRIPTIONS_PER_SUBSCRIBER, registerSubscription, removeSubscription, type RegisterInput } from '../../streams/subscriptions.js';
import type { TenantScope } from '../../streams/subscriber-writes.js';
import { client } from '../helpers/api.js';
import { inboxEvents, names } from '../helpers/inbox.js';
import { BY_TEST, bootstrapWorkspace, startTestService, type TestService } from '../helpers/service.js';
import { AuditTrail } from '../../streams/subscriber-audit.js';
import { auditsSettled } from '../../streams/audit-outbox.js';
import { createLogger } from '../../lib/log.js';

// Concurrent identical requests, as retrying clients send them: the audit ledger records what the
// stream records (one entry per real change), whatever the interleaving.

type Ctx = { service: TestService; api: ReturnType<typeof client>; key: string; pk: string; tenantId: string; workspaceId: string };
const races = suite<Ctx>('concurrent requests and the audit ledger');

/** `redis` with the Lua command `script` run through `around`, which runs it when it likes (a race injected at an exact point). */
function aroundScript(redis: Redis, script: string, around: (run: () => Promise<unknown>, args: unknown[]) => Promise<unknown>): Redis {
  const command = commandName(script);
  return new Proxy(redis, {
    get(target, prop, receiver) {
      const value = Reflect.get(target, prop, receiver);
      if (typeof value !== 'function') return value;
      if (prop !== command) return value.bind(target);
      return (...args: unknown[]) => around(() => value.apply(target, args), args);
    },
  });
}

races.before(async (ctx) => {
  ctx.service = await startTestService('races');
  ctx.api = client(ctx.service.url);
  const { keys, tenant, workspace } = await bootstrapWorkspace(ctx.service, 'races');
  ctx.key = keys.tenant;
  ctx.pk = keys.client;
  ctx.tenantId = tenant.id;
  ctx.workspaceId = workspace.id;
});
races.after(async (ctx) => ctx.service.stop());

type Entry = { type: string; target: { id: string } | null; changes?: Record<string, unknown>; previousAttributes?: Record<string, unknown>; data: { object: Record<string, unknown> } };
async function ledger(service: TestService, workspaceId: string, type: string, targetId?: string): Promise<Entry[]> {
  const entries = (await service.redis.xrange(service.keys.ledger(workspaceId), '-', '+')).map(([, f]) => JSON.parse(f[3]!) as Entry);
  return entries.filter((e) => e.type === type && (targetId === undefined || e.target?.id === targetId));
}

const times = <T>(n: number, f: (i: number) => Promise<T>) => Promise.all(Array.from({ length: n }, (_, i) => f(i)));

races('parallel creates of one externalId without attributes: one 201 and one subscriber.created, through the API and identify', async ({ api, key, pk, service, tenantId, workspaceId }) => {
  const upserts = await times(20, () => api.post('/v1/subscribers', key, { externalId: 'twin' }));
  assert.equal(upserts.map((r) => r.status).sort(), [...Array(19).fill(200), 201]);
  const identifies = await times(20, () => api.post('/v1/client/identify', pk, { externalId: 'twin-app', source: 'ios' }));
  assert.ok(identifies.every((r) => r.status === 200));
  for (const externalId of ['twin', 'twin-app']) {
    assert.equal(names(await inboxEvents(service, tenantId, externalId)).filter((n) => n === '$subscriber.created'), ['$subscriber.created']);
    const id = (await api.get(`/v1/subscribers/${externalId}`, key)).body.data.id;
    assert.is((await ledger(service, workspaceId, 'subscriber.created', id)).length, 1, `one subscriber.created for ${externalId}`);
  }
});

races('parallel identical enabled changes audit one subscription.updated per real change, as the stream has one $subscription.muted', async ({ api, key, pk, service, tenantId, workspaceId }) => {
  const reg = await api.post('/v1/client/subscriptions', pk, { externalId: 'muter', channel: 'push', token: 'b'.repeat(64), platform: 'ios' });
  const id = reg.body.data.id;
  const mutes = await times(25, () => api.patch(`/v1/client/subscriptions/${id}`, pk, { enabled: false }));
  assert.ok(mutes.every((r) => r.status === 200 && r.body.data.enabled === false));
  const unmutes = await times(25, () => api.patch(`/v1/subscribers/muter/subscriptions/${id}`, key, { enabled: true }));
  assert.ok(unmutes.every((r) => r.status === 200 && r.body.data.enabled === true));
  assert.equal(names(await inboxEvents(service, tenantId, 'muter')).filter((n) => n.includes('muted')), ['$subscription.muted', '$subscription.unmuted']);
  const updates = await ledger(service, workspaceId, 'subscription.updated', id);
  assert.equal(updates.map((e) => [e.changes, e.previousAttributes]), [[{ enabled: false }, { enabled: true }], [{ enabled: true }, { enabled: false }]]);
});

races('re-registering a device audits subscription.updated only when a field changed, with changes and previousAttributes', async ({ api, pk, service, workspaceId }) => {
  const device = { channel: 'push', token: 'c'.repeat(64), platform: 'ios', authorizationStatus: 'provisional' };
  const first = await api.post('/v1/client/subscriptions', pk, { externalId: 'launcher', ...device });
  assert.is(first.status, 201);
  const id = first.body.data.id;
  // every launch registers again, some at once
  const launches = await times(10, () => api.post('/v1/client/subscriptions', pk, { externalId: 'launcher', ...device }));
  assert.ok(launches.every((r) => r.status === 200 && r.body.data.id === id));
  assert.equal(await ledger(service, workspaceId, 'subscription.updated', id), [], 'nothing changed, nothing audited');
  await api.post('/v1/client/subscriptions', pk, { externalId: 'launcher', ...device, authorizationStatus: 'authorized' });
  const updates = await ledger(service, workspaceId, 'subscription.updated', id);
  assert.equal(updates.map((e) => [e.changes, e.previousAttributes]), [[{ authorizationStatus: 'authorized' }, { authorizationStatus: 'provisional' }]]);
  assert.is((await ledger(service, workspaceId, 'subscription.created', id)).length, 1);
});

races('parallel preference updates of different categories: none lost, and each audit entry tells its own change on the preferences the one before left', async ({ api, key, service, workspaceId }) => {
  const created = await api.post('/v1/subscribers', key, { externalId: 'chooser' });
  const updates = await times(12, (i) => api.patch('/v1/subscribers/chooser/preferences', key, { categories: { [`cat-${i}`]: { push: false } } }));
  assert.ok(updates.every((r) => r.status === 200));
  assert.is(Object.keys((await api.get('/v1/subscribers/chooser/preferences', key)).body.data.categories).length, 12);
  const entries = await ledger(service, workspaceId, 'subscriber.updated', created.body.data.id);
  assert.is(entries.length, 12);
  // each entry tells only its own category, added
  const categoriesOf = (e: Entry, side: 'changes' | 'previousAttributes') => (e[side]!.preferences as { categories: Record<string, unknown> }).categories;
  for (const e of entries) {
    const [name] = Object.keys(categoriesOf(e, 'changes'));
    assert.equal(categoriesOf(e, 'changes'), { [name!]: { push: false } });
    assert.equal(categoriesOf(e, 'previousAttributes'), { [name!]: null });
  }
  // one after the other: each entry's record holds the categories of the entries before it, and its own
  const held = entries.map((e) => Object.keys((e.data.object.preferences as { categories: object }).categories).length);
  assert.equal(held.sort((a, b) => a - b), Array.from({ length: 12 }, (_, i) => i + 1));
});

races('client calls audit what they change once: identify attributes, a merge (filled attributes, the deleted anonymous subscriber), client preferences', async ({ api, key, pk, service, workspaceId }) => {
  const first = await api.post('/v1/client/identify', pk, { externalId: 'app-user', source: 'ios', attributes: { locale: 'en-GB' } });
  const id = first.body.data.id;
  assert.is((await ledger(service, workspaceId, 'subscriber.created', id)).length, 1);
  // ten identical retries of a change: one entry, naming the value it replaced
  const again = await times(10, () => api.post('/v1/client/identify', pk, { externalId: 'app-user', source: 'ios', attributes: { locale: 'fr-FR', properties: { plan: 'pro' } } }));
  assert.ok(again.every((r) => r.status === 200));
  let updated = await ledger(service, workspaceId, 'subscriber.updated', id);
  assert.is(updated.length, 1);
  assert.equal([updated[0]!.changes, updated[0]!.previousAttributes], [{ locale: 'fr-FR', properties: { plan: 'pro' } }, { locale: 'en-GB', properties: { plan: null } }]);
  // a merge: the anonymous email moves (the user has none), its locale does not (the user's wins); the anonymous subscriber is deleted
  const anonymous = await api.post('/v1/client/identify', pk, { externalId: 'app-anon', source: 'ios', attributes: { email: 'anon@example.com', locale: 'de-DE' } });
  await times(3, () => api.post('/v1/client/identify', pk, { externalId: 'app-user', anonymousId: 'app-anon', source: 'ios' }));
  updated = await ledger(service, workspaceId, 'subscriber.updated', id);
  assert.is(updated.length, 2);
  assert.equal([updated[1]!.changes, updated[1]!.previousAttributes], [{ email: 'anon@example.com' }, { email: null }]);
  assert.is((await ledger(service, workspaceId, 'subscriber.deleted', anonymous.body.data.id)).length, 1);
  // client preferences: a change is subscriber.updated with the preferences it replaced; the same update again writes nothing
  await times(5, () => api.patch('/v1/client/preferences', pk, { externalId: 'app-user', categories: { news: { push: false } } }));
  updated = await ledger(service, workspaceId, 'subscriber.updated', id);
  assert.is(updated.length, 3);
  assert.equal((updated[2]!.changes!.preferences as { categories: unknown }).categories, { news: { push: false } });
  assert.equal((updated[2]!.previousAttributes!.preferences as { categories: unknown }).categories, { news: null }, 'a category that was not set');
  // preferences of an unknown user create it: subscriber.created, not updated
  const fresh = await api.patch('/v1/client/preferences', pk, { externalId: 'app-new', channels: { push: false } });
  assert.is(fresh.status, 200);
  const freshId = (await api.get('/v1/subscribers/app-new', key)).body.data.id;
  assert.equal([(await ledger(service, workspaceId, 'subscriber.created', freshId)).length, (await ledger(service, workspaceId, 'subscriber.updated', freshId)).length], [1, 0]);
});

races('a device registered for the anonymous subscriber while it is merged is kept: it moves to the user, or stays with the anonymous id', async ({ api, key, pk }) => {
  for (let round = 0; round < 4; round++) {
    const anonymousId = `anon-${round}`, externalId = `signed-in-${round}`;
    await api.post('/v1/client/subscriptions', pk, { externalId: anonymousId, channel: 'push', token: `${round}`.repeat(64), platform: 'ios' });
    const tokens = Array.from({ length: 8 }, (_, i) => `${round}${i}`.padEnd(64, 'd'));
    const identify = times(2, () => api.post('/v1/client/identify', pk, { externalId, anonymousId, source: 'ios' }));
    const registrations = times(8, (i) => new Promise((r) => setTimeout(r, i * (2 + round))).then(() => api.post('/v1/client/subscriptions', pk, { externalId: anonymousId, channel: 'push', token: tokens[i], platform: 'ios' })));
    assert.ok((await registrations).every((r) => r.status === 201));
    // a merge outpaced by registrations may give up with 429 lock_timeout "changing too fast": a retry finishes it
    for (const r of await identify) assert.ok(r.status === 200 || (r.status === 429 && r.body.error.code === 'lock_timeout' && r.headers.get('retry-after') === '1'), JSON.stringify(r.body));
    if ((await identify).some((r) => r.status === 429)) assert.is((await api.post('/v1/client/identify', pk, { externalId, anonymousId, source: 'ios' })).status, 200);
    const held = new Set<string>();
    for (const id of [anonymousId, externalId]) {
      const list = await api.get(`/v1/subscribers/${id}/subscriptions?limit=100`, key);
      if (list.status === 200) for (const s of list.body.data.items) held.add(s.token);
    }
    assert.equal(tokens.filter((t) => !held.has(t)), [], `round ${round}: every registered device is held by someone`);
  }
});

races('identify calls racing to merge one anonymous subscriber: exactly one $identify says merged (probe B1: every one did)', async ({ api, pk, service, tenantId }) => {
  for (let round = 0; round < 3; round++) {
    const anonymousId = `anon-race-${round}`, externalId = `merge-race-${round}`;
    await api.post('/v1/client/subscriptions', pk, { externalId: anonymousId, channel: 'push', token: `${round}`.padStart(64, 'f'), platform: 'ios' });
    const answers = await times(10, () => api.post('/v1/client/identify', pk, { externalId, anonymousId, source: 'ios' }));
    assert.ok(answers.every((r) => r.status === 200), JSON.stringify(answers.map((r) => r.body.error)));
    const identifies = (await inboxEvents(service, tenantId, externalId)).filter((e) => e.name === '$identify');
    assert.is(identifies.length, 10);
    assert.is(identifies.filter((e) => e.data.merged === true).length, 1, `round ${round}: one merge, one merged: true`);
  }
});

races('identify calls merging one anonymous subscriber into two users at once: one merge takes its device, topics and properties, the other nothing (probe BX: both got them, the device moved on to the loser)', async ({ api, key, pk, service, tenantId }) => {
  assert.is((await api.post('/v1/topics', key, { slug: 'merge-pair', name: 'Merge pair' })).status, 201);
  for (let round = 0; round < 8; round++) {
    const anonymousId = `anon-pair-${round}`, a = `pair-a-${round}`, b = `pair-b-${round}`, token = `${round}`.padStart(64, 'd');
    await api.post('/v1/client/subscriptions', pk, { externalId: anonymousId, channel: 'push', token, platform: 'ios' });
    await api.post('/v1/client/identify', pk, { externalId: anonymousId, source: 'ios', attributes: { properties: { fromAnon: round } } });
    assert.is((await api.post('/v1/topics/merge-pair/subscribers', key, { externalIds: [anonymousId] })).status, 200);
    const answers = await Promise.all([a, b].map((externalId) => api.post('/v1/client/identify', pk, { externalId, anonymousId, source: 'ios' })));
    assert.ok(answers.every((r) => r.status === 200), JSON.stringify(answers.map((r) => r.body.error)));
    const merged = (externalId: string) => inboxEvents(service, tenantId, externalId).then((events) => events.filter((e) => e.name === '$identify').map((e) => e.data.merged));
    const [mergedA, mergedB] = [await merged(a), await merged(b)];
    assert.equal([mergedA, mergedB].map((m) => m.length), [1, 1], `round ${round}: one $identify each`);
    const winner = mergedA[0] === true ? a : b, loser = winner === a ? b : a;
    assert.equal([mergedA[0], mergedB[0]].filter((m) => m === true).length, 1, `round ${round}: one merge`);
    const devices = async (externalId: string) => (await api.get(`/v1/subscribers/${externalId}/subscriptions`, key)).body.data.items.map((x: { token: string }) => x.token);
    assert.equal([await devices(winner), await devices(loser)], [[token], []], `round ${round}: the device is the merged user's only`);
    const properties = async (externalId: string) => (await api.get(`/v1/subscribers/${externalId}`, key)).body.data.properties;
    assert.equal([(await properties(winner)).fromAnon, (await properties(loser)).fromAnon], [round, undefined], `round ${round}: the properties too`);
    const members = (await api.get('/v1/topics/merge-pair/subscribers?limit=100', key)).body.data.items.map((m: { externalId: string }) => m.externalId);
    assert.equal([members.includes(winner), members.includes(loser)], [true, false], `round ${round}: and the topic`);
    assert.is((await api.get(`/v1/subscribers/${anonymousId}`, key)).status, 404, 'the anonymous subscriber is gone');
  }
});

races('deleting a subscriber while its device registers again leaves the device with one subscription, and its token owned', async ({ api, key, pk }) => {
  for (let round = 0; round < 12; round++) {
    const externalId = `leaving-${round}`, other = `next-user-${round}`, token = `${round}`.padStart(64, 'e');
    await api.post('/v1/client/subscriptions', pk, { externalId, channel: 'push', token, platform: 'ios' });
    const registrations = times(6, (i) => new Promise((r) => setTimeout(r, i * (1 + (round % 4)))).then(() => api.post('/v1/client/subscriptions', pk, { externalId, channel: 'push', token, platform: 'ios' })));
    assert.is((await api.del(`/v1/subscribers/${externalId}`, key)).status, 200);
    assert.ok((await registrations).every((r) => r.status === 200 || r.status === 201));
    const held = async (id: string) => { const r = await api.get(`/v1/subscribers/${id}/subscriptions`, key); return r.status === 200 ? r.body.data.items.filter((s: { token: string }) => s.token === token).length : 0; };
    assert.ok((await held(externalId)) <= 1, `round ${round}: one subscription per device`);
    // the device changes hands: it moves, whoever held it
    await api.post('/v1/client/subscriptions', pk, { externalId: other, channel: 'push', token, platform: 'ios' });
    assert.equal([await held(externalId), await held(other)], [0, 1], `round ${round}: the device has one holder`);
  }
});

/**
 * Probe R (2 of 250 rounds of removals racing re-registrations of one device by its user): a
 * registration that claimed the token, then wrote after a removal had taken away the record a later
 * registration wrote, and had forgotten the token (that registration's claim was the latest), left
 * a record the token index did not name; the device's next registration by another user made a
 * second subscription. The late writer now finds the token forgotten and gives it back to its record.
 */
races('a registration writing after a removal forgot the token gives it back: the device keeps one subscription', async ({ service, tenantId, workspaceId }) => {
  const scope = { workspaceId, tenantId, partitions: service.config.partitions };
  const device = { channel: 'push' as const, token: 'ab'.repeat(32), platform: 'ios' as const };
  const first = await registerSubscription(service.redis, service.keys, scope, 'late-u', device);
  // a registration held between its claim and its write
  let claimed!: () => void;
  let release!: () => void;
  const held = new Promise<void>((r) => (release = r));
  const hasClaimed = new Promise<void>((r) => (claimed = r));
  const late = registerSubscription(service.redis, service.keys, scope, 'late-u', device, { afterClaim: async () => { claimed(); await held; } });
  await hasClaimed;
  // meanwhile another registration of the same user claims and writes, and a removal takes that record and the token
  await registerSubscription(service.redis, service.keys, scope, 'late-u', device);
  await removeSubscription(service.redis, service.keys, scope, 'late-u', first.subscription.id);
  assert.is(await service.redis.hget(service.keys.tokens(tenantId), `push:${device.token}`), null, 'the removal forgot the token');
  release();
  const written = await late;
  assert.is(written.subscription.id, first.subscription.id);
  assert.equal((await listSubscriptions(service.redis, service.keys, scope, 'late-u')).map((s) => s.id), [first.subscription.id]);
  assert.is(await service.redis.hget(service.keys.tokens(tenantId), `push:${device.token}`), `${first.subscription.id}|late-u`, 'the token names the record written last');
  // so another user registering the device moves it (same id): still one subscription for it
  const moved = await registerSubscription(service.redis, service.keys, scope, 'late-v', device);
  assert.is(moved.subscription.id, first.subscription.id);
  assert.equal(await listSubscriptions(service.redis, service.keys, scope, 'late-u'), []);
});

/**
 * Probe R (2 of 60 rounds of 4 users × 20 registrations of one device): two subscribers of one
 * partition share the record's key; when one took the record over and the other took it back before
 * the first one's move removed the other's reference, the other's stream read `registered` twice in
 * a row. Taking back a record another holds while still naming it now writes `removed` (moved) first.
 */
races('taking back a device another subscriber of the partition took over writes removed before registered', async ({ service, tenantId, workspaceId }) => {
  const scope = { workspaceId, tenantId, partitions: service.config.partitions };
  const u = 'back-u';
  const v = Array.from({ length: 10_000 }, (_, i) => `back-v${i}`).find((x) => partitionOf(tenantId, x, scope.partitions) === partitionOf(tenantId, u, scope.partitions))!;
  const p = partitionOf(tenantId, u, scope.partitions);
  const device = { channel: 'push' as const, token: 'cd'.repeat(32), platform: 'ios' as const };
  const { subscription } = await registerSubscription(service.redis, service.keys, scope, u, device);
  const id = subscription.id;
  // v's move, stopped after it wrote its copy (the one key both subscribers' sets name) and before
  // it removed u's reference: the token names v, the move is not settled
  const k = service.keys;
  const claim = await service.redis.hincrby(k.subscriptionClaims(tenantId), id, 1);
  await service.redis.multi()
    .hset(k.tokens(tenantId), `push:${device.token}`, `${id}|${v}`).hset(k.subscriptionOwners(tenantId), id, v).hset(k.tokenMoves(tenantId), `push:${device.token}`, u)
    .hset(k.subscription(p, tenantId, id), 'holder', v, 'claim', String(claim)).sadd(k.subscriberSubscriptions(p, tenantId, v), id).exec();
  // u takes it back
  const back = await registerSubscription(service.redis, service.keys, scope, u, device);
  assert.is(back.subscription.id, id);
  const seen = (await inboxEvents(service, tenantId, u)).map((e) => `${e.name}${e.data?.reason ? `(${e.data.reason})` : ''}`).filter((n) => n.startsWith('$subscription.'));
  assert.equal(seen, ['$subscription.registered', '$subscription.removed(moved)', '$subscription.registered']);
  assert.equal((await listSubscriptions(service.redis, service.keys, scope, u)).map((s) => s.id), [id]);
  assert.equal(await listSubscriptions(service.redis, service.keys, scope, v), []);
});

/**
 * Probe R (5 of 20 rounds of a device moving to another user while its first user removed it): the
 * removal recorded `subscription.deleted` after the move had been audited, so the ledger's last word
 * on a subscription that lives on with the new user was a deletion. A removal of what is a leftover of
 * a move (the token's owner is another subscriber whose copy is written) is not audited, and its
 * event says `moved`; a reference to a record the other subscriber of the partition holds is 404.
 */
async function unsettledMove(service: TestService, tenantId: string, u: string, v: string, id: string, token: string): Promise<void> {
  const k = service.keys;
  const partitions = service.config.partitions;
  const claim = await service.redis.hincrby(k.subscriptionClaims(tenantId), id, 1);
  const at = new Date().toISOString();
  const pv = partitionOf(tenantId, v, partitions);
  // v's move, stopped after it wrote its copy and before it removed u's: the token names v, the move is not settled
  await service.redis.multi()
    .hset(k.tokens(tenantId), `push:${token}`, `${id}|${v}`).hset(k.subscriptionOwners(tenantId), id, v).hset(k.tokenMoves(tenantId), `push:${token}`, u)
    .hset(k.subscription(pv, tenantId, id), { id, channel: 'push', token, address: '', platform: 'ios', environment: 'production', authorizationStatus: '', device: '{}', enabled: '1', createdAt: at, updatedAt: at, claim: String(claim), holder: v })
    .sadd(k.subscriberSubscriptions(pv, tenantId, v), id).exec();
}

const streamOf = async (service: TestService, tenantId: string, externalId: string) =>
  (await inboxEvents(service, tenantId, externalId)).map((e) => `${e.name}${e.data?.reason ? `(${e.data.reason})` : ''}`).filter((n) => n.startsWith('$subscription.'));

races('removing what a move left behind is not audited as a deletion while the subscription lives on with its new user', async ({ api, key, pk, service, tenantId, workspaceId }) => {
  const scope = { workspaceId, tenantId, partitions: service.config.partitions };
  const u = 'left-u';
  const pu = partitionOf(tenantId, u, scope.partitions);
  const others = Array.from({ length: 10_000 }, (_, i) => `left-v${i}`);
  for (const [v, token] of [[others.find((x) => partitionOf(tenantId, x, scope.partitions) !== pu)!, 'e1'.repeat(32)], [others.find((x) => partitionOf(tenantId, x, scope.partitions) === pu)!, 'e2'.repeat(32)]] as const) {
    const same = partitionOf(tenantId, v, scope.partitions) === pu;
    const reg = await api.post('/v1/client/subscriptions', pk, { externalId: u, channel: 'push', token, platform: 'ios' });
    assert.is(reg.status, 201);
    const id = reg.body.data.id as string;
    await unsettledMove(service, tenantId, u, v, id, token);
    const removal = await api.del(`/v1/subscribers/${u}/subscriptions/${id}`, key);
    // another subscriber of the partition holds the one record both sets name: not u's any more (as its GET says)
    assert.is(removal.status, same ? 404 : 200, `${same ? 'same' : 'other'} partition`);
    assert.equal((await streamOf(service, tenantId, u)).slice(-2), ['$subscription.registered', '$subscription.removed(moved)']);
    assert.equal(await ledger(service, workspaceId, 'subscription.deleted', id), [], 'no deletion audited');
    assert.equal((await listSubscriptions(service.redis, service.keys, scope, v)).map((s) => s.id), [id], 'v keeps the device');
    assert.equal(await listSubscriptions(service.redis, service.keys, scope, u), []);
  }
});

// Until probe AI such a removal audited nothing, taking the move's write for granted: a mover refused
// (409) or killed before its write left the ledger saying the device still existed, for good. Now the
// removal is a deletion, and a mover that does write finds no copy to take over and records the
// device created anew after it: the ledger's last word names whoever holds the device either way.
races('a removal racing a move claimed but not written yet is a deletion; the move, once written, audits the device created for its user after it', async ({ api, key, pk, service, tenantId, workspaceId }) => {
  const scope = { workspaceId, tenantId, partitions: service.config.partitions };
  const trail = await auditTrail(service, workspaceId, tenantId);
  const token = 'e3'.repeat(32);
  const reg = await api.post('/v1/client/subscriptions', pk, { externalId: 'race-u', channel: 'push', token, platform: 'ios' });
  const id = reg.body.data.id as string;
  const move = heldRegistration(service, scope, 'race-v', { channel: 'push', token, platform: 'ios' }, trail);
  await move.claimed;
  const removal = await api.del(`/v1/subscribers/race-u/subscriptions/${id}`, key);
  assert.is(removal.status, 200);
  assert.equal((await streamOf(service, tenantId, 'race-u')).slice(-1), ['$subscription.removed(removed)']);
  move.go();
  const moved = await move.done;
  await auditsSettled(2_000);
  assert.is(moved.subscription.id, id);
  assert.is(moved.created, true);
  assert.equal((await listSubscriptions(service.redis, service.keys, scope, 'race-v')).map((s) => s.id), [id]);
  const all = (await service.redis.xrange(service.keys.ledger(workspaceId), '-', '+')).map(([, f]) => JSON.parse(f[3]!) as Entry).filter((e) => e.target?.id === id);
  assert.equal(all.map((e) => [e.type, e.data.object.externalId, e.changes?.externalId, e.previousAttributes?.externalId]), [['subscription.created', 'race-u', undefined, undefined], ['subscription.deleted', 'race-u', undefined, undefined], ['subscription.created', 'race-v', undefined, undefined]]);
});

/**
 * Probe R (18 of 30 rounds of users registering one device at once): a registration whose claim
 * lost to another user's claim before its write audited its own copy (created, or taken over), and
 * its check after the write removed that copy without a word, so the ledger's newest entry for the
 * subscription named the user who no longer held it. Then the removal of the lost copy recorded the
 * owner change to the subscriber the token names; now the move marks the copy it takes from before
 * its write (probe CA), so the registration that lost writes nothing and answers what it sent: the
 * ledger holds the one copy that was written, created for the user who holds it.
 */
races('a registration whose claim was lost before its write writes nothing: the ledger names the subscriber that holds the device, once', async ({ service, tenantId, workspaceId }) => {
  const scope = { workspaceId, tenantId, partitions: service.config.partitions };
  const trail = () => auditTrail(service, workspaceId, tenantId);
  const device = { channel: 'push' as const, token: 'e4'.repeat(32), platform: 'ios' as const };
  let claimed!: () => void;
  let release!: () => void;
  const held = new Promise<void>((r) => (release = r));
  const hasClaimed = new Promise<void>((r) => (claimed = r));
  // lost-a claims the new token, then waits; lost-b takes the token over and registers it whole
  const first = registerSubscription(service.redis, service.keys, scope, 'lost-a', device, { audit: await trail(), afterClaim: async () => { claimed(); await held; } });
  await hasClaimed;
  const second = await registerSubscription(service.redis, service.keys, scope, 'lost-b', device, { audit: await trail() });
  release();
  const lost = await first;
  await auditsSettled(2_000);
  const id = second.subscription.id;
  assert.equal([lost.subscription.id, lost.subscription.externalId, lost.created], [id, 'lost-a', false]);
  assert.equal((await listSubscriptions(service.redis, service.keys, scope, 'lost-b')).map((s) => s.id), [id]);
  assert.equal(await listSubscriptions(service.redis, service.keys, scope, 'lost-a'), []);
  const all = (await service.redis.xrange(service.keys.ledger(workspaceId), '-', '+')).map(([, f]) => JSON.parse(f[3]!) as Entry).filter((e) => e.target?.id === id);
  assert.equal(all.map((e) => [e.type, e.data.object.externalId]), [['subscription.created', 'lost-b']]);
  assert.equal(await streamOf(service, tenantId, 'lost-a'), [], 'nothing came or went on lost-a');
});

/** The audit trail of a request of the default tenant, for calling the stream functions directly. */
async function auditTrail(service: TestService, workspaceId: string, tenantId: string): Promise<AuditTrail> {
  const workspace = await service.redis.hgetall(service.keys.workspace(workspaceId));
  return new AuditTrail(service.redis, service.keys, { workspace: { id: workspaceId, slug: workspace.slug! }, tenant: { id: tenantId, slug: 'default' }, ...BY_TEST }, createLogger('error'));
}

/** A registration of `externalId` held between its claim and its write: `claimed` resolves once it claimed, `go()` lets it write. */
function heldRegistration(service: TestService, scope: TenantScope, externalId: string, device: RegisterInput, audit?: AuditTrail) {
  let claimed!: () => void;
  let go!: () => void;
  const held = new Promise<void>((r) => (go = r));
  const hasClaimed = new Promise<void>((r) => (claimed = r));
  const done = registerSubscription(service.redis, service.keys, scope, externalId, device, { audit, afterClaim: async () => { claimed(); await held; } });
  return { claimed: hasClaimed, go, done };
}

/**
 * Two app users registering one device at once, the second claiming before either wrote: the first
 * one's copy, written after the second's claim, is left for the second's move to take over (one
 * subscription.created, then the owner change), instead of being removed by its own check (then the
 * second found no copy and audited a second subscription.created: every round of probe R's repeat).
 */
races('a copy written after another user claimed the device is left to that user\'s move: one created, then the owner change', async ({ service, tenantId, workspaceId }) => {
  const scope = { workspaceId, tenantId, partitions: service.config.partitions };
  const trail = () => auditTrail(service, workspaceId, tenantId);
  const device = { channel: 'push' as const, token: 'e5'.repeat(32), platform: 'ios' as const };
  const a = heldRegistration(service, scope, 'leave-a', device, await trail());
  await a.claimed;
  const b = heldRegistration(service, scope, 'leave-b', device, await trail());
  await b.claimed;
  a.go();
  const first = await a.done;
  b.go();
  const second = await b.done;
  await auditsSettled(2_000);
  const id = first.subscription.id;
  assert.is(second.subscription.id, id);
  assert.equal((await listSubscriptions(service.redis, service.keys, scope, 'leave-b')).map((s) => s.id), [id]);
  assert.equal(await listSubscriptions(service.redis, service.keys, scope, 'leave-a'), []);
  const all = (await service.redis.xrange(service.keys.ledger(workspaceId), '-', '+')).map(([, f]) => JSON.parse(f[3]!) as Entry).filter((e) => e.target?.id === id);
  assert.equal(all.map((e) => [e.type, e.data.object.externalId, e.previousAttributes?.externalId]), [['subscription.created', 'leave-a', undefined], ['subscription.updated', 'leave-b', 'leave-a']]);
  assert.equal((await streamOf(service, tenantId, 'leave-a')), ['$subscription.registered', '$subscription.removed(moved)']);
});

races('a copy left to a mover that is then refused (its subscriber is full) stays the device\'s subscription', async ({ service, tenantId, workspaceId }) => {
  const scope = { workspaceId, tenantId, partitions: service.config.partitions };
  for (let i = 0; i < MAX_SUBSCRIPTIONS_PER_SUBSCRIBER; i++) await registerSubscription(service.redis, service.keys, scope, 'full-b', { channel: 'push', token: `f${String(i).padStart(2, '0')}`.padEnd(64, '0'), platform: 'ios' });
  const device = { channel: 'push' as const, token: 'e6'.repeat(32), platform: 'ios' as const };
  const a = heldRegistration(service, scope, 'full-a', device);
  await a.claimed;
  const b = heldRegistration(service, scope, 'full-b', device);
  await b.claimed;
  a.go();
  const first = await a.done;
  b.go();
  const refused = await b.done.then(() => null, (e: unknown) => e);
  assert.is((refused as ApiError).status, 409);
  assert.equal((await listSubscriptions(service.redis, service.keys, scope, 'full-a')).map((s) => s.id), [first.subscription.id]);
  assert.is(await service.redis.hget(service.keys.tokens(tenantId), `push:${device.token}`), `${first.subscription.id}|full-a`, 'the token names the copy that stayed');
});

/**
 * A subscriber whose version moves under every attempt of a compare-and-set write: after its bounded
 * retries the write gives up with 429 `lock_timeout` ("changing too fast", retryable: spec Part 7),
 * not 409, and writes nothing. Here each attempt's own read bumps the version after the snapshot.
 */
races('a subscriber write that loses every compare-and-set gives up with 429 lock_timeout and writes nothing', async ({ service, tenantId, workspaceId }) => {
  const scope = { workspaceId, tenantId, partitions: service.config.partitions };
  const x = 'always-moving';
  const p = partitionOf(tenantId, x, scope.partitions);
  await changeSubscriber(service.redis, service.keys, scope, x, () => ({ create: true, events: [], ops: [['hset', service.keys.subscriber(p, tenantId, x), 'marker', 'first']], result: null }));
  const before = (await inboxEvents(service, tenantId, x)).length;
  let attempts = 0;
  const err = await changeSubscriber(service.redis, service.keys, scope, x,
    () => ({ create: false, events: [{ name: '$subscriber.updated', data: {} }], ops: [['hset', service.keys.subscriber(p, tenantId, x), 'marker', 'never']], result: null }),
    async () => { attempts++; await service.redis.hincrby(service.keys.subscriber(p, tenantId, x), 'v', 1); },
  ).then(() => null, (e: unknown) => e);
  assert.instance(err, ApiError);
  assert.is((err as ApiError).status, 429);
  assert.is((err as ApiError).code, 'lock_timeout');
  assert.ok(attempts > 1, `retried (${attempts} attempts)`);
  assert.is(await service.redis.hget(service.keys.subscriber(p, tenantId, x), 'marker'), 'first', 'nothing written');
  assert.is((await inboxEvents(service, tenantId, x)).length, before);
});

/**
 * Every clock reading of a write is the same instant: a new subscriber's `updatedAt` (set by the
 * change) was read before the write's own time (its `createdAt`), 1 ms earlier when the millisecond
 * ticked between them (probe U). Here every reading of the clock moves it 1 ms.
 */
races('a subscriber created by an attribute or preference write has updatedAt equal to createdAt, however the clock moves during the write', async ({ service, tenantId, workspaceId }) => {
  const scope = { workspaceId, tenantId, partitions: service.config.partitions };
  const realNow = Date.now;
  let t = realNow();
  Date.now = () => t++;
  try {
    const { subscriber } = await upsertSubscriber(service.redis, service.keys, scope, 'tick-attrs', { locale: 'en-US' }, { create: true });
    assert.is(subscriber.updatedAt, subscriber.createdAt, 'upsert');
    await updatePreferences(service.redis, service.keys, scope, 'tick-prefs', { channels: { push: false } }, { create: true });
  } finally {
    Date.now = realNow;
  }
  const prefs = await getSubscriber(service.redis, service.keys, scope, 'tick-prefs');
  assert.is(prefs.updatedAt, prefs.createdAt, 'preferences');
});

/**
 * A subscriber deleted and created anew starts its version again: a change computed from the old
 * one carried the same version as the new one's and applied to it (probe W: a DELETE read before a
 * concurrent delete and create removed the new subscriber and named the old one in its answer and
 * audit entry). The compare-and-set also checks the subscriber id.
 */
races('a change computed from a subscriber that was deleted and created anew meanwhile is computed again from the new one', async ({ service, tenantId, workspaceId }) => {
  const scope = { workspaceId, tenantId, partitions: service.config.partitions };
  const x = 'born-again';
  const p = partitionOf(tenantId, x, scope.partitions);
  const record = service.keys.subscriber(p, tenantId, x);
  const first = (await upsertSubscriber(service.redis, service.keys, scope, x, {}, { create: true })).subscriber;
  const seen: (string | null)[] = [];
  let reads = 0;
  await changeSubscriber(service.redis, service.keys, scope, x,
    (snapshot) => {
      seen.push(snapshot.id);
      return { create: false, events: [], ops: [['hset', record, 'marker', `computed from ${snapshot.id}`]], result: null };
    },
    async () => {
      // after the snapshot's reads (same connection, in order): the subscriber goes and comes back, at the same version
      if (reads++ === 0) {
        await deleteSubscriber(service.redis, service.keys, scope, x);
        await upsertSubscriber(service.redis, service.keys, scope, x, {}, { create: true });
      }
    },
  );
  const second = await service.redis.hget(record, 'id');
  assert.ok(second && second !== first.id, 'a new subscriber');
  assert.equal(seen, [first.id, second], 'computed again from the new one');
  assert.is(await service.redis.hget(record, 'marker'), `computed from ${second}`);
});

races('an upsert answers the subscriber as its write left it, even when a delete follows at once (probe W: it read the record again and answered 404 for a write it had made)', async ({ service, tenantId, workspaceId }) => {
  const scope = { workspaceId, tenantId, partitions: service.config.partitions };
  const x = 'gone-at-once';
  let deletes = 0;
  // a client whose subscriber write is followed by a delete of the subscriber before its reply is read
  const racing = aroundScript(service.redis, 'writeSubscriber', async (run) => {
    const reply = await run();
    if (deletes++ === 0) await deleteSubscriber(service.redis, service.keys, scope, x);
    return reply;
  });
  const { subscriber, created } = await upsertSubscriber(racing, service.keys, scope, x, { email: 'gone@example.com' }, { create: true });
  assert.is(created, true);
  assert.equal([subscriber.externalId, subscriber.email], [x, 'gone@example.com']);
  assert.match(subscriber.id, /^sub_/);
  assert.is(deletes, 1, 'one write, and the delete after it before the answer');
  assert.is(await service.redis.hget(service.keys.subscriber(partitionOf(tenantId, x, scope.partitions), tenantId, x), 'id'), null, 'deleted');
});

races('a merge into a subscriber deleted, or deleted and made anew, since identify wrote it stops: nothing of the anonymous one moves and the user is not made again (probe X)', async ({ api, key, pk, service, tenantId, workspaceId }) => {
  const { redis, keys } = service;
  const scope = { workspaceId, tenantId, partitions: service.config.partitions };
  assert.is((await api.post('/v1/topics', key, { slug: 'merge-gone' })).status, 201);
  for (const [u, anon, remade, token] of [['gone-u', 'gone-anon', false, 'c1'.repeat(32)], ['remade-u', 'remade-anon', true, 'c2'.repeat(32)]] as const) {
    const { subscriber } = await upsertSubscriber(redis, keys, scope, u, {}, { create: true });
    const device = await api.post('/v1/client/subscriptions', pk, { externalId: anon, channel: 'push', token, platform: 'ios' });
    assert.is(device.status, 201, device.text);
    assert.is((await api.post('/v1/topics/merge-gone/subscribers', key, { externalIds: [anon] })).status, 200);
    const plan = (await planMerge(redis, keys, scope, anon, u))!;
    await deleteSubscriber(redis, keys, scope, u);
    if (remade) await upsertSubscriber(redis, keys, scope, u, {}, { create: true });
    assert.is(await mergeSubscriber(redis, keys, scope, plan, undefined, subscriber.id), false, `${u}: not merged`);
    assert.equal((await listSubscriptions(redis, keys, scope, anon)).map((s) => s.id), [device.body.data.id], `${anon} keeps its device`);
    assert.equal((await topicsOfSubscriber(redis, keys, scope, anon)).map((t) => t.slug), ['merge-gone'], `${anon} keeps its topic`);
    const now = (await api.get(`/v1/subscribers/${u}`, key));
    assert.is(now.status, remade ? 200 : 404, `${u}: ${remade ? 'the new one stays' : 'not made again'}`);
    if (remade) {
      assert.is.not(now.body.data.id, subscriber.id);
      assert.equal(await listSubscriptions(redis, keys, scope, u), [], 'nothing moved into the new one');
    }
  }
});

races('a merge skips a topic of the anonymous subscriber deleted while it runs: the merge finishes, the anonymous one deleted, its other topics moved (probe FC: 404 and a half-done merge)', async ({ api, key, pk, service, tenantId, workspaceId }) => {
  const { redis, keys } = service;
  const scope = { workspaceId, tenantId, partitions: service.config.partitions };
  assert.is((await api.post('/v1/topics', key, { slug: 'fc-kept' })).status, 201);
  const gone = await api.post('/v1/topics', key, { slug: 'fc-gone' });
  assert.is(gone.status, 201);
  const goneRecord = keys.topic(tenantId, gone.body.data.id);
  const [u, anon] = ['fc-u', 'fc-anon'];
  assert.is((await api.post('/v1/client/subscriptions', pk, { externalId: anon, channel: 'push', token: 'fc'.repeat(32), platform: 'ios' })).status, 201);
  assert.is((await api.post('/v1/topics/fc-kept/subscribers', key, { externalIds: [anon] })).status, 200);
  assert.is((await api.post('/v1/topics/fc-gone/subscribers', key, { externalIds: [anon] })).status, 200);
  await upsertSubscriber(redis, keys, scope, u, {}, { create: true });
  const plan = (await planMerge(redis, keys, scope, anon, u))!;
  // a topic is deleted after the merge read the anonymous one's topics, before it adds the user to it
  let deleted = false;
  const racing = aroundScript(redis, 'syncTopicMembers', async (run, args) => {
    if (args[0] === goneRecord && !deleted) {
      deleted = true;
      assert.is((await api.del('/v1/topics/fc-gone', key)).status, 200);
    }
    return run();
  });
  assert.is(await mergeSubscriber(racing, keys, scope, plan), true, 'merged');
  assert.ok(deleted, 'the topic was deleted inside the merge');
  assert.is((await api.get(`/v1/subscribers/${anon}`, key)).status, 404, 'the anonymous subscriber is deleted');
  assert.equal((await topicsOfSubscriber(redis, keys, scope, u)).map((t) => t.slug), ['fc-kept']);
  assert.equal((await listSubscriptions(redis, keys, scope, u)).map((s) => s.token), ['fc'.repeat(32)], 'the device moved');
});

races('a mute of the anonymous user\'s email made while the merge runs (after it listed the devices) holds for the identified user (probe P: 36 of 60 raced mutes were lost)', async ({ api, key, pk, service, tenantId, workspaceId }) => {
  const { redis, keys } = service;
  const scope = { workspaceId, tenantId, partitions: service.config.partitions };
  const [u, anon] = ['pm-u', 'pm-anon'];
  const email = await api.post('/v1/client/subscriptions', pk, { externalId: anon, channel: 'email', address: 'pm@example.com' });
  assert.is(email.status, 201);
  await upsertSubscriber(redis, keys, scope, u, {}, { create: true });
  const plan = (await planMerge(redis, keys, scope, anon, u))!;
  // the user mutes the email once the merge has listed the anonymous subscriber's devices (its widgets move next)
  let muted = false;
  const racing = aroundScript(redis, 'moveWidgets', async (run) => {
    if (!muted) {
      muted = true;
      assert.is((await api.patch(`/v1/client/subscriptions/${email.body.data.id}?externalId=${anon}`, pk, { enabled: false })).body.data.enabled, false);
    }
    return run();
  });
  assert.is(await mergeSubscriber(racing, keys, scope, plan), true, 'merged');
  assert.ok(muted, 'muted inside the merge');
  assert.equal((await listSubscriptions(redis, keys, scope, u)).map((s) => [s.address, s.enabled]), [['pm@example.com', false]]);
});

races('a merge that runs longer than its lock renews it: a second merge of the same anonymous subscriber waits, then merges nothing (probe T: past 30 s a second identify merged its 50,000 topics into another user too)', async ({ api, key, pk, service, tenantId, workspaceId }) => {
  const { redis, keys } = service;
  const scope = { workspaceId, tenantId, partitions: service.config.partitions };
  const [first, second, anon] = ['ml-first', 'ml-second', 'ml-anon'];
  assert.is((await api.post('/v1/client/subscriptions', pk, { externalId: anon, channel: 'push', token: 'ml'.repeat(32), platform: 'ios' })).status, 201);
  for (let i = 0; i < 6; i++) {
    assert.is((await api.post('/v1/topics', key, { slug: `ml-topic-${i}` })).status, 201);
    assert.is((await api.post(`/v1/topics/ml-topic-${i}/subscribers`, key, { externalIds: [anon] })).status, 200);
  }
  for (const u of [first, second]) await upsertSubscriber(redis, keys, scope, u, {}, { create: true });
  const plans = [(await planMerge(redis, keys, scope, anon, first))!, (await planMerge(redis, keys, scope, anon, second))!];
  // the first merge takes 6 × 150 ms over its topics, with a lock of 300 ms
  const slow = aroundScript(redis, 'syncTopicMembers', async (run) => {
    await new Promise((r) => setTimeout(r, 150));
    return run();
  });
  const lockMs = mergeLockTiming.lockMs;
  mergeLockTiming.lockMs = 300;
  try {
    const merging = mergeSubscriber(slow, keys, scope, plans[0]!);
    await new Promise((r) => setTimeout(r, 500));
    const [one, two] = await Promise.all([merging, mergeSubscriber(redis, keys, scope, plans[1]!)]);
    assert.equal([one, two], [true, false], 'the first merged; the second found the anonymous subscriber gone');
  } finally {
    mergeLockTiming.lockMs = lockMs;
  }
  assert.is((await topicsOfSubscriber(redis, keys, scope, first)).length, 6);
  assert.equal((await topicsOfSubscriber(redis, keys, scope, second)).map((t) => t.slug), [], 'the second user got none of its topics');
});

races('identify racing a delete of its externalId answers 200, never 404 (probe X: it read the subscriber again after writing it, 27-31 of 40 races answered 404)', async ({ api, key, pk }) => {
  const answers: number[] = [];
  for (let i = 0; i < 20; i++) {
    const x = `id-race-${i}`;
    assert.is((await api.post('/v1/subscribers', key, { externalId: x })).status, 201);
    const [identify, del] = await Promise.all([api.post('/v1/client/identify', pk, { externalId: x, source: 'ios' }), api.del(`/v1/subscribers/${x}`, key)]);
    answers.push(identify.status);
    assert.ok([200, 404].includes(del.status), del.text);
  }
  assert.equal([...new Set(answers)], [200]);
});

races.run();
