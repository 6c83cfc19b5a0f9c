import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { partitionOf } from '../../lib/partition.js';
import { client } from '../helpers/api.js';
import { bootstrapWorkspace, makeKey, startTestService, type TestService } from '../helpers/service.js';

type Ctx = { service: TestService; api: ReturnType<typeof client>; key: string; workspaceKey: string; workspaceId: string; tenantId: string; partitions: number };
const segments = suite<Ctx>('segments');

segments.before(async (ctx) => {
  ctx.service = await startTestService('segments');
  ctx.api = client(ctx.service.url);
  const { keys, workspace, tenant } = await bootstrapWorkspace(ctx.service, 'segments');
  ctx.key = keys.tenant;
  ctx.workspaceKey = keys.workspace;
  ctx.workspaceId = workspace.id;
  ctx.tenantId = tenant.id;
  ctx.partitions = ctx.service.config.partitions;
});
segments.after(async (ctx) => ctx.service.stop());

const ISO = /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/;
const PRO = { attribute: 'plan', eq: 'pro' };
const ACTIVE = { all: [PRO, { event: 'app.opened', count: { gte: 3 }, within: '7d' }] };
const PENDING = { status: 'pending', processed: 0, total: null, startedAt: null, completedAt: null };

const version = async ({ service, tenantId }: Ctx) => Number((await service.redis.get(service.keys.automationVersion(tenantId))) ?? 0);
const backfillQueued = async ({ service, tenantId, workspaceId }: Ctx, id: string) => (await service.redis.zscore(service.keys.segmentBackfills, `${tenantId}|${workspaceId}|${id}`)) !== null;

segments('a segment is created with its backfill pending, stored for the workers and read back by slug', async (ctx) => {
  const { api, key, service, tenantId } = ctx;
  const before = await version(ctx);
  const created = await api.post('/v1/segments', key, { slug: 'active-pros', name: 'Active pros', description: 'Pro plan, opened the app 3 times this week', where: ACTIVE });
  assert.is(created.status, 201);
  const segment = created.body.data;
  assert.match(segment.id, /^seg_/);
  assert.equal({ ...segment, id: 'x', createdAt: 'x', updatedAt: 'x' }, {
    id: 'x', slug: 'active-pros', name: 'Active pros', description: 'Pro plan, opened the app 3 times this week', where: ACTIVE,
    memberCount: 0, backfill: PENDING, createdAt: 'x', updatedAt: 'x',
  });
  assert.match(segment.createdAt, ISO);
  assert.is(segment.updatedAt, segment.createdAt);
  assert.equal((await api.get('/v1/segments/active-pros', key)).body.data, segment);

  const stored = await service.redis.hgetall(service.keys.segment(tenantId, segment.id));
  assert.equal(stored, {
    id: segment.id, slug: 'active-pros', name: 'Active pros', description: 'Pro plan, opened the app 3 times this week', where: JSON.stringify(ACTIVE),
    backfill: JSON.stringify(PENDING), createdAt: segment.createdAt, updatedAt: segment.createdAt,
  });
  assert.is(await service.redis.hget(service.keys.segmentSlugs(tenantId), 'active-pros'), segment.id);
  assert.is(await service.redis.zscore(service.keys.segmentIndex(tenantId), segment.id), '0');
  assert.ok(await backfillQueued(ctx, segment.id), 'the backfill is queued');
  assert.is(await version(ctx), before + 1, 'automation version bumped');
});

segments('name and description are optional: null in the answer, empty in the record', async ({ api, key, service, tenantId }) => {
  const res = await api.post('/v1/segments', key, { slug: 'bare-segment', where: PRO });
  assert.is(res.status, 201);
  assert.is(res.body.data.name, null);
  assert.is(res.body.data.description, null);
  const stored = await service.redis.hmget(service.keys.segment(tenantId, res.body.data.id), 'name', 'description');
  assert.equal(stored, ['', '']);
});

