import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import type { Redis } from 'ioredis';
import { createLogger } from '../../lib/log.js';
import { partitionOf } from '../../lib/partition.js';
import { commandName } from '../../streams/lua-scripts.js';
import { connectRedis } from '../../streams/redis.js';
import { addTopicMembers, removeTopicMembers, sweepTopicMirrors } from '../../streams/topic-members.js';
import { client } from '../helpers/api.js';
import { killUnderLoad, startSweeper, startWebProcess, killSuite } from '../helpers/audit.js';
import { bootstrapWorkspace, startTestService, type TestService } from '../helpers/service.js';
import { waitFor } from '../helpers/wait.js';

// Topic membership is written twice: the subscriber's topic set in its partition, then the topic's
// member set in the tenant slot. A process killed between the two must not leave them disagreeing
// for good (a removed subscriber still listed, counted and pushed by topic sends; an added one
// missed): the partition write records a mirror entry with it, and the worker's sweeper mirrors
// what a dead writer left.

type Api = ReturnType<typeof client>;
type Boot = Awaited<ReturnType<typeof bootstrapWorkspace>>;

function expect(res: { status: number; text: string; body: any }, ...ok: number[]) {
  assert.ok(ok.includes(res.status), `${res.status}: ${res.text}`);
  return res.body.data;
}

/** The mirror entries left in the partitions. */
async function pendingMirrors(service: TestService): Promise<number> {
  const counts = await Promise.all(Array.from({ length: service.config.partitions }, (_, p) => service.redis.hlen(service.keys.topicMirrors(p))));
  return counts.reduce((a, b) => a + b, 0);
}

/** Where the topic's member set and the subscribers' partition sets disagree, for `names`. */
async function disagreements(service: TestService, tenantId: string, topicId: string, names: string[]): Promise<{ zsetOnly: string[]; partitionOnly: string[] }> {
  const { redis, keys, config } = service;
  const zset = new Set(await redis.zrange(keys.topicMembers(tenantId, topicId), 0, -1));
  const pipeline = redis.pipeline();
  for (const x of names) pipeline.sismember(keys.subscriberTopics(partitionOf(tenantId, x, config.partitions), tenantId, x), topicId);
  const inPartition = ((await pipeline.exec()) ?? []).map(([, n]) => n === 1);
  return {
    zsetOnly: names.filter((x, i) => zset.has(x) && !inPartition[i]),
    partitionOnly: names.filter((x, i) => !zset.has(x) && inPartition[i]),
  };
}

type Ctx = { service: TestService; api: Api; boot: Boot; dying?: Redis };
const died = suite<Ctx>('a topic membership call that died between the partition write and the member set');

died.before(async (ctx) => {
  ctx.service = await startTestService('topic-mirror');
  ctx.api = client(ctx.service.url);
  ctx.boot = await bootstrapWorkspace(ctx.service, 'topic-mirror');
  // a connection whose process "dies" at the member set write: everything before it is applied
  ctx.dying = connectRedis({ url: ctx.service.env.REDIS_URL! });
  (ctx.dying as unknown as Record<string, unknown>)[commandName('syncTopicMembers')] = () => Promise.reject(new Error('killed'));
});
died.after(async (ctx) => {
  ctx.dying?.disconnect();
  await ctx.service.stop();
});

const scopeOf = (ctx: Ctx) => ({ workspaceId: ctx.boot.workspace.id, tenantId: ctx.boot.tenant.id, partitions: ctx.service.config.partitions });
const log = createLogger('error');

died('a call that completes leaves no mirror entry behind', async (ctx) => {
  const { api, boot, service } = ctx;
  const t = expect(await api.post('/v1/topics', boot.keys.tenant, { slug: 'mirror-live' }), 201);
  expect(await api.post(`/v1/topics/${t.slug}/subscribers`, boot.keys.tenant, { externalIds: ['live-1', 'live-2', 'live-3'] }), 200);
  expect(await api.post(`/v1/topics/${t.slug}/subscribers/remove`, boot.keys.tenant, { externalIds: ['live-2'] }), 200);
  assert.is(await pendingMirrors(service), 0);
});

