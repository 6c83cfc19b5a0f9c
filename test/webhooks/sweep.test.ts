import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { sweepWebhooks, WEBHOOK_GROUP } from '../../actors/webhook-dispatcher.js';
import { now, setClockOffset } from '../../lib/clock.js';
import { derivedId, newId } from '../../lib/ids.js';
import { createLogger } from '../../lib/log.js';
import { deliveryKeepMs, UNREAD_LEDGER_WINDOW_MS } from '../../lib/webhook-policy.js';
import { encodeCursor } from '../../http/list.js';
import { scoreAt } from '../../streams/scored-index.js';
import { findWorkspace, SYSTEM_WRITER } from '../../streams/identity.js';
import { updateEndpoint } from '../../streams/webhook-endpoints.js';
import { requeueOwed } from '../../streams/webhook-deliveries.js';
import type { RoleContext } from '../../streams/role-context.js';
import { client } from '../helpers/api.js';
import { bootstrapWorkspace, startTestService, type TestService } from '../helpers/service.js';

type Ctx = { service: TestService; role: RoleContext; api: ReturnType<typeof client> };

const sweep = suite<Ctx>('webhook housekeeping');

sweep.before(async (ctx) => {
  ctx.service = await startTestService('wh-sweep');
  const { config, redis, keys } = ctx.service;
  ctx.role = { config, redis, keys, log: createLogger('error'), target: { url: ctx.service.env.REDIS_URL! } };
  ctx.api = client(ctx.service.url);
});
sweep.after(async (ctx) => ctx.service.stop());

async function endpoint(ctx: Ctx, slug: string, key: string): Promise<string> {
  const res = await ctx.api.post(`/v1/workspaces/${slug}/webhooks`, key, { url: 'https://8.8.8.8/hooks' });
  assert.is(res.status, 201);
  return res.body.data.id;
}

sweep('a workspace without endpoints leaves the registry; one with endpoints stays', async (ctx) => {
  const { redis, keys } = ctx.service;
  const a = await bootstrapWorkspace(ctx.service, 'sw-a');
  const b = await bootstrapWorkspace(ctx.service, 'sw-b');
  const ea = await endpoint(ctx, 'sw-a', a.keys.workspace);
  await endpoint(ctx, 'sw-b', b.keys.workspace);
  assert.equal((await redis.zrange(keys.webhookWorkspaces, 0, -1)).sort(), [a.workspace.id, b.workspace.id].sort());
  await ctx.api.del(`/v1/workspaces/sw-a/webhooks/${ea}`, a.keys.workspace);
  assert.equal(await redis.zrange(keys.webhookWorkspaces, 0, -1), [b.workspace.id], 'deleting the last endpoint leaves the registry');
  await redis.zadd(keys.webhookWorkspaces, 0, a.workspace.id); // as if that step had been interrupted
  const result = await sweepWebhooks(ctx.role);
  assert.is(result.unregistered, 1);
  assert.equal(await redis.zrange(keys.webhookWorkspaces, 0, -1), [b.workspace.id]);
});

sweep('an endpoint made whose registry write Redis refuses is answered 201 with its secret, and the sweep registers its workspace (probe CB)', async (ctx) => {
  const { redis, keys } = ctx.service;
  const f = await bootstrapWorkspace(ctx.service, 'sw-f');
  const registry = await redis.zrange(keys.webhookWorkspaces, 0, -1);
  // the registry write fails (as Redis out of memory refuses it), after the endpoint's own script
  await redis.del(keys.webhookWorkspaces);
  await redis.set(keys.webhookWorkspaces, 'not a sorted set');
  try {
    const res = await ctx.api.post('/v1/workspaces/sw-f/webhooks', f.keys.workspace, { url: 'https://8.8.8.8/hooks' });
    assert.is(res.status, 201);
    assert.match(res.body.data.secret, /^whsec_/);
  } finally {
    await redis.del(keys.webhookWorkspaces);
    if (registry.length) await redis.zadd(keys.webhookWorkspaces, ...registry.flatMap((ws) => [0, ws]));
  }
  assert.is((await ctx.api.get('/v1/workspaces/sw-f/webhooks', f.keys.workspace)).body.data.total, 1, 'one endpoint: a retry is not needed');
  assert.ok((await sweepWebhooks(ctx.role)).joined >= 1);
  assert.ok((await redis.zrange(keys.webhookWorkspaces, 0, -1)).includes(f.workspace.id));
});