segments('bodies outside the rules are validation errors naming each field, deep expression paths included', async ({ api, key }) => {
  const cases: [unknown, string][] = [
    [{ slug: 'ab', where: PRO }, 'slug'],
    [{ slug: 'Bad-Slug', where: PRO }, 'slug'],
    [{ where: PRO }, 'slug'],
    [{ slug: 'no-rule' }, 'where'],
    [{ slug: 'fine', where: 'plan = pro' }, 'where'],
    [{ slug: 'fine', where: {} }, 'where'],
    [{ slug: 'fine', where: { all: [PRO, { event: 'app.opened', count: { gte: 'three' } }] } }, 'where.all[1].count.gte'],
    [{ slug: 'fine', where: { any: [PRO, { not: { attribute: 'plan', near: 'pro' } }] } }, 'where.any[1].not.near'],
    [{ slug: 'fine', where: { event: 'x', within: '2y' } }, 'where.within'],
    [{ slug: 'fine', where: { property: 'total', gt: 5 } }, 'where'],
    [{ slug: 'fine', where: PRO, name: '' }, 'name'],
    [{ slug: 'fine', where: PRO, memberCount: 3 }, 'memberCount'],
  ];
  for (const [body, param] of cases) {
    const res = await api.post('/v1/segments', key, body);
    assert.is(res.status, 400, JSON.stringify(body).slice(0, 80));
    assert.is(res.body.error.code, 'validation');
    assert.ok(res.body.error.details.some((d: any) => d.param === param), `${param} in ${JSON.stringify(res.body.error.details)}`);
  }
  const both = await api.post('/v1/segments', key, { slug: 'x', where: { all: [{ attribute: 'plan' }] } });
  assert.equal(both.body.error.details.map((d: any) => d.param).sort(), ['slug', 'where.all[0]']);
  const empty = await api.post('/v1/segments', key, {});
  assert.equal(empty.body.error.details.map((d: any) => d.param).sort(), ['slug', 'where']);
  assert.is((await api.get('/v1/segments/fine', key)).status, 404, 'nothing was created');
});

segments('a slug already taken in the tenant is 409 conflict', async ({ api, key }) => {
  assert.is((await api.post('/v1/segments', key, { slug: 'taken-segment', where: PRO })).status, 201);
  const again = await api.post('/v1/segments', key, { slug: 'taken-segment', name: 'other', where: PRO });
  assert.is(again.status, 409);
  assert.is(again.body.error.code, 'conflict');
  assert.is(again.body.error.param, 'slug');
  assert.is((await api.get('/v1/segments/taken-segment', key)).body.data.name, null, 'the first segment is untouched');
});

segments('an unknown or malformed slug is 404 not_found on every route', async ({ api, key }) => {
  const replies = [
    await api.get('/v1/segments/missing', key),
    await api.get('/v1/segments/NOT-A-SLUG', key),
    await api.get('/v1/segments/seg_0000000000000000000000000', key),
    await api.patch('/v1/segments/missing', key, { name: 'x' }),
    await api.del('/v1/segments/missing', key),
    await api.del('/v1/segments/a', key),
    await api.get('/v1/segments/missing/members', key),
  ];
  for (const res of replies) {
    assert.is(res.status, 404);
    assert.is(res.body.error.code, 'not_found');
  }
});

segments('the list is newest first with total and keyset pages that join into the whole', async ({ service, api }) => {
  const { keys } = await bootstrapWorkspace(service, 'segments-list');
  const slugs = Array.from({ length: 7 }, (_, i) => `list-${i}`);
  for (const slug of slugs) await api.post('/v1/segments', keys.tenant, { slug, where: PRO });
  const all = (await api.get('/v1/segments', keys.tenant)).body.data;
  assert.is(all.total, 7);
  assert.is(all.hasMore, false);
  assert.equal(all.items.map((s: any) => s.slug), [...slugs].reverse());
  const seen: string[] = [];
  let cursor: string | null = null;
  for (let page = 0; page < 10; page++) {
    const res: any = await api.get(`/v1/segments?limit=3${cursor ? `&cursor=${cursor}` : ''}`, keys.tenant);
    assert.is(res.body.data.total, 7);
    assert.ok(res.body.data.items.length <= 3);
    seen.push(...res.body.data.items.map((s: any) => s.slug));
    cursor = res.body.data.nextCursor;
    if (!res.body.data.hasMore) break;
  }
  assert.equal(seen, [...slugs].reverse());
  assert.is((await api.get('/v1/segments?cursor=garbage', keys.tenant)).body.error.param, 'cursor');
  // a cursor another list issued is refused, not read as the end of this one
  await api.post('/v1/topics', keys.tenant, { slug: 'cursor-topic-a' });
  await api.post('/v1/topics', keys.tenant, { slug: 'cursor-topic-b' });
  const topicCursor = (await api.get('/v1/topics?limit=1', keys.tenant)).body.data.nextCursor;
  assert.ok(topicCursor);
  const crossed = await api.get(`/v1/segments?limit=2&cursor=${topicCursor}`, keys.tenant);
  assert.equal([crossed.status, crossed.body.error?.code, crossed.body.error?.param], [400, 'validation', 'cursor']);
  const segmentCursor = (await api.get('/v1/segments?limit=1', keys.tenant)).body.data.nextCursor;
  // a workflow that exists: an unknown slug is 404 before its cursor is read
  assert.is((await api.post('/v1/workflows', keys.tenant, { slug: 'any-flow', trigger: { event: 'any.thing' }, steps: [{ type: 'sleep', duration: '1h' }] })).status, 201);
  for (const path of ['/v1/topics', '/v1/messages', '/v1/workflows', '/v1/workflows/any-flow/runs']) {
    const res = await api.get(`${path}?cursor=${segmentCursor}`, keys.tenant);
    assert.equal([res.status, res.body.error?.param], [400, 'cursor'], path);
  }
});

