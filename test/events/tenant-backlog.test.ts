import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { partitionOf } from '../../lib/partition.js';
import { client, type Reply } from '../helpers/api.js';
import { BY_TEST, bootstrapWorkspace, makeKey, startTestService, type TestService } from '../helpers/service.js';
import { waitFor } from '../helpers/wait.js';
import { createTenant, ensureWorkspace } from '../../streams/identity.js';
import { swHeaders } from '../sources/signing.js';
import { tenantRequestsInProgress, withinTenantLimit } from '../../http/middleware/auth.js';

// TENANT_INBOX_MAX_BACKLOG (docs/events.md, Fairness between tenants): a tenant holding that many
// unprocessed events in one partition gets 429 rate_limited for requests writing there, while
// another tenant's events in that same partition, and its own elsewhere, are accepted; once the
// worker processes the backlog the tenant is accepted again.

type Ctx = {
  service: TestService; api: ReturnType<typeof client>;
  a: { key: string; clientKey: string; tenantId: string }; b: { key: string; tenantId: string };
};
const LIMIT = 5;
const fair = suite<Ctx>('tenant backlog (TENANT_INBOX_MAX_BACKLOG)');

// Web role only at first: nothing drains the inboxes, so a tenant's backlog stays where it was put.
fair.before(async (ctx) => {
  ctx.service = await startTestService('tenant-backlog', { TENANT_INBOX_MAX_BACKLOG: String(LIMIT) });
  ctx.api = client(ctx.service.url);
  const { keys } = await bootstrapWorkspace(ctx.service, 'fair');
  const tenantOf = async (key: string) => (await ctx.api.get('/v1/whoami', key)).body.data.tenant.id as string;
  ctx.a = { key: keys.tenant, clientKey: keys.client, tenantId: await tenantOf(keys.tenant) };
  const { workspace } = await ensureWorkspace(ctx.service.redis, ctx.service.keys, 'fair', BY_TEST);
  await createTenant(ctx.service.redis, ctx.service.keys, workspace, 'other', BY_TEST);
  const bKey = (await makeKey(ctx.service, 'fair', 'tenant', ['*'], { tenant: 'other' })).key;
  ctx.b = { key: bKey, tenantId: await tenantOf(bKey) };
});
fair.after(async (ctx) => ctx.service.stop());

const partition = (ctx: Ctx, tenantId: string, externalId: string) => partitionOf(tenantId, externalId, ctx.service.config.partitions);
/** The first of `prefix-0`, `prefix-1`, … of `tenantId` that falls (or does not fall) in partition `p`. */
function externalIdIn(ctx: Ctx, tenantId: string, prefix: string, p: number, inside = true): string {
  for (let i = 0; i < 10_000; i++) if ((partition(ctx, tenantId, `${prefix}-${i}`) === p) === inside) return `${prefix}-${i}`;
  throw new Error('no such externalId');
}
function assertLimited(res: Reply, what: string): void {
  assert.is(res.status, 429, `${what}: ${res.text.slice(0, 300)}`);
  assert.is(res.body.error.code, 'rate_limited', what);
  assert.is(res.headers.get('retry-after'), '1', `${what} says when to retry`);
}

