import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { client } from '../helpers/api.js';
import { bootstrapWorkspace, startTestService, type TestService } from '../helpers/service.js';
import { MAX_DETAILS } from '../../lib/errors.js';
import { FULL_CHECK_VALUES } from '../../lib/validator.js';

type Ctx = { service: TestService; api: ReturnType<typeof client>; keys: { tenant: string; client: string } };
const huge = suite<Ctx>('huge invalid bodies get a bounded answer (probe K2)');

huge.before(async (ctx) => {
  ctx.service = await startTestService('huge-invalid');
  ctx.api = client(ctx.service.url);
  ctx.keys = (await bootstrapWorkspace(ctx.service, 'huge-invalid')).keys;
});
huge.after(async (ctx) => ctx.service.stop());

huge('a batch far over 100 events is refused for its size alone, its items not read: server and client routes', async ({ api, keys }) => {
  const empties = Array.from({ length: 30_000 }, () => ({}));
  const server = await api.post('/v1/events', keys.tenant, { events: empties });
  assert.equal([server.status, server.body.error.code, server.body.error.details], [400, 'validation', [{ param: 'events', message: 'must NOT have more than 100 items' }]]);
  const app = await api.post('/v1/client/events', keys.client, { externalId: 'k2', source: 'ios', events: empties });
  assert.equal([app.status, app.body.error.details], [400, [{ param: 'events', message: 'must NOT have more than 100 items' }]]);
  // just over the limit, and small: still every failing field
  const small = await api.post('/v1/events', keys.tenant, { events: Array.from({ length: 101 }, () => ({})) });
  assert.is(small.body.error.details.length, 1 + 101 * 2, "the size, and each item's missing externalId and name");
});

huge('unknown fields past the full-check bound: the first problem only; below it, each one (at most MAX_DETAILS)', async ({ api, keys }) => {
  const many = Object.fromEntries(Array.from({ length: 60_000 }, (_, i) => [`k${i}`, 1])); // ~640 KB, under the body limit
  const res = await api.post('/v1/events', keys.tenant, { externalId: 'u', name: 'a.b', ...many });
  assert.equal([res.status, res.body.error.details.length], [400, 1]);
  assert.match(res.body.error.details[0].param, /^k\d+$/);
  const some = Object.fromEntries(Array.from({ length: 50 }, (_, i) => [`k${i}`, 1]));
  const listed = await api.post('/v1/events', keys.tenant, { externalId: 'u', name: 'a.b', ...some });
  assert.is(listed.body.error.details.length, 50);
  const capped = Object.fromEntries(Array.from({ length: Math.min(FULL_CHECK_VALUES - 10, MAX_DETAILS + 500) }, (_, i) => [`k${i}`, 1]));
  const bounded = await api.post('/v1/events', keys.tenant, { externalId: 'u', name: 'a.b', ...capped });
  assert.is(bounded.body.error.details.length, MAX_DETAILS);
});

huge('joined lists of problems stay within MAX_DETAILS: body and query of one route, a query and its cursor (probe BV: 2,000 and 1,001)', async ({ api, keys }) => {
  const query = Array.from({ length: 1_500 }, (_, i) => `q${i}=`).join('&');
  const body = Object.fromEntries(Array.from({ length: 1_500 }, (_, i) => [`k${i}`, 1]));
  const patch = await api.patch(`/v1/client/subscriptions/sbn_x?${query}`, keys.client, body);
  assert.equal([patch.status, patch.body.error.details.length, patch.body.error.message], [400, MAX_DETAILS, `${MAX_DETAILS} fields are invalid`]);
  const list = await api.get(`/v1/topics?${query}&cursor=bad`, keys.tenant);
  assert.equal([list.status, list.body.error.details.length], [400, MAX_DETAILS]);
});

huge('a workflow of 40,000 steps is refused for its size, not checked step by step', async ({ api, keys }) => {
  const res = await api.post('/v1/workflows', keys.tenant, { slug: 'k2-big', trigger: { event: 'a.b' }, steps: Array.from({ length: 40_000 }, () => ({ type: 'nope' })) });
  assert.is(res.status, 400);
  assert.ok(res.body.error.details.length <= 2, JSON.stringify(res.body.error.details));
  assert.ok(res.body.error.details.every((d: any) => d.param === 'steps'), JSON.stringify(res.body.error.details));
});

huge.run();
