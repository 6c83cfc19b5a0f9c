import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { partitionOf } from '../../lib/partition.js';
import { readPreferences } from '../../streams/preferences.js';
import type { TenantScope } from '../../streams/subscriber-writes.js';
import { loadSubscribers } from '../../streams/subscribers.js';
import { getSubscription } from '../../streams/subscriptions.js';
import { startRoleProcess, stopRoleProcess, type RoleProcess } from '../helpers/processes.js';
import { startWebProcess } from '../helpers/audit.js';
import { bootstrapWorkspace, startTestService, type TestService } from '../helpers/service.js';
import { waitFor } from '../helpers/wait.js';

// A real web process is killed (SIGKILL) under concurrent subscriber and client writes of every
// audited kind; a real worker then sweeps the outboxes. Every write that took effect has its audit
// entries: each subscriber has one subscriber.created, and the newest entry of every subscriber and
// subscription describes it as it is (deleted ones end with their .deleted entry: a subscription
// that went with its deleted subscriber too).

type Ctx = { service: TestService; web?: RoleProcess; worker?: RoleProcess };
const WRITERS = 128;
const kill = suite<Ctx>('subscriber audit entries survive a web process killed mid-write');

kill.before(async (ctx) => {
  ctx.service = await startTestService('subscriber-audit-kill');
});
kill.after(async (ctx) => {
  if (ctx.web) await stopRoleProcess(ctx.web);
  if (ctx.worker) await stopRoleProcess(ctx.worker);
  await ctx.service.stop();
});

/**
 * One client's writes, each on subscribers of its own (so the writes of one record are sequential
 * and the ledger's order per record is the order of its writes): POST /v1/subscribers creating and
 * updating `s`, PATCH, preferences, a device registered, muted, updated; identify of an anonymous
 * `a` merged into a new `u` (filled attributes, `a` deleted), identify updating `u`, client
 * preferences, a device for `u` removed or `s`'s device moved to `u`; every third `s` deleted (with
 * its email address, and its device when it did not move).
 * Returns at the first request the dead process does not answer.
 */