sweep('a workspace whose endpoint was made but not registered (its writer stopped in between) joins the registry', async (ctx) => {
  const { redis, keys } = ctx.service;
  const d = await bootstrapWorkspace(ctx.service, 'sw-d');
  await endpoint(ctx, 'sw-d', d.keys.workspace);
  await redis.zrem(keys.webhookWorkspaces, d.workspace.id); // as if the writer had stopped before joinRegistry
  const e = await bootstrapWorkspace(ctx.service, 'sw-e');
  await redis.sadd(keys.webhookForwarding, e.workspace.id); // joined forwarding, then stopped before its script: no endpoint
  const result = await sweepWebhooks(ctx.role);
  assert.is(result.joined, 1);
  const registry = await redis.zrange(keys.webhookWorkspaces, 0, -1);
  assert.ok(registry.includes(d.workspace.id), 'the workspace with an endpoint is registered');
  assert.not.ok(registry.includes(e.workspace.id), 'the one without is not');
  assert.is((await sweepWebhooks(ctx.role)).joined, 0, 'once');
});

sweep('ledgers of workspaces without endpoints keep the last hour only; read ledgers are left to their group', async (ctx) => {
  const { redis, keys } = ctx.service;
  const c = await bootstrapWorkspace(ctx.service, 'sw-c');
  const b = await bootstrapWorkspace(ctx.service, 'sw-b');
  const at = now();
  for (const ws of [c.workspace.id, b.workspace.id]) {
    await redis.del(keys.ledger(ws));
    await redis.xadd(keys.ledger(ws), `${at - UNREAD_LEDGER_WINDOW_MS - 60_000}-0`, 'kind', 'audit', 'payload', '{}');
    await redis.xadd(keys.ledger(ws), `${at - 60_000}-0`, 'kind', 'audit', 'payload', '{}');
  }
  const result = await sweepWebhooks(ctx.role);
  assert.ok(result.trimmed >= 1);
  assert.is(await redis.xlen(keys.ledger(c.workspace.id)), 1, 'the hour-old entry is gone');
  assert.is(await redis.xlen(keys.ledger(b.workspace.id)), 2, 'a ledger the dispatchers read is trimmed by their group only');
});

sweep('a disabled endpoint\'s queued attempts due before its deliveries\' keep began go; later ones wait for a re-enable', async (ctx) => {
  const { redis, keys, config } = ctx.service;
  const q = await bootstrapWorkspace(ctx.service, 'sw-q');
  const id = await endpoint(ctx, 'sw-q', q.keys.workspace);
  assert.is((await ctx.api.patch(`/v1/workspaces/sw-q/webhooks/${id}`, q.keys.workspace, { enabled: false })).status, 200);
  const due = keys.webhookDue(q.workspace.id, id);
  const at = now();
  const keep = deliveryKeepMs(config.retentionMs, config.webhookRetryScheduleMs);
  await redis.zadd(due, at - keep - 60_000, 'whd_old', at - keep - 1, 'whd_old#1', at - keep + 60_000, 'whd_kept', at - config.retentionMs - 60_000, 'whd_past_retention', at - 60_000, 'whd_recent');
  const result = await sweepWebhooks(ctx.role);
  assert.is(result.dropped, 2);
  assert.equal(await redis.zrange(due, 0, -1), ['whd_kept', 'whd_past_retention', 'whd_recent']);
  assert.is((await sweepWebhooks(ctx.role)).dropped, 0);
});

