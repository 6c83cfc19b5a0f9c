import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { identityHash } from '../../lib/identity-hash.js';
import { partitionOf } from '../../lib/partition.js';
import { tenantIdentity } from '../../streams/identity.js';
import { client } from '../helpers/api.js';
import { bootstrapWorkspace, startTestService, type TestService } from '../helpers/service.js';

type Ctx = { service: TestService; api: ReturnType<typeof client>; tenantKey: string; clientKey: string };
const backlog = suite<Ctx>('ingest backlog (INBOX_MAX_BACKLOG)');

// Web role only: nothing drains the inbox, so it stays over the limit once filled.
backlog.before(async (ctx) => {
  ctx.service = await startTestService('backlog', { INBOX_MAX_BACKLOG: '100' });
  ctx.api = client(ctx.service.url);
  const { keys } = await bootstrapWorkspace(ctx.service, 'backlog');
  ctx.tenantKey = keys.tenant;
  ctx.clientKey = keys.client;
});
backlog.after(async (ctx) => ctx.service.stop());

backlog('every route that ingests answers 503 unavailable over the backlog, and the document declares it', async ({ api, service, tenantKey, clientKey }) => {
  const events = Array.from({ length: 100 }, (_, i) => ({ name: 'page.viewed', id: `fill-${i}` }));
  const filled = await api.post('/v1/client/events', clientKey, { externalId: 'busy-1', source: 'ios', events });
  assert.is(filled.status, 202);

  const answers = {
    'POST /v1/events': await api.post('/v1/events', tenantKey, { externalId: 'busy-1', name: 'page.viewed' }),
    'POST /v1/client/events': await api.post('/v1/client/events', clientKey, { externalId: 'busy-1', source: 'ios', events: [{ name: 'page.viewed' }] }),
    'POST /v1/client/identify': await api.post('/v1/client/identify', clientKey, { externalId: 'busy-1', source: 'ios' }),
  };
  const doc = (await (await fetch(`${service.url}/v1/openapi.json`)).json()) as any;
  for (const [operation, res] of Object.entries(answers)) {
    assert.is(res.status, 503, operation);
    assert.is(res.body.error.code, 'unavailable', operation);
    assert.is(res.headers.get('retry-after'), '5', `${operation} says when to retry`);
    const [method, path] = operation.split(' ') as [string, string];
    assert.ok(doc.paths[path][method.toLowerCase()].responses['503'], `${operation} declares 503`);
    const declared = doc.paths[path][method.toLowerCase()].responses['503'].$ref.split('/').pop();
    assert.ok(doc.components.responses[declared].headers['Retry-After'], `${operation} declares its Retry-After`);
  }
});

backlog('a subscriber write over the backlog answers 503 unavailable and writes nothing: a client key cannot grow the inbox without bound (probe EB: 300 mute toggles went in past the limit)', async ({ api, service, tenantKey, clientKey }) => {
  const { redis, keys, config } = service;
  const tenantId = (await api.get('/v1/whoami', tenantKey)).body.data.tenant.id as string;
  const inbox = keys.inbox(partitionOf(tenantId, 'busy-1', config.partitions));
  // the partition is over its limit since the test above; fill it again should it run alone
  if ((await redis.xlen(inbox)) <= 100) await api.post('/v1/client/events', clientKey, { externalId: 'busy-1', source: 'ios', events: Array.from({ length: 100 }, (_, i) => ({ name: 'page.viewed', id: `refill-${i}` })) });
  const before = await redis.xlen(inbox);
  assert.ok(before > 100, `over the limit: ${before}`);
  // a subscriber of another partition, joined in the same call as busy-1
  const calm = Array.from({ length: 50 }, (_, i) => `joined-${i}`).find((x) => partitionOf(tenantId, x, config.partitions) !== partitionOf(tenantId, 'busy-1', config.partitions))!;
  const answers = {
    'a registration': await api.post('/v1/client/subscriptions', clientKey, { externalId: 'busy-1', channel: 'push', token: 'ab'.repeat(32), platform: 'ios' }),
    'preferences': await api.patch('/v1/client/preferences', clientKey, { externalId: 'busy-1', channels: { push: false } }),
    'an attribute change': await api.patch('/v1/subscribers/busy-1', tenantKey, { properties: { plan: 'pro' } }),
    'a topic join': await (async () => {
      await api.post('/v1/topics', tenantKey, { slug: 'busy-topic' });
      return api.post('/v1/topics/busy-topic/subscribers', tenantKey, { externalIds: ['busy-1', calm] });
    })(),
  };
  for (const [what, res] of Object.entries(answers)) {
    assert.is(res.status, 503, `${what}: ${res.text}`);
    assert.is(res.body.error.code, 'unavailable', what);
    assert.is(res.headers.get('retry-after'), '5', what);
  }
  assert.is(await redis.xlen(inbox), before, 'nothing appended');
  assert.is((await api.get('/v1/subscribers/busy-1/subscriptions', tenantKey)).body.data.total, 0, 'nothing registered');
  // the join the call did make is listed at once, the refused one is not (probe EC: neither was, until the sweeper)
  assert.equal((await api.get('/v1/topics/busy-topic/subscribers', tenantKey)).body.data.items.map((m: any) => m.externalId), [calm]);
  // a read is a read: one carrying a valid hash marks the subscriber verified, unbounded (probe EC: it answered 503)
  const boot = (await api.get('/v1/whoami', tenantKey)).body.data;
  const { secret } = await tenantIdentity(redis, keys, { id: boot.tenant.id, slug: boot.tenant.slug, workspaceId: boot.workspace.id } as Parameters<typeof tenantIdentity>[2]);
  const read = await api.get(`/v1/client/preferences?externalId=busy-1&identityHash=${identityHash(secret, 'busy-1')}`, clientKey);
  assert.is(read.status, 200, read.text);
});

backlog('a batch touching one partition over the backlog is refused whole: nothing of it is stored in the others (probe X)', async ({ api, service, tenantKey }) => {
  const { redis, keys, config } = service;
  const tenantId = (await api.get('/v1/whoami', tenantKey)).body.data.tenant.id as string;
  const busy = partitionOf(tenantId, 'busy-1', config.partitions);
  // 19 fresh subscribers in other partitions, and one event for the subscriber whose partition is full
  const others = Array.from({ length: 400 }, (_, i) => `calm-${i}`).filter((x) => partitionOf(tenantId, x, config.partitions) !== busy).slice(0, 19);
  const lengthsBefore = await Promise.all(others.map((x) => redis.xlen(keys.inbox(partitionOf(tenantId, x, config.partitions)))));
  const events = [...others.map((externalId) => ({ externalId, name: 'order.placed' })), { externalId: 'busy-1', name: 'order.placed' }];
  for (let attempt = 0; attempt < 2; attempt++) {
    const res = await api.post('/v1/events', tenantKey, { events });
    assert.equal([res.status, res.body.error?.code], [503, 'unavailable'], `attempt ${attempt}`);
  }
  const lengthsAfter = await Promise.all(others.map((x) => redis.xlen(keys.inbox(partitionOf(tenantId, x, config.partitions)))));
  assert.equal(lengthsAfter, lengthsBefore, 'no other partition got an entry');
  for (const x of others.slice(0, 3)) assert.is((await api.get(`/v1/subscribers/${x}`, tenantKey)).status, 404, `${x} was not created`);
});

backlog.run();
