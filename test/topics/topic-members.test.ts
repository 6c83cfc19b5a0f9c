import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { partitionOf } from '../../lib/partition.js';
import { topicMembers, topicsOfSubscriber } from '../../streams/topic-members.js';
import { client } from '../helpers/api.js';
import { bootstrapWorkspace, makeKey, startTestService, type TestService } from '../helpers/service.js';
import { waitFor } from '../helpers/wait.js';

type Ctx = { service: TestService; api: ReturnType<typeof client>; key: string; tenantId: string; workspaceId: string };
const members = suite<Ctx>('topic members');

members.before(async (ctx) => {
  ctx.service = await startTestService('topic-members', {}, ['web', 'worker']);
  ctx.api = client(ctx.service.url);
  const { keys, tenant, workspace } = await bootstrapWorkspace(ctx.service, 'members');
  ctx.key = keys.tenant;
  ctx.tenantId = tenant.id;
  ctx.workspaceId = workspace.id;
});
members.after(async (ctx) => ctx.service.stop());

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

async function topic(ctx: Ctx, slug: string): Promise<{ id: string; slug: string }> {
  const res = await ctx.api.post('/v1/topics', ctx.key, { slug });
  assert.is(res.status, 201);
  return res.body.data;
}

/** Last stream sequence issued to each externalId (0 for none): a write to a stream moves it. */
async function sequences({ service, tenantId }: Ctx, externalIds: string[]): Promise<number[]> {
  return Promise.all(externalIds.map(async (x) => Number((await service.redis.hget(service.keys.sequences(partitionOf(tenantId, x, service.config.partitions)), `${tenantId}|${x}`)) ?? 0)));
}

async function allMembers(ctx: Ctx, slug: string, limit: number): Promise<{ externalIds: string[]; totals: number[]; pages: number }> {
  const externalIds: string[] = [];
  const totals: number[] = [];
  let cursor: string | null = null;
  let pages = 0;
  for (; pages < 1000; ) {
    const res: any = await ctx.api.get(`/v1/topics/${slug}/subscribers?limit=${limit}${cursor ? `&cursor=${cursor}` : ''}`, ctx.key);
    assert.is(res.status, 200);
    pages++;
    externalIds.push(...res.body.data.items.map((m: any) => m.externalId));
    totals.push(res.body.data.total);
    cursor = res.body.data.nextCursor;
    if (!res.body.data.hasMore) {
      assert.is(cursor, null);
      break;
    }
  }
  return { externalIds, totals, pages };
}

async function timeline(ctx: Ctx, externalId: string) {
  return ctx.api.get(`/v1/subscribers/${encodeURIComponent(externalId)}/timeline`, ctx.key);
}

members('a thousand externalIds join in one call; a thousand and one is refused', async (ctx) => {
  const { api, key } = ctx;
  await topic(ctx, 'bulk');
  const ids = Array.from({ length: 1000 }, (_, i) => `bulk-${i}`);
  const res = await api.post('/v1/topics/bulk/subscribers', key, { externalIds: ids });
  assert.is(res.status, 200);
  assert.equal(res.body.data, { added: 1000, alreadyMembers: 0, subscribersCreated: 1000, subscriberCount: 1000 });
  assert.is((await api.get('/v1/topics/bulk', key)).body.data.subscriberCount, 1000);
  assert.ok((await sequences(ctx, ids)).every((s) => s === 2), 'each stream holds $subscriber.created and $subscriber.updated');
  const cases: [unknown, string][] = [
    [{ externalIds: [...ids, 'one-too-many'] }, 'externalIds'],
    [{ externalIds: [] }, 'externalIds'],
    [{ externalIds: 'bulk-1' }, 'externalIds'],
    [{ externalIds: ['ok', ''] }, 'externalIds[1]'],
    [{ externalIds: ['x'.repeat(257)] }, 'externalIds[0]'],
    [{ externalIds: ['ok', 7] }, 'externalIds[1]'],
    [{}, 'externalIds'],
  ];
  for (const [body, param] of cases) {
    const bad = await api.post('/v1/topics/bulk/subscribers', key, body);
    assert.is(bad.status, 400);
    assert.is(bad.body.error.code, 'validation');
    assert.ok(bad.body.error.details.some((d: any) => d.param === param), `${param} in ${JSON.stringify(bad.body.error.details)}`);
  }
  assert.is((await api.get('/v1/topics/bulk', key)).body.data.subscriberCount, 1000);
});