sweep('an endpoint disabled by a dispatcher that stopped before its audit event gets it from the sweep, once, under a fixed id', async (ctx) => {
  const { redis, keys } = ctx.service;
  const d = await bootstrapWorkspace(ctx.service, 'sw-d');
  const id = await endpoint(ctx, 'sw-d', d.keys.workspace);
  // what lua/recordWebhookAttempts leaves when the streak disables the endpoint, the dispatcher then killed
  const disabledEvents = async () => (await redis.xrange(keys.ledger(d.workspace.id), '-', '+')).map(([, f]) => JSON.parse(f[3]!)).filter((p) => p.type === 'webhook.disabled');
  // a note younger than a minute belongs to the dispatcher that is appending the event right now
  await redis.hset(keys.webhookUnannounced(d.workspace.id), id, new Date(now() - 30_000).toISOString());
  assert.is((await sweepWebhooks(ctx.role)).announced, 0);
  const disabledAt = new Date(now() - 61_000).toISOString();
  await redis.hset(keys.webhookEndpoint(d.workspace.id, id), 'enabled', '0', 'disabledAt', disabledAt);
  await redis.hset(keys.webhookUnannounced(d.workspace.id), id, disabledAt);
  assert.is((await disabledEvents()).length, 0);
  assert.is((await sweepWebhooks(ctx.role)).announced, 1);
  const [event] = await disabledEvents();
  assert.equal([event.target.id, event.actor.type, event.data.object.enabled, event.changes], [id, 'system', false, { enabled: false, disabledAt }]);
  assert.is(event.id, derivedId('webhookEvent', Date.parse(disabledAt), `webhook.disabled|${id}|${disabledAt}`));
  assert.is(await redis.hlen(keys.webhookUnannounced(d.workspace.id)), 0, 'the note is cleared');
  assert.is((await sweepWebhooks(ctx.role)).announced, 0);
  // killed after the append but before the note was cleared: the next sweep appends the same event (same id) again
  await redis.hset(keys.webhookUnannounced(d.workspace.id), id, disabledAt);
  await sweepWebhooks(ctx.role);
  assert.equal((await disabledEvents()).map((e) => e.id), [event.id, event.id]);
  // deleting the endpoint drops a note still there
  await redis.hset(keys.webhookUnannounced(d.workspace.id), id, disabledAt);
  assert.is((await ctx.api.del(`/v1/workspaces/sw-d/webhooks/${id}`, d.keys.workspace)).status, 200);
  assert.is(await redis.hlen(keys.webhookUnannounced(d.workspace.id)), 0);
});

sweep('delivery indexes lose ids past their keep (the retention after the last scheduled attempt), by when each delivery was made', async (ctx) => {
  const { redis, keys, config } = ctx.service;
  const b = await bootstrapWorkspace(ctx.service, 'sw-b');
  const [e] = await redis.zrange(keys.webhookEndpoints(b.workspace.id), 0, 0);
  const keep = deliveryKeepMs(config.retentionMs, config.webhookRetryScheduleMs);
  const old = derivedId('webhookDelivery', now() - keep - 60_000, 'old');
  const fresh = derivedId('webhookDelivery', now() - keep - 60_000, 'fresh'); // an old event delivered lately
  // made more than a retention ago, its retries may still run (probe R: it was pruned, its record expired)
  const retrying = derivedId('webhookDelivery', now() - config.retentionMs - 60_000, 'retrying');
  for (const index of [keys.webhookDeliveries(b.workspace.id, e!), keys.webhookDeliveries(b.workspace.id, e!, 'failed')]) {
    await redis.zadd(index, scoreAt(now() - keep - 60_000), old, scoreAt(now() - config.retentionMs - 60_000), retrying, scoreAt(now() - 60_000), fresh);
  }
  const result = await sweepWebhooks(ctx.role);
  assert.is(result.pruned, 2);
  assert.equal(await redis.zrange(keys.webhookDeliveries(b.workspace.id, e!), 0, -1), [retrying, fresh]);
  assert.equal(await redis.zrange(keys.webhookDeliveries(b.workspace.id, e!, 'failed'), 0, -1), [retrying, fresh]);
});