fair('a tenant over its backlog in one partition is refused there (429, whole request, nothing stored); another tenant there and its own other partitions are not', async (ctx) => {
  const { api, a, b, service: { redis, keys } } = ctx;
  const hot = 'hot-1';
  const p = partition(ctx, a.tenantId, hot);
  // events one request at a time: each of the first LIMIT is accepted, then the tenant has LIMIT waiting
  for (let i = 0; i < LIMIT; i++) {
    const res = await api.post('/v1/events', a.key, { externalId: hot, name: 'page.viewed', id: `e-${i}` });
    assert.is(res.status, 202, `event ${i}: ${res.text}`);
  }
  const lengthBefore = await redis.xlen(keys.inbox(p));
  assertLimited(await api.post('/v1/events', a.key, { externalId: hot, name: 'page.viewed', id: 'e-over' }), 'one more event');
  // another subscriber of the same tenant in the same partition waits with it
  assertLimited(await api.post('/v1/events', a.key, { externalId: externalIdIn(ctx, a.tenantId, 'same', p), name: 'page.viewed' }), 'a neighbour of the same tenant');
  // a batch touching the partition is refused whole: its events elsewhere are not stored either
  const elsewhere = Array.from({ length: 6 }, (_, i) => externalIdIn(ctx, a.tenantId, `calm${i}`, p, false));
  const lengthsElsewhere = () => Promise.all(elsewhere.map((x) => redis.xlen(keys.inbox(partition(ctx, a.tenantId, x)))));
  const before = await lengthsElsewhere();
  assertLimited(await api.post('/v1/events', a.key, { events: [...elsewhere.map((externalId) => ({ externalId, name: 'order.placed' })), { externalId: hot, name: 'order.placed' }] }), 'a batch');
  assert.equal(await lengthsElsewhere(), before, 'nothing of the refused batch stored in its other partitions');
  assert.is(await redis.xlen(keys.inbox(p)), lengthBefore, 'nor in the full one');
  // the app's own events, and a Source's webhook, are refused the same way
  assertLimited(await api.post('/v1/client/events', a.clientKey, { externalId: hot, source: 'ios', events: [{ name: 'page.viewed' }] }), 'POST /v1/client/events');
  const source = (await api.post('/v1/sources', a.key, { name: 'Clerk', provider: 'clerk', format: 'standard-webhooks', mapping: { externalId: 'data.id' } })).body.data;
  const delivery = JSON.stringify({ type: 'user.updated', data: { id: hot } });
  assertLimited(await api.call('POST', `/v1/sources/${source.id}/inbound`, { raw: delivery, headers: swHeaders(source.secret, delivery) }), 'a source delivery');

  // the same tenant elsewhere, and another tenant in the same partition, go on
  assert.is((await api.post('/v1/events', a.key, { events: elsewhere.map((externalId) => ({ externalId, name: 'order.placed' })) })).status, 202, 'tenant A in other partitions');
  const neighbour = externalIdIn(ctx, b.tenantId, 'b', p);
  for (let i = 0; i < LIMIT; i++) {
    const res = await api.post('/v1/events', b.key, { externalId: neighbour, name: 'page.viewed' });
    assert.is(res.status, 202, `tenant B in the same partition, event ${i}: ${res.text}`);
  }
  assertLimited(await api.post('/v1/events', b.key, { externalId: neighbour, name: 'page.viewed' }), 'tenant B at its own limit');

  // the document declares the answer on every route that refuses it
  const doc = (await (await fetch(`${ctx.service.url}/v1/openapi.json`)).json()) as any;
  for (const path of ['/v1/events', '/v1/client/events', '/v1/sources/{id}/inbound']) {
    assert.is(doc.paths[path].post.responses['429']?.$ref, '#/components/responses/RateLimited', path);
  }
  assert.ok(doc.components.responses.RateLimited.headers['Retry-After']);

  // a worker processes the backlog: tenant A is accepted there again, and nothing refused was stored
  const worker = await startTestService('tenant-backlog-worker', { REDIS_KEY_PREFIX: ctx.service.env.REDIS_KEY_PREFIX!, TENANT_INBOX_MAX_BACKLOG: String(LIMIT) }, ['worker']);
  try {
    const res = await waitFor('tenant A accepted again', async () => {
      const answer = await api.post('/v1/events', a.key, { externalId: hot, name: 'page.viewed', id: 'e-after' });
      return answer.status === 202 ? answer : null;
    }, 20_000, 100);
    assert.is(res.body.data.items[0].sequence, LIMIT + 2, 'the next sequence after $subscriber.created and the LIMIT accepted: no refused event took one');
    const timeline = await waitFor('the timeline holds the new event', async () => {
      const page = await api.get(`/v1/subscribers/${hot}/timeline?limit=100`, a.key);
      return page.body.data.items?.length === LIMIT + 2 ? page.body.data.items : null;
    }, 20_000, 100);
    assert.equal(timeline.map((e: any) => e.name), ['page.viewed', ...Array(LIMIT).fill('page.viewed'), '$subscriber.created']);
  } finally {
    await worker.stop();
  }
});

