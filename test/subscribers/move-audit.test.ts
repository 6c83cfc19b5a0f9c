import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { sweepAuditOutboxes } from '../../actors/audit-outbox-sweeper.js';
import { newId } from '../../lib/ids.js';
import { partitionOf } from '../../lib/partition.js';
import { callScript } from '../../streams/lua-scripts.js';
import { createLogger } from '../../lib/log.js';
import { AuditTrail, type MadeIntent, type WriteAudit, type WriteReply } from '../../streams/subscriber-audit.js';
import type { TenantScope } from '../../streams/subscriber-writes.js';
import { tokenField } from '../../streams/subscribers.js';
import { MAX_SUBSCRIPTIONS_PER_SUBSCRIBER, registerSubscription, sweepTokenMoves } from '../../streams/subscriptions.js';
import { client } from '../helpers/api.js';
import { auditEntries, roleContext, startSweeper } from '../helpers/audit.js';
import { stopRoleProcess } from '../helpers/processes.js';
import { waitFor } from '../helpers/wait.js';
import { inboxEvents, names } from '../helpers/inbox.js';
import { BY_TEST, bootstrapWorkspace, startTestService, type TestService } from '../helpers/service.js';

// A device token that changes hands keeps its subscription id: the audit ledger says so with one
// subscription.updated naming the owner change (externalId), never a second subscription.created
// for an id a webhook receiver already knows; also when the move is finished after a crash, and
// when an identify merges the anonymous subscriber holding the device.

type Ctx = { service: TestService; api: ReturnType<typeof client>; key: string; pk: string; scope: TenantScope; workspace: { id: string; slug: string }; tenant: { id: string; slug: string } };
const move = suite<Ctx>('the audit entries of a device moving between subscribers');

move.before(async (ctx) => {
  ctx.service = await startTestService('move-audit');
  ctx.api = client(ctx.service.url);
  const { keys, tenant, workspace } = await bootstrapWorkspace(ctx.service, 'move-audit');
  ctx.key = keys.tenant;
  ctx.pk = keys.client;
  ctx.workspace = { id: workspace.id, slug: workspace.slug };
  ctx.tenant = { id: tenant.id, slug: tenant.slug };
  ctx.scope = { workspaceId: workspace.id, tenantId: tenant.id, partitions: ctx.service.config.partitions };
});
move.after(async (ctx) => ctx.service.stop());

const token = (n: number) => n.toString(16).padStart(64, 'f');

/** lua/claimToken alone, as a registration killed right after its claim leaves it (its lock expired: none taken here). */
const claimOnly = (ctx: Ctx, field: string, externalId: string) => {
  const { keys } = ctx.service;
  const t = ctx.tenant.id;
  return callScript<string[]>(ctx.service.redis, 'claimToken', [keys.tokens(t), keys.subscriptionOwners(t), keys.tokenMoves(t), keys.subscriptionClaims(t), keys.tokenLock(t, field)], [field, newId('subscription'), externalId, '', 0]);
};

/**
 * The trail of a writer whose process dies right after its write applied: the write (and its
 * intent in the outbox) stands, and the writer goes no further (no settle, nothing after).
 */
class DyingTrail extends AuditTrail {
  override written(_made: MadeIntent, _audit: WriteAudit, _reply: WriteReply): void {
    throw new Error('the process died right after the write');
  }
}
const dyingTrail = (ctx: Ctx) => new DyingTrail(ctx.service.redis, ctx.service.keys, { workspace: ctx.workspace, tenant: ctx.tenant, ...BY_TEST }, createLogger('error'));

/** The ledger's subscription entries of one subscription: type, owner, and the owner change when there is one. */
async function subscriptionEntries(ctx: Ctx, id: string) {
  return (await auditEntries(ctx.service, ctx.workspace.id)).filter((e) => e.target?.id === id)
    .map((e) => ({ type: e.type, externalId: e.data.object.externalId, changes: e.changes, previousAttributes: e.previousAttributes }));
}