members('adding members again writes nothing to their streams and keeps their join time', async (ctx) => {
  const { api, key } = ctx;
  await topic(ctx, 'again');
  const first = await api.post('/v1/topics/again/subscribers', key, { externalIds: ['again-1', 'again-2', 'again-1', 'again-1'] });
  assert.equal(first.body.data, { added: 2, alreadyMembers: 0, subscribersCreated: 2, subscriberCount: 2 }, 'a repeated id counts once');
  const joined = (await api.get('/v1/topics/again/subscribers', key)).body.data.items;
  const before = await sequences(ctx, ['again-1', 'again-2']);
  assert.equal(before, [2, 2]);
  await sleep(5);
  const second = await api.post('/v1/topics/again/subscribers', key, { externalIds: ['again-2', 'again-1', 'again-3'] });
  assert.equal(second.body.data, { added: 1, alreadyMembers: 2, subscribersCreated: 1, subscriberCount: 3 });
  assert.equal(await sequences(ctx, ['again-1', 'again-2']), before, 'no new stream event for members');
  const after = (await api.get('/v1/topics/again/subscribers', key)).body.data.items;
  assert.is(after[0].externalId, 'again-3');
  assert.equal(after.slice(1), joined, 'first join time kept');
});

members('adding an existing subscriber writes only $subscriber.updated', async (ctx) => {
  const { api, key } = ctx;
  await topic(ctx, 'existing');
  await api.post('/v1/events', key, { externalId: 'tracked-1', name: 'signed.up' });
  const res = await api.post('/v1/topics/existing/subscribers', key, { externalIds: ['tracked-1'] });
  assert.equal(res.body.data, { added: 1, alreadyMembers: 0, subscribersCreated: 0, subscriberCount: 1 });
  assert.equal(await sequences(ctx, ['tracked-1']), [3]);
});

members('a subscriber created by a topic add shows $subscriber.created then $subscriber.updated', async (ctx) => {
  const { api, key } = ctx;
  await topic(ctx, 'welcome');
  await api.post('/v1/topics/welcome/subscribers', key, { externalIds: ['newcomer'] });
  const items = await waitFor('the worker to apply both events', async () => {
    const res = await timeline(ctx, 'newcomer');
    return res.status === 200 && res.body.data.items.length === 2 ? res.body.data.items : null;
  });
  assert.equal(items.map((e: any) => e.name), ['$subscriber.updated', '$subscriber.created']);
  assert.equal(items.map((e: any) => e.sequence), [2, 1]);
  assert.is(items[0].source, 'system');
  assert.equal(items[0].data, { changes: { topics: { added: ['welcome'] } } });
});

members('removing writes $subscriber.updated for members only and creates nobody', async (ctx) => {
  const { api, key } = ctx;
  await topic(ctx, 'leaving');
  await api.post('/v1/topics/leaving/subscribers', key, { externalIds: ['leave-1', 'leave-2'] });
  const res = await api.post('/v1/topics/leaving/subscribers/remove', key, { externalIds: ['leave-1', 'ghost', 'leave-1'] });
  assert.is(res.status, 200);
  assert.equal(res.body.data, { removed: 1, notMembers: 1, subscriberCount: 1 });
  assert.equal(await sequences(ctx, ['leave-1', 'leave-2', 'ghost']), [3, 2, 0]);
  assert.is((await timeline(ctx, 'ghost')).status, 404, 'removal never creates a subscriber');
  const items = await waitFor('the removal on the timeline', async () => {
    const t = await timeline(ctx, 'leave-1');
    return t.status === 200 && t.body.data.items.length === 3 ? t.body.data.items : null;
  });
  assert.equal(items[0].data, { changes: { topics: { removed: ['leaving'] } } });
  const again = await api.post('/v1/topics/leaving/subscribers/remove', key, { externalIds: ['leave-1'] });
  assert.equal(again.body.data, { removed: 0, notMembers: 1, subscriberCount: 1 });
  assert.equal(await sequences(ctx, ['leave-1']), [3], 'a second removal writes nothing');
  assert.equal((await api.get('/v1/topics/leaving/subscribers', key)).body.data.items.map((m: any) => m.externalId), ['leave-2']);
  const rejoin = await api.post('/v1/topics/leaving/subscribers', key, { externalIds: ['leave-1'] });
  assert.equal(rejoin.body.data, { added: 1, alreadyMembers: 0, subscribersCreated: 0, subscriberCount: 2 });
});