fair.run();

// TENANT_INGEST_CONCURRENCY: with its places taken (in this process, as requests in progress take
// them) a tenant's next event request is 429 at once, another tenant's is not; a request
// whose body is still arriving holds no place (probe L1: a client key's slow uploads held the
// backend's events off).
type Held = { finish: () => Promise<number> };
/** An event request whose body is sent in part: it stays unread until `finish`. */
async function holdOpen(url: string, key: string, body: string): Promise<Held> {
  const { request } = await import('node:http');
  const target = new URL('/v1/events', url);
  const req = request({ host: target.hostname, port: target.port, path: target.pathname, method: 'POST', agent: false,
    headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json', 'content-length': String(Buffer.byteLength(body)) } });
  const answered = new Promise<number>((done, fail) => {
    req.on('response', (res) => { res.resume(); res.on('end', () => done(res.statusCode ?? 0)); });
    req.on('error', fail);
  });
  answered.catch(() => {}); // awaited by `finish`
  req.write(body.slice(0, 10));
  return { finish: () => { req.end(body.slice(10)); return answered; } };
}

const concurrency = suite<{ service: TestService; api: ReturnType<typeof client>; a: string; b: string; aClient: string; tenantA: string }>('tenant ingest concurrency (TENANT_INGEST_CONCURRENCY)');
concurrency.before(async (ctx) => {
  ctx.service = await startTestService('tenant-concurrency', { TENANT_INGEST_CONCURRENCY: '2' });
  ctx.api = client(ctx.service.url);
  const { keys } = await bootstrapWorkspace(ctx.service, 'conc');
  ctx.a = keys.tenant;
  ctx.aClient = keys.client;
  ctx.tenantA = (await ctx.api.get('/v1/whoami', keys.tenant)).body.data.tenant.id;
  const { workspace } = await ensureWorkspace(ctx.service.redis, ctx.service.keys, 'conc', BY_TEST);
  await createTenant(ctx.service.redis, ctx.service.keys, workspace, 'other', BY_TEST);
  ctx.b = (await makeKey(ctx.service, 'conc', 'tenant', ['*'], { tenant: 'other' })).key;
});
concurrency.after(async (ctx) => ctx.service.stop());

concurrency('past the limit of requests in progress a tenant gets 429 at once; another tenant does not; finished requests free their place; slow uploads hold none', async ({ service, api, a, b, aClient, tenantA }) => {
  const event = (externalId: string) => ({ externalId, name: 'page.viewed' });
  /** Two places of tenant A's ingest group taken, in this process, the way a request in progress takes one; resolves to a release. */
  const holdTwo = async () => {
    let release = () => {};
    const held = new Promise<void>((done) => (release = done));
    const taken = [withinTenantLimit('ingest', 2, tenantA, () => held), withinTenantLimit('ingest', 2, tenantA, () => held)];
    assert.is(tenantRequestsInProgress('ingest', tenantA), 2);
    return async () => {
      release();
      await Promise.all(taken);
      return [202, 202];
    };
  };
  let release: (() => Promise<number[]>) | undefined;
  try {
    release = await holdTwo();
    assertLimited(await api.post('/v1/events', a, event('fast-1')), 'a third request of tenant A');
    assertLimited(await api.post('/v1/client/events', aClient, { externalId: 'fast-1', source: 'ios', events: [{ name: 'page.viewed' }] }), 'its app\'s events count with them');
    assert.is((await api.post('/v1/events', b, event('fast-1'))).status, 202, 'tenant B goes on');
    await release();
    assert.is(tenantRequestsInProgress('ingest', tenantA), 0);
    assert.is((await api.post('/v1/events', a, event('fast-1'))).status, 202, 'their places are free again');
    // refused requests (400) free their places too
    for (let i = 0; i < 3; i++) assert.is((await api.post('/v1/events', a, { externalId: 'fast-1', name: '$bad' })).status, 400);
    assert.is(tenantRequestsInProgress('ingest', tenantA), 0);
    // bodies still arriving hold no place: three slow uploads, and tenant A's next request goes through
    const body = JSON.stringify(event('slow-1'));
    const slow = [await holdOpen(service.url, a, body), await holdOpen(service.url, a, body), await holdOpen(service.url, a, body)];
    assert.is((await api.post('/v1/events', a, event('fast-2'))).status, 202, 'not refused for uploads in progress');
    assert.is(tenantRequestsInProgress('ingest', tenantA), 0);
    for (const h of slow) assert.is(await h.finish(), 202, 'each, its body complete'); // one after the other: 3 at once would pass the limit of 2
  } finally {
    release?.();
  }
});

concurrency.run();

// SUBSCRIBER_INBOX_MAX_BACKLOG: one subscriber holding that many unprocessed events ($subscriber.created
// included) is refused (429) while its tenant's other subscribers in the same partition go on.
const hot = suite<{ service: TestService; api: ReturnType<typeof client>; key: string; clientKey: string; tenantId: string }>('subscriber backlog (SUBSCRIBER_INBOX_MAX_BACKLOG)');
hot.before(async (ctx) => {
  ctx.service = await startTestService('subscriber-backlog', { SUBSCRIBER_INBOX_MAX_BACKLOG: '3', TENANT_INBOX_MAX_BACKLOG: '100' });
  ctx.api = client(ctx.service.url);
  const { keys } = await bootstrapWorkspace(ctx.service, 'hot');
  ctx.key = keys.tenant;
  ctx.clientKey = keys.client;
  ctx.tenantId = (await ctx.api.get('/v1/whoami', keys.tenant)).body.data.tenant.id;
});
hot.after(async (ctx) => ctx.service.stop());

hot('a subscriber at its backlog is refused (whole request, named); its neighbours in the partition are not; processed, it is accepted again', async (ctx) => {
  const { api, key, clientKey, tenantId, service } = ctx;
  const { redis, keys, config } = service;
  const p = partitionOf(tenantId, 'looping', config.partitions);
  let accepted = 0;
  for (; accepted < 10; accepted++) {
    const res = await api.post('/v1/events', key, { externalId: 'looping', name: 'app.opened' });
    if (res.status !== 202) {
      assertLimited(res, 'the looping subscriber');
      assert.match(res.body.error.message, /"looping"/);
      break;
    }
  }
  assert.is(accepted, 2, 'its $subscriber.created and 2 events make 3 waiting');
  let neighbour = 0;
  while (partitionOf(tenantId, `n-${neighbour}`, config.partitions) !== p) neighbour++;
  const lengthBefore = await redis.xlen(keys.inbox(p));
  assertLimited(await api.post('/v1/events', key, { events: [{ externalId: `n-${neighbour}`, name: 'app.opened' }, { externalId: 'looping', name: 'app.opened' }] }), 'a batch naming it');
  assert.is(await redis.xlen(keys.inbox(p)), lengthBefore, 'nothing of the batch stored');
  assertLimited(await api.post('/v1/client/events', clientKey, { externalId: 'looping', source: 'ios', events: [{ name: 'app.opened' }] }), 'from the app');
  // the neighbour has a limit of its own ($subscriber.created and 2 events)
  for (let i = 0; i < 2; i++) assert.is((await api.post('/v1/events', key, { externalId: `n-${neighbour}`, name: 'app.opened' })).status, 202, `its neighbour, event ${i}`);
  const worker = await startTestService('subscriber-backlog-worker', { REDIS_KEY_PREFIX: service.env.REDIS_KEY_PREFIX! }, ['worker']);
  try {
    const res = await waitFor('the subscriber accepted again', async () => {
      const answer = await api.post('/v1/events', key, { externalId: 'looping', name: 'app.opened' });
      return answer.status === 202 ? answer : null;
    }, 20_000, 100);
    assert.is(res.body.data.items[0].sequence, 4, 'no refused event took a sequence');
  } finally {
    await worker.stop();
  }
});

hot.run();

// A burst of requests arriving together is counted against itself (probe L1: 16 concurrent
// 100-event batches for one new subscriber were all admitted at limit 250, leaving 1,601 waiting):
// requests are admitted in order while the backlog plus what was admitted before them is under the
// limit, whether they share a flush or come in several, so a limit is passed by one request at most.
const burst = suite<{ service: TestService; api: ReturnType<typeof client>; key: string; tenantId: string }>('backlog limits against a burst');
burst.before(async (ctx) => {
  ctx.service = await startTestService('backlog-burst', { SUBSCRIBER_INBOX_MAX_BACKLOG: '250', TENANT_INBOX_MAX_BACKLOG: '500' });
  ctx.api = client(ctx.service.url);
  const { keys } = await bootstrapWorkspace(ctx.service, 'burst');
  ctx.key = keys.tenant;
  ctx.tenantId = (await ctx.api.get('/v1/whoami', keys.tenant)).body.data.tenant.id;
});
burst.after(async (ctx) => ctx.service.stop());

const statuses = (replies: Reply[]) => replies.map((r) => r.status).sort().join(',');

burst('16 concurrent 100-event batches for one new subscriber: 3 accepted (301 waiting at limit 250), 13 refused, nothing of them stored', async ({ api, key, tenantId, service }) => {
  const { redis, keys, config } = service;
  const batch = (b: number) => ({ events: Array.from({ length: 100 }, (_, i) => ({ externalId: 'importing', name: 'history.imported', id: `b${b}-${i}` })) });
  const replies = await Promise.all(Array.from({ length: 16 }, (_, b) => api.post('/v1/events', key, batch(b))));
  assert.is(statuses(replies), [...Array(3).fill(202), ...Array(13).fill(429)].join(','), replies.map((r) => r.status).join(','));
  for (const res of replies.filter((r) => r.status === 429)) assertLimited(res, 'a batch past the limit');
  const p = partitionOf(tenantId, 'importing', config.partitions);
  assert.is(Number(await redis.hget(keys.sequences(p), `${tenantId}|importing`)), 301, '$subscriber.created and 3 batches');
  assert.is(await redis.xlen(keys.inbox(p)), 301, 'nothing of the refused batches stored');
});

burst('30 concurrent 100-event batches of one tenant over one partition: 5 accepted (500 waiting at limit 500), 25 refused', async (ctx) => {
  const { api, key, tenantId, service } = ctx;
  const { redis, keys, config } = service;
  const p = (partitionOf(tenantId, 'importing', config.partitions) + 1) % config.partitions;
  const subscribers: string[] = [];
  for (let i = 0; subscribers.length < 10 && i < 10_000; i++) if (partitionOf(tenantId, `user-${i}`, config.partitions) === p) subscribers.push(`user-${i}`);
  const batch = () => ({ events: Array.from({ length: 100 }, (_, i) => ({ externalId: subscribers[i % 10]!, name: 'order.placed' })) });
  const replies = await Promise.all(Array.from({ length: 30 }, () => api.post('/v1/events', key, batch())));
  assert.is(statuses(replies), [...Array(5).fill(202), ...Array(25).fill(429)].join(','), replies.map((r) => r.status).join(','));
  assert.match(replies.find((r) => r.status === 429)!.body.error.message, /This tenant has 500 or more events waiting/);
  assert.equal(await redis.hmget(keys.tenantBacklog(p), `i|${tenantId}`, `d|${tenantId}`), ['500', null], 'the tenant\'s ordinal there: 5 batches');
  assert.is(await redis.xlen(keys.inbox(p)), 510, '500 events and 10 $subscriber.created');
});

burst.run();

// Two web processes on one Redis: one that has no figure kept for a key takes it to be under
// KEEP_BACKLOG of the limit, so it may admit blind only what keeps that bound under the limit (probe
// N: at KEEP 0.5 a process that had not written there admitted two 100-event requests past a limit
// the other process had filled, 700 waiting at 500).
const twoWebs = suite<{ one: TestService; two: TestService; api1: ReturnType<typeof client>; api2: ReturnType<typeof client>; key: string; tenantId: string }>('backlog limits with two web processes');
twoWebs.before(async (ctx) => {
  ctx.one = await startTestService('backlog-web-1', { TENANT_INBOX_MAX_BACKLOG: '500', SUBSCRIBER_INBOX_MAX_BACKLOG: '250' });
  ctx.two = await startTestService('backlog-web-2', { REDIS_KEY_PREFIX: ctx.one.env.REDIS_KEY_PREFIX!, TENANT_INBOX_MAX_BACKLOG: '500', SUBSCRIBER_INBOX_MAX_BACKLOG: '250' });
  ctx.api1 = client(ctx.one.url);
  ctx.api2 = client(ctx.two.url);
  const { keys } = await bootstrapWorkspace(ctx.one, 'twowebs');
  ctx.key = keys.tenant;
  ctx.tenantId = (await ctx.api1.get('/v1/whoami', keys.tenant)).body.data.tenant.id;
});
twoWebs.after(async (ctx) => {
  await ctx.two?.stop();
  await ctx.one?.stop();
});

twoWebs('a process with no figure for a partition or a subscriber the other filled admits no 100-event request there', async ({ one, api1, api2, key, tenantId }) => {
  const { redis, keys, config } = one;
  const p = partitionOf(tenantId, 'spread-0', config.partitions);
  const inP: string[] = [];
  for (let i = 0; inP.length < 10 && i < 10_000; i++) if (partitionOf(tenantId, `spread-${i}`, config.partitions) === p) inP.push(`spread-${i}`);
  const batch = (ids: string[], n = 100) => ({ events: Array.from({ length: n }, (_, i) => ({ externalId: ids[i % ids.length]!, name: 'order.placed' })) });
  // web 2 fills the tenant's share of the partition: 5 batches of 100
  for (let b = 0; b < 5; b++) assert.is((await api2.post('/v1/events', key, batch(inP))).status, 202, `web 2, batch ${b}`);
  assertLimited(await api2.post('/v1/events', key, batch(inP)), 'web 2 at the limit');
  // web 1 never wrote there
  for (let b = 0; b < 3; b++) assertLimited(await api1.post('/v1/events', key, batch(inP)), `web 1, batch ${b}`);
  assert.equal(await redis.hmget(keys.tenantBacklog(p), `i|${tenantId}`), ['500']);
  // a subscriber: web 2 brings it to 250, web 1 (no figure) admits no 100-event request for it
  for (let b = 0; b < 3; b++) await api2.post('/v1/events', key, batch(['hot-sub'], b < 2 ? 100 : 49));
  const q = partitionOf(tenantId, 'hot-sub', config.partitions);
  assert.is(await redis.hget(keys.sequences(q), `${tenantId}|hot-sub`), '250');
  for (let b = 0; b < 3; b++) assertLimited(await api1.post('/v1/events', key, batch(['hot-sub'])), `web 1, subscriber batch ${b}`);
  assert.is(await redis.hget(keys.sequences(q), `${tenantId}|hot-sub`), '250');
});

twoWebs.run();
