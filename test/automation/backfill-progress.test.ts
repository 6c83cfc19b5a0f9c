import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { backfillTurn } from '../../actors/segment-backfill.js';
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

progress.run();