move('a token registered by A, then by B: subscription.created (A), then one subscription.updated naming the owner change and what else changed', async (ctx) => {
  const { api, pk, service } = ctx;
  const first = await api.post('/v1/client/subscriptions', pk, { externalId: 'owner-a', channel: 'push', token: token(1), platform: 'ios', device: { model: 'iPhone15,2' } });
  assert.is(first.status, 201);
  const moved = await api.post('/v1/client/subscriptions', pk, { externalId: 'owner-b', channel: 'push', token: token(1), platform: 'ios', device: { model: 'iPhone16,1' } });
  assert.is(moved.status, 201);
  const id = first.body.data.id;
  assert.is(moved.body.data.id, id, 'the same subscription');
  // registering what B holds now changes nothing and audits nothing
  assert.is((await api.post('/v1/client/subscriptions', pk, { externalId: 'owner-b', channel: 'push', token: token(1), platform: 'ios', device: { model: 'iPhone16,1' } })).status, 200);
  assert.equal(await subscriptionEntries(ctx, id), [
    { type: 'subscription.created', externalId: 'owner-a', changes: undefined, previousAttributes: undefined },
    { type: 'subscription.updated', externalId: 'owner-b', changes: { externalId: 'owner-b', device: { model: 'iPhone16,1' } }, previousAttributes: { externalId: 'owner-a', device: { model: 'iPhone15,2' } } },
  ]);
  // the subscription keeps its id and its creation time: only the owner (and what the registration gave) changed
  assert.is(moved.body.data.createdAt, first.body.data.createdAt, 'created when A registered it');
  // the stream events stay as they are: registered on B, removed (moved) on A
  assert.equal(names(await inboxEvents(service, ctx.tenant.id, 'owner-a')), ['$subscriber.created', '$subscription.registered', '$subscription.removed']);
  assert.equal(names(await inboxEvents(service, ctx.tenant.id, 'owner-b')), ['$subscriber.created', '$subscription.registered']);

  // and back to A: one more subscription.updated, the other way
  assert.is((await api.post('/v1/client/subscriptions', pk, { externalId: 'owner-a', channel: 'push', token: token(1), platform: 'ios', device: { model: 'iPhone16,1' } })).status, 201);
  const entries = await subscriptionEntries(ctx, id);
  assert.equal(entries.map((e) => e.type), ['subscription.created', 'subscription.updated', 'subscription.updated']);
  assert.equal([entries[2]!.changes, entries[2]!.previousAttributes], [{ externalId: 'owner-a' }, { externalId: 'owner-b' }]);
});

move('a move killed after the claim, before the new owner\'s write, is finished by the next registration: one subscription.updated', async (ctx) => {
  const { api, pk } = ctx;
  const first = await api.post('/v1/client/subscriptions', pk, { externalId: 'claimed-a', channel: 'push', token: token(2), platform: 'ios' });
  // the killed registration of B got as far as lua/claimToken
  const [claim] = await claimOnly(ctx, tokenField('push', token(2), ''), 'claimed-b');
  assert.is(claim, 'moved');
  assert.is((await api.post('/v1/client/subscriptions', pk, { externalId: 'claimed-b', channel: 'push', token: token(2), platform: 'ios' })).status, 201);
  assert.equal(await subscriptionEntries(ctx, first.body.data.id), [
    { type: 'subscription.created', externalId: 'claimed-a', changes: undefined, previousAttributes: undefined },
    { type: 'subscription.updated', externalId: 'claimed-b', changes: { externalId: 'claimed-b' }, previousAttributes: { externalId: 'claimed-a' } },
  ]);
});

move('a move killed after the new owner\'s write (its entry left in the outbox, the previous copy not removed): the retry finishes it, the sweep settles the entry, once', async (ctx) => {
  const { api, pk, service } = ctx;
  const first = await api.post('/v1/client/subscriptions', pk, { externalId: 'written-a', channel: 'push', token: token(3), platform: 'ios' });
  // B's registration writes, then its process dies: neither the settle nor the removal from A happens
  const deadTrail = dyingTrail(ctx);
  let failed: unknown = null;
  await registerSubscription(service.redis, service.keys, ctx.scope, 'written-b', { channel: 'push', token: token(3), platform: 'ios' }, { audit: deadTrail }).catch((err) => (failed = err));
  assert.ok(failed, 'the dead writer could not settle');
  assert.is((await api.get('/v1/subscribers/written-a/subscriptions', ctx.key)).body.data.total, 1, 'A still holds its copy');
  // the next registration of the token finishes the move; the sweeper settles what the dead writer recorded
  assert.is((await api.post('/v1/client/subscriptions', pk, { externalId: 'written-b', channel: 'push', token: token(3), platform: 'ios' })).status, 200);
  assert.equal(await sweepAuditOutboxes(roleContext(service), 0), { settled: 1, kept: 0 });
  assert.equal(await sweepAuditOutboxes(roleContext(service), 0), { settled: 0, kept: 0 });
  assert.equal(await subscriptionEntries(ctx, first.body.data.id), [
    { type: 'subscription.created', externalId: 'written-a', changes: undefined, previousAttributes: undefined },
    { type: 'subscription.updated', externalId: 'written-b', changes: { externalId: 'written-b' }, previousAttributes: { externalId: 'written-a' } },
  ]);
  assert.equal(names(await inboxEvents(service, ctx.tenant.id, 'written-a')).at(-1), '$subscription.removed');
});

