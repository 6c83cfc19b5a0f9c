import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { timerMember } from '../../actors/automation.js';
import { backfillTurn } from '../../actors/segment-backfill.js';
import { partitionOf } from '../../lib/partition.js';
import { createLogger } from '../../lib/log.js';
import type { RoleContext } from '../../streams/role-context.js';
import { client } from '../helpers/api.js';
import { bootstrapWorkspace, startTestService, type TestService } from '../helpers/service.js';

// A backfill's `processed` against its `total` when subscribers are created while it walks (probe Z:
// `processed` went past `total`, 3,095 of 3,035, then dropped back to 3,035 at completion).

type Ctx = { service: TestService; role: RoleContext; api: ReturnType<typeof client> };
const progress = suite<Ctx>('segment backfill progress');

progress.before(async (ctx) => {
  // web only: the test takes the backfill's turns itself, one subscriber a chunk
  ctx.service = await startTestService('backfill-progress', { SEGMENT_BACKFILL_CHUNK: '1' }, ['web']);
  const { config, redis, keys } = ctx.service;
  ctx.role = { config, redis, keys, log: createLogger('error'), target: { url: ctx.service.env.REDIS_URL! } };
  ctx.api = client(ctx.service.url);
});
progress.after(async (ctx) => ctx.service.stop());

progress('subscribers created during the walk raise total with processed: processed never passes total', async ({ service, role, api }) => {
  const boot = await bootstrapWorkspace(service, 'progress');
  const key = boot.keys.tenant;
  for (let i = 0; i < 30; i++) assert.is((await api.post('/v1/subscribers', key, { externalId: `before-${i}` })).status, 201);
  const segment = (await api.post('/v1/segments', key, { slug: 'everyone', where: { not: { attribute: 'plan', eq: 'none' } } })).body.data;
  const member = `${boot.tenant.id}|${boot.workspace.id}|${segment.id}`;
  const read = async () => (await api.get('/v1/segments/everyone', key)).body.data.backfill;
  await backfillTurn(role, member); // counts 30, walks 20 of them (one a chunk)
  assert.equal([(await read()).status, (await read()).total, (await read()).processed <= 20], ['running', 30, true]);
  for (let i = 0; i < 40; i++) assert.is((await api.post('/v1/subscribers', key, { externalId: `during-${i}` })).status, 201);
  const seen: { processed: number; total: number }[] = [];
  for (let turn = 0; turn < 10; turn++) {
    await backfillTurn(role, member);
    const { processed, total } = await read();
    seen.push({ processed, total });
  }
  const last = seen[seen.length - 1]!;
  assert.ok(last.processed > 30, `the walk found subscribers created during it (${last.processed})`);
  for (const s of seen) assert.ok(s.processed <= s.total, `processed ${s.processed} of ${s.total}`);
  assert.is(last.total, last.processed);
});

progress('a worker commit re-arming a subscriber\'s window timer after the backfill queued it leaves it queued (probe FD: one member, the ZADD of a commit made with older definitions moved the re-check to the window\'s due time)', async ({ service, role, api }) => {
  const boot = await bootstrapWorkspace(service, 'recheck');
  const key = boot.keys.tenant;
  assert.is((await api.post('/v1/subscribers', key, { externalId: 'windowed' })).status, 201);
  const segment = (await api.post('/v1/segments', key, { slug: 'all-of-them', where: { not: { attribute: 'plan', eq: 'none' } } })).body.data;
  const member = `${boot.tenant.id}|${boot.workspace.id}|${segment.id}`;
  const timers = service.keys.timers(partitionOf(boot.tenant.id, 'windowed', service.config.partitions));
  // this subscriber's timers due now (the partition holds other tests' too)
  const queued = async () => (await service.redis.zrangebyscore(timers, 0, 0)).filter((m) => m.includes(boot.tenant.id) && m.endsWith('|windowed')).length;
  for (let turn = 0; turn < 20 && (await queued()) === 0; turn++) await backfillTurn(role, member);
  assert.is(await queued(), 1, 'the backfill queued the subscriber');
  // what a worker's commit writes when the subscriber's window timer is due in an hour (actors/automation.ts, segments)
  await service.redis.zadd(timers, Date.now() + 3_600_000, timerMember('seg', boot.workspace.id, boot.tenant.id, '-', 'windowed'));
  assert.is(await queued(), 1, 'still queued for its re-check now');
  assert.is(await backfillTurn(role, member), 'more', 'the backfill waits for it');
});

progress.run();
