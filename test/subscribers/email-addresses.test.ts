import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { identityHash } from '../../lib/identity-hash.js';
import { setIdentityRequired, tenantIdentity } from '../../streams/identity.js';
import { legacyEmailField, tokenField } from '../../streams/subscribers.js';
import { client } from '../helpers/api.js';
import { inboxEvents, names } from '../helpers/inbox.js';
import { BY_TEST, bootstrapWorkspace, startTestService, type TestService } from '../helpers/service.js';

type Ctx = { service: TestService; api: ReturnType<typeof client>; pk: string; boot: Awaited<ReturnType<typeof bootstrapWorkspace>> };
const e = suite<Ctx>('email addresses are one per subscriber: knowing an address takes nothing from its holder');

e.before(async (ctx) => {
  ctx.service = await startTestService('email-addresses');
  ctx.api = client(ctx.service.url);
  ctx.boot = await bootstrapWorkspace(ctx.service, 'email-addresses');
  ctx.pk = ctx.boot.keys.client;
});
e.after(async (ctx) => ctx.service.stop());

const subscriptionsOf = async (api: Ctx['api'], key: string, externalId: string) => (await api.get(`/v1/subscribers/${externalId}/subscriptions`, key)).body.data.items;

e('a verified user registering another user\'s address gets a subscription of her own; the holder keeps hers, muted as she left it, and nothing of hers is answered', async ({ api, pk, service, boot }) => {
  const { secret } = await tenantIdentity(service.redis, service.keys, boot.tenant);
  await setIdentityRequired(service.redis, service.keys, boot.workspace, boot.tenant, true, BY_TEST);
  const proof = (id: string) => ({ externalId: id, identityHash: identityHash(secret, id) });
  try {
    const carol = await api.post('/v1/client/subscriptions', pk, { ...proof('carol'), address: 'carol@example.org', device: { model: 'iPhone15,3', locale: 'de_DE' } });
    assert.is(carol.status, 201, JSON.stringify(carol.body));
    const muted = await api.patch(`/v1/client/subscriptions/${carol.body.data.id}?externalId=carol&identityHash=${identityHash(secret, 'carol')}`, pk, { enabled: false });
    assert.is(muted.status, 200, JSON.stringify(muted.body));
    const mallory = await api.post('/v1/client/subscriptions', pk, { ...proof('mallory'), address: 'Carol@Example.org' });
    assert.is(mallory.status, 201, JSON.stringify(mallory.body));
    const mine = mallory.body.data;
    assert.is.not(mine.id, carol.body.data.id);
    assert.is(mine.externalId, 'mallory');
    assert.is(mine.address, 'carol@example.org');
    assert.equal(mine.device, {}, 'the holder\'s device details are not the caller\'s to read');
    assert.is(mine.enabled, true);
    assert.is.not(mine.createdAt, carol.body.data.createdAt);
    // the holder's subscription is untouched: still hers, still muted, its handle still works
    const hers = await subscriptionsOf(api, boot.keys.tenant, 'carol');
    assert.equal(hers.map((s: any) => [s.id, s.address, s.enabled]), [[carol.body.data.id, 'carol@example.org', false]]);
    const again = await api.patch(`/v1/client/subscriptions/${carol.body.data.id}?externalId=carol&identityHash=${identityHash(secret, 'carol')}`, pk, { enabled: true });
    assert.is(again.status, 200, JSON.stringify(again.body));
    assert.not.ok(names(await inboxEvents(service, boot.tenant.id, 'carol')).includes('$subscription.removed'));
    // registering it again is the same subscription for each of them
    const twice = await api.post('/v1/client/subscriptions', pk, { ...proof('mallory'), address: 'carol@example.org' });
    assert.equal([twice.status, twice.body.data.id], [200, mine.id]);
    const hersAgain = await api.post('/v1/client/subscriptions', pk, { ...proof('carol'), address: 'carol@example.org' });
    assert.equal([hersAgain.status, hersAgain.body.data.id], [200, carol.body.data.id]);
  } finally {
    await setIdentityRequired(service.redis, service.keys, boot.workspace, boot.tenant, false, BY_TEST);
  }
});

