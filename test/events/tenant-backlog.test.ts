import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { partitionOf } from '../../lib/partition.js';
import { client, type Reply } from '../helpers/api.js';
import { BY_TEST, bootstrapWorkspace, makeKey, startTestService, type TestService } from '../helpers/service.js';
import { waitFor } from '../helpers/wait.js';
import { createTenant, ensureWorkspace } from '../../streams/identity.js';
import { swHeaders } from '../sources/signing.js';

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