move('the previous owner registering the device again before a crashed move was finished takes it back: one subscription.updated each way', async (ctx) => {
  const { api, pk, service } = ctx;
  const first = await api.post('/v1/client/subscriptions', pk, { externalId: 'back-a', channel: 'push', token: token(5), platform: 'ios' });
  const deadTrail = dyingTrail(ctx);
  await registerSubscription(service.redis, service.keys, ctx.scope, 'back-b', { channel: 'push', token: token(5), platform: 'ios' }, { audit: deadTrail }).catch(() => null);
  // A still holds its copy (B's registration died before removing it), and registers the device again
  assert.is((await api.post('/v1/client/subscriptions', pk, { externalId: 'back-a', channel: 'push', token: token(5), platform: 'ios' })).status, 200);
  assert.equal(await sweepAuditOutboxes(roleContext(service), 0), { settled: 1, kept: 0 });
  assert.is((await api.get('/v1/subscribers/back-a/subscriptions', ctx.key)).body.data.total, 1);
  assert.is((await api.get('/v1/subscribers/back-b/subscriptions', ctx.key)).body.data.total, 0);
  // the swept entry of B's write lands after A's in the ledger (consumers order by createdAt): compare as a set
  const entries = await subscriptionEntries(ctx, first.body.data.id);
  assert.is(entries[0]!.type, 'subscription.created');
  assert.equal(entries.slice(1).map((e) => JSON.stringify([e.type, e.changes, e.previousAttributes])).sort(), [
    ['subscription.updated', { externalId: 'back-a' }, { externalId: 'back-b' }],
    ['subscription.updated', { externalId: 'back-b' }, { externalId: 'back-a' }],
  ].map((e) => JSON.stringify(e)).sort());
});

/** The unsettled move of token `n` (the previous externalId), or null. */
const moveOf = (ctx: Ctx, n: number) => ctx.service.redis.hget(ctx.service.keys.tokenMoves(ctx.tenant.id), tokenField('push', token(n), ''));
const tenants = (ctx: Ctx) => [{ workspaceId: ctx.workspace.id, tenantId: ctx.tenant.id }];
const quiet = createLogger('error');

move('a move killed after the new owner\'s write, then the previous subscriber deleted: its copy goes as moved, no subscription.deleted for the device the new owner holds', async (ctx) => {
  const { api, pk, service } = ctx;
  const first = await api.post('/v1/client/subscriptions', pk, { externalId: 'deleted-a', channel: 'push', token: token(6), platform: 'ios' });
  const id = first.body.data.id;
  await registerSubscription(service.redis, service.keys, ctx.scope, 'deleted-b', { channel: 'push', token: token(6), platform: 'ios' }, { audit: dyingTrail(ctx) }).catch(() => null);
  assert.equal((await api.get('/v1/subscribers/deleted-a/subscriptions', ctx.key)).body.data.items.map((s: any) => s.id), [id], 'A still lists the device');
  assert.is((await api.del('/v1/subscribers/deleted-a', ctx.key)).status, 200);
  assert.equal(await sweepAuditOutboxes(roleContext(service), 0), { settled: 1, kept: 0 }, 'the dead mover\'s entry');
  assert.equal(await subscriptionEntries(ctx, id), [
    { type: 'subscription.created', externalId: 'deleted-a', changes: undefined, previousAttributes: undefined },
    { type: 'subscription.updated', externalId: 'deleted-b', changes: { externalId: 'deleted-b' }, previousAttributes: { externalId: 'deleted-a' } },
  ], 'the ledger\'s last word is the owner change');
  const deleted = (await auditEntries(service, ctx.workspace.id)).filter((e) => e.type === 'subscriber.deleted' && e.data.object.externalId === 'deleted-a');
  assert.is(deleted.length, 1, 'the subscriber\'s own deletion is audited');
  const removed = (await inboxEvents(service, ctx.tenant.id, 'deleted-a')).filter((e) => e.name === '$subscription.removed');
  assert.equal(removed.map((e) => [e.data.subscription.id, e.data.reason]), [[id, 'moved']]);
  assert.equal((await api.get('/v1/subscribers/deleted-b/subscriptions', ctx.key)).body.data.items.map((s: any) => s.id), [id], 'B keeps the device');
  // the move, whose previous subscriber is gone, is settled by the sweep
  assert.equal(await sweepTokenMoves(service.redis, service.keys, ctx.scope.partitions, tenants(ctx), 0, quiet), { finished: 1, kept: 0 });
  assert.is(await moveOf(ctx, 6), null);
});

