import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { setClockOffset } from '../../lib/clock.js';
import { sweepRetention } from '../../actors/retention-sweeper.js';
import { client } from '../helpers/api.js';
import { bootstrapWorkspace, holdRetentionSweeps, startTestService, type TestService } from '../helpers/service.js';
import { waitFor } from '../helpers/wait.js';
import { partitionOf } from '../../lib/partition.js';

type Ctx = { service: TestService; api: ReturnType<typeof client>; key: string; tenantId: string };
const reads = suite<Ctx>('event read models');

const HOUR = 3_600_000;
const DAY = 86_400_000;
const ago = (ms: number) => new Date(Date.now() - ms).toISOString();

reads.before(async (ctx) => {
  ctx.service = await startTestService('reads', {}, ['web', 'worker']);
  // the worker's minute timer forgot the idle tenant and the dedupe entries a test's own sweep then counted
  await holdRetentionSweeps(ctx.service);
  ctx.api = client(ctx.service.url);
  const boot = await bootstrapWorkspace(ctx.service, 'reads');
  ctx.key = boot.keys.tenant;
  ctx.tenantId = boot.tenant.id;
  const events = [
    ...Array.from({ length: 25 }, (_, i) => ({ externalId: `buyer-${i % 5}`, name: 'order.completed', data: { n: i } })),
    { externalId: 'buyer-0', name: 'order.refunded', timestamp: ago(2 * DAY) },
    { externalId: 'buyer-1', name: 'order.refunded', timestamp: ago(2 * DAY) },
    { externalId: 'buyer-2', name: 'order.refunded', timestamp: ago(2 * DAY) },
    { externalId: 'buyer-0', name: 'app.opened.custom', timestamp: ago(3 * HOUR) },
  ];
  await ctx.api.post('/v1/events', ctx.key, { events: events.slice(0, 20) });
  await ctx.api.post('/v1/events', ctx.key, { events: events.slice(20) });
  await ctx.api.post('/v1/client/events', (await bootstrapWorkspace(ctx.service, 'reads')).keys.client, { externalId: 'buyer-0', source: 'ios', events: [{ name: 'order.completed' }] });
  // 5 $subscriber.created + 25 + 3 + 1 + 1 from the app
  await waitFor('the worker to apply every event', async () => {
    const res = await ctx.api.get('/v1/events?limit=100', ctx.key);
    return res.body.data.items.length === 35;
  });
});
reads.after(async (ctx) => ctx.service.stop());

reads('the tenant log lists newest first with keyset pagination and no total', async ({ api, key }) => {
  const all = (await api.get('/v1/events?limit=100', key)).body.data;
  assert.is(all.total, undefined);
  assert.is(all.hasMore, false);
  const received = all.items.map((e: any) => Date.parse(e.receivedAt));
  assert.equal(received, [...received].sort((a, b) => b - a));
  const ids: string[] = [];
  let cursor: string | null = null;
  for (let page = 0; page < 20; page++) {
    const res: any = await api.get(`/v1/events?limit=4${cursor ? `&cursor=${cursor}` : ''}`, key);
    ids.push(...res.body.data.items.map((e: any) => e.id));
    cursor = res.body.data.nextCursor;
    if (!res.body.data.hasMore) break;
  }
  assert.equal(ids, all.items.map((e: any) => e.id), 'pages join into the whole list, nothing twice');
});

reads('events of one request list in reverse input order, across partitions, each subscriber\'s creation just below its first event', async ({ api, key }) => {
  const all = (await api.get('/v1/events?limit=100', key)).body.data.items;
  const firstBatch = all.filter((e: any) => e.name === 'order.completed' && e.data.n !== undefined && e.data.n < 20);
  assert.equal(firstBatch.map((e: any) => e.data.n), Array.from({ length: 20 }, (_, i) => 19 - i));
  for (let b = 0; b < 5; b++) {
    const created = all.findIndex((e: any) => e.name === '$subscriber.created' && e.externalId === `buyer-${b}`);
    const first = all.findIndex((e: any) => e.externalId === `buyer-${b}` && e.data.n === b);
    assert.is(created, first + 1, `buyer-${b}`);
  }
  const samples = (await api.get('/v1/events/names/order.completed', key)).body.data.samples;
  const newest = all.filter((e: any) => e.name === 'order.completed').slice(0, 20);
  assert.equal(samples.map((e: any) => e.id), newest.map((e: any) => e.id), 'samples are the list\'s 20 newest, in its order');
});

