import { Redis } from 'ioredis';
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { sweepAuditOutboxes } from '../../actors/audit-outbox-sweeper.js';
import { createLogger } from '../../lib/log.js';
import { auditsSettled, parseOutboxField } from '../../streams/audit-outbox.js';
import { updatePreferences } from '../../streams/preferences.js';
import type { RoleContext } from '../../streams/role-context.js';
import { AuditTrail } from '../../streams/subscriber-audit.js';
import { mergeSubscriber, planMerge } from '../../streams/subscriber-merge.js';
import type { TenantScope } from '../../streams/subscriber-writes.js';
import { deleteSubscriber, upsertSubscriber } from '../../streams/subscribers.js';
import { listSubscriptions, registerSubscription, removeSubscription, setSubscriptionEnabled, type RegisterInput } from '../../streams/subscriptions.js';
import { BY_TEST, bootstrapWorkspace, startTestService, type TestService } from '../helpers/service.js';

// "A writer that died": each kind of subscriber write run as a live request would (its entries
// settled) and by a writer whose settle never happens (its trail's Redis connection is gone, as
// for a process killed right after the write): the sweeper then settles what the dead writer's
// scripts recorded, and the ledger holds the same entries for both, once.

type Ctx = { service: TestService; scope: TenantScope; trail: AuditTrail; dead: Redis; deadTrail: AuditTrail; sweeper: RoleContext };
const died = suite<Ctx>('subscriber writes whose writer died before settling their audit entries');

died.before(async (ctx) => {
  ctx.service = await startTestService('subscriber-audit-outbox');
  const { redis, keys } = ctx.service;
  const { workspace, tenant } = await bootstrapWorkspace(ctx.service, 'died');
  ctx.scope = { workspaceId: workspace.id, tenantId: tenant.id, partitions: ctx.service.config.partitions };
  const auditScope = { workspace: { id: workspace.id, slug: workspace.slug }, tenant: { id: tenant.id, slug: tenant.slug }, ...BY_TEST };
  ctx.trail = new AuditTrail(redis, keys, auditScope, createLogger("error"));
  // a closed connection: every settle fails once the write is made
  ctx.dead = new Redis(ctx.service.env.REDIS_URL!, { lazyConnect: true });
  ctx.dead.disconnect();
  ctx.deadTrail = new AuditTrail(ctx.dead, keys, auditScope, createLogger("error"));
  ctx.sweeper = { config: ctx.service.config, redis, keys, log: createLogger('error'), target: null as never };
});
died.after(async (ctx) => ctx.service.stop());

const push = (x: string, extra: Partial<RegisterInput> = {}): RegisterInput => ({ channel: 'push', token: `tok-${x}`, platform: 'ios', ...extra });

/**
 * Each kind of write: `setup` (not audited) then `write` with the trail under test; `types` the
 * entries it makes (`ordered`: in this order in the ledger, live and swept), `intents` how many its
 * writes leave in the outboxes (default 1).
 */