segments('PATCH changes name and description; a new rule restarts the backfill; the slug is refused by name', async (ctx) => {
  const { api, key, service, tenantId, workspaceId } = ctx;
  const created = (await api.post('/v1/segments', key, { slug: 'editable', name: 'Old', description: 'About', where: PRO })).body.data;
  // the job runner finished the first backfill
  const done = { status: 'completed', processed: 10, total: 10, startedAt: created.createdAt, completedAt: created.createdAt };
  await service.redis.hset(service.keys.segment(tenantId, created.id), 'backfill', JSON.stringify(done));
  await service.redis.zrem(service.keys.segmentBackfills, `${tenantId}|${workspaceId}|${created.id}`);
  await new Promise((r) => setTimeout(r, 5));

  let v = await version(ctx);
  const renamed = await api.patch('/v1/segments/editable', key, { name: 'New', description: null });
  assert.is(renamed.status, 200);
  assert.is(renamed.body.data.name, 'New');
  assert.is(renamed.body.data.description, null);
  assert.equal(renamed.body.data.backfill, done, 'a rename keeps the backfill');
  assert.ok(renamed.body.data.updatedAt > created.updatedAt);
  assert.not.ok(await backfillQueued(ctx, created.id));
  assert.is(await version(ctx), v + 1);

  v = await version(ctx);
  const same = await api.patch('/v1/segments/editable', key, { name: 'New', where: { eq: 'pro', attribute: 'plan' } });
  assert.is(same.body.data.updatedAt, renamed.body.data.updatedAt, 'the same rule in another key order is no change');
  assert.equal(same.body.data.backfill, done);
  assert.is(await version(ctx), v, 'no change, no reload');

  const rule = { any: [PRO, { topic: 'vip' }] };
  const changed = await api.patch('/v1/segments/editable', key, { where: rule });
  assert.equal(changed.body.data.where, rule);
  assert.equal(changed.body.data.backfill, PENDING, 'a new rule restarts the backfill');
  assert.ok(await backfillQueued(ctx, created.id));
  assert.is(await version(ctx), v + 1);

  const slug = await api.patch('/v1/segments/editable', key, { slug: 'renamed' });
  assert.is(slug.status, 400);
  assert.is(slug.body.error.param, 'slug');
  assert.match(slug.body.error.message, /cannot be changed/);
  const many = await api.patch('/v1/segments/editable', key, { slug: 'renamed', name: 'x'.repeat(129), where: { all: [] } });
  assert.equal(many.body.error.details.map((d: any) => d.param).sort(), ['name', 'slug', 'where.all']);
  for (const body of [{}, { name: '' }, { other: 1 }]) assert.is((await api.patch('/v1/segments/editable', key, body)).body.error.code, 'validation');
  assert.is((await api.get('/v1/segments/editable', key)).body.data.name, 'New');
});