sweep('deliveries indexed at score 0 (by an earlier version) get their createdAt score, in their old order within a millisecond; old cursors go on', async (ctx) => {
  const { redis, keys } = ctx.service;
  const ws = await bootstrapWorkspace(ctx.service, 'sw-legacy');
  const e = await endpoint(ctx, 'sw-legacy', ws.keys.workspace);
  const base = `/v1/workspaces/sw-legacy/webhooks/${e}/deliveries`;
  const t = now() - 60_000;
  // as stored before: score 0, so listed by id (event time, then a hash), which need not be createdAt order
  const legacy = [
    { seed: 'a', eventMs: t, createdMs: t + 20 },
    { seed: 'b', eventMs: t + 1, createdMs: t + 10 },
    { seed: 'c', eventMs: t + 2, createdMs: t + 10 },
  ].map((d) => ({ ...d, id: derivedId('webhookDelivery', d.eventMs, d.seed) }));
  for (const d of legacy) {
    const iso = new Date(d.createdMs).toISOString();
    await redis.hset(keys.webhookDelivery(ws.workspace.id, d.id), {
      id: d.id, endpointId: e, eventId: `whe_${d.id.slice(4)}`, eventType: 'legacy.event', status: 'success', attempts: 1, replays: 0, n: 1,
      createdAt: iso, updatedAt: iso, nextAttemptAt: '', lastAttemptAt: iso, lastStatusCode: 204,
    });
    for (const status of [undefined, 'success']) await redis.zadd(keys.webhookDeliveries(ws.workspace.id, e, status), 0, d.id);
  }
  const expired = derivedId('webhookDelivery', t + 3, 'expired'); // its record is gone
  for (const status of [undefined, 'pending']) await redis.zadd(keys.webhookDeliveries(ws.workspace.id, e, status), 0, expired);
  const [a, b, c] = legacy.map((d) => d.id) as [string, string, string];

  const before = await ctx.api.get(`${base}?limit=2`, ws.keys.workspace);
  assert.equal(before.body.data.items.map((d: any) => d.id), [c], 'before the sweep they list as they did, by id (the expired one dropped)');
  const result = await sweepWebhooks(ctx.role);
  assert.is(result.rescored, 4);
  assert.is(Number(await redis.zscore(keys.webhookDeliveries(ws.workspace.id, e), a)), scoreAt(t + 20));
  assert.equal([await redis.zscore(keys.webhookDeliveries(ws.workspace.id, e), b), await redis.zscore(keys.webhookDeliveries(ws.workspace.id, e), c)],
    [String(scoreAt(t + 10, 0)), String(scoreAt(t + 10, 1))], 'same millisecond: numbered in their old order (by id)');
  assert.is(await redis.zcard(keys.webhookDeliveries(ws.workspace.id, e, 'pending')), 0, 'an id whose record expired leaves every index');

  for (const status of ['', '?status=success']) {
    const list = await ctx.api.get(`${base}${status}`, ws.keys.workspace);
    assert.equal([list.body.data.total, list.body.data.items.map((d: any) => d.id)], [3, [a, c, b]], `newest createdAt first ${status}`);
  }
  const resumed = await ctx.api.get(`${base}?cursor=${before.body.data.nextCursor}`, ws.keys.workspace);
  assert.equal(resumed.body.data.items.map((d: any) => d.id), [b], 'a cursor taken before the sweep goes on after its delivery\'s new place');
  const fromA = await ctx.api.get(`${base}?cursor=${encodeCursor(a)}`, ws.keys.workspace);
  assert.equal(fromA.body.data.items.map((d: any) => d.id), [c, b], 'so does a cursor of the list ordered by id (a bare id)');
  const fromGone = await ctx.api.get(`${base}?cursor=${encodeCursor(expired)}`, ws.keys.workspace);
  assert.is(fromGone.status, 200, 'a delivery that left the index is placed by the time in its id');
  const bogus = await ctx.api.get(`${base}?cursor=${encodeCursor('nope')}`, ws.keys.workspace);
  assert.equal([bogus.status, bogus.body.error.code, bogus.body.error.param], [400, 'validation', 'cursor']);

  assert.is((await sweepWebhooks(ctx.role)).rescored, 0, 'nothing left to rescore');
  // a dispatcher of the earlier version, during a rolling upgrade, moves a delivery to another status at score 0
  await redis.zrem(keys.webhookDeliveries(ws.workspace.id, e, 'success'), a);
  await redis.zadd(keys.webhookDeliveries(ws.workspace.id, e, 'failed'), 0, a);
  assert.is((await sweepWebhooks(ctx.role)).rescored, 1);
  assert.is(await redis.zscore(keys.webhookDeliveries(ws.workspace.id, e, 'failed'), a), String(scoreAt(t + 20)), 'it takes its score in the index of all');
});

