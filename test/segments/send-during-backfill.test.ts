import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { client } from '../helpers/api.js';
import { startRoleProcess, stopRoleProcess, type RoleProcess } from '../helpers/processes.js';
import { bootstrapWorkspace, startTestService, type TestService } from '../helpers/service.js';
import { waitFor } from '../helpers/wait.js';

type Ctx = { service: TestService; scheduler: RoleProcess | null };
const backfilling = suite<Ctx>('a message to a segment whose backfill has not completed');

backfilling.before.each(async (ctx) => {
  // no scheduler role, which runs the backfills: this test starts one when it wants the backfill to run
  ctx.service = await startTestService('send-backfill', {}, ['web', 'worker', 'dispatcher']);
  ctx.scheduler = null;
});
backfilling.after.each(async (ctx) => {
  if (ctx.scheduler) await stopRoleProcess(ctx.scheduler);
  await ctx.service.stop();
});

backfilling('waits for the backfill and reaches the whole audience, not the members evaluated so far (probe BI: 0 of 666)', async (ctx) => {
  const { service } = ctx;
  const api = client(service.url);
  const { keys } = await bootstrapWorkspace(service, 'send-backfill');
  const key = keys.tenant;
  const pros = Array.from({ length: 30 }, (_, i) => `pro-${i}`);
  for (const externalId of pros) assert.is((await api.post('/v1/subscribers', key, { externalId, properties: { plan: 'pro' } })).status, 201);
  assert.is((await api.post('/v1/subscribers', key, { externalId: 'basic-1', properties: { plan: 'basic' } })).status, 201);
  const created = await api.post('/v1/segments', key, { slug: 'pros', where: { attribute: 'properties.plan', eq: 'pro' } });
  assert.is(created.status, 201, created.text);
  assert.equal([created.body.data.memberCount, created.body.data.backfill.status], [0, 'pending']);

  const sent = await api.post('/v1/messages', key, { to: { segment: 'pros' }, title: 'Hello', body: 'pros' });
  assert.is(sent.status, 202, sent.text);
  const id = sent.body.data.id as string;
  // the dispatcher has the message (sending) and waits: nothing is walked while the backfill is pending
  await waitFor('the dispatcher to take the message', async () => (await api.get(`/v1/messages/${id}`, key)).body.data.status === 'sending', 10_000, 50);
  await new Promise((r) => setTimeout(r, 1_000));
  const waiting = (await api.get(`/v1/messages/${id}`, key)).body.data;
  assert.equal([waiting.status, waiting.counts.total], ['sending', 0], 'not completed with the members evaluated so far');
  // the wait holds its own batch only: the tenant's later broadcasts go out beside it (probe BL: a
  // `where` message stayed queued behind it)
  const other = await api.post('/v1/messages', key, { to: { where: { attribute: 'properties.plan', eq: 'basic' } }, title: 'Hello', body: 'basics' });
  assert.is(other.status, 202, other.text);
  const beside = await waitFor('the later broadcast to complete while the segment send waits', async () => {
    const m = (await api.get(`/v1/messages/${other.body.data.id}`, key)).body.data;
    return m.status === 'completed' ? m : null;
  }, 15_000, 100);
  assert.is(beside.counts.total, 1);
  assert.is((await api.get(`/v1/messages/${id}`, key)).body.data.status, 'sending', 'still waiting for the backfill');

  const s = service.env;
  ctx.scheduler = startRoleProcess('scheduler', { REDIS_URL: s.REDIS_URL!, REDIS_KEY_PREFIX: s.REDIS_KEY_PREFIX!, HERALD_PARTITIONS: s.HERALD_PARTITIONS! });
  const done = await waitFor('the message to complete once the backfill has', async () => {
    const m = (await api.get(`/v1/messages/${id}`, key)).body.data;
    return m.status === 'completed' ? m : null;
  }, 30_000, 100);
  assert.is((await api.get('/v1/segments/pros', key)).body.data.backfill.status, 'completed');
  assert.is(done.counts.total, pros.length, 'one delivery per member of the whole audience');
});

backfilling.run();