segments('delete answers the segment as it was and removes its record, slug, members and queued backfill', async (ctx) => {
  const { api, key, service, tenantId } = ctx;
  const created = (await api.post('/v1/segments', key, { slug: 'short-lived', name: 'Short', where: PRO })).body.data;
  await service.redis.zadd(service.keys.segmentMembers(0, tenantId, created.id), 0, 'a');
  await service.redis.zadd(service.keys.segmentMembers(ctx.partitions - 1, tenantId, created.id), 0, 'b');
  const total = (await api.get('/v1/segments', key)).body.data.total;
  const v = await version(ctx);
  const deleted = await api.del('/v1/segments/short-lived', key);
  assert.is(deleted.status, 200);
  assert.equal(deleted.body.data, { ...created, memberCount: 2 });
  assert.is(await version(ctx), v + 1);
  assert.is(await service.redis.exists(service.keys.segment(tenantId, created.id)), 0);
  assert.is(await service.redis.hget(service.keys.segmentSlugs(tenantId), 'short-lived'), null);
  assert.is(await service.redis.zscore(service.keys.segmentIndex(tenantId), created.id), null);
  assert.not.ok(await backfillQueued(ctx, created.id));
  for (let p = 0; p < ctx.partitions; p++) assert.is(await service.redis.exists(service.keys.segmentMembers(p, tenantId, created.id)), 0);
  assert.is((await api.get('/v1/segments/short-lived', key)).status, 404);
  assert.is((await api.del('/v1/segments/short-lived', key)).status, 404);
  assert.is((await api.get('/v1/segments', key)).body.data.total, total - 1);
  const again = await api.post('/v1/segments', key, { slug: 'short-lived', where: PRO });
  assert.is(again.status, 201);
  assert.is.not(again.body.data.id, created.id);
});

segments('members are subscriber records, newest subscriber first across partitions, with total and keyset pages', async ({ api, key, service, tenantId, partitions }) => {
  const segment = (await api.post('/v1/segments', key, { slug: 'members', where: PRO })).body.data;
  // members are `<sub_ id>|<externalId>` (ids are time-ordered); externalIds of any bytes
  const ids = ['Zed', 'alice', 'bob', 'carol', 'dave', 'erin', 'frank', 'émile', '\uff5e-tilde', '😀-smile', 'a/b c%'];
  const subscriberIds = new Map<string, string>();
  for (const externalId of ids) {
    const res = await api.post('/v1/subscribers', key, { externalId, properties: { plan: 'pro' } });
    assert.is(res.status, 201);
    subscriberIds.set(externalId, res.body.data.id);
  }
  for (const externalId of ids) await service.redis.zadd(service.keys.segmentMembers(partitionOf(tenantId, externalId, partitions), tenantId, segment.id), 0, `${subscriberIds.get(externalId)}|${externalId}`);
  const used = new Set(ids.map((x) => partitionOf(tenantId, x, partitions)));
  assert.ok(used.size > 1, 'members spread over partitions');
  const expected = [...ids].sort((a, b) => (subscriberIds.get(a)! < subscriberIds.get(b)! ? 1 : -1));
  const newestFirst = (await api.get('/v1/subscribers?limit=100', key)).body.data.items.map((s: any) => s.externalId).filter((x: string) => ids.includes(x));
  assert.equal(expected, newestFirst, 'the order of GET /v1/subscribers');

  const all = (await api.get('/v1/segments/members/members', key)).body.data;
  assert.is(all.total, ids.length);
  assert.is(all.hasMore, false);
  assert.is(all.nextCursor, null);
  assert.equal(all.items.map((s: any) => s.externalId), expected);
  assert.match(all.items[0].id, /^sub_/);
  assert.equal(all.items[0].properties, { plan: 'pro' });
  assert.is((await api.get('/v1/segments/members', key)).body.data.memberCount, ids.length);

  const seen: string[] = [];
  let cursor: string | null = null;
  for (let page = 0; page < 10; page++) {
    const res: any = await api.get(`/v1/segments/members/members?limit=4${cursor ? `&cursor=${cursor}` : ''}`, key);
    assert.is(res.body.data.total, ids.length);
    assert.ok(res.body.data.items.length <= 4);
    seen.push(...res.body.data.items.map((s: any) => s.externalId));
    cursor = res.body.data.nextCursor;
    if (!res.body.data.hasMore) break;
  }
  assert.equal(seen, expected);

  // a member whose subscriber is gone is left out (the workers clean up after the delete)
  assert.is((await api.del(`/v1/subscribers/${encodeURIComponent('bob')}`, key)).status, 200);
  const after = (await api.get('/v1/segments/members/members', key)).body.data;
  assert.not.ok(after.items.some((s: any) => s.externalId === 'bob'));
});