died('a remove: the member stays listed and counted until the sweep, which takes it out once; an add: the sweep lists it with the join time of the call', async (ctx) => {
  const { api, boot, service } = ctx;
  const { redis, keys } = service;
  const scope = scopeOf(ctx);
  const t = expect(await api.post('/v1/topics', boot.keys.tenant, { slug: 'mirror-dead' }), 201);
  const topic = { id: t.id, slug: t.slug };
  expect(await api.post(`/v1/topics/${t.slug}/subscribers`, boot.keys.tenant, { externalIds: ['leaver', 'stayer'] }), 200);

  // the remove writes the partition, then its process dies
  await removeTopicMembers(ctx.dying!, keys, scope, topic, ['leaver']).then(() => assert.unreachable('the member set write cannot run'), (err: Error) => assert.is(err.message, 'killed'));
  // the add (of a subscriber it creates, and of an existing one) likewise
  const before = Date.now();
  await addTopicMembers(ctx.dying!, keys, scope, topic, ['joiner', 'existing-joiner']).catch((err: Error) => assert.is(err.message, 'killed'));
  const after = Date.now();
  assert.equal(await disagreements(service, scope.tenantId, t.id, ['leaver', 'stayer', 'joiner', 'existing-joiner']), { zsetOnly: ['leaver'], partitionOnly: ['joiner', 'existing-joiner'] });
  assert.is(await pendingMirrors(service), 3, 'one mirror entry per partition change');
  // a retry by nobody: the readers see the stale copy
  assert.is(expect(await api.get(`/v1/topics/${t.slug}`, boot.keys.tenant), 200).subscriberCount, 2);

  // a live writer's entries are left alone while younger than the sweep's age
  assert.equal(await sweepTopicMirrors(redis, keys, scope.partitions, 60_000, log), { mirrored: 0, kept: 0 });
  assert.equal(await sweepTopicMirrors(redis, keys, scope.partitions, 0, log), { mirrored: 3, kept: 0 });
  assert.is(await pendingMirrors(service), 0);
  assert.equal(await sweepTopicMirrors(redis, keys, scope.partitions, 0, log), { mirrored: 0, kept: 0 }, 'once');

  assert.equal(await disagreements(service, scope.tenantId, t.id, ['leaver', 'stayer', 'joiner', 'existing-joiner']), { zsetOnly: [], partitionOnly: [] });
  const listed = expect(await api.get(`/v1/topics/${t.slug}/subscribers`, boot.keys.tenant), 200);
  assert.equal(listed.items.map((m: any) => m.externalId).sort(), ['existing-joiner', 'joiner', 'stayer']);
  assert.is(listed.total, 3);
  for (const m of listed.items.filter((i: any) => i.externalId !== 'stayer')) {
    const joined = Date.parse(m.joinedAt);
    assert.ok(joined >= before - 1 && joined <= after, `${m.externalId} joined at the call (${m.joinedAt})`);
  }
});

died('the sweep mirrors what the partition says now: a member that joined again after a dead remove stays, one removed after a dead add goes', async (ctx) => {
  const { api, boot, service } = ctx;
  const scope = scopeOf(ctx);
  const t = expect(await api.post('/v1/topics', boot.keys.tenant, { slug: 'mirror-later' }), 201);
  const topic = { id: t.id, slug: t.slug };
  expect(await api.post(`/v1/topics/${t.slug}/subscribers`, boot.keys.tenant, { externalIds: ['back'] }), 200);
  await removeTopicMembers(ctx.dying!, service.keys, scope, topic, ['back']).catch((err: Error) => assert.is(err.message, 'killed'));
  await addTopicMembers(ctx.dying!, service.keys, scope, topic, ['gone']).catch((err: Error) => assert.is(err.message, 'killed'));
  // later calls that complete
  expect(await api.post(`/v1/topics/${t.slug}/subscribers`, boot.keys.tenant, { externalIds: ['back'] }), 200);
  expect(await api.post(`/v1/topics/${t.slug}/subscribers/remove`, boot.keys.tenant, { externalIds: ['gone'] }), 200);
  assert.equal(await sweepTopicMirrors(service.redis, service.keys, scope.partitions, 0, log), { mirrored: 2, kept: 0 });
  assert.equal(await service.redis.zrange(service.keys.topicMembers(scope.tenantId, t.id), 0, -1), ['back']);
  assert.equal(await disagreements(service, scope.tenantId, t.id, ['back', 'gone']), { zsetOnly: [], partitionOnly: [] });
});

