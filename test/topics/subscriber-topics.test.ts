import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { TOPIC_SCAN_BUDGET } from '../../streams/topic-members.js';
import { client } from '../helpers/api.js';
import { bootstrapWorkspace, startTestService, type TestService } from '../helpers/service.js';
import { waitFor } from '../helpers/wait.js';

type Ctx = { service: TestService; api: ReturnType<typeof client>; key: string };
const topicsOf = suite<Ctx>('a subscriber\'s topics');

topicsOf.before(async (ctx) => {
  ctx.service = await startTestService('subscriber-topics', {}, ['web']);
  ctx.api = client(ctx.service.url);
  ctx.key = (await bootstrapWorkspace(ctx.service, 'subtopics')).keys.tenant;
});
topicsOf.after(async (ctx) => ctx.service.stop());

/** Creates the topics in `slugs`' order, `atOnce` at a time (those of one group are made in any order among themselves). */
async function createTopics(ctx: Ctx, slugs: string[], atOnce = 1): Promise<string[]> {
  const ids: string[] = [];
  for (let i = 0; i < slugs.length; i += atOnce) {
    const made = await Promise.all(slugs.slice(i, i + atOnce).map((slug) => ctx.api.post('/v1/topics', ctx.key, { slug })));
    for (const res of made) {
      assert.is(res.status, 201);
      ids.push(res.body.data.id);
    }
  }
  return ids;
}

async function join(ctx: Ctx, slug: string, externalIds: string[]): Promise<void> {
  assert.is((await ctx.api.post(`/v1/topics/${slug}/subscribers`, ctx.key, { externalIds })).status, 200);
}

/** Every page of the subscriber's topics: the slugs in order, each page's size, total and cursor. */
async function allPages(ctx: Ctx, externalId: string, limit: number) {
  const slugs: string[] = [];
  const sizes: number[] = [];
  const totals: number[] = [];
  let cursor: string | null = null;
  for (let pages = 0; pages < 100; pages++) {
    const res: any = await ctx.api.get(`/v1/subscribers/${encodeURIComponent(externalId)}/topics?limit=${limit}${cursor ? `&cursor=${cursor}` : ''}`, ctx.key);
    assert.is(res.status, 200, JSON.stringify(res.body.error));
    slugs.push(...res.body.data.items.map((t: any) => t.slug));
    sizes.push(res.body.data.items.length);
    totals.push(res.body.data.total);
    cursor = res.body.data.nextCursor;
    assert.is(res.body.data.hasMore, cursor !== null);
    if (!cursor) return { slugs, sizes, totals };
  }
  throw new Error('more than 100 pages');
}

topicsOf('the topics a subscriber joined, newest topic first, paginated, with total; a deleted topic is gone from both', async (ctx) => {
  const { api, key } = ctx;
  const slugs = Array.from({ length: 12 }, (_, i) => `news-${String(i).padStart(2, '0')}`);
  await createTopics(ctx, slugs);
  for (const slug of ['news-01', 'news-04', 'news-05', 'news-09', 'news-11']) await join(ctx, slug, ['reader']);
  await join(ctx, 'news-02', ['other-reader']);
  const listed = await allPages(ctx, 'reader', 2);
  assert.equal(listed.slugs, ['news-11', 'news-09', 'news-05', 'news-04', 'news-01'], 'newest topic first, each once');
  assert.equal(listed.sizes, [2, 2, 1]);
  assert.equal(listed.totals, [5, 5, 5]);
  const one = (await api.get('/v1/subscribers/reader/topics', key)).body.data;
  assert.equal(Object.keys(one.items[0]).sort(), ['createdAt', 'description', 'id', 'name', 'slug', 'subscriberCount', 'updatedAt'], 'topic records, as GET /v1/topics lists them');

  assert.is((await api.del('/v1/topics/news-05', key)).status, 200);
  const after = await allPages(ctx, 'reader', 100);
  assert.equal(after.slugs, ['news-11', 'news-09', 'news-04', 'news-01'], 'the deleted topic is not listed');
  assert.equal(after.totals, [4], 'nor counted, though its id stays in the subscriber\'s set until the sweeper comes');
  await join(ctx, 'news-09', ['reader']); // already a member: nothing changes
  await api.post('/v1/topics/news-11/subscribers/remove', key, { externalIds: ['reader'] });
  assert.equal((await allPages(ctx, 'reader', 100)).slugs, ['news-09', 'news-04', 'news-01'], 'a leave shows at once');

  assert.is((await api.get('/v1/subscribers/nobody/topics', key)).body.error.code, 'not_found', 'an unknown subscriber is 404');
  assert.is((await api.post('/v1/subscribers', key, { externalId: 'lonely' })).status, 201);
  assert.equal(await allPages(ctx, 'lonely', 10), { slugs: [], sizes: [0], totals: [0] }, 'a subscriber of no topic');
});