move('a move killed after its claim, before the new owner\'s write, then the previous subscriber deleted: the device nobody holds is audited deleted (probe AI)', async (ctx) => {
  const { api, pk, service } = ctx;
  const first = await api.post('/v1/client/subscriptions', pk, { externalId: 'unwritten-a', channel: 'push', token: token(16), platform: 'ios' });
  const id = first.body.data.id;
  // the killed registration of B got as far as lua/claimToken: the owner index names B, who holds nothing
  assert.equal((await claimOnly(ctx, tokenField('push', token(16), ''), 'unwritten-b'))[0], 'moved');
  assert.is((await api.del('/v1/subscribers/unwritten-a', ctx.key)).status, 200);
  await sweepAuditOutboxes(roleContext(service), 0);
  assert.equal((await subscriptionEntries(ctx, id)).map((e) => [e.type, e.externalId]), [['subscription.created', 'unwritten-a'], ['subscription.deleted', 'unwritten-a']]);
  const removed = (await inboxEvents(service, ctx.tenant.id, 'unwritten-a')).filter((e) => e.name === '$subscription.removed');
  assert.equal(removed.map((e) => [e.data.subscription.id, e.data.reason]), [[id, 'subscriber_deleted']]);
});

move('a move killed after the new owner\'s write is finished by the sweeper once it is older than the sweep interval: the previous copy goes (moved, not audited), the move is settled, once', async (ctx) => {
  const { api, pk, service } = ctx;
  const first = await api.post('/v1/client/subscriptions', pk, { externalId: 'swept-a', channel: 'push', token: token(7), platform: 'ios' });
  const id = first.body.data.id;
  await registerSubscription(service.redis, service.keys, ctx.scope, 'swept-b', { channel: 'push', token: token(7), platform: 'ios' }, { audit: dyingTrail(ctx) }).catch(() => null);
  assert.is(await moveOf(ctx, 7), 'swept-a');
  // a mover that wrote moments ago is alive: left to it
  assert.equal(await sweepTokenMoves(service.redis, service.keys, ctx.scope.partitions, tenants(ctx), 60_000, quiet), { finished: 0, kept: 0 });
  assert.is((await api.get('/v1/subscribers/swept-a/subscriptions', ctx.key)).body.data.total, 1);
  assert.equal(await sweepTokenMoves(service.redis, service.keys, ctx.scope.partitions, tenants(ctx), 0, quiet), { finished: 1, kept: 0 });
  assert.equal(await sweepTokenMoves(service.redis, service.keys, ctx.scope.partitions, tenants(ctx), 0, quiet), { finished: 0, kept: 0 }, 'once');
  assert.is(await moveOf(ctx, 7), null);
  assert.is((await api.get('/v1/subscribers/swept-a/subscriptions', ctx.key)).body.data.total, 0, 'A\'s copy is gone');
  assert.equal((await api.get('/v1/subscribers/swept-b/subscriptions', ctx.key)).body.data.items.map((s: any) => s.id), [id]);
  assert.equal((await inboxEvents(service, ctx.tenant.id, 'swept-a')).filter((e) => e.name === '$subscription.removed').map((e) => e.data.reason), ['moved']);
  assert.equal(await sweepAuditOutboxes(roleContext(service), 0), { settled: 1, kept: 0 });
  assert.equal((await subscriptionEntries(ctx, id)).map((e) => e.type), ['subscription.created', 'subscription.updated'], 'nothing audited beyond the owner change');
});

