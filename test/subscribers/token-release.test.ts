import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { createLogger } from '../../lib/log.js';
import { partitionOf } from '../../lib/partition.js';
import { tokenField } from '../../streams/subscribers.js';
import { listSubscriptions, registerSubscription, removeSubscription, sweepTokenReleases } from '../../streams/subscriptions.js';
import { bootstrapWorkspace, startTestService, type TestService } from '../helpers/service.js';

type Ctx = { service: TestService };
const release = suite<Ctx>('a removal killed before releasing its token index entry leaves it to the sweeper');

release.before(async (ctx) => {
  ctx.service = await startTestService('token-release');
});
release.after(async (ctx) => ctx.service.stop());

const log = createLogger('error');
const killed = async () => {
  throw new Error('killed between the removal and its release');
};
/** Runs `removal`, which must die where `killed` throws. */
async function dies(removal: () => Promise<unknown>): Promise<void> {
  const outcome = await removal().then(() => 'lived', (err: Error) => err.message);
  assert.is(outcome, 'killed between the removal and its release');
}

release('an address and a device token removed by a process that died before lua/releaseToken: the sweeper releases both, once they are older than its interval (probe DV: they stayed for good)', async ({ service }) => {
  const { redis, keys, config } = service;
  const boot = await bootstrapWorkspace(service, 'token-release');
  const scope = { workspaceId: boot.workspace.id, tenantId: boot.tenant.id, partitions: config.partitions };
  const index = keys.tokens(boot.tenant.id);
  const mail = await registerSubscription(redis, keys, scope, 'anon-rel', { channel: 'email', address: 'rel@example.org' });
  const phone = await registerSubscription(redis, keys, scope, 'anon-rel', { channel: 'push', platform: 'ios', token: 'ab'.repeat(32) });
  const fields = [tokenField('email', 'rel@example.org', 'anon-rel'), tokenField('push', 'ab'.repeat(32), 'anon-rel')];
  for (const s of [mail.subscription, phone.subscription]) {
    await dies(() => removeSubscription(redis, keys, scope, 'anon-rel', s.id, undefined, { afterDetach: killed }));
  }
  const p = partitionOf(boot.tenant.id, 'anon-rel', config.partitions);
  assert.is(await redis.hlen(keys.tokenReleases(p)), 2, 'each removal recorded the release it owes');
  for (const f of fields) assert.ok(await redis.hget(index, f), `${f}: not released yet`);
  assert.equal(await sweepTokenReleases(redis, keys, config.partitions, 60_000, log), { finished: 0, kept: 0 }, 'younger than the interval: its writer may be alive');
  assert.equal(await sweepTokenReleases(redis, keys, config.partitions, 0, log), { finished: 2, kept: 0 });
  for (const f of fields) assert.is(await redis.hget(index, f), null, `${f}: released`);
  assert.is(await redis.hget(keys.subscriptionOwners(boot.tenant.id), mail.subscription.id), null, 'and its owner entry');
  assert.is(await redis.hlen(keys.tokenReleases(p)), 0);

  // a removal that lives releases and forgets its record at once
  const again = await registerSubscription(redis, keys, scope, 'anon-rel', { channel: 'email', address: 'rel@example.org' });
  await removeSubscription(redis, keys, scope, 'anon-rel', again.subscription.id);
  assert.is(await redis.hget(index, fields[0]!), null);
  assert.is(await redis.hlen(keys.tokenReleases(p)), 0);
});

release('a late release takes nothing from a registration made after the removal (fenced by its claim)', async ({ service }) => {
  const { redis, keys, config } = service;
  const boot = await bootstrapWorkspace(service, 'token-release-fence');
  const scope = { workspaceId: boot.workspace.id, tenantId: boot.tenant.id, partitions: config.partitions };
  const token = 'cd'.repeat(32);
  const first = await registerSubscription(redis, keys, scope, 'owner-1', { channel: 'push', platform: 'ios', token });
  await dies(() => removeSubscription(redis, keys, scope, 'owner-1', first.subscription.id, undefined, { afterDetach: killed }));
  // the same device registers again before the sweeper comes: its entry must stay
  const back = await registerSubscription(redis, keys, scope, 'owner-1', { channel: 'push', platform: 'ios', token });
  assert.equal(await sweepTokenReleases(redis, keys, config.partitions, 0, log), { finished: 1, kept: 0 });
  assert.is(await redis.hget(keys.tokens(boot.tenant.id), tokenField('push', token, 'owner-1')), `${back.subscription.id}|owner-1`);
  assert.is(await redis.hget(keys.subscriptionOwners(boot.tenant.id), back.subscription.id), 'owner-1');
});

/**
 * A device registered by `previous`, then moved to `user`, its move left unsettled (its mover killed
 * before settling it, or its removal of the previous copy refused), as lua/claimToken records it.
 */
async function movedLeftUnsettled(service: TestService, slug: string, previous: string, user: string, hex: string) {
  const { redis, keys, config } = service;
  const boot = await bootstrapWorkspace(service, slug);
  const scope = { workspaceId: boot.workspace.id, tenantId: boot.tenant.id, partitions: config.partitions };
  const token = hex.repeat(32);
  const field = tokenField('push', token, user);
  await registerSubscription(redis, keys, scope, previous, { channel: 'push', platform: 'ios', token });
  const moved = await registerSubscription(redis, keys, scope, user, { channel: 'push', platform: 'ios', token });
  await redis.hset(keys.tokenMoves(boot.tenant.id), field, previous);
  return { boot, scope, token, field, moved };
}