topicsOf('cursors are the list\'s own; bad queries are 400 validation', async (ctx) => {
  const { api, key } = ctx;
  await createTopics(ctx, ['cur-a', 'cur-b', 'cur-c']);
  for (const slug of ['cur-a', 'cur-b', 'cur-c']) await join(ctx, slug, ['cur-1', 'cur-2']);
  const first = await api.get('/v1/subscribers/cur-1/topics?limit=1', key);
  const cursor = first.body.data.nextCursor as string;
  assert.ok(cursor);
  const elsewhere = await api.get(`/v1/subscribers/cur-2/topics?limit=1&cursor=${cursor}`, key);
  assert.is(elsewhere.status, 400, 'another subscriber\'s cursor');
  assert.is(elsewhere.body.error.param, 'cursor');
  const members = await api.get(`/v1/topics?limit=1`, key);
  assert.is((await api.get(`/v1/subscribers/cur-1/topics?cursor=${members.body.data.nextCursor}`, key)).status, 400, 'the topic list\'s cursor');
  for (const q of ['limit=0', 'limit=101', 'limit=x', 'cursor=junk', 'extra=1']) {
    const res = await api.get(`/v1/subscribers/cur-1/topics?${q}`, key);
    assert.is(res.status, 400, q);
    assert.is(res.body.error.code, 'validation', q);
  }
});

topicsOf(`a tenant of more topics than one call reads (${TOPIC_SCAN_BUDGET}): short pages with hasMore, every topic found once`, async (ctx) => {
  const count = TOPIC_SCAN_BUDGET + 300;
  const slugs = Array.from({ length: count }, (_, i) => `many-${String(i).padStart(5, '0')}`);
  await createTopics(ctx, slugs, 50);
  // the oldest, one in the middle and the newest (each in a group of its own)
  const joined = [slugs[0]!, slugs[1_000]!, slugs[count - 1]!];
  for (const slug of joined) await join(ctx, slug, ['far-reader']);
  const listed = await allPages(ctx, 'far-reader', 50);
  assert.equal(listed.slugs, [...joined].reverse(), 'newest first, each once');
  assert.ok(listed.sizes.length >= 2, `the oldest is past one call's reading: pages ${JSON.stringify(listed.sizes)}`);
  assert.ok(listed.totals.every((t) => t === 3), 'total is the whole count on every page');
  const exact = await allPages(ctx, 'far-reader', 2);
  assert.equal(exact.slugs, [...joined].reverse(), 'with a limit smaller than the count, too');
});

topicsOf('a subscriber in 1,100 topics deleted leaves every one of them, the last chunk\'s too (its cleanup works through them 500 at a time: probe T, 50,000 at once held 386 MB)', async (ctx) => {
  const slugs = Array.from({ length: 1_100 }, (_, i) => `bulk-${String(i).padStart(4, '0')}`);
  await createTopics(ctx, slugs, 100);
  for (let i = 0; i < slugs.length; i += 4) await Promise.all(slugs.slice(i, i + 4).map((slug) => join(ctx, slug, ['in-many'])));
  assert.is((await ctx.api.get('/v1/subscribers/in-many/topics?limit=1', ctx.key)).body.data.total, 1_100);
  assert.is((await ctx.api.del('/v1/subscribers/in-many', ctx.key)).status, 200);
  // every topic's count, page by page (the cleanup goes through them in the set's order, not the slugs')
  const counted = async () => {
    let members = 0;
    let cursor: string | null = null;
    for (let pages = 0; pages < 100; pages++) {
      const page: any = (await ctx.api.get(`/v1/topics?limit=100${cursor ? `&cursor=${cursor}` : ''}`, ctx.key)).body.data;
      members += page.items.filter((t: any) => t.slug.startsWith('bulk-')).reduce((n: number, t: any) => n + t.subscriberCount, 0);
      cursor = page.nextCursor;
      if (!cursor) break;
    }
    return members;
  };
  assert.ok(await waitFor('every topic to lose its member', async () => (await counted()) === 0 || null, 20_000));
  assert.equal((await ctx.api.get(`/v1/topics/${slugs[1_099]}/subscribers`, ctx.key)).body.data.items, []);
});

topicsOf.run();