move('a move whose mover died before its write is left to the next registration of the device; one whose mover is a live registration is not touched', async (ctx) => {
  const { api, pk, service: { redis, keys } } = ctx;
  await api.post('/v1/client/subscriptions', pk, { externalId: 'unwritten-a', channel: 'push', token: token(8), platform: 'ios' });
  const field = tokenField('push', token(8), '');
  await claimOnly(ctx, field, 'unwritten-b');
  assert.equal(await sweepTokenMoves(redis, keys, ctx.scope.partitions, tenants(ctx), 0, quiet), { finished: 0, kept: 0 });
  assert.is(await redis.hget(keys.tokenMoves(ctx.tenant.id), field), 'unwritten-a');
  assert.is((await api.get('/v1/subscribers/unwritten-a/subscriptions', ctx.key)).body.data.total, 1, 'the copy stays for the mover to take over');
});

move('a registration settling its move does not forget a later claim\'s move of the same token (lua/settleTokenMove)', async (ctx) => {
  const { api, pk, service: { redis, keys } } = ctx;
  await api.post('/v1/client/subscriptions', pk, { externalId: 'chain-a', channel: 'push', token: token(9), platform: 'ios' });
  const field = tokenField('push', token(9), '');
  // B's registration moves the token from A; C claims it from B before B's write (and dies)
  await registerSubscription(redis, keys, ctx.scope, 'chain-b', { channel: 'push', token: token(9), platform: 'ios' }, {
    afterClaim: async () => void (await claimOnly(ctx, field, 'chain-c')),
  });
  assert.is(await redis.hget(keys.tokenMoves(ctx.tenant.id), field), 'chain-b', 'C\'s move from B is still recorded');
});

move('a third user registering the device after a mover was killed right after its claim takes the first user\'s copy over and removes it: one holder, createdAt kept, one owner change (probe CA)', async (ctx) => {
  const { api, pk, service: { redis, keys } } = ctx;
  const first = await api.post('/v1/client/subscriptions', pk, { externalId: 'dead-a', channel: 'push', token: token(13), platform: 'ios' });
  const id = first.body.data.id;
  const field = tokenField('push', token(13), '');
  await claimOnly(ctx, field, 'dead-b');
  const third = await api.post('/v1/client/subscriptions', pk, { externalId: 'dead-c', channel: 'push', token: token(13), platform: 'ios' });
  assert.is(third.status, 201);
  assert.equal([third.body.data.id, third.body.data.createdAt], [id, first.body.data.createdAt]);
  assert.is((await api.get('/v1/subscribers/dead-a/subscriptions', ctx.key)).body.data.total, 0, 'A\'s copy went with the move');
  assert.equal((await api.get('/v1/subscribers/dead-c/subscriptions', ctx.key)).body.data.items.map((s: any) => s.id), [id]);
  assert.is(await redis.hget(keys.tokenMoves(ctx.tenant.id), field), null, 'settled');
  assert.equal((await subscriptionEntries(ctx, id)).map((e) => [e.type, e.externalId, e.previousAttributes?.externalId]), [
    ['subscription.created', 'dead-a', undefined],
    ['subscription.updated', 'dead-c', 'dead-a'],
  ]);
});