segments('a subscriber record lists the slugs of its segments, and drops segments that were deleted', async ({ api, key, service, tenantId, partitions }) => {
  const a = (await api.post('/v1/segments', key, { slug: 'seg-a', where: PRO })).body.data;
  const b = (await api.post('/v1/segments', key, { slug: 'seg-b', where: PRO })).body.data;
  const gone = (await api.post('/v1/segments', key, { slug: 'seg-gone', where: PRO })).body.data;
  const created = await api.post('/v1/subscribers', key, { externalId: 'in-segments' });
  assert.equal(created.body.data.segments, []);
  const p = partitionOf(tenantId, 'in-segments', partitions);
  await service.redis.hset(service.keys.automation(p, tenantId, 'in-segments'), 'segs', JSON.stringify([b.id, gone.id, a.id]));
  await service.redis.zadd(service.keys.segmentMembers(p, tenantId, a.id), 0, `${created.body.data.id}|in-segments`);
  assert.is((await api.del('/v1/segments/seg-gone', key)).status, 200);

  assert.equal((await api.get('/v1/subscribers/in-segments', key)).body.data.segments, ['seg-a', 'seg-b']);
  const list = (await api.get('/v1/subscribers?limit=100', key)).body.data.items;
  assert.equal(list.find((s: any) => s.externalId === 'in-segments').segments, ['seg-a', 'seg-b']);
  assert.equal(list.find((s: any) => s.externalId === 'alice').segments, []);
  assert.equal((await api.patch('/v1/subscribers/in-segments', key, { locale: 'en-US' })).body.data.segments, ['seg-a', 'seg-b']);
  assert.equal((await api.post('/v1/subscribers', key, { externalId: 'in-segments', locale: 'fr-FR' })).body.data.segments, ['seg-a', 'seg-b']);
  const members = (await api.get('/v1/segments/seg-a/members', key)).body.data.items;
  assert.equal(members.map((s: any) => [s.externalId, s.segments]), [['in-segments', ['seg-a', 'seg-b']]]);
  assert.equal((await api.del('/v1/subscribers/in-segments', key)).body.data.segments, ['seg-a', 'seg-b']);
});

segments('a segments:read key reads but cannot write; a key without segments scopes cannot read', async ({ service, api }) => {
  const reader = (await makeKey(service, 'segments', 'tenant', ['segments:read'])).key;
  assert.is((await api.get('/v1/segments', reader)).status, 200);
  assert.is((await api.get('/v1/segments/active-pros', reader)).status, 200);
  assert.is((await api.get('/v1/segments/active-pros/members', reader)).status, 200);
  const writes = [
    await api.post('/v1/segments', reader, { slug: 'by-reader', where: PRO }),
    await api.patch('/v1/segments/active-pros', reader, { name: 'x' }),
    await api.del('/v1/segments/active-pros', reader),
  ];
  for (const res of writes) {
    assert.is(res.status, 403);
    assert.is(res.body.error.code, 'missing_permission');
  }
  const other = (await makeKey(service, 'segments', 'tenant', ['topics:read'])).key;
  for (const path of ['/v1/segments', '/v1/segments/active-pros', '/v1/segments/active-pros/members']) {
    const res = await api.get(path, other);
    assert.is(res.status, 403);
    assert.is(res.body.error.code, 'missing_permission');
  }
  const writer = (await makeKey(service, 'segments', 'tenant', ['segments:*'])).key;
  assert.is((await api.post('/v1/segments', writer, { slug: 'by-writer', where: PRO })).status, 201);
  const clientKey = (await bootstrapWorkspace(service, 'segments')).keys.client;
  assert.is((await api.get('/v1/segments', clientKey)).body.error.code, 'forbidden');
});

segments('another tenant\'s segment is 404; a workspace key reaches it with Service-Tenant', async ({ service, api, key, workspaceKey }) => {
  const euKey = (await makeKey(service, 'segments', 'tenant', ['*'], { tenant: 'eu' })).key;
  assert.is((await api.post('/v1/segments', euKey, { slug: 'eu-only', where: PRO })).status, 201);
  assert.is((await api.post('/v1/segments', euKey, { slug: 'active-pros', where: PRO })).status, 201, 'slugs are per tenant');
  assert.is((await api.get('/v1/segments/eu-only', key)).status, 404);
  assert.is((await api.del('/v1/segments/eu-only', key)).status, 404);
  assert.is((await api.get('/v1/segments/eu-only', workspaceKey)).status, 404);
  assert.is((await api.get('/v1/segments/eu-only', workspaceKey, { 'Service-Tenant': 'eu' })).status, 200);
  assert.is((await api.get('/v1/segments', euKey)).body.data.total, 2);
});