reads('the tenant log filters by name, source and receivedAt', async ({ api, key }) => {
  const named = (await api.get('/v1/events?name=order.refunded', key)).body.data.items;
  assert.is(named.length, 3);
  const ios = (await api.get('/v1/events?source=ios', key)).body.data.items;
  assert.is(ios.length, 1);
  assert.is(ios[0].name, 'order.completed');
  const later = (await api.get(`/v1/events?after=${encodeURIComponent(new Date(Date.now() + 60_000).toISOString())}`, key)).body.data.items;
  assert.is(later.length, 0);
  const bad = await api.get('/v1/events?cursor=garbage', key);
  assert.is(bad.status, 400);
  assert.is(bad.body.error.code, 'validation');
  const badSource = await api.get('/v1/events?source=fax', key);
  assert.is(badSource.body.error.details[0].param, 'source');
});

reads('after= is on receivedAt, also for an entry logged under a later millisecond (another web process\'s write reached the partition first); a name filter that is no event name is 400', async ({ api, key, service, tenantId }) => {
  const { redis, keys, config } = service;
  // what lua/applyEvents writes when a later-stamped write of another web process came first: log id ms > receivedAt
  const p = partitionOf(tenantId, 'late-logged', config.partitions);
  const top = (await redis.xrevrange(keys.tenantLog(p, tenantId), '+', '-', 'COUNT', 1))[0]?.[0];
  const receivedMs = top ? Number(top.split('-')[0]) + 1 : Date.now() - 60_000;
  await redis.xadd(keys.tenantLog(p, tenantId), `${receivedMs + 40}-0`, 'id', 'evt_01m8zzzzzzzzzzzzzzzzzzzzzz', 'q', '1', 'x', 'late-logged', 'u', 'sub_x', 'n', 'late.logged', 'o', 'server',
    'ts', String(receivedMs), 'r', String(receivedMs), 'd', '{}', 'ru', '', 'm', '', 'st', '', 'pv', '');
  const at = (ms: number) => new Date(ms).toISOString();
  const names = async (after: number) => (await api.get(`/v1/events?name=late.logged&after=${at(after)}`, key)).body.data.items.map((e: any) => e.name);
  assert.equal(await names(receivedMs - 1), ['late.logged'], 'received after');
  assert.equal(await names(receivedMs), [], 'received at the time given: not after it, whatever its log id');
  assert.equal(await names(receivedMs + 20), [], 'received before');
  for (const path of ['/v1/events/volume?range=7d&name=*', '/v1/events?name=*', '/v1/events?name=Order.Completed']) {
    const res = await api.get(path, key);
    assert.equal([res.status, res.body.error?.code, res.body.error?.param], [400, 'validation', 'name'], path);
  }
  assert.is((await api.get('/v1/events/volume?range=7d&name=$app.opened', key)).status, 200, 'reserved names are names');
});

reads('GET /v1/events answers a time before 1970 and a forged cursor beyond any stream id without a 500', async ({ api, key }) => {
  const all = (await api.get('/v1/events?limit=100', key)).body.data.items;
  for (const after of ['1969-12-31T00:00:00Z', '0000-01-01T00:00:00Z']) {
    const res = await api.get(`/v1/events?limit=100&after=${after}`, key);
    assert.is(res.status, 200, after);
    assert.equal(res.body.data.items.map((e: any) => e.id), all.map((e: any) => e.id), `after=${after} filters nothing out`);
  }
  const forged = (position: string) => Buffer.from(JSON.stringify({ v: 1, p: position })).toString('base64url');
  for (const position of ['18446744073709551615/', '99999999999999999999999/evt_x', '']) {
    const res = await api.get(`/v1/events?cursor=${forged(position)}`, key);
    assert.is(res.status, 400, position);
    assert.is(res.body.error.code, 'validation');
    assert.is(res.body.error.param, 'cursor');
  }
  // probe C1: on a timeline these read as numbers, or as the end of the list (an empty last page)
  for (const position of ['', '-1', '0', '0x10', ' 7', '1e3', '1.5', '99999999999999999999']) {
    const res = await api.get(`/v1/subscribers/buyer-0/timeline?cursor=${forged(position)}`, key);
    assert.is(res.status, 400, `timeline position ${JSON.stringify(position)}`);
    assert.is(res.body.error.param, 'cursor');
  }
  assert.is((await api.get(`/v1/subscribers/buyer-0/timeline?cursor=${forged('2')}`, key)).status, 200, 'a sequence is a position');
});

