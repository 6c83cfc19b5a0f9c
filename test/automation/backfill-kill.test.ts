import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { client } from '../helpers/api.js';
import { startRoleProcess, stopRoleProcess, type RoleProcess } from '../helpers/processes.js';
import { bootstrapWorkspace, startTestService, type TestService } from '../helpers/service.js';
import { waitFor } from '../helpers/wait.js';

type Ctx = { service: TestService; roles: RoleProcess[] };
const kill = suite<Ctx>('a segment backfill survives a scheduler SIGKILL');
const SUBSCRIBERS = 240;

kill.before(async (ctx) => {
  ctx.service = await startTestService('backfill-kill', { PARTITION_LEASE_MS: '1000' }, ['web', 'worker']);
  ctx.roles = [];
});
kill.after(async (ctx) => {
  for (const r of ctx.roles) await stopRoleProcess(r);
  await ctx.service.stop();
});

kill('a scheduler killed mid-backfill leaves progress that the next one resumes: every subscriber is evaluated, progress counts each once', async (ctx) => {
  const api = client(ctx.service.url);
  const boot = await bootstrapWorkspace(ctx.service, 'backfill-kill');
  const key = boot.keys.tenant;
  const ids = Array.from({ length: SUBSCRIBERS }, (_, i) => `bf-${String(i).padStart(3, '0')}`);
  for (let i = 0; i < ids.length; i += 100) {
    await api.post('/v1/events', key, { events: ids.slice(i, i + 100).map((externalId, k) => ({ externalId, name: 'joined', data: { n: i + k } })) });
  }
  await waitFor('the population to be applied', async () => (await api.get('/v1/events?name=joined&limit=1', key)).body.data.items.length === 1, 10_000);
  // one subscriber per chunk: the backfill takes many turns, long enough to be killed in the middle
  const env = { REDIS_URL: ctx.service.env.REDIS_URL!, REDIS_KEY_PREFIX: ctx.service.env.REDIS_KEY_PREFIX!, HERALD_PARTITIONS: ctx.service.env.HERALD_PARTITIONS!, PARTITION_LEASE_MS: '1000', SEGMENT_BACKFILL_CHUNK: '1' };
  const first = startRoleProcess('scheduler', env);
  ctx.roles.push(first);
  await api.post('/v1/segments', key, { slug: 'even-joiners', where: { all: [{ event: 'joined' }, { not: { attribute: 'odd', eq: true } }] } });
  const midway = await waitFor('the backfill to be under way', async () => {
    const s = (await api.get('/v1/segments/even-joiners', key)).body.data;
    return s.backfill.status === 'running' && s.backfill.processed >= 20 ? s : null;
  }, 60_000, 5); // the scheduler process's start: seconds, and more under CI load
  first.child.kill('SIGKILL');
  await first.exited;
  const atKill = (await api.get('/v1/segments/even-joiners', key)).body.data.backfill;
  assert.ok(atKill.processed < SUBSCRIBERS, `killed before the end (${atKill.processed} of ${atKill.total})`);
  assert.is(midway.backfill.total, SUBSCRIBERS);
  ctx.roles.push(startRoleProcess('scheduler', env));
  const done = await waitFor('the backfill to complete', async () => {
    const s = (await api.get('/v1/segments/even-joiners', key)).body.data;
    return s.backfill.status === 'completed' ? s : null;
  }, 60_000, 100);
  assert.is(done.backfill.processed, SUBSCRIBERS, 'each subscriber counted once');
  assert.is(done.backfill.total, SUBSCRIBERS);
  assert.is(done.memberCount, SUBSCRIBERS, 'every subscriber was evaluated');
  if (process.env.HERALD_TEST_VERBOSE) console.log(`killed at ${atKill.processed} of ${SUBSCRIBERS}`);
});

kill.run();
