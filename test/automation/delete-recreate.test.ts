import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { partitionOf } from '../../lib/partition.js';
import { client } from '../helpers/api.js';
import { actorsCaughtUp } from '../helpers/inbox.js';
import { startRoleProcess, stopRoleProcess, type RoleProcess } from '../helpers/processes.js';
import { bootstrapWorkspace, startTestService, type TestService } from '../helpers/service.js';
import { waitFor } from '../helpers/wait.js';

type Ctx = { service: TestService; workers: RoleProcess[] };
const again = suite<Ctx>('a subscriber deleted and created again');

again.before(async (ctx) => {
  ctx.service = await startTestService('delete-recreate', { PARTITION_LEASE_MS: '1000' }, ['web']);
  ctx.workers = [];
});
again.after(async (ctx) => {
  for (const w of ctx.workers) await stopRoleProcess(w);
  await ctx.service.stop();
});

again('the deleted subscriber\'s canceled runs write nothing onto the new subscriber\'s stream, when the worker reads the delete and the new events together (probe H3)', async (ctx) => {
  const { service } = ctx;
  const api = client(service.url);
  const boot = await bootstrapWorkspace(service, 'delete-recreate');
  const key = boot.keys.tenant;
  const env = { ...service.env, HERALD_PARTITIONS: String(service.config.partitions) };
  const worker = () => {
    const w = startRoleProcess('worker', env);
    ctx.workers.push(w);
    return w;
  };
  assert.is((await api.post('/v1/workflows', key, { slug: 'held', trigger: { event: 'hold.go' }, steps: [{ type: 'sleep', duration: '1h' }, { type: 'exit' }] })).status, 201);
  const first = worker();
  await api.post('/v1/events', key, { externalId: 'again-x', name: 'hold.go', data: {} });
  const runs = async (status: string) => (await api.get(`/v1/workflows/held/runs?status=${status}`, key)).body.data.items as any[];
  // (each of the two waits on the run holds a worker process's start: many seconds under CI load)
  const [sleeping] = await waitFor('the run sleeps', async () => ((await runs('sleeping')).length === 1 ? runs('sleeping') : null), 60_000);
  await stopRoleProcess(first);
  // while no worker runs: the delete, then events that create a subscriber of the same externalId
  assert.is((await api.del('/v1/subscribers/again-x', key)).status, 200);
  const created = await api.post('/v1/events', key, { events: [{ externalId: 'again-x', name: 'after.x', data: {} }, { externalId: 'again-x', name: 'after.y', data: {} }] });
  assert.is(created.status, 202);
  worker();
  const [canceled] = await waitFor('the run canceled', async () => ((await runs('canceled')).length === 1 ? runs('canceled') : null), 60_000);
  assert.equal([canceled.id, canceled.reason], [sleeping.id, 'subscriber_deleted']);
  const p = partitionOf(boot.tenant.id, 'again-x', service.config.partitions);
  await waitFor('the worker caught up', () => actorsCaughtUp(service, p), 20_000);
  const timeline = (await api.get('/v1/subscribers/again-x/timeline?limit=100', key)).body.data.items as any[];
  const names = timeline.map((e) => e.name).reverse();
  assert.ok(names.includes('after.y'), names.join(' '));
  assert.not.ok(names.includes('$run.canceled'), `nothing of the old run after the delete: ${names.join(' ')}`);
  assert.equal(names.slice(names.indexOf('$subscriber.deleted')), ['$subscriber.deleted', '$subscriber.created', 'after.x', 'after.y']);
});

again.run();