reads('the catalog counts every window, orders by 7-day volume and counts distinct subscribers', async ({ api, key }) => {
  const res = await api.get('/v1/events/names', key);
  const entries = res.body.data.items;
  assert.equal(entries.map((e: any) => e.name), ['order.completed', '$subscriber.created', 'order.refunded', 'app.opened.custom']);
  const completed = entries[0];
  assert.equal(completed.counts, { last24h: 26, last7d: 26, last30d: 26, allTime: 26 });
  assert.is(completed.subscribers7d, 5);
  assert.equal(completed.sources, ['ios', 'server']);
  assert.equal(completed.providers, []);
  const refunded = entries[2];
  assert.equal(refunded.counts, { last24h: 0, last7d: 3, last30d: 3, allTime: 3 });
  assert.is(refunded.subscribers7d, 3);
  assert.ok(Date.parse(refunded.firstAt) < Date.now() - DAY);
  const paged = await api.get('/v1/events/names?limit=2', key);
  assert.is(paged.body.data.items.length, 2);
  assert.is(paged.body.data.hasMore, true);
  const rest = await api.get(`/v1/events/names?limit=2&cursor=${paged.body.data.nextCursor}`, key);
  assert.equal(rest.body.data.items.map((e: any) => e.name), ['order.refunded', 'app.opened.custom']);
  // a later page's entries get every count too (the 24-hour and 30-day ones are read for the page only)
  assert.equal(rest.body.data.items[0], refunded);
});

reads('one catalog entry has its series and its 20 newest samples', async ({ api, key }) => {
  const res = await api.get('/v1/events/names/order.completed', key);
  assert.is(res.status, 200);
  assert.is(res.body.data.entry.counts.allTime, 26);
  assert.is(res.body.data.samples.length, 20);
  assert.ok(res.body.data.samples.every((e: any) => e.name === 'order.completed'));
  assert.is(res.body.data.samples[0].source, 'ios', 'newest first: the app event came last');
  assert.is(res.body.data.series.unit, 'day');
  assert.is(res.body.data.series.buckets.at(-1).count, 26);
  assert.is((await api.get('/v1/events/names/never.seen', key)).status, 404);
});

reads('volume has hourly or daily buckets, omits empty ones and filters by name', async ({ api, key }) => {
  const day = (await api.get('/v1/events/volume', key)).body.data;
  assert.is(day.range, '24h');
  assert.is(day.unit, 'hour');
  assert.is(day.buckets.reduce((n: number, b: any) => n + b.count, 0), 32, 'all but the three refunds two days ago');
  assert.ok(day.buckets.every((b: any) => b.count > 0));
  assert.is(day.buckets.length, 2, 'this hour and three hours ago');
  const week = (await api.get('/v1/events/volume?range=7d&name=order.refunded', key)).body.data;
  assert.is(week.unit, 'day');
  assert.equal(week.buckets.map((b: any) => [b.count, b.subscribers]), [[3, 3]]);
  const month = (await api.get('/v1/events/volume?range=30d', key)).body.data;
  assert.is(month.buckets.reduce((n: number, b: any) => n + b.count, 0), 35);
  assert.is((await api.get('/v1/events/volume?range=1y', key)).body.error.code, 'validation');
});

reads('a subscriber timeline lists every kind of event newest first and pages by sequence', async ({ api, key }) => {
  const all = (await api.get('/v1/subscribers/buyer-0/timeline?limit=100', key)).body.data.items;
  assert.is(all.at(-1).name, '$subscriber.created');
  assert.equal(all.map((e: any) => e.sequence), Array.from({ length: all.length }, (_, i) => all.length - i));
  const first = (await api.get('/v1/subscribers/buyer-0/timeline?limit=3', key)).body.data;
  const second = (await api.get(`/v1/subscribers/buyer-0/timeline?limit=3&cursor=${first.nextCursor}`, key)).body.data;
  assert.equal([...first.items, ...second.items].map((e: any) => e.id), all.slice(0, 6).map((e: any) => e.id));
  assert.is((await api.get('/v1/subscribers/nobody/timeline', key)).status, 404);
});