e('a merge gives the identified user the anonymous one\'s address (one subscription when both had it) and deletes the anonymous one', async ({ api, pk, boot }) => {
  await api.post('/v1/client/subscriptions', pk, { externalId: 'anon-mail', address: 'shared@example.org' });
  await api.post('/v1/client/subscriptions', pk, { externalId: 'anon-mail', address: 'only-anon@example.org' });
  const own = await api.post('/v1/client/subscriptions', pk, { externalId: 'user-mail', address: 'shared@example.org' });
  const res = await api.post('/v1/client/identify', pk, { externalId: 'user-mail', anonymousId: 'anon-mail', source: 'ios' });
  assert.is(res.status, 200, JSON.stringify(res.body));
  const theirs = await subscriptionsOf(api, boot.keys.tenant, 'user-mail');
  assert.equal(theirs.map((s: any) => s.address).sort(), ['only-anon@example.org', 'shared@example.org']);
  assert.ok(theirs.some((s: any) => s.id === own.body.data.id));
  assert.is((await api.get('/v1/subscribers/anon-mail', boot.keys.tenant)).status, 404);
});

e('a merge leaves the identified user\'s own subscription of an address both hold as it was: its platform, device and mute (probe DV: the anonymous copy was registered over it)', async ({ api, pk, service, boot }) => {
  const own = await api.post('/v1/client/subscriptions', pk, { externalId: 'keep-mail', address: 'both@example.org', platform: 'ios', device: { model: 'UserPhone', locale: 'de_DE' } });
  assert.is(own.status, 201, JSON.stringify(own.body));
  assert.is((await api.patch(`/v1/subscribers/keep-mail/subscriptions/${own.body.data.id}`, boot.keys.tenant, { enabled: false })).status, 200);
  const before = (await subscriptionsOf(api, boot.keys.tenant, 'keep-mail'))[0];
  assert.is((await api.post('/v1/client/subscriptions', pk, { externalId: 'anon-keep', address: 'Both@example.org', platform: 'android', device: { model: 'AnonPhone' } })).status, 201);
  const ledgerBefore = await service.redis.xlen(service.keys.ledger(boot.workspace.id));
  const res = await api.post('/v1/client/identify', pk, { externalId: 'keep-mail', anonymousId: 'anon-keep', source: 'ios' });
  assert.is(res.status, 200, JSON.stringify(res.body));
  assert.equal(await subscriptionsOf(api, boot.keys.tenant, 'keep-mail'), [before], 'unchanged, updatedAt included');
  const entries = (await service.redis.xrange(service.keys.ledger(boot.workspace.id), '-', '+')).slice(ledgerBefore).map(([, f]) => f.join(' '));
  assert.not.ok(entries.some((f) => f.includes('subscription.updated') && f.includes(own.body.data.id)), 'no subscription.updated of the user\'s own');
  assert.is((await api.get('/v1/subscribers/anon-keep', boot.keys.tenant)).status, 404);
});

e('an address registered under its former tenant-wide field is taken over by its holder\'s next registration (no second subscription) and released by its removal', async ({ api, pk, service, boot }) => {
  const { redis, keys } = service;
  const first = await api.post('/v1/client/subscriptions', pk, { externalId: 'old-mail', address: 'old@example.org' });
  assert.is(first.status, 201);
  // as an earlier version stored it
  const index = keys.tokens(boot.tenant.id);
  const value = await redis.hget(index, tokenField('email', 'old@example.org', 'old-mail'));
  assert.is(value, `${first.body.data.id}|old-mail`);
  await redis.hdel(index, tokenField('email', 'old@example.org', 'old-mail'));
  await redis.hset(index, legacyEmailField('OLD@example.org'), value!);
  // another user registering the address does not take it
  const other = await api.post('/v1/client/subscriptions', pk, { externalId: 'new-mail', address: 'old@example.org' });
  assert.is(other.status, 201);
  assert.is.not(other.body.data.id, first.body.data.id);
  assert.is(await redis.hget(index, legacyEmailField('old@example.org')), value);
  const again = await api.post('/v1/client/subscriptions', pk, { externalId: 'old-mail', address: 'old@example.org' });
  assert.equal([again.status, again.body.data.id], [200, first.body.data.id]);
  assert.is(await redis.hget(index, legacyEmailField('old@example.org')), null);
  assert.is(await redis.hget(index, tokenField('email', 'old@example.org', 'old-mail')), value);
  assert.is((await subscriptionsOf(api, boot.keys.tenant, 'old-mail')).length, 1);
  // a removal releases an entry still under the former field
  await redis.hdel(index, tokenField('email', 'old@example.org', 'old-mail'));
  await redis.hset(index, legacyEmailField('old@example.org'), value!);
  const removed = await api.del(`/v1/client/subscriptions/${first.body.data.id}?externalId=old-mail`, pk);
  assert.is(removed.status, 200, JSON.stringify(removed.body));
  assert.is(await redis.hget(index, legacyEmailField('old@example.org')), null);
});