move('a third user\'s registration refused at its limit after a mover was killed gives the claim back with the unsettled move it replaced: the next registration still finishes it', async (ctx) => {
  const { api, pk, service: { redis, keys } } = ctx;
  const first = await api.post('/v1/client/subscriptions', pk, { externalId: 'full-a', channel: 'push', token: token(14), platform: 'ios' });
  const field = tokenField('push', token(14), '');
  await claimOnly(ctx, field, 'full-b');
  for (let i = 0; i < MAX_SUBSCRIPTIONS_PER_SUBSCRIBER; i++) assert.is((await api.post('/v1/client/subscriptions', pk, { externalId: 'full-c', channel: 'push', token: token(1_000 + i), platform: 'ios' })).status, 201);
  assert.is((await api.post('/v1/client/subscriptions', pk, { externalId: 'full-c', channel: 'push', token: token(14), platform: 'ios' })).status, 409);
  assert.is(await redis.hget(keys.tokenMoves(ctx.tenant.id), field), 'full-a', 'the move from A is recorded again');
  assert.is((await redis.hget(keys.tokens(ctx.tenant.id), field))!.split('|')[1], 'full-b');
  // the dead mover's user registers the device: the move from A is finished
  assert.is((await api.post('/v1/client/subscriptions', pk, { externalId: 'full-b', channel: 'push', token: token(14), platform: 'ios' })).status, 201);
  assert.is((await api.get('/v1/subscribers/full-a/subscriptions', ctx.key)).body.data.total, 0);
  assert.equal((await api.get('/v1/subscribers/full-b/subscriptions', ctx.key)).body.data.items.map((s: any) => [s.id, s.createdAt]), [[first.body.data.id, first.body.data.createdAt]]);
});

move('a first registration overtaken by a move that is then refused (its claim given back, its mark not yet) claims again and writes its copy (probe CD)', async (ctx) => {
  const { service: { redis, keys } } = ctx;
  const t = ctx.tenant.id;
  const field = tokenField('push', token(15), '');
  let claims = 0;
  const first = await registerSubscription(redis, keys, ctx.scope, 'given-a', { channel: 'push', token: token(15), platform: 'ios' }, {
    afterClaim: async () => {
      if (claims++ > 0) return; // A's claim again: nothing in between
      // another user's registration claims the device and marks A's copy moved out, then is refused: its claim goes back first
      const [claim, id, stamp] = await claimOnly(ctx, field, 'given-b');
      assert.is(claim, 'moved');
      await callScript(redis, 'markMovedOut', [keys.subscriptionMovedOut(partitionOf(t, 'given-a', ctx.scope.partitions), t, id!)], ['given-a', stamp!, Date.now() + 60_000]);
      await callScript(redis, 'unclaimToken', [keys.tokens(t), keys.subscriptionOwners(t), keys.tokenMoves(t), keys.subscriptionClaims(t)], [field, id!, 'given-b', 'given-a', '']);
    },
  });
  assert.is(first.created, true, 'A\'s registration wrote its copy');
  assert.is(claims, 2, 'A claimed twice');
  assert.equal((await ctx.api.get('/v1/subscribers/given-a/subscriptions', ctx.key)).body.data.items.map((s: any) => s.id), [first.subscription.id]);
  assert.is(await redis.hget(keys.tokens(t), field), `${first.subscription.id}|given-a`);
});

move('a mute by subscription id alone, sent while another user\'s registration moves the device, acts for the holder once its copy is written (probe Y1: 404, the mute lost)', async (ctx) => {
  const { api, pk, service } = ctx;
  const a = await api.post('/v1/client/subscriptions', pk, { externalId: 'holder-a', channel: 'push', token: token(16), platform: 'ios' });
  assert.is(a.status, 201);
  let muted: Promise<{ status: number; body: any }> | null = null;
  await registerSubscription(service.redis, service.keys, ctx.scope, 'holder-b', { channel: 'push', token: token(16), platform: 'ios' }, {
    afterClaim: async () => {
      // the owner index names B now, B's copy is not written yet
      muted = api.patch(`/v1/client/subscriptions/${a.body.data.id}`, pk, { enabled: false });
      await new Promise((r) => setTimeout(r, 150));
    },
  });
  const res = await muted!;
  assert.is(res.status, 200, JSON.stringify(res.body));
  assert.equal([res.body.data.id, res.body.data.enabled], [a.body.data.id, false]);
  const held = (await api.get('/v1/subscribers/holder-b/subscriptions', ctx.key)).body.data.items;
  assert.equal(held.map((s: any) => [s.id, s.enabled]), [[a.body.data.id, false]]);
});