segments('create, update and delete are audited in the workspace ledger', async ({ service, api, key, workspaceId }) => {
  const created = (await api.post('/v1/segments', key, { slug: 'audited', name: 'Before', where: PRO })).body.data;
  await api.patch('/v1/segments/audited', key, { name: 'After', where: ACTIVE });
  await api.patch('/v1/segments/audited', key, { name: 'After' }); // no change, no entry
  await api.del('/v1/segments/audited', key);
  const entries = (await service.redis.xrange(service.keys.ledger(workspaceId), '-', '+'))
    .map(([, fields]) => JSON.parse(fields[fields.indexOf('payload') + 1]!))
    .filter((p) => p.target?.id === created.id);
  assert.equal(entries.map((e) => e.type), ['segment.created', 'segment.updated', 'segment.deleted']);
  const [c, u, d] = entries;
  assert.equal(c.data.object, created);
  assert.equal(c.target, { type: 'segment', id: created.id });
  assert.is(c.tenant.slug, 'default');
  assert.is(c.actor.type, 'api_key');
  assert.equal(u.changes, { name: 'After', where: ACTIVE });
  assert.equal(u.previousAttributes, { name: 'Before', where: PRO });
  assert.is(d.data.object.slug, 'audited');
  const groups = (await api.get('/v1/workspaces/segments/webhooks/catalog', (await bootstrapWorkspace(service, 'segments')).keys.workspace)).body.data.groups as any[];
  const group = groups.find((g) => g.resource === 'segment' && g.source === 'audit');
  assert.equal(group.events.map((e: any) => e.name), ['segment.created', 'segment.updated', 'segment.deleted'], 'the catalog lists them');
});

segments('a tenant holds at most 100 segments and 100 workflows: the next one is 400 bad_request', async (ctx) => {
  const { api, service } = ctx;
  const { keys } = await bootstrapWorkspace(service, 'segments-limit');
  const count = async (path: string) => (await api.get(`${path}?limit=1`, keys.tenant)).body.data.total;
  for (let i = 0; i < 100; i++) {
    const made = await api.post('/v1/segments', keys.tenant, { slug: `seg-${i}`, where: PRO });
    assert.is(made.status, 201, made.text);
  }
  const over = await api.post('/v1/segments', keys.tenant, { slug: 'seg-100', where: PRO });
  assert.is(over.status, 400);
  assert.is(over.body.error.code, 'bad_request');
  assert.is(over.body.error.param, 'request', 'param names the first of the details (the whole request)');
  assert.equal(over.body.error.details.map((d: any) => d.param), ['request']);
  assert.is(await count('/v1/segments'), 100, 'nothing written');
  const steps = [{ type: 'exit' }];
  for (let i = 0; i < 100; i++) assert.is((await api.post('/v1/workflows', keys.tenant, { slug: `wf-${i}`, trigger: { event: 'go' }, steps })).status, 201);
  const overWorkflow = await api.post('/v1/workflows', keys.tenant, { slug: 'wf-100', trigger: { event: 'go' }, steps });
  assert.is(overWorkflow.status, 400);
  assert.is(overWorkflow.body.error.code, 'bad_request');
  assert.is(await count('/v1/workflows'), 100);
});

/**
 * Probe R: concurrent PATCHes alternating two rules each set a rule and a name; the writer compared
 * its rule with a read taken before the script, so one that matched that stale read was dropped
 * (answered 200 with its name but another's rule). Each answer must carry its own request's rule
 * and name, and the final record the rule that goes with its final name.
 */
segments('concurrent updates each write their own rule: the answer and the final record pair each name with its rule', async (ctx) => {
  const { api, key } = ctx;
  const A = { attribute: 'plan', eq: 'a' };
  const B = { attribute: 'plan', eq: 'b' };
  assert.is((await api.post('/v1/segments', key, { slug: 'racing-rules', where: A })).status, 201);
  for (let round = 0; round < 5; round++) {
    const answers = await Promise.all(Array.from({ length: 20 }, (_, i) => api.patch('/v1/segments/racing-rules', key, { name: `n${round}-${i}`, where: i % 2 ? A : B })));
    for (const [i, res] of answers.entries()) {
      assert.is(res.status, 200);
      assert.is(res.body.data.name, `n${round}-${i}`);
      assert.equal(res.body.data.where, i % 2 ? A : B, `round ${round}, request ${i}: its own rule`);
    }
    const final = (await api.get('/v1/segments/racing-rules', key)).body.data;
    const writer = Number(final.name.split('-')[1]);
    assert.equal(final.where, writer % 2 ? A : B, `round ${round}: the rule of the request whose name is final`);
  }
});

segments.run();