release('a late release takes nothing from a registration that finishes an unsettled move of the same device (probe EA: that claim kept its number, the fence let the release through)', async ({ service }) => {
  const { redis, keys, config } = service;
  const { boot, scope, token, field, moved } = await movedLeftUnsettled(service, 'token-release-move', 'prev-x', 'user-x', 'ef');
  await dies(() => removeSubscription(redis, keys, scope, 'user-x', moved.subscription.id, undefined, { afterDetach: killed }));
  const back = await registerSubscription(redis, keys, scope, 'user-x', { channel: 'push', platform: 'ios', token });
  assert.equal(await sweepTokenReleases(redis, keys, config.partitions, 0, log), { finished: 1, kept: 0 });
  assert.is(await redis.hget(keys.tokens(boot.tenant.id), field), `${back.subscription.id}|user-x`, 'the device keeps its entry');
  assert.is(await redis.hget(keys.subscriptionOwners(boot.tenant.id), back.subscription.id), 'user-x', 'and its owner');
  const again = await registerSubscription(redis, keys, scope, 'user-x', { channel: 'push', platform: 'ios', token });
  assert.is(again.subscription.id, back.subscription.id, 'the next registration is the same subscription, no second one');
});

release('a live removal racing a registration that finishes an unsettled move of the same device keeps the entry the registration confirmed (probe ED: its own release passed the fence; the device then had two subscriptions)', async ({ service }) => {
  const { redis, keys } = service;
  const { boot, scope, token, field, moved } = await movedLeftUnsettled(service, 'token-release-live', 'prev-l', 'user-l', '9a');
  let back: Awaited<ReturnType<typeof registerSubscription>> | undefined;
  await removeSubscription(redis, keys, scope, 'user-l', moved.subscription.id, undefined, {
    afterDetach: async () => {
      back = await registerSubscription(redis, keys, scope, 'user-l', { channel: 'push', platform: 'ios', token });
    },
  });
  assert.is(back!.subscription.id, moved.subscription.id, 'the registration took the subscription back');
  assert.is(await redis.hget(keys.tokens(boot.tenant.id), field), `${back!.subscription.id}|user-l`, 'the device keeps its entry');
  assert.is(await redis.hget(keys.subscriptionOwners(boot.tenant.id), back!.subscription.id), 'user-l', 'and its owner');
  const again = await registerSubscription(redis, keys, scope, 'user-l', { channel: 'push', platform: 'ios', token });
  assert.is(again.subscription.id, back!.subscription.id, 'the next registration is the same subscription, no second one');
});

/** A device moved from one subscriber to another (different partitions) whose mover died after its write: the previous copy and the move stay. */
async function unsettledMove(service: TestService, slug: string) {
  const { redis, keys, config } = service;
  const boot = await bootstrapWorkspace(service, slug);
  const scope = { workspaceId: boot.workspace.id, tenantId: boot.tenant.id, partitions: config.partitions };
  const token = 'a5'.repeat(32);
  const partition = (n: string) => partitionOf(boot.tenant.id, n, config.partitions);
  const anon = `${slug}-0`;
  const user = Array.from({ length: 50 }, (_, i) => `${slug}-${i + 1}`).find((n) => partition(n) !== partition(anon))!;
  const first = await registerSubscription(redis, keys, scope, anon, { channel: 'push', platform: 'ios', token });
  const anonRecord = keys.subscription(partition(anon), boot.tenant.id, first.subscription.id);
  const saved = await redis.hgetall(anonRecord);
  const moved = await registerSubscription(redis, keys, scope, user, { channel: 'push', platform: 'ios', token });
  assert.is(moved.subscription.id, first.subscription.id);
  await redis.hset(anonRecord, saved);
  await redis.sadd(keys.subscriberSubscriptions(partition(anon), boot.tenant.id, anon), first.subscription.id);
  await redis.hset(keys.tokenMoves(boot.tenant.id), tokenField('push', token, user), anon);
  assert.is((await listSubscriptions(redis, keys, scope, anon)).length, 1, 'the previous copy is back');
  return { scope, token, anon, user, id: moved.subscription.id };
}

/** After the removal: neither holds the device, the move is forgotten, and the next registration is the device's one subscription. */
async function oneSubscriptionAfter(service: TestService, m: Awaited<ReturnType<typeof unsettledMove>>): Promise<void> {
  const { redis, keys } = service;
  assert.equal(await listSubscriptions(redis, keys, m.scope, m.anon), [], 'the previous holder\'s copy went with it');
  assert.is(await redis.hlen(keys.tokenMoves(m.scope.tenantId)), 0);
  const again = await registerSubscription(redis, keys, m.scope, `${m.anon}-next`, { channel: 'push', platform: 'ios', token: m.token });
  assert.is(again.created, true);
  assert.equal([(await listSubscriptions(redis, keys, m.scope, m.anon)).length, (await listSubscriptions(redis, keys, m.scope, m.user)).length], [0, 0], 'one subscription for the device, the new one');
}

release('a removal by the device\'s new holder while its move is unsettled removes the previous holder\'s copy too (probe EM: the release forgot the move and left that copy, so the device got a second subscription and a merge of that user answered 429 for good)', async ({ service }) => {
  const m = await unsettledMove(service, 'unsettled-live');
  await removeSubscription(service.redis, service.keys, m.scope, m.user, m.id);
  await oneSubscriptionAfter(service, m);
});

release('and so does the sweeper finishing such a removal killed before its release', async ({ service }) => {
  const m = await unsettledMove(service, 'unsettled-swept');
  await dies(() => removeSubscription(service.redis, service.keys, m.scope, m.user, m.id, undefined, { afterDetach: killed }));
  assert.equal(await sweepTokenReleases(service.redis, service.keys, service.config.partitions, 0, log), { finished: 1, kept: 0 });
  await oneSubscriptionAfter(service, m);
});

release.run();