reads('pages of any limit list the tenant\'s events exactly as one page does, newest first, none repeated or missed', async ({ api, service }) => {
  const { keys: own } = await bootstrapWorkspace(service, 'reads-pages');
  const key = own.tenant;
  // 260 events over 40 subscribers (most partitions), sent in batches so many share a millisecond
  for (let b = 0; b < 4; b++) {
    const events = Array.from({ length: 65 }, (_, i) => ({ externalId: `pager-${(b * 65 + i) % 40}`, name: i % 3 ? 'page.a' : 'page.b' }));
    assert.is((await api.post('/v1/events', key, { events })).status, 202);
  }
  const all: string[] = [];
  await waitFor('every event applied', async () => {
    all.length = 0;
    let cursor: string | null = null;
    do {
      const res: any = await api.get(`/v1/events?limit=100${cursor ? `&cursor=${cursor}` : ''}`, key);
      all.push(...res.body.data.items.map((e: any) => e.id));
      cursor = res.body.data.nextCursor;
    } while (cursor);
    return all.length === 300; // 260 + 40 $subscriber.created
  });
  for (const [limit, query] of [[1, ''], [7, ''], [50, ''], [9, '&name=page.b']] as const) {
    const ids: string[] = [];
    let cursor: string | null = null;
    for (let pages = 0; pages < 400; pages++) {
      const res: any = await api.get(`/v1/events?limit=${limit}${query}${cursor ? `&cursor=${cursor}` : ''}`, key);
      assert.ok(res.body.data.items.length <= limit);
      ids.push(...res.body.data.items.map((e: any) => e.id));
      cursor = res.body.data.nextCursor;
      if (!cursor) break;
    }
    const expected = query ? (await api.get('/v1/events?limit=100&name=page.b', key)).body.data.items.map((e: any) => e.id) : all;
    assert.equal(ids, expected, `limit ${limit}${query}`);
  }
});

reads('a cursor is bound to the list that gave it: another subscriber\'s timeline, another tenant\'s events refuse it (400 cursor)', async ({ api, key, service }) => {
  const timeline = (await api.get('/v1/subscribers/buyer-0/timeline?limit=2', key)).body.data;
  assert.ok(timeline.nextCursor);
  assert.is((await api.get(`/v1/subscribers/buyer-0/timeline?limit=2&cursor=${timeline.nextCursor}`, key)).status, 200, 'its own list reads it');
  const other = await api.get(`/v1/subscribers/buyer-1/timeline?limit=2&cursor=${timeline.nextCursor}`, key);
  assert.equal([other.status, other.body.error?.code, other.body.error?.param], [400, 'validation', 'cursor']);

  const events = (await api.get('/v1/events?limit=2', key)).body.data;
  const { keys: otherTenant } = await bootstrapWorkspace(service, 'reads-other');
  const foreign = await api.get(`/v1/events?limit=2&cursor=${events.nextCursor}`, otherTenant.tenant);
  assert.equal([foreign.status, foreign.body.error?.code, foreign.body.error?.param], [400, 'validation', 'cursor']);
  // a filter is not part of the list: the position reads on under another name filter
  assert.is((await api.get(`/v1/events?limit=2&name=order.completed&cursor=${events.nextCursor}`, key)).status, 200);
  // an encoded path names the same list as the plain one
  const odd = (await api.get('/v1/subscribers/buyer%2D0/timeline?limit=2', key)).body.data;
  assert.is((await api.get(`/v1/subscribers/buyer-0/timeline?limit=2&cursor=${odd.nextCursor}`, key)).status, 200);
});

reads('an externalId with slashes, percent signs, spaces and non-ASCII round-trips through the path', async ({ api, key }) => {
  const odd = 'a/b %c ü✓';
  await api.post('/v1/events', key, { externalId: odd, name: 'odd.id' });
  const res = await waitFor('the odd subscriber timeline', async () => {
    const r = await api.get(`/v1/subscribers/${encodeURIComponent(odd)}/timeline`, key);
    return r.status === 200 && r.body.data.items.length === 2 ? r : null;
  });
  assert.is(res.body.data.items[0].externalId, odd);
  const long = await api.get(`/v1/subscribers/${'x'.repeat(257)}/timeline`, key);
  assert.is(long.status, 404, 'a malformed id (spec 2.3 rules 2 and 4)');
  assert.is(long.body.error.code, 'not_found');
});