async function writer(base: string, keys: { tenant: string; client: string }, loop: number, done: () => boolean, iterations: { n: number }): Promise<void> {
  // plain requests (the answers' schemas are the other tests' business): the web process, not this one, is the busy one
  const send = async (method: string, path: string, key: string, body?: unknown) => {
    const res = await fetch(base + path, { method, headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' }, body: body === undefined ? undefined : JSON.stringify(body) });
    const reply = (await res.json()) as { data: any };
    if (res.status >= 300) throw new Error(`${method} ${path} answered ${res.status}: ${JSON.stringify(reply)}`);
    return reply.data;
  };
  const post = (path: string, key: string, body: unknown) => send('POST', path, key, body);
  const patch = (path: string, key: string, body: unknown) => send('PATCH', path, key, body);
  const { tenant: key, client: pk } = keys;
  try {
    for (let n = 0; !done(); n++) {
      const s = `s-${loop}-${n}`, u = `u-${loop}-${n}`, a = `a-${loop}-${n}`;
      const token = (k: number) => `${loop}-${n}-${k}`.padStart(64, '0');
      await post('/v1/subscribers', key, { externalId: s, email: `${s}@example.com`, properties: { n } });
      await post('/v1/subscribers', key, { externalId: s, locale: 'en', properties: { step: 2 } });
      await patch(`/v1/subscribers/${s}`, key, { timezone: 'Europe/Paris' });
      await patch(`/v1/subscribers/${s}/preferences`, key, { categories: { news: { push: false } } });
      const device = await post('/v1/client/subscriptions', pk, { externalId: s, channel: 'push', token: token(0), platform: 'ios' });
      await patch(`/v1/client/subscriptions/${device.id}`, pk, { enabled: false });
      await post('/v1/client/subscriptions', pk, { externalId: s, channel: 'push', token: token(0), authorizationStatus: 'authorized' });
      await post('/v1/client/subscriptions', pk, { externalId: s, channel: 'email', address: `${s}@example.com` });
      await post('/v1/client/identify', pk, { externalId: a, source: 'ios', attributes: { email: `${a}@example.com`, properties: { anonymous: true } } });
      await post('/v1/client/identify', pk, { externalId: u, anonymousId: a, source: 'ios', attributes: { locale: 'fr' } });
      await post('/v1/client/identify', pk, { externalId: u, source: 'ios', attributes: { properties: { n } } });
      await patch('/v1/client/preferences', pk, { externalId: u, channels: { email: false } });
      const own = await post('/v1/client/subscriptions', pk, { externalId: u, channel: 'push', token: token(1), platform: 'android' });
      if (n % 2 === 1) await send('DELETE', `/v1/client/subscriptions/${own.id}`, pk);
      else await post('/v1/client/subscriptions', pk, { externalId: u, channel: 'push', token: token(0), platform: 'ios' });
      if (n % 3 === 0) await send('DELETE', `/v1/subscribers/${s}`, key);
      iterations.n++;
    }
  } catch (err) {
    if (!done()) throw err;
  }
}

/** The audit payloads of the workspace, one per event id (a settle repeated after a crash repeats its id), in ledger order of their last copy. */
async function auditEntries(service: TestService, workspaceId: string): Promise<any[]> {
  const byId = new Map<string, any>();
  for (const [, fields] of await service.redis.xrange(service.keys.ledger(workspaceId), '-', '+')) {
    if (fields[fields.indexOf('kind') + 1] !== 'audit') continue;
    const payload = JSON.parse(fields[fields.indexOf('payload') + 1]!);
    byId.delete(payload.id);
    byId.set(payload.id, payload);
  }
  return [...byId.values()];
}

/** Every subscriber of the tenant, as a read answers it (with its preferences), by id. */
async function subscribersNow(service: TestService, scope: TenantScope): Promise<Map<string, any>> {
  const { redis, keys } = service;
  const externalIds: string[] = [];
  for (let p = 0; p < scope.partitions; p++) {
    for (const field of await redis.hkeys(keys.subscribers(p))) if (field.startsWith(`${scope.tenantId}|`)) externalIds.push(field.slice(scope.tenantId.length + 1));
  }
  const loaded = await loadSubscribers(redis, keys, scope, externalIds);
  const out = new Map<string, any>();
  for (const s of loaded) {
    if (!s) continue;
    const { segments: _segments, ...subscriber } = s;
    const stored = await redis.hget(keys.subscriber(partitionOf(scope.tenantId, s.externalId, scope.partitions), scope.tenantId, s.externalId), 'preferences');
    out.set(s.id, { subscriber, preferences: readPreferences(stored ?? undefined) });
  }
  return out;
}

/** What of the invariant does not hold on the ledger, by kind (empty lists: it holds). */
async function audit(service: TestService, scope: TenantScope) {
  const entries = await auditEntries(service, scope.workspaceId);
  const subscribers = await subscribersNow(service, scope);
  const byTarget = new Map<string, any[]>();
  for (const e of entries) if (e.target) byTarget.set(e.target.id, [...(byTarget.get(e.target.id) ?? []), e]);
  const existingExternalIds = new Set([...subscribers.values()].map((s) => s.subscriber.externalId));

  const created = (id: string) => (byTarget.get(id) ?? []).filter((e) => e.type === 'subscriber.created').length;
  const externalIdOf = (id: string) => subscribers.get(id)!.subscriber.externalId as string;
  const withoutCreated = [...subscribers.keys()].filter((id) => created(id) === 0).map(externalIdOf);
  const createdTwice = [...subscribers.keys()].filter((id) => created(id) > 1).map(externalIdOf);
  const stale: string[] = [];
  let subscriberTargets = 0, subscriptionTargets = 0, withSubscriber = 0;
  for (const [id, list] of byTarget) {
    const newest = list.at(-1)!;
    const object = newest.data.object;
    if (newest.target.type === 'subscriber') {
      subscriberTargets++;
      const now = subscribers.get(id);
      if (!now) { if (newest.type !== 'subscriber.deleted') stale.push(`${id} (${object.externalId}) is gone, its newest entry is ${newest.type}`); continue; }
      const { segments: _s, preferences, ...described } = object;
      if (newest.type === 'subscriber.deleted' || JSON.stringify(described) !== JSON.stringify(now.subscriber) || (preferences && JSON.stringify(preferences) !== JSON.stringify(now.preferences))) {
        stale.push(`${id} (${object.externalId}): newest ${newest.type} ${JSON.stringify(object)} but it is ${JSON.stringify(now)}`);
      }
    } else if (newest.target.type === 'subscription') {
      subscriptionTargets++;
      const owner = await service.redis.hget(service.keys.subscriptionOwners(scope.tenantId), id);
      let current = null;
      for (const holder of new Set([owner, object.externalId])) {
        if (holder) current ??= await getSubscription(service.redis, service.keys, scope, holder, id).catch(() => null);
      }
      if (current) {
        if (newest.type === 'subscription.deleted' || JSON.stringify(object) !== JSON.stringify(current)) stale.push(`${id}: newest ${newest.type} ${JSON.stringify(object)} but it is ${JSON.stringify(current)}`);
      } else if (newest.type !== 'subscription.deleted') {
        stale.push(`${id} is gone (${existingExternalIds.has(object.externalId) ? 'its' : 'with its deleted'} subscriber ${object.externalId}), its newest entry is ${newest.type}`);
      } else if (!existingExternalIds.has(object.externalId)) {
        withSubscriber++;
      }
    }
  }
  return { subscribers: subscribers.size, subscriberTargets, subscriptionTargets, withSubscriber, withoutCreated, createdTwice, stale };
}

kill('after a SIGKILL under concurrent subscriber, subscription, preference and identify writes, every write has its entries: one subscriber.created each, the newest entry describes the record', async (ctx) => {
  const { service } = ctx;
  const boot = await bootstrapWorkspace(service, 'kill');
  const scope: TenantScope = { workspaceId: boot.workspace.id, tenantId: boot.tenant.id, partitions: service.config.partitions };
  // the port the process says it listens on (PORT 0): one picked free here could be taken by another
  // shard's process before this one binds it, and that one's health answered for it
  const { web, url, env } = await startWebProcess(service);
  ctx.web = web;

  let killed = false;
  const iterations = { n: 0 };
  // a writer's failure is kept, not left a rejection nobody awaits yet: one while the test still waits
  // (or once a failed wait's after hook stopped the process) ended the whole shard process (a CI-like run)
  let failed: unknown = null;
  const writers = Array.from({ length: WRITERS }, (_, loop) => writer(url, boot.keys, loop, () => killed, iterations).catch((err) => void (failed ??= err)));
  // some 4,000 requests: on a loaded CI machine 60 s ran out (its after hook then killed the process under the writers)
  await waitFor('the writers to get going', async () => failed !== null || iterations.n >= 2 * WRITERS, 120_000, 5);
  if (failed) throw failed;
  ctx.web.child.kill('SIGKILL');
  killed = true;
  await ctx.web.exited;
  await Promise.all(writers);
  if (failed) throw failed;

  const outboxes = [service.keys.tenantOutbox(boot.tenant.id), ...Array.from({ length: scope.partitions }, (_, p) => service.keys.partitionOutbox(p))];
  const pending = async () => (await Promise.all(outboxes.map((k) => service.redis.hlen(k)))).reduce((a, b) => a + b, 0);
  const left = await pending();
  ctx.worker = startRoleProcess('worker', { ...env, AUDIT_OUTBOX_SWEEP_MS: '200' });
  // the worker process takes seconds to start on a loaded CI machine before its first sweep
  await waitFor('the sweeper to empty the outboxes', async () => (await pending()) === 0, 45_000, 100);

  const found = await audit(service, scope);
  console.log(`  killed after ${iterations.n} iterations; ${left} intents left by the dead process; ${found.subscribers} subscribers, ${found.subscriberTargets} subscriber and ${found.subscriptionTargets} subscription targets in the ledger (${found.withSubscriber} deleted with their subscriber); `
    + `${found.withoutCreated.length} without subscriber.created (${found.withoutCreated.filter((x) => x.startsWith('s-')).length} created by POST /v1/subscribers), ${found.createdTwice.length} with two, ${found.stale.length} stale`);
  assert.equal(found.withoutCreated, [], `${found.withoutCreated.length} of ${found.subscribers} subscribers have no subscriber.created`);
  assert.equal(found.createdTwice, [], 'one subscriber.created each');
  assert.equal(found.stale, [], `${found.stale.length} records whose newest entry does not describe them`);
});

kill.run();