sweep('a re-enable whose request died before its re-queue: the sweep re-queues the failed and pending deliveries once its note is a minute old, and clears the note; a finished one leaves none', async (ctx) => {
  const { redis, keys } = ctx.service;
  const r = await bootstrapWorkspace(ctx.service, 'sw-requeue');
  const ws = r.workspace.id;
  const e = await endpoint(ctx, 'sw-requeue', r.keys.workspace);
  const path = `/v1/workspaces/sw-requeue/webhooks/${e}`;
  // two deliveries waiting for their retry in 5 hours, one succeeded
  const later = now() + 5 * 3_600_000;
  const delivery = async (status: string) => {
    const id = newId('webhookDelivery');
    await redis.hset(keys.webhookDelivery(ws, id), 'id', id, 'endpointId', e, 'status', status, 'nextAttemptAt', status === 'success' ? '' : String(later));
    await redis.zadd(keys.webhookDeliveries(ws, e, status), scoreAt(now()), id);
    if (status !== 'success') await redis.zadd(keys.webhookDue(ws, e), later, id);
    return id;
  };
  const [failed, pending, done] = [await delivery('failed'), await delivery('pending'), await delivery('success')];
  assert.is((await ctx.api.patch(path, r.keys.workspace, { enabled: false })).status, 200);
  // the re-enable's script, and then the process dies: the note stays, nothing is re-queued
  const workspace = (await findWorkspace(redis, keys, ws))!;
  const updated = (await updateEndpoint(redis, keys, workspace, e, { enabled: true }, SYSTEM_WRITER))!;
  assert.is(updated.reenabled, true);
  assert.equal(await redis.hgetall(keys.webhookRequeues(ws)), { [e]: String(updated.atMs) });
  assert.is(Number(await redis.zscore(keys.webhookDue(ws, e), failed)), later);
  try {
    assert.is((await sweepWebhooks(ctx.role)).requeued, 0, 'a young note is left to its request');
    setClockOffset(61_000);
    assert.is((await sweepWebhooks(ctx.role)).requeued, 1);
  } finally {
    setClockOffset(0);
  }
  for (const id of [failed, pending]) {
    assert.is(Number(await redis.zscore(keys.webhookDue(ws, e), id)), updated.atMs, 'due at the re-enable');
    assert.is(await redis.hget(keys.webhookDelivery(ws, id), 'nextAttemptAt'), String(updated.atMs));
  }
  assert.is(await redis.zscore(keys.webhookDue(ws, e), done), null);
  assert.equal(await redis.hgetall(keys.webhookRequeues(ws)), {}, 'the note is cleared');
  assert.is((await sweepWebhooks(ctx.role)).requeued, 0);

  // through the API: the request re-queues and clears its note before it answers
  await redis.zadd(keys.webhookDue(ws, e), later, failed);
  assert.is((await ctx.api.patch(path, r.keys.workspace, { enabled: false })).status, 200);
  assert.is((await ctx.api.patch(path, r.keys.workspace, { enabled: true })).status, 200);
  assert.ok(Number(await redis.zscore(keys.webhookDue(ws, e), failed)) <= now());
  assert.equal(await redis.hgetall(keys.webhookRequeues(ws)), {});

  // an endpoint deleted with a note owed takes the note with it, and a stale note of a gone endpoint re-queues nothing
  assert.is((await ctx.api.patch(path, r.keys.workspace, { enabled: false })).status, 200);
  await updateEndpoint(redis, keys, workspace, e, { enabled: true }, SYSTEM_WRITER);
  assert.is((await ctx.api.del(path, r.keys.workspace)).status, 200);
  assert.equal(await redis.hgetall(keys.webhookRequeues(ws)), {});
  await redis.hset(keys.webhookRequeues(ws), e, '1000');
  await redis.zadd(keys.webhookDeliveries(ws, e, 'failed'), scoreAt(now()), failed); // (as a purge not done yet)
  assert.is(await requeueOwed(redis, keys, ws, e, 1000), 0);
  assert.equal(await redis.hgetall(keys.webhookRequeues(ws)), {});
  await redis.del(keys.webhookDeliveries(ws, e, 'failed'));
  assert.is(await redis.exists(keys.webhookDue(ws, e)), 0, 'no queue outlives its endpoint');
});

sweep('a ledger whose entries were trimmed before the dispatchers read them is reported, with how many were lost; one read in time is not', async (ctx) => {
  const { redis, keys } = ctx.service;
  const r = await bootstrapWorkspace(ctx.service, 'sw-lag');
  const ws = r.workspace.id;
  await endpoint(ctx, 'sw-lag', r.keys.workspace);
  const ledger = keys.ledger(ws);
  await redis.xgroup('CREATE', ledger, WEBHOOK_GROUP, '0', 'MKSTREAM');
  assert.is((await sweepWebhooks(ctx.role)).behind.filter((b) => b.workspaceId === ws).length, 0, 'unread, but nothing lost and far from the cap');
  const readAll = async () => {
    const read = (await redis.xreadgroup('GROUP', WEBHOOK_GROUP, 'c', 'COUNT', 1_000, 'STREAMS', ledger, '>')) as [string, [string, string[]][]][] | null;
    if (read) await redis.xack(ledger, WEBHOOK_GROUP, ...read[0]![1].map(([id]) => id));
  };
  await readAll(); // (a group that has read keeps count of what it read)
  // appends trimming the ledger to 5 entries while nobody reads it (as at the cap, with dispatchers far behind)
  for (let i = 0; i < 10; i++) await redis.xadd(ledger, 'MAXLEN', '5', '*', 'k', 'audit', 'p', '{}');
  const [lag] = (await sweepWebhooks(ctx.role)).behind.filter((b) => b.workspaceId === ws);
  assert.equal(lag, { workspaceId: ws, unread: 10, lost: 5 });
  // read and acked: nothing to report
  await readAll();
  assert.is((await sweepWebhooks(ctx.role)).behind.filter((b) => b.workspaceId === ws).length, 0);
});

sweep.run();