reads('catalog windows roll by the hour and reach the hour ahead; volume shows them', async ({ api, key }) => {
  const events = [
    { externalId: 'edge', name: 'edge.window', timestamp: ago(7 * DAY - 5 * 60_000) },
    { externalId: 'edge', name: 'edge.window', timestamp: ago(6.5 * DAY) },
    { externalId: 'edge', name: 'edge.window', timestamp: ago(24 * HOUR - 5 * 60_000) },
    { externalId: 'edge', name: 'edge.window', timestamp: ago(25 * HOUR + 5 * 60_000) },
    { externalId: 'edge', name: 'edge.window', timestamp: ago(-50 * 60_000) },
  ];
  assert.is((await api.post('/v1/events', key, { events })).status, 202);
  const entry = await waitFor('the edge events in the catalog', async () => {
    const res = await api.get('/v1/events/names/edge.window', key);
    return res.status === 200 && res.body.data.entry.counts.allTime === 5 ? res.body.data.entry : null;
  });
  assert.equal(entry.counts, { last24h: 2, last7d: 5, last30d: 5, allTime: 5 });
  const day = (await api.get('/v1/events/volume?name=edge.window', key)).body.data;
  assert.is(day.buckets.reduce((n: number, b: any) => n + b.count, 0), 2, 'the hour ahead and 24 hours ago');
  const week = (await api.get('/v1/events/volume?range=7d&name=edge.window', key)).body.data;
  assert.is(week.buckets.reduce((n: number, b: any) => n + b.count, 0), 5);
});

reads('a caller id keeps a pointer to the one stored copy; replays answer the original before and after the worker applied it', async ({ api, key, service, tenantId }) => {
  const x = 'pointer-1';
  const p = partitionOf(tenantId, x, service.config.partitions);
  const field = `${tenantId}|${Buffer.byteLength(x)}|${x}|order-77`;
  const big = { note: 'n'.repeat(900) };
  const first = (await api.post('/v1/events', key, { externalId: x, name: 'order.paid', id: 'order-77', data: big })).body.data.items[0];
  const asOriginal = (item: any) => ({ ...item, status: 'accepted' });
  // the replay may meet the entry still in the inbox or already in the tenant log: either answers the original
  const early = (await api.post('/v1/events', key, { externalId: x, name: 'order.paid', id: 'order-77', data: { other: true } })).body.data.items[0];
  assert.is(early.status, 'duplicate');
  assert.equal(asOriginal(early), first);
  const pointer = await waitFor('the worker to point the dedupe entry at the tenant log', async () => {
    const v = await service.redis.hget(service.keys.dedupe(p), field);
    return v?.startsWith('l') ? v : null;
  });
  assert.ok(pointer.length < 40, `a pointer, not a copy of the event (${pointer.length} bytes)`);
  const logged = await service.redis.xrange(service.keys.tenantLog(p, tenantId), pointer.slice(1), pointer.slice(1));
  assert.is(logged.length, 1, 'it names the tenant-log entry');
  const late = (await api.post('/v1/events', key, { events: [{ externalId: x, name: 'order.paid', id: 'order-77', data: { other: 2 } }] })).body.data.items[0];
  assert.is(late.status, 'duplicate');
  assert.equal(asOriginal(late), first);
  // an entry written before pointers (the original itself) still answers
  const legacy = JSON.stringify({ id: 'evt_legacy', q: 9, ts: String(Date.parse(first.timestamp)), r: String(Date.parse(first.receivedAt)), o: 'server', n: 'order.old', ru: '', m: '', st: '' });
  await service.redis.hset(service.keys.dedupe(p), `${tenantId}|${x}|old-1`, `${legacy}\n{"kept":1}`);
  const old = (await api.post('/v1/events', key, { externalId: x, name: 'order.old', id: 'old-1' })).body.data.items[0];
  assert.equal([old.status, old.id, old.sequence, old.data], ['duplicate', 'evt_legacy', 9, { kept: 1 }]);
  // a pointer whose entry was trimmed away has expired: the event is new, and the entry points at it
  await service.redis.hset(service.keys.dedupe(p), field, 'l1-1');
  const fresh = (await api.post('/v1/events', key, { externalId: x, name: 'order.paid', id: 'order-77', data: { again: true } })).body.data.items[0];
  assert.is(fresh.status, 'accepted');
  assert.is.not(fresh.id, first.id);
  assert.match((await service.redis.hget(service.keys.dedupe(p), field)) ?? '', /^[il]\d+-\d+$/);
});