members('members list newest joined first across pages, with total and nothing twice', async (ctx) => {
  const { api, key } = ctx;
  await topic(ctx, 'paged');
  const a = Array.from({ length: 10 }, (_, i) => `a${i}`);
  const b = Array.from({ length: 5 }, (_, i) => `b${i}`);
  await api.post('/v1/topics/paged/subscribers', key, { externalIds: a });
  await sleep(5);
  await api.post('/v1/topics/paged/subscribers', key, { externalIds: b });
  const expected = [...b.reverse(), ...a.reverse()];
  for (const limit of [1, 4, 5, 100]) {
    const { externalIds, totals, pages } = await allMembers(ctx, 'paged', limit);
    assert.equal(externalIds, expected, `limit ${limit}`);
    assert.ok(totals.every((t) => t === 15));
    assert.is(pages, Math.max(1, Math.ceil(15 / limit)));
  }
  const first = (await api.get('/v1/topics/paged/subscribers?limit=1', key)).body.data.items[0];
  assert.match(first.joinedAt, /^\d{4}-\d\d-\d\dT/);
  assert.ok(Math.abs(Date.parse(first.joinedAt) - Date.now()) < 60_000);
  assert.is((await api.get('/v1/topics/paged/subscribers?cursor=nonsense', key)).body.error.param, 'cursor');
  const forged = Buffer.from(JSON.stringify({ v: 1, p: 'no-score' })).toString('base64url');
  assert.is((await api.get(`/v1/topics/paged/subscribers?cursor=${forged}`, key)).body.error.param, 'cursor');
});

members('members sharing a join score page in Redis order (bytes, descending)', async (ctx) => {
  const { service } = ctx;
  const t = await topic(ctx, 'ties');
  const tied = ['Z', 'a', 'é', '名', 'Ａ', '🚀'];
  const members = service.keys.topicMembers(ctx.tenantId, t.id);
  await service.redis.zadd(members, 6_000_000, 'newest', ...tied.flatMap((m) => [5_000_000, m]), 4_000_000, 'oldest');
  const expected = ['newest', '🚀', 'Ａ', '名', 'é', 'a', 'Z', 'oldest'];
  assert.equal(await service.redis.zrange(members, 0, -1, 'REV'), expected, 'the order Redis keeps');
  for (const limit of [1, 2, 3, 7]) assert.equal((await allMembers(ctx, 'ties', limit)).externalIds, expected, `limit ${limit}`);
});

members('an externalId with /, %, spaces and non-ASCII is a member like any other', async (ctx) => {
  const { api, key } = ctx;
  await topic(ctx, 'odd-ids');
  const odd = 'a/b %2F c ü 名前 🚀';
  const res = await api.post('/v1/topics/odd-ids/subscribers', key, { externalIds: [odd, 'plain'] });
  assert.equal(res.body.data, { added: 2, alreadyMembers: 0, subscribersCreated: 2, subscriberCount: 2 });
  assert.equal((await allMembers(ctx, 'odd-ids', 1)).externalIds, ['plain', odd]);
  const items = await waitFor('the odd subscriber\'s timeline', async () => {
    const t = await timeline(ctx, odd);
    return t.status === 200 && t.body.data.items.length === 2 ? t.body.data.items : null;
  });
  assert.is(items[0].externalId, odd);
  assert.equal((await api.post('/v1/topics/odd-ids/subscribers/remove', key, { externalIds: [odd] })).body.data, { removed: 1, notMembers: 0, subscriberCount: 1 });
});

members('concurrent adds and removes leave the member list and the subscribers agreeing', async (ctx) => {
  const { api, key, service, tenantId } = ctx;
  const t = await topic(ctx, 'race');
  const ids = ['race-1', 'race-2', 'race-3'];
  for (let round = 0; round < 5; round++) {
    await Promise.all(Array.from({ length: 8 }, (_, i) => api.post(`/v1/topics/race/subscribers${i % 2 ? '/remove' : ''}`, key, { externalIds: i % 3 ? ids : [...ids].reverse() })));
    for (const x of ids) {
      const p = partitionOf(tenantId, x, service.config.partitions);
      const inPartition = await service.redis.sismember(service.keys.subscriberTopics(p, tenantId, x), t.id);
      const listed = await service.redis.zscore(service.keys.topicMembers(tenantId, t.id), x);
      assert.is(listed !== null, inPartition === 1, `${x} in round ${round}`);
    }
  }
});

members('a deleted topic\'s id left in subscribers\' sets is ignored, and its slug starts afresh', async (ctx) => {
  const { api, key, service, tenantId } = ctx;
  const old = await topic(ctx, 'gone');
  await topic(ctx, 'kept');
  await api.post('/v1/topics/gone/subscribers', key, { externalIds: ['stale-1'] });
  await api.post('/v1/topics/kept/subscribers', key, { externalIds: ['stale-1'] });
  const before = await sequences(ctx, ['stale-1']);
  assert.is((await api.del('/v1/topics/gone', key)).body.data.subscriberCount, 1);
  assert.equal(await sequences(ctx, ['stale-1']), before, 'deletion writes no member event');
  assert.is(await service.redis.exists(service.keys.topicMembers(tenantId, old.id)), 0, 'member set removed');
  const scope = { workspaceId: ctx.workspaceId, tenantId, partitions: service.config.partitions };
  const p = partitionOf(tenantId, 'stale-1', service.config.partitions);
  assert.ok(await service.redis.sismember(service.keys.subscriberTopics(p, tenantId, 'stale-1'), old.id), 'the stale id stays');
  assert.equal((await topicsOfSubscriber(service.redis, service.keys, scope, 'stale-1')).map((x) => x.slug), ['kept']);
  const fresh = await topic(ctx, 'gone');
  assert.is.not(fresh.id, old.id);
  assert.is((await api.get('/v1/topics/gone/subscribers', key)).body.data.total, 0);
  assert.equal((await api.post('/v1/topics/gone/subscribers', key, { externalIds: ['stale-1'] })).body.data.added, 1);
  assert.equal((await topicsOfSubscriber(service.redis, service.keys, scope, 'stale-1')).map((x) => x.slug), ['gone', 'kept']);
});

