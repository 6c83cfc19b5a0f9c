import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { Automation } from '../../actors/automation.js';
import { createLogger } from '../../lib/log.js';
import { partitionOf } from '../../lib/partition.js';
import { WORKER_LEASES } from '../../streams/partition-leases.js';
import type { StreamEntry } from '../../streams/stream-consumer.js';
import { client } from '../helpers/api.js';
import { roleEnv } from '../helpers/audit.js';
import { startRoleProcess, stopRoleProcess, type RoleProcess } from '../helpers/processes.js';
import { bootstrapWorkspace, startTestService, type TestService } from '../helpers/service.js';
import { waitFor } from '../helpers/wait.js';
import { recordOf } from '../../lib/field-list.js';

const PRO = { attribute: 'plan', eq: 'pro' };

/** Whatever of segment `id` is left in the partitions: member sets, gone-members sets, lists, and `segs` naming it. */
async function leftovers(service: TestService, tenantId: string, id: string, externalIds: string[]): Promise<string[]> {
  const { redis, keys, config } = service;
  const left: string[] = [];
  for (let p = 0; p < config.partitions; p++) {
    if (await redis.exists(keys.segmentMembers(p, tenantId, id))) left.push(`members in p${p}: ${await redis.zcard(keys.segmentMembers(p, tenantId, id))}`);
    if (await redis.exists(keys.deletedSegmentMembers(p, tenantId, id))) left.push(`gone members in p${p}`);
    if (await redis.sismember(keys.deletedSegmentVisits(p), `${tenantId}|${id}`)) left.push(`listed to visit in p${p}`);
  }
  for (const x of externalIds) {
    const segs = await redis.hget(keys.automation(partitionOf(tenantId, x, config.partitions), tenantId, x), 'segs');
    if (segs && (JSON.parse(segs) as string[]).includes(id)) left.push(`segs of ${x}`);
  }
  return left;
}

// ---------------------------------------------------------------------------------------------

type RaceCtx = { service: TestService; api: ReturnType<typeof client>; key: string; tenantId: string };
const race = suite<RaceCtx>('a segment deleted between a worker\'s load of the definitions and its commit');

race.before(async (ctx) => {
  // no worker role: the test's own automation step handles the inbox, with a hook before its commit
  ctx.service = await startTestService('segment-delete-race');
  ctx.api = client(ctx.service.url);
  const boot = await bootstrapWorkspace(ctx.service, 'seg-delete-race');
  ctx.key = boot.keys.tenant;
  ctx.tenantId = boot.tenant.id;
});
race.after(async (ctx) => ctx.service.stop());

race('the commit adds no member and no segs id of the deleted segment, and still those of the others (probe EF)', async (ctx) => {
  const { service, api, key, tenantId } = ctx;
  const { redis, keys, config } = service;
  const doomed = (await api.post('/v1/segments', key, { slug: 'doomed', where: PRO })).body.data.id as string;
  const kept = (await api.post('/v1/segments', key, { slug: 'kept', where: PRO })).body.data.id as string;
  assert.is((await api.post('/v1/subscribers', key, { externalId: 'racer', properties: { plan: 'pro' } })).status, 201);
  const p = partitionOf(tenantId, 'racer', config.partitions);
  const entries: StreamEntry[] = ((await redis.xrange(keys.inbox(p), '-', '+')) as [string, string[]][]).map(([id, list]) => ({ id, fields: recordOf(list) }));
  assert.ok(entries.some((e) => e.fields.x === 'racer' && e.fields.n === '$subscriber.created'));

  const owner = 'test-worker';
  await redis.set(keys.lease(p, WORKER_LEASES), owner);
  let deleted = 0;
  const automation = new Automation(redis, keys, createLogger('error'), owner, {
    // the delete lands after the step computed `racer` a member of both segments from the definitions it loaded
    beforeCommit: async () => {
      deleted++;
      assert.is((await api.del('/v1/segments/doomed', key)).status, 200);
    },
  });
  await automation.handle(p, entries);
  assert.is(deleted, 1, 'the step committed once, after the delete');

  assert.is(await redis.exists(keys.segmentMembers(p, tenantId, doomed)), 0, 'no member set of the deleted segment');
  assert.equal(await redis.zrange(keys.segmentMembers(p, tenantId, kept), 0, -1), [`${(await api.get('/v1/subscribers/racer', key)).body.data.id}|racer`]);
  assert.equal(JSON.parse((await redis.hget(keys.automation(p, tenantId, 'racer'), 'segs'))!), [kept], 'segs names the kept segment only');
  assert.equal((await api.get('/v1/subscribers/racer', key)).body.data.segments, ['kept']);
  assert.equal(await leftovers(service, tenantId, doomed, ['racer']), []);
});

race.run();

// ---------------------------------------------------------------------------------------------

type LiveCtx = { service: TestService; api: ReturnType<typeof client>; key: string; tenantId: string; worker: RoleProcess };
const live = suite<LiveCtx>('a segment deleted while a worker process keeps its members');

live.before(async (ctx) => {
  ctx.service = await startTestService('segment-delete-live');
  ctx.api = client(ctx.service.url);
  const boot = await bootstrapWorkspace(ctx.service, 'seg-delete-live');
  ctx.key = boot.keys.tenant;
  ctx.tenantId = boot.tenant.id;
  ctx.worker = startRoleProcess('worker', { ...roleEnv(ctx.service), AUDIT_OUTBOX_SWEEP_MS: '200' });
});
live.after(async (ctx) => {
  await stopRoleProcess(ctx.worker);
  await ctx.service.stop();
});

live('its former members\' segs lose its id, and no member set is left, with joins racing the delete', async (ctx) => {
  const { service, api, key, tenantId } = ctx;
  const subscribers = Array.from({ length: 40 }, (_, i) => `m-${i}`);
  const created = (await api.post('/v1/segments', key, { slug: 'short-lived', where: PRO })).body.data.id as string;
  for (const externalId of subscribers) assert.is((await api.post('/v1/subscribers', key, { externalId, properties: { plan: 'pro' } })).status, 201);
  await waitFor('every subscriber a member', async () => (await api.get('/v1/segments/short-lived', key)).body.data.memberCount === subscribers.length, 30_000, 100);
  // idle members: nothing evaluates them again after the delete, only the sweeper reaches their segs
  const idle = subscribers.slice(0, 20);
  const busy = subscribers.slice(20);
  // the others leave and join again while the segment is deleted
  const toggling = (async () => {
    for (let round = 0; round < 6; round++) {
      await Promise.all(busy.map((x) => api.patch(`/v1/subscribers/${x}`, key, { properties: { plan: round % 2 ? 'pro' : 'free' } })));
    }
  })();
  await new Promise((r) => setTimeout(r, 50));
  assert.is((await api.del('/v1/segments/short-lived', key)).status, 200);
  await toggling;
  const left = await waitFor('nothing of the deleted segment left', async () => {
    const now = await leftovers(service, tenantId, created, subscribers);
    return now.length === 0 ? now : null;
  }, 30_000, 200).catch(async () => leftovers(service, tenantId, created, subscribers));
  assert.equal(left, []);
  for (const x of idle) assert.equal((await api.get(`/v1/subscribers/${x}`, key)).body.data.segments, []);
});

live.run();