reads('a timeline whose older entries retention trimmed from the log ends at the first trimmed one: no empty pages with hasMore (probe BK: 8 empty pages before the end)', async ({ api, service }) => {
  const boot = await bootstrapWorkspace(service, 'trimmed-timeline');
  const key = boot.keys.tenant;
  const x = 'burst-then-quiet';
  assert.is((await api.post('/v1/events', key, { events: Array.from({ length: 12 }, (_, i) => ({ externalId: x, name: 'burst.tick', data: { i } })) })).status, 202);
  const all = await waitFor('the burst applied', async () => {
    const items = (await api.get(`/v1/subscribers/${x}/timeline?limit=100`, key)).body.data.items;
    return items.length === 13 ? items : null;
  });
  // the retention trim of the tenant log (MINID) took every entry older than the newest three; the
  // timeline's members stay until the subscriber's next writes trim them, or the key expires
  const p = partitionOf(boot.tenant.id, x, service.config.partitions);
  const log = service.keys.tenantLog(p, boot.tenant.id);
  const ids = (await service.redis.xrange(log, '-', '+')).map(([id]) => id);
  assert.is(ids.length, 13);
  await service.redis.xtrim(log, 'MINID', ids[10]!);
  assert.is(await service.redis.zcard(service.keys.timeline(p, boot.tenant.id, x)), 13, 'the members are still there');
  const pages: number[][] = [];
  let cursor: string | null = null;
  for (let n = 0; n < 10; n++) {
    const page: any = (await api.get(`/v1/subscribers/${x}/timeline?limit=2${cursor ? `&cursor=${cursor}` : ''}`, key)).body.data;
    pages.push(page.items.map((e: any) => e.sequence));
    cursor = page.nextCursor;
    if (!page.hasMore) break;
  }
  assert.equal(pages, [[13, 12], [11]], 'the live events, then the end');
  assert.equal(pages.flat(), all.slice(0, 3).map((e: any) => e.sequence));
});

reads('expired data really goes after the retention window', async ({ api, key, service }) => {
  await api.post('/v1/events', key, { externalId: 'old-timer', name: 'kept.briefly', id: 'once' });
  await waitFor('the event to be applied', async () => (await api.get('/v1/subscribers/old-timer/timeline', key)).body.data.items.length === 2);
  setClockOffset(31 * DAY);
  try {
    await sweepRetention({ config: service.config, redis: service.redis, keys: service.keys, log: console as any, target: { url: '' } });
    const log = (await api.get('/v1/events?name=kept.briefly', key)).body.data.items;
    assert.is(log.length, 0, 'the tenant log is trimmed to the window');
    assert.is((await api.get('/v1/subscribers/old-timer/timeline', key)).body.data.items.length, 0);
    // the tenant wrote nothing in this partition within the window: it leaves the partition's
    // tenant list, with its empty log and its sample lists; its catalog (all-time counts) stays
    const tenantId = (await api.get('/v1/whoami', key)).body.data.tenant.id;
    const p = partitionOf(tenantId, 'old-timer', service.config.partitions);
    assert.is(await service.redis.zscore(service.keys.partitionTenants(p), tenantId), null);
    assert.is(await service.redis.exists(service.keys.tenantLog(p, tenantId), service.keys.samples(p, tenantId, 'kept.briefly')), 0);
    assert.is(await service.redis.hget(service.keys.catalog(p, tenantId), 'kept.briefly|all'), '1');
    const entry = (await api.get('/v1/events/names/kept.briefly', key)).body.data;
    assert.equal([entry.entry.counts.allTime, entry.samples], [1, []], 'the name is still in the catalog, its sample gone');
    const again = await api.post('/v1/events', key, { externalId: 'old-timer', name: 'kept.briefly', id: 'once' });
    assert.is(again.body.data.items[0].status, 'accepted', 'the dedupe key expired with the window');
  } finally {
    setClockOffset(0);
  }
});