type Scenario = { setup?: (ctx: Ctx, x: string) => Promise<unknown>; write: (ctx: Ctx, x: string, trail: AuditTrail) => Promise<unknown>; types: string[]; intents?: number; ordered?: boolean };
const scenarios: Record<string, Scenario> = {
  'POST /v1/subscribers creating (subscriber.attributes)': {
    write: ({ service: { redis, keys }, scope }, x, audit) => upsertSubscriber(redis, keys, scope, x, { email: 'new@example.com', properties: { plan: 'free' } }, { create: true, audit }),
    types: ['subscriber.created'],
  },
  'PATCH /v1/subscribers updating (subscriber.attributes)': {
    setup: ({ service: { redis, keys }, scope }, x) => upsertSubscriber(redis, keys, scope, x, { locale: 'en', properties: { plan: 'free', n: 1 } }),
    write: ({ service: { redis, keys }, scope }, x, audit) => upsertSubscriber(redis, keys, scope, x, { locale: 'fr', properties: { n: null } }, { create: false, audit }),
    types: ['subscriber.updated'],
  },
  'DELETE /v1/subscribers of a subscriber with 2 devices and 1 address (subscriber.delete: subscription.deleted each, then subscriber.deleted, one intent)': {
    setup: async ({ service: { redis, keys }, scope }, x) => {
      await upsertSubscriber(redis, keys, scope, x, { phone: '+33100000000' });
      await registerSubscription(redis, keys, scope, x, push(x));
      await registerSubscription(redis, keys, scope, x, push(`${x}-2`, { platform: 'android' }));
      await registerSubscription(redis, keys, scope, x, { channel: 'email', address: `${x}@example.com` });
    },
    write: ({ service: { redis, keys }, scope }, x, audit) => deleteSubscriber(redis, keys, scope, x, { audit }),
    types: ['subscription.deleted', 'subscription.deleted', 'subscription.deleted', 'subscriber.deleted'],
    ordered: true,
  },
  'a registration of a new device (subscription.register)': {
    write: ({ service: { redis, keys }, scope }, x, audit) => registerSubscription(redis, keys, scope, x, push(x), { audit }),
    types: ['subscription.created'],
  },
  'a registration changing a device (subscription.register)': {
    setup: ({ service: { redis, keys }, scope }, x) => registerSubscription(redis, keys, scope, x, push(x, { authorizationStatus: 'provisional' })),
    write: ({ service: { redis, keys }, scope }, x, audit) => registerSubscription(redis, keys, scope, x, push(x, { authorizationStatus: 'authorized', device: { model: 'X' } }), { audit }),
    types: ['subscription.updated'],
  },
  'a registration moving a device from another subscriber (subscription.register)': {
    setup: ({ service: { redis, keys }, scope }, x) => registerSubscription(redis, keys, scope, `${x}-before`, push(x)),
    write: ({ service: { redis, keys }, scope }, x, audit) => registerSubscription(redis, keys, scope, x, push(x), { audit }),
    types: ['subscription.updated'],
  },
  'muting a device (subscription.update)': {
    setup: ({ service: { redis, keys }, scope }, x) => registerSubscription(redis, keys, scope, x, push(x)),
    write: async ({ service: { redis, keys }, scope }, x, audit) => {
      const [device] = await listSubscriptions(redis, keys, scope, x);
      return setSubscriptionEnabled(redis, keys, scope, x, device!.id, false, audit);
    },
    types: ['subscription.updated'],
  },
  'removing a device (subscription.delete)': {
    setup: ({ service: { redis, keys }, scope }, x) => registerSubscription(redis, keys, scope, x, push(x)),
    write: async ({ service: { redis, keys }, scope }, x, audit) => {
      const [device] = await listSubscriptions(redis, keys, scope, x);
      return removeSubscription(redis, keys, scope, x, device!.id, audit);
    },
    types: ['subscription.deleted'],
  },
  'changing preferences (subscriber.preferences)': {
    setup: ({ service: { redis, keys }, scope }, x) => upsertSubscriber(redis, keys, scope, x, {}),
    write: ({ service: { redis, keys }, scope }, x, audit) => updatePreferences(redis, keys, scope, x, { channels: { email: false }, categories: { news: { push: false } } }, { audit }),
    types: ['subscriber.updated'],
  },
  'client preferences creating the subscriber (subscriber.preferences)': {
    write: ({ service: { redis, keys }, scope }, x, audit) => updatePreferences(redis, keys, scope, x, { channels: { push: false } }, { create: true, audit }),
    types: ['subscriber.created'],
  },
  'identify changing attributes and merging (held: one subscriber.updated absorbs the other, then subscriber.deleted)': {
    setup: async ({ service: { redis, keys }, scope }, x) => {
      await upsertSubscriber(redis, keys, scope, x, { locale: 'en', properties: { a: 1 } });
      await upsertSubscriber(redis, keys, scope, `${x}-anon`, { email: 'anon@example.com', locale: 'de', properties: { a: 9, c: 3 } });
    },
    write: identifyMerging({ timezone: 'Europe/Paris', properties: { b: 2 } }),
    types: ['subscriber.updated', 'subscriber.deleted'],
    intents: 2,
  },
  'identify creating the subscriber and merging (subscriber.created carried by the merge\'s write)': {
    setup: ({ service: { redis, keys }, scope }, x) => upsertSubscriber(redis, keys, scope, `${x}-anon`, { phone: '+33100000001', properties: { z: 1 } }),
    write: identifyMerging({ locale: 'it' }),
    types: ['subscriber.created', 'subscriber.updated', 'subscriber.deleted'],
    intents: 2,
  },
  'identify merging an anonymous subscriber that holds a device (held: the device\'s owner change, then subscriber.deleted)': {
    setup: ({ service: { redis, keys }, scope }, x) => registerSubscription(redis, keys, scope, `${x}-anon`, push(`${x}-anon`)),
    write: identifyMerging({ locale: 'pt' }),
    types: ['subscriber.created', 'subscription.updated', 'subscriber.deleted'],
    intents: 3,
  },
};

/** What identify does with the trail: its own attributes, then the merge of `<x>-anon`, entries held to the end. */
function identifyMerging(attributes: Record<string, unknown>): Scenario['write'] {
  return ({ service: { redis, keys }, scope }, x, trail) => trail.holding(async () => {
    await upsertSubscriber(redis, keys, scope, x, attributes, { create: true, audit: trail });
    const plan = await planMerge(redis, keys, scope, `${x}-anon`, x);
    await mergeSubscriber(redis, keys, scope, plan!, trail);
  });
}

/**
 * The audit payloads about `x`, then about its helpers (`<x>-anon`, `<x>-before`), each oldest
 * first (the sweeper settles one outbox after the other: the order between subscribers of
 * different partitions is not the writer's).
 */
async function entriesOf(service: TestService, workspaceId: string, x: string): Promise<any[]> {
  const entries = (await service.redis.xrange(service.keys.ledger(workspaceId), '-', '+')).map(([, f]) => JSON.parse(f[f.indexOf('payload') + 1]!));
  return [x, `${x}-anon`, `${x}-before`].flatMap((subject) => entries.filter((e) => e.data?.object?.externalId === subject));
}