e('a removal racing its holder\'s registration of an address under its former field leaves the subscription its owner entry (probe DV: one release per field, the first dropping the owner, and the takeover not writing it back)', async ({ api, pk, service, boot }) => {
  const { redis, keys } = service;
  const index = keys.tokens(boot.tenant.id);
  const first = (await api.post('/v1/client/subscriptions', pk, { externalId: 'race-mail', address: 'race@example.org' })).body.data;
  const value = `${first.id}|race-mail`;
  await redis.hdel(index, tokenField('email', 'race@example.org', 'race-mail'));
  await redis.hset(index, legacyEmailField('race@example.org'), value);
  // where the removal's first release left things: the owner entry and claim number gone, the former field still there
  await redis.hdel(keys.subscriptionOwners(boot.tenant.id), first.id);
  const again = await api.post('/v1/client/subscriptions', pk, { externalId: 'race-mail', address: 'race@example.org' });
  assert.is(again.body.data.id, first.id, JSON.stringify(again.body));
  assert.is(await redis.hget(keys.subscriptionOwners(boot.tenant.id), first.id), 'race-mail', 'the takeover writes the owner entry');
  const muted = await api.patch(`/v1/client/subscriptions/${first.id}?externalId=race-mail`, pk, { enabled: false });
  assert.is(muted.status, 200, 'reachable by id');
  // one release takes either field, and the owner with it
  await redis.hdel(index, tokenField('email', 'race@example.org', 'race-mail'));
  await redis.hset(index, legacyEmailField('race@example.org'), value);
  assert.is((await api.del(`/v1/client/subscriptions/${first.id}?externalId=race-mail`, pk)).status, 200);
  assert.is(await redis.hget(index, legacyEmailField('race@example.org')), null);
  assert.is(await redis.hget(keys.subscriptionOwners(boot.tenant.id), first.id), null);
});

e('a merge counts an address both subscribers hold once: a user at the limit of 50 merges an anonymous one holding one of its addresses (review of session 56: a false 409)', async ({ api, pk, boot }) => {
  for (let i = 0; i < 50; i++) assert.is((await api.post('/v1/client/subscriptions', pk, { externalId: 'full-mail', address: `f${i}@example.org` })).status, 201);
  await api.post('/v1/client/subscriptions', pk, { externalId: 'anon-full', address: 'F0@example.org' });
  const res = await api.post('/v1/client/identify', pk, { externalId: 'full-mail', anonymousId: 'anon-full', source: 'ios' });
  assert.is(res.status, 200, JSON.stringify(res.body));
  assert.is((await api.get('/v1/subscribers/full-mail/subscriptions?limit=100', boot.keys.tenant)).body.data.total, 50);
  assert.is((await api.get('/v1/subscribers/anon-full', boot.keys.tenant)).status, 404);
});

e('a move an earlier version left unsettled under an address\'s former field is settled when its holder registers the address: the previous holder\'s copy goes (review of session 56: it stayed, one id under two subscribers)', async ({ api, pk, service, boot }) => {
  const { redis, keys } = service;
  const index = keys.tokens(boot.tenant.id);
  // B registered the address, then (an earlier version) A's registration moved it and was killed before removing B's copy
  const b = (await api.post('/v1/client/subscriptions', pk, { externalId: 'was-b', address: 'moving@example.org' })).body.data;
  await redis.hdel(index, tokenField('email', 'moving@example.org', 'was-b'));
  await redis.hset(index, legacyEmailField('moving@example.org'), `${b.id}|now-a`);
  await redis.hset(keys.subscriptionOwners(boot.tenant.id), b.id, 'now-a');
  await redis.hset(keys.tokenMoves(boot.tenant.id), legacyEmailField('moving@example.org'), 'was-b');
  const a = await api.post('/v1/client/subscriptions', pk, { externalId: 'now-a', address: 'moving@example.org' });
  assert.equal([a.status < 300, a.body.data.id], [true, b.id], JSON.stringify(a.body));
  assert.equal((await subscriptionsOf(api, boot.keys.tenant, 'was-b')).map((s: any) => s.id), [], 'the previous holder\'s copy is removed');
  assert.equal((await subscriptionsOf(api, boot.keys.tenant, 'now-a')).map((s: any) => s.id), [b.id]);
  assert.is(await redis.hget(keys.tokenMoves(boot.tenant.id), legacyEmailField('moving@example.org')), null);
  assert.is(await redis.hget(keys.tokenMoves(boot.tenant.id), tokenField('email', 'moving@example.org', 'now-a')), null, 'settled');
});

e.run();