move('the worker\'s sweeper finishes a move whose mover died after its write', async (ctx) => {
  const { api, pk, service } = ctx;
  await api.post('/v1/client/subscriptions', pk, { externalId: 'worker-a', channel: 'push', token: token(10), platform: 'ios' });
  await registerSubscription(service.redis, service.keys, ctx.scope, 'worker-b', { channel: 'push', token: token(10), platform: 'ios' }, { audit: dyingTrail(ctx) }).catch(() => null);
  const worker = startSweeper(service);
  try {
    // the worker process takes seconds to start on a loaded CI machine before its first sweep
    await waitFor('the sweeper to finish the move', async () => (await moveOf(ctx, 10)) === null, 45_000, 100);
  } finally {
    await stopRoleProcess(worker);
  }
  assert.is((await api.get('/v1/subscribers/worker-a/subscriptions', ctx.key)).body.data.total, 0);
  assert.is((await api.get('/v1/subscribers/worker-b/subscriptions', ctx.key)).body.data.total, 1);
});

for (const [where, n] of [['another partition', 11], ['the same partition', 12]] as const) {
  move(`a registration of the owner overtaken by another app user\'s whole move before its write (${where}) writes nothing and answers what it sent, never the holder\'s details: no second subscription.created, no second owner change`, async (ctx) => {
    const { api, pk, service } = ctx;
    const { redis, keys } = service;
    // in another partition B's copy is another record, which A's write does not see; in the same one both name one record
    const partition = (externalId: string) => partitionOf(ctx.tenant.id, externalId, ctx.scope.partitions);
    const a = `late-a${n}`;
    const b = Array.from({ length: 64 }, (_, i) => `late-b${n}-${i}`).find((id) => (partition(id) === partition(a)) === (n === 12))!;
    const first = await api.post('/v1/client/subscriptions', pk, { externalId: a, channel: 'push', token: token(n), platform: 'ios' });
    const id = first.body.data.id;
    const trail = new AuditTrail(redis, keys, { workspace: ctx.workspace, tenant: ctx.tenant, ...BY_TEST }, quiet);
    // A registers the device again (its claim: 'same'); before A's write (its lock expired), B's registration claims, writes, removes A's copy and settles, then B mutes it
    const late = await registerSubscription(redis, keys, ctx.scope, a, { channel: 'push', token: token(n), platform: 'ios', device: { model: 'A-model' } }, {
      audit: trail,
      afterClaim: async () => {
        const moved = await api.post('/v1/client/subscriptions', pk, { externalId: b, channel: 'push', token: token(n), platform: 'ios', authorizationStatus: 'denied', device: { model: 'B-model', locale: 'de-DE' } });
        assert.is(moved.status, 201);
        assert.is((await api.patch(`/v1/client/subscriptions/${id}?externalId=${b}`, pk, { enabled: false })).status, 200);
      },
    });
    assert.is(late.subscription.id, id);
    assert.is(late.created, false, 'A\'s registration found the device registered (its claim came first), then lost it');
    assert.equal([late.subscription.externalId, late.subscription.device, late.subscription.authorizationStatus, late.subscription.enabled], [a, { model: 'A-model' }, null, true], 'what A sent, nothing of B\'s');
    assert.is(late.subscription.createdAt, first.body.data.createdAt);
    await sweepAuditOutboxes(roleContext(service), 0);
    assert.equal((await subscriptionEntries(ctx, id)).map((e) => [e.type, e.externalId]), [['subscription.created', a], ['subscription.updated', b], ['subscription.updated', b]]);
    assert.is((await api.get(`/v1/subscribers/${a}/subscriptions`, ctx.key)).body.data.total, 0);
    const held = (await api.get(`/v1/subscribers/${b}/subscriptions`, ctx.key)).body.data.items;
    assert.equal(held.map((s: any) => [s.id, s.createdAt, s.device.model]), [[id, first.body.data.createdAt, 'B-model']], 'B holds it, created when A first registered it');
    assert.equal(names(await inboxEvents(service, ctx.tenant.id, a)), ['$subscriber.created', '$subscription.registered', '$subscription.removed'], 'A\'s stream: no registered after the removal');
    // A registering it once more afterwards takes it back (a later claim than the move)
    assert.is((await api.post('/v1/client/subscriptions', pk, { externalId: a, channel: 'push', token: token(n), platform: 'ios' })).status, 201);
    assert.equal((await subscriptionEntries(ctx, id)).map((e) => [e.type, e.externalId]), [['subscription.created', a], ['subscription.updated', b], ['subscription.updated', b], ['subscription.updated', a]]);
  });
}