died('a dead call on a topic deleted since: the sweep drops its entry, brings back no member set, and takes the id out of the subscriber\'s own set (probe BE: adds racing a delete left it there for good)', async (ctx) => {
  const { api, boot, service } = ctx;
  const scope = scopeOf(ctx);
  const t = expect(await api.post('/v1/topics', boot.keys.tenant, { slug: 'mirror-deleted' }), 201);
  // also what an add whose member set write came after the delete (a 404) leaves: the partition written, the member set never
  await addTopicMembers(ctx.dying!, service.keys, scope, { id: t.id, slug: t.slug }, ['orphan']).catch((err: Error) => assert.is(err.message, 'killed'));
  const own = service.keys.subscriberTopics(partitionOf(scope.tenantId, 'orphan', scope.partitions), scope.tenantId, 'orphan');
  assert.is(await service.redis.sismember(own, t.id), 1);
  expect(await api.del(`/v1/topics/${t.slug}`, boot.keys.tenant), 200);
  assert.equal(await sweepTopicMirrors(service.redis, service.keys, scope.partitions, 0, log), { mirrored: 1, kept: 0 });
  assert.is(await service.redis.exists(service.keys.topicMembers(scope.tenantId, t.id)), 0);
  assert.is(await pendingMirrors(service), 0);
  assert.is(await service.redis.sismember(own, t.id), 0, 'the deleted topic\'s id left the subscriber\'s set');
});

died.run();

const CALLS = 600;
const ROUNDS = 6;

const kill = killSuite('topic membership calls SIGKILLed mid-call leave the member set agreeing after the sweep', 'topic-mirror-kill');

kill('600 single-id removes, then adds, at once on a web process SIGKILLed under them: after the sweep the member set and the partitions agree', async (ctx) => {
  const { service } = ctx;
  const boot = await bootstrapWorkspace(service, 'mirror-kill');
  const tenantId = boot.tenant.id;
  const api = client(service.url);
  const t = expect(await api.post('/v1/topics', boot.keys.tenant, { slug: 'mirror-kill' }), 201);
  const names = Array.from({ length: CALLS }, (_, i) => `m-${i}`);
  for (let i = 0; i < names.length; i += 500) expect(await api.post(`/v1/topics/${t.slug}/subscribers`, boot.keys.tenant, { externalIds: names.slice(i, i + 500) }), 200);

  // remove rounds, then add rounds: each a web process killed while the calls are in flight, until a
  // kill leaves the copies disagreeing (or ROUNDS)
  let kills = 0;
  let left = { zsetOnly: [] as string[], partitionOnly: [] as string[] };
  let pending = 0;
  for (const path of ['subscribers/remove', 'subscribers']) {
    // each round goes on where the last stopped: calls on subscribers already changed write nothing
    let next = 0;
    for (let round = 0; round < ROUNDS; round++) {
      const { web, api: webApi } = await startWebProcess(service);
      ctx.web = web;
      kills++;
      let answered = 0;
      await killUnderLoad(web, 100, async () => {
        const x = names[next++ % names.length]!; // a call left unanswered by the kill is not retried
        const res = await webApi.post(`/v1/topics/${t.slug}/${path}`, boot.keys.tenant, { externalIds: [x] });
        if (res.status !== 200) throw new Error(`${res.status}: ${res.text}`);
        answered++;
      }, async () => answered >= CALLS / 4);
      ctx.web = undefined;
      left = await disagreements(service, tenantId, t.id, names);
      pending = await pendingMirrors(service);
      if (left.zsetOnly.length + left.partitionOnly.length > 0) break;
    }
    if (left.zsetOnly.length + left.partitionOnly.length > 0) break;
  }
  if (process.env.HERALD_TEST_VERBOSE) console.log(`  ${kills} kill(s): ${left.zsetOnly.length} listed but removed, ${left.partitionOnly.length} joined but not listed, ${pending} mirror entries left`);

  ctx.worker = startSweeper(service);
  // the worker process takes seconds to start on a loaded CI machine before its first sweep
  await waitFor('the sweeper to mirror what the dead calls left', async () => (await pendingMirrors(service)) === 0, 45_000, 100);
  assert.equal(await disagreements(service, tenantId, t.id, names), { zsetOnly: [], partitionOnly: [] }, 'the member set and the partitions agree');
  const topic = expect(await api.get(`/v1/topics/${t.slug}`, boot.keys.tenant), 200);
  assert.is(topic.subscriberCount, await service.redis.zcard(service.keys.topicMembers(tenantId, t.id)));
  // a kill left copies disagreeing (else this proved nothing)
  assert.ok(left.zsetOnly.length + left.partitionOnly.length > 0, 'a kill left the copies disagreeing');
});

kill.run();