members('membership changes add no audit entries; the streams are their record', async (ctx) => {
  const { api, key, service, workspaceId } = ctx;
  await topic(ctx, 'quiet');
  const audits = async () => (await service.redis.xrange(service.keys.ledger(workspaceId), '-', '+')).filter(([, f]) => f[f.indexOf('kind') + 1] === 'audit').length;
  const before = await audits();
  await api.post('/v1/topics/quiet/subscribers', key, { externalIds: ['q-1', 'q-2'] });
  await api.post('/v1/topics/quiet/subscribers/remove', key, { externalIds: ['q-1'] });
  assert.is(await audits(), before);
});

members('topics:write is needed to change members', async (ctx) => {
  const { api, service } = ctx;
  const reader = (await makeKey(service, 'members', 'tenant', ['topics:read'])).key;
  const res = await api.post('/v1/topics/bulk/subscribers', reader, { externalIds: ['x'] });
  assert.is(res.status, 403);
  assert.is(res.body.error.code, 'missing_permission');
  assert.is((await api.get('/v1/topics/bulk/subscribers?limit=1', reader)).body.data.total, 1000);
});

members('topicMembers streams 2,500 members in chunks, each once, newest first', async (ctx) => {
  const { service, tenantId } = ctx;
  const t = await topic(ctx, 'stream');
  const key = service.keys.topicMembers(tenantId, t.id);
  // Scores repeat every 10 members, so chunk edges fall inside groups of equal scores.
  const entries = Array.from({ length: 2500 }, (_, i) => [Math.floor(i / 10) * 1000, `s-${String(i).padStart(4, '0')}`] as const);
  for (let i = 0; i < entries.length; i += 500) await service.redis.zadd(key, ...entries.slice(i, i + 500).flat());
  const expected = await service.redis.zrange(key, 0, -1, 'REV');
  const chunks: string[][] = [];
  for await (const chunk of topicMembers(service.redis, service.keys, tenantId, t.id)) chunks.push(chunk);
  assert.equal(chunks.map((c) => c.length), [1000, 1000, 500]);
  assert.equal(chunks.flat(), expected);
  const small: string[][] = [];
  for await (const chunk of topicMembers(service.redis, service.keys, tenantId, t.id, 7)) small.push(chunk);
  assert.ok(small.every((c) => c.length <= 7));
  assert.equal(small.flat(), expected);
  const exact: string[][] = [];
  for await (const chunk of topicMembers(service.redis, service.keys, tenantId, t.id, 500)) exact.push(chunk);
  assert.is(exact.length, 5, 'a last full chunk is followed by no empty one');
  const none: string[][] = [];
  for await (const chunk of topicMembers(service.redis, service.keys, tenantId, 'tpc_none')) none.push(chunk);
  assert.equal(none, []);
});

members('cursors of the longest externalIds are accepted back (topic members and the subscriber list)', async (ctx) => {
  const { api, key } = ctx;
  await topic(ctx, 'wide');
  // 256 characters of 3 UTF-8 bytes, and 256 quotes (escaped in the cursor's JSON): the widest positions
  const ids = ['中'.repeat(256), '"'.repeat(256), '中'.repeat(255) + 'a'];
  assert.is((await api.post('/v1/topics/wide/subscribers', key, { externalIds: ids })).status, 200);
  const walked = await allMembers(ctx, 'wide', 1);
  assert.equal(walked.externalIds.sort(), [...ids].sort());
  assert.is(walked.pages, 3);
  const first = await api.get('/v1/subscribers?limit=1', key);
  assert.ok(first.body.data.nextCursor.length > 1024, 'wider than the old bound');
  const second = await api.get(`/v1/subscribers?limit=1&cursor=${first.body.data.nextCursor}`, key);
  assert.is(second.status, 200);
  assert.is.not(second.body.data.items[0].externalId, first.body.data.items[0].externalId);
});

members.run();