/** An entry without what differs between two subjects given the same change: ids, externalId (an owner change's too), token, address, times. */
function shape(e: any) {
  const { id: _id, externalId: _x, token: _t, address: _a, createdAt: _c, updatedAt: _u, ...object } = e.data.object;
  const owner = (attributes?: Record<string, unknown>) => attributes && ('externalId' in attributes ? { ...attributes, externalId: String(attributes.externalId).replace(/^(live|dead)-\d+/, 'x') } : attributes);
  return { type: e.type, target: e.target.type, targetIsObject: e.target.id === e.data.object.id, object, changes: owner(e.changes), previousAttributes: owner(e.previousAttributes), actor: e.actor, tenant: e.tenant };
}

async function outboxFields(ctx: Ctx): Promise<string[]> {
  const { redis, keys } = ctx.service;
  const all = await Promise.all(Array.from({ length: ctx.scope.partitions }, (_, p) => redis.hvals(keys.partitionOutbox(p))));
  return all.flat();
}

let n = 0;
for (const [name, scenario] of Object.entries(scenarios)) {
  died(`${name}: the sweeper settles what the dead writer recorded, once, as the live writer settles it`, async (ctx) => {
    const { service, scope } = ctx;
    const live = `live-${n}`, dead = `dead-${n}`;
    n++;
    await scenario.setup?.(ctx, live);
    await scenario.setup?.(ctx, dead);
    await scenario.write(ctx, live, ctx.trail);
    // a write outside `holding` is answered before its entries are appended (settleAuditLater)
    await auditsSettled(5_000);
    assert.equal(await outboxFields(ctx), [], 'a live writer leaves nothing in the outbox');
    const settledLive = await entriesOf(service, scope.workspaceId, live);
    assert.equal(settledLive.map((e) => e.type).sort(), [...scenario.types].sort());
    if (scenario.ordered) assert.equal(settledLive.map((e) => e.type), scenario.types, 'in order');
    assert.equal(await entriesOf(service, scope.workspaceId, dead), []);

    // its writes apply; every settle fails (thrown at the end of `holding`, else reported to the log)
    await scenario.write(ctx, dead, ctx.deadTrail).catch(() => null);
    await auditsSettled(5_000);
    const left = (await outboxFields(ctx)).map((v) => parseOutboxField(v).record);
    assert.equal(await entriesOf(service, scope.workspaceId, dead), [], 'nothing reached the ledger');
    assert.is(left.length, scenario.intents ?? 1, 'one intent per outbox written: an absorbed intent is gone');

    assert.equal(await sweepAuditOutboxes(ctx.sweeper, 0), { settled: left.length, kept: 0 });
    const swept = await entriesOf(service, scope.workspaceId, dead);
    // the same entries; in what order a sweep appends the intents of one outbox is the hash's, not the writer's
    const byShape = (entries: any[]) => entries.map(shape).sort((a, b) => (JSON.stringify(a) < JSON.stringify(b) ? -1 : 1));
    assert.equal(byShape(swept), byShape(settledLive), 'the same entries as the live writer');
    if (scenario.ordered) assert.equal(swept.map((e) => e.type), scenario.types, 'swept in order');
    const ids = new Set(left.flatMap((r) => r.ids));
    assert.ok(swept.every((e) => ids.has(e.id)), 'under the ids fixed in the intents');
    assert.equal(await outboxFields(ctx), []);
    assert.equal(await sweepAuditOutboxes(ctx.sweeper, 0), { settled: 0, kept: 0 });
    assert.equal(await entriesOf(service, scope.workspaceId, dead), swept, 'once');
  });
}

died('a held intent the sweeper settled before the next write of the request is not absorbed: its entries are not repeated', async (ctx) => {
  const { service: { redis, keys }, scope, trail } = ctx;
  await upsertSubscriber(redis, keys, scope, 'slow', { locale: 'en' });
  await upsertSubscriber(redis, keys, scope, 'slow-anon', { email: 'slow@example.com' });
  await trail.holding(async () => {
    await upsertSubscriber(redis, keys, scope, 'slow', { locale: 'fr' }, { create: true, audit: trail });
    // the request is slower than AUDIT_OUTBOX_SWEEP_MS: the sweeper settles the held intent
    assert.equal(await sweepAuditOutboxes(ctx.sweeper, 0), { settled: 1, kept: 0 });
    await mergeSubscriber(redis, keys, scope, (await planMerge(redis, keys, scope, 'slow-anon', 'slow'))!, trail);
  });
  const entries = await entriesOf(ctx.service, scope.workspaceId, 'slow');
  assert.equal(entries.map((e) => [e.type, e.changes]), [
    ['subscriber.updated', { locale: 'fr' }],
    ['subscriber.updated', { email: 'slow@example.com' }],
    ['subscriber.deleted', undefined],
  ]);
  assert.equal(await outboxFields(ctx), []);
});

died.run();
