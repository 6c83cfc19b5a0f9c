import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { readCatalog } from '../../streams/read-models.js';
import { client } from '../helpers/api.js';
import { bootstrapWorkspace, startTestService, type TestService } from '../helpers/service.js';
import { waitFor } from '../helpers/wait.js';

// Paging the catalog while its counts change (docs/events.md, Catalog paging): a walk lists the
// names in their order at its first page, each exactly once, with the counts of the moment.

type Ctx = { service: TestService; api: ReturnType<typeof client>; key: string; tenantId: string };
const walk = suite<Ctx>('catalog walk over changing counts');

walk.before(async (ctx) => {
  ctx.service = await startTestService('catalog-walk', {}, ['web', 'worker']);
  ctx.api = client(ctx.service.url);
  const boot = await bootstrapWorkspace(ctx.service, 'catalog-walk');
  ctx.key = boot.keys.tenant;
  ctx.tenantId = boot.tenant.id;
});
walk.after(async (ctx) => ctx.service.stop());

/** `count` events named `name` (one subscriber), then waits until the catalog counts them all. */
async function track(ctx: Ctx, name: string, count: number): Promise<void> {
  const res = await ctx.api.post('/v1/events', ctx.key, { events: Array.from({ length: count }, () => ({ externalId: 'walker', name })) });
  assert.is(res.status, 202, res.text);
}
async function settled(ctx: Ctx, name: string, allTime: number): Promise<void> {
  await waitFor(`${name} counted ${allTime} times`, async () => {
    const res = await ctx.api.get(`/v1/events/names/${name}`, ctx.key);
    return res.status === 200 && res.body.data.entry.counts.allTime === allTime;
  });
}
const names = (res: any): string[] => res.body.data.items.map((e: any) => e.name);

walk('a name that climbs past the cursor between pages is listed once, with its count of the moment; a new name waits for the next walk', async (ctx) => {
  const { api, key } = ctx;
  // w1..w6 counted 7..2 times ($subscriber.created, once, comes last)
  for (let i = 1; i <= 6; i++) await track(ctx, `w${i}`, 8 - i);
  await settled(ctx, 'w6', 2);
  const first = await api.get('/v1/events/names?limit=2', key);
  assert.equal(names(first), ['w1', 'w2']);
  // w6 climbs to the top, and a new name arrives, before the next page
  await track(ctx, 'w6', 10);
  await track(ctx, 'w0', 20);
  await settled(ctx, 'w6', 12);
  await settled(ctx, 'w0', 20);
  const second = await api.get(`/v1/events/names?limit=2&cursor=${first.body.data.nextCursor}`, key);
  assert.equal(names(second), ['w3', 'w4']);
  const third = await api.get(`/v1/events/names?limit=2&cursor=${second.body.data.nextCursor}`, key);
  assert.equal(names(third), ['w5', 'w6'], 'w6 is not skipped for having climbed past the cursor');
  assert.is(third.body.data.items[1].counts.allTime, 12, 'with its count of the moment');
  assert.is(third.body.data.hasMore, true);
  const fourth = await api.get(`/v1/events/names?limit=2&cursor=${third.body.data.nextCursor}`, key);
  assert.equal(names(fourth), ['$subscriber.created']);
  assert.equal([fourth.body.data.hasMore, fourth.body.data.nextCursor], [false, null]);
  // the next walk sees the new order and the new name
  assert.equal(names(await api.get('/v1/events/names?limit=3', key)), ['w0', 'w6', 'w1']);
});

walk('a walk whose kept order is gone goes on from its last entry by keyset; a forged order part is 400', async (ctx) => {
  const { api, key, service: { redis, keys }, tenantId } = ctx;
  const first = await api.get('/v1/events/names?limit=2', key);
  assert.equal(names(first), ['w0', 'w6']);
  const kept = await redis.zrange(keys.catalogOrders(tenantId), 0, -1);
  assert.ok(kept.length >= 1);
  for (const id of kept) await redis.del(keys.catalogOrder(tenantId, id));
  const next = await api.get(`/v1/events/names?limit=3&cursor=${first.body.data.nextCursor}`, key);
  assert.is(next.status, 200, next.text);
  assert.equal(names(next), ['w1', 'w2', 'w3'], 'from w6\'s place in the order as it is now');
  // a cursor whose order part is malformed names no list position
  const forged = (position: string) => Buffer.from(JSON.stringify({ v: 1, p: position })).toString('base64url');
  for (const position of ['o/!!/0/1/1/w1', 'o/abc/x/1/1/w1', 'o/abc/0/']) {
    const res = await api.get(`/v1/events/names?cursor=${forged(position)}`, key);
    assert.equal([res.status, res.body.error?.code, res.body.error?.param], [400, 'validation', 'cursor'], position);
  }
});

walk('a tenant keeps at most 20 orders; a catalog over the bound keeps none (pages by keyset)', async (ctx) => {
  const { api, key, service: { redis, keys, config }, tenantId } = ctx;
  for (let i = 0; i < 25; i++) assert.is((await api.get('/v1/events/names?limit=1', key)).status, 200);
  const kept = await redis.zrange(keys.catalogOrders(tenantId), 0, -1);
  assert.is(kept.length, 20);
  const lists = await Promise.all(kept.map((id) => redis.exists(keys.catalogOrder(tenantId, id))));
  assert.ok(lists.every((n) => n === 1), 'every kept order has its list');
  assert.ok(await redis.ttl(keys.catalogOrder(tenantId, kept[0]!)) > 0, 'each expires');
  // what the route asks: the names after the first page, kept only when the catalog holds at most the bound (8 names here)
  const within = await readCatalog(redis, keys, config.partitions, tenantId, { page: { after: null, limit: 2, keepOrder: 8 } });
  assert.equal(within.rest, ['w1', 'w2', 'w3', 'w4', 'w5', '$subscriber.created']);
  const over = await readCatalog(redis, keys, config.partitions, tenantId, { page: { after: null, limit: 2, keepOrder: 7 } });
  assert.equal([over.rest, over.items.map((e) => e.name), over.hasMore], [undefined, ['w0', 'w6'], true]);
});

walk.run();