reads('every tenant log of a partition is trimmed, however many tenants it holds; a tenant still writing is kept, an idle one only once its log is empty', async ({ service }) => {
  const p = 1;
  const tenants = Array.from({ length: 12_500 }, (_, i) => `tnt_trim${String(i).padStart(6, '0')}`);
  const recent = Date.now();
  for (let i = 0; i < tenants.length; i += 500) {
    const pipeline = service.redis.pipeline();
    for (const t of tenants.slice(i, i + 500)) {
      pipeline.xadd(service.keys.tenantLog(p, t), '1000-1', 'n', 'expired');
      pipeline.xadd(service.keys.tenantLog(p, t), `${recent}-1`, 'n', 'kept');
    }
    pipeline.zadd(service.keys.partitionTenants(p), ...tenants.slice(i, i + 500).flatMap((t) => [recent, t]));
    await pipeline.exec();
  }
  // idle: last applied long ago; one with its log emptied by the trim, one whose log still holds an entry in the window
  const idle = 'tnt_trimidle', idleButKept = 'tnt_trimidlekept';
  await service.redis.pipeline()
    .xadd(service.keys.tenantLog(p, idle), '1000-1', 'n', 'expired').rpush(service.keys.samples(p, idle, 'a.b'), '1000-1').hset(service.keys.catalog(p, idle), 'a.b|all', '1')
    .xadd(service.keys.tenantLog(p, idleButKept), `${recent}-1`, 'n', 'kept')
    .zadd(service.keys.partitionTenants(p), 1000, idle, 1000, idleButKept).exec();
  const sweep = () => sweepRetention({ config: service.config, redis: service.redis, keys: service.keys, log: console as any, target: { url: '' } });
  const expiredLeft = async () => {
    const pipeline = service.redis.pipeline();
    for (const t of tenants) pipeline.xlen(service.keys.tenantLog(p, t));
    return (await pipeline.exec())!.filter(([, n]) => n !== 1).length;
  };
  const first = await sweep();
  assert.is(first.idleTenantsForgotten, 1);
  assert.ok(await expiredLeft() > 0, 'one sweep trims at most 10,000 tenants of a partition');
  await sweep();
  assert.is(await expiredLeft(), 0, 'the next sweep goes on where the last one stopped');
  assert.is(await service.redis.zscore(service.keys.partitionTenants(p), idle), null);
  assert.is(await service.redis.exists(service.keys.tenantLog(p, idle), service.keys.samples(p, idle, 'a.b')), 0);
  assert.is(await service.redis.hget(service.keys.catalog(p, idle), 'a.b|all'), '1', 'the catalog stays');
  assert.is(await service.redis.zscore(service.keys.partitionTenants(p), idleButKept), '1000', 'a log with an entry in the window is kept');
  // every tenant still writing stays listed (other tests' tenants may share the partition: no exact count)
  const scores = (await service.redis.zmscore(service.keys.partitionTenants(p), ...tenants)) as (string | null)[];
  assert.is(scores.filter((score) => score === String(recent)).length, tenants.length);
  const pipeline = service.redis.pipeline();
  for (const t of [...tenants, idleButKept]) pipeline.del(service.keys.tenantLog(p, t));
  await pipeline.zrem(service.keys.partitionTenants(p), ...tenants, idleButKept).del(service.keys.catalog(p, idle)).exec();
});

reads('one sweep forgets every expired dedupe entry of a partition, not only the first 5,000', async ({ service }) => {
  const p = 0;
  const fields = Array.from({ length: 12_000 }, (_, i) => `tnt_sweep|x-${i}|id-${i}`);
  for (let i = 0; i < fields.length; i += 1_000) {
    const chunk = fields.slice(i, i + 1_000);
    await service.redis.pipeline().hset(service.keys.dedupe(p), ...chunk.flatMap((f) => [f, 'l1-1'])).zadd(service.keys.dedupeAge(p), ...chunk.flatMap((f) => [1, f])).exec();
  }
  const { dedupeRemoved } = await sweepRetention({ config: service.config, redis: service.redis, keys: service.keys, log: console as any, target: { url: '' } });
  assert.ok(dedupeRemoved >= 12_000, `removed ${dedupeRemoved}`);
  assert.is(await service.redis.zcount(service.keys.dedupeAge(p), '-inf', 1), 0);
  assert.is((await service.redis.hmget(service.keys.dedupe(p), ...fields.slice(-3))).filter(Boolean).length, 0);
});