move('a device moving between two app users of one partition: the previous user\'s $subscription.removed shows it as that user had it (muted), not as the new holder has it', async (ctx) => {
  const { api, pk, service } = ctx;
  const partition = (externalId: string) => partitionOf(ctx.tenant.id, externalId, ctx.scope.partitions);
  const a = 'left-a';
  const b = Array.from({ length: 64 }, (_, i) => `left-b${i}`).find((id) => partition(id) === partition(a))!;
  const first = await api.post('/v1/client/subscriptions', pk, { externalId: a, channel: 'push', token: token(13), platform: 'ios' });
  assert.is((await api.patch(`/v1/client/subscriptions/${first.body.data.id}?externalId=${a}`, pk, { enabled: false })).status, 200);
  const moved = await api.post('/v1/client/subscriptions', pk, { externalId: b, channel: 'push', token: token(13), platform: 'ios' });
  assert.equal([moved.status, moved.body.data.enabled], [201, true]);
  const removed = (await inboxEvents(service, ctx.tenant.id, a)).filter((e) => e.name === '$subscription.removed');
  assert.equal(removed.map((e) => e.data), [{ subscription: { id: first.body.data.id, channel: 'push', platform: 'ios', enabled: false }, reason: 'moved' }]);
  const registered = (await inboxEvents(service, ctx.tenant.id, b)).filter((e) => e.name === '$subscription.registered');
  assert.equal(registered.map((e) => e.data.subscription.enabled), [true]);
  // the other way back: B (enabled) loses it to A again, and B's removal shows it enabled
  assert.is((await api.post('/v1/client/subscriptions', pk, { externalId: a, channel: 'push', token: token(13), platform: 'ios' })).status, 201);
  const bRemoved = (await inboxEvents(service, ctx.tenant.id, b)).filter((e) => e.name === '$subscription.removed');
  assert.equal(bRemoved.map((e) => [e.data.subscription.enabled, e.data.reason]), [[true, 'moved']]);
  assert.equal((await api.get(`/v1/subscribers/${a}/subscriptions`, ctx.key)).body.data.items.map((s: any) => s.id), [first.body.data.id]);
});

move('identify merging the anonymous subscriber: each device it held is one subscription.updated naming the owner change; an address (never moved) is created for the identified one, muted as it was, and deleted from the anonymous one', async (ctx) => {
  const { api, pk } = ctx;
  const device = await api.post('/v1/client/subscriptions', pk, { externalId: 'anon-m', channel: 'push', token: token(4), platform: 'ios' });
  const muted = await api.post('/v1/client/subscriptions', pk, { externalId: 'anon-m', channel: 'email', address: 'anon-m@example.com' });
  assert.is((await api.patch(`/v1/client/subscriptions/${muted.body.data.id}`, pk, { enabled: false })).status, 200);
  assert.is((await api.post('/v1/client/identify', pk, { externalId: 'user-m', anonymousId: 'anon-m', source: 'ios' })).status, 200);
  // a retry of the identify changes nothing more
  assert.is((await api.post('/v1/client/identify', pk, { externalId: 'user-m', anonymousId: 'anon-m', source: 'ios' })).status, 200);
  assert.equal((await subscriptionEntries(ctx, device.body.data.id)).map((e) => [e.type, e.externalId, e.changes, e.previousAttributes]), [
    ['subscription.created', 'anon-m', undefined, undefined],
    ['subscription.updated', 'user-m', { externalId: 'user-m' }, { externalId: 'anon-m' }],
  ]);
  assert.equal((await subscriptionEntries(ctx, muted.body.data.id)).map((e) => [e.type, e.externalId, e.changes, e.previousAttributes]), [
    ['subscription.created', 'anon-m', undefined, undefined],
    ['subscription.updated', 'anon-m', { enabled: false }, { enabled: true }],
    ['subscription.deleted', 'anon-m', undefined, undefined],
  ]);
  const own = (await api.get('/v1/subscribers/user-m/subscriptions', ctx.key)).body.data.items.find((s: any) => s.channel === 'email');
  assert.equal([own.address, own.enabled], ['anon-m@example.com', false]);
  assert.equal((await subscriptionEntries(ctx, own.id)).map((e) => [e.type, e.externalId]), [['subscription.created', 'user-m']]);
});

move.run();