reads('a catalog walk goes on in its first page\'s order: a name that arrives at the top meanwhile makes the next page repeat nothing (test/events/catalog-walk.test.ts: the rest)', async ({ api, service }) => {
  const key = (await bootstrapWorkspace(service, 'reads-keyset')).keys.tenant;
  const post = (name: string, n: number) => api.post('/v1/events', key, { events: Array.from({ length: n }, (_, i) => ({ externalId: `k-${i % 2}`, name })) });
  await post('k.first', 6);
  await post('k.second', 4);
  await post('k.third', 3);
  const names = async () => (await api.get('/v1/events/names?limit=100', key)).body.data.items.map((e: any) => e.name);
  // every event counted (the order of the first page is the walk's)
  await waitFor('the catalog', async () => {
    const items = (await api.get('/v1/events/names?limit=100', key)).body.data.items;
    return items.map((e: any) => `${e.name}:${e.counts.allTime}`).join(' ') === 'k.first:6 k.second:4 k.third:3 $subscriber.created:2';
  });
  const first = (await api.get('/v1/events/names?limit=2', key)).body.data;
  assert.equal(first.items.map((e: any) => e.name), ['k.first', 'k.second']);
  await post('k.burst', 20);
  await waitFor('the burst in the catalog', async () => (await names())[0] === 'k.burst');
  const second = (await api.get(`/v1/events/names?limit=2&cursor=${first.nextCursor}`, key)).body.data;
  assert.equal(second.items.map((e: any) => e.name), ['k.third', '$subscriber.created'], 'after k.second, k.burst not repeated nor listed');
  assert.equal([second.hasMore, second.nextCursor], [false, null]);
  const forged = Buffer.from(JSON.stringify({ v: 1, p: '2' })).toString('base64url');
  const bad = await api.get(`/v1/events/names?cursor=${forged}`, key);
  assert.equal([bad.status, bad.body.error.code, bad.body.error.param], [400, 'validation', 'cursor']);
});

reads('a read Redis answers with an error is the request\'s error, never a smaller count (probe DP: volume counted it as 0)', async ({ api, service }) => {
  const boot = await bootstrapWorkspace(service, 'reads-broken');
  const { redis, keys, config } = service;
  const hour = Math.floor(Date.now() / HOUR) * HOUR;
  // one partition's bucket of the current hour holds what HGET cannot read
  await redis.rpush(keys.volume(config.partitions - 1, boot.tenant.id, 'h', hour), 'not a hash');
  try {
    const res = await api.get('/v1/events/volume?range=24h', boot.keys.tenant);
    assert.is(res.status, 500, JSON.stringify(res.body));
    assert.is(res.body.error.code, 'internal');
  } finally {
    await redis.del(keys.volume(config.partitions - 1, boot.tenant.id, 'h', hour));
  }
});

reads('distinct subscribers never exceed the events counted, whatever the HyperLogLog estimates (probe EZ: 30,016 subscribers of 30,000 events)', async ({ api, key, service, tenantId }) => {
  // the one app.opened.custom event's estimates, made to overshoot as a large count's error can
  const estimates = await service.redis.keys(`${service.keys.prefix}*:uv:${tenantId}:*:app.opened.custom`);
  assert.ok(estimates.length >= 2, 'an hourly and a daily estimate');
  for (const k of estimates) await service.redis.pfadd(k, ...Array.from({ length: 50 }, (_, i) => `ghost-${i}`));
  const hours = (await api.get('/v1/events/volume?name=app.opened.custom', key)).body.data;
  assert.equal(hours.buckets.map((b: any) => [b.count, b.subscribers]), [[1, 1]]);
  const entry = (await api.get('/v1/events/names/app.opened.custom', key)).body.data.entry;
  assert.equal([entry.counts.allTime, entry.subscribers7d], [1, 1]);
});

reads.run();
