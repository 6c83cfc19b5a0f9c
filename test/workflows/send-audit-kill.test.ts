import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { client } from '../helpers/api.js';
import { auditEntries, killWhen, oneEntryEach, outboxesEmptied, roleEnv } from '../helpers/audit.js';
import { startRoleProcess, stopRoleProcess, type RoleProcess } from '../helpers/processes.js';
import { bootstrapWorkspace, runSendsMade, startTestService, type TestService } from '../helpers/service.js';
import { waitFor } from '../helpers/wait.js';

type Ctx = { service: TestService; roles: RoleProcess[] };
const kill = suite<Ctx>('message.created of workflow sends survives workers killed mid-run');

const SUBSCRIBERS = 600;
const SENDS_PER_RUN = 3;
const ROUNDS = 3;

kill.before(async (ctx) => {
  ctx.service = await startTestService('wf-send-audit-kill');
  ctx.roles = [];
});
kill.after(async (ctx) => {
  for (const r of ctx.roles) await stopRoleProcess(r);
  await ctx.service.stop();
});

kill('after workers are SIGKILLed while runs send, every workflow message has exactly one message.created', async (ctx) => {
  const { service } = ctx;
  const api = client(service.url);
  const { workspace, tenant, keys: apiKeys } = await bootstrapWorkspace(service, 'kill');
  const key = apiKeys.tenant;
  const index = service.keys.messageIndex(tenant.id);
  // quick lease handover, and a sweeper that settles what a killed worker left within the round
  const env = { ...roleEnv(service), PARTITION_LEASE_MS: '1000', AUDIT_OUTBOX_SWEEP_MS: '200' };
  const workers = (n: number) => {
    const started = Array.from({ length: n }, () => startRoleProcess('worker', env));
    ctx.roles.push(...started);
    return started;
  };

  const steps = Array.from({ length: SENDS_PER_RUN }, (_, i) => ({ type: 'send', message: { title: 'Kill', body: `send ${i}` } }));
  assert.is((await api.post('/v1/workflows', key, { slug: 'burst', trigger: { event: 'burst.started' }, steps })).status, 201);
  for (let from = 0; from < SUBSCRIBERS; from += 100) {
    const events = Array.from({ length: 100 }, (_, i) => ({ externalId: `user-${from + i}`, name: 'burst.started' }));
    assert.is((await api.post('/v1/events', key, { events })).status, 202);
  }

  // each round: two workers take the partitions and send; both are killed mid-way (between a
  // message's script and its ledger append now and then, and before the batch's commit, so the
  // next owner retries steps whose messages exist: replays)
  const total = SUBSCRIBERS * SENDS_PER_RUN;
  for (let round = 1; round <= ROUNDS; round++) {
    const pair = workers(2);
    const target = Math.floor((total * round) / (ROUNDS + 1));
    const enough = async () => (await service.redis.zcard(index)) >= target;
    for (const victim of pair) await killWhen(victim, enough);
  }
  const left = await service.redis.hlen(service.keys.tenantOutbox(tenant.id));
  workers(1);
  await waitFor('every run to complete', async () => (await api.get('/v1/workflows/burst/runs?status=completed', key)).body.data.total === SUBSCRIBERS, 60_000, 200);
  await runSendsMade(service);
  await outboxesEmptied(service, [service.keys.tenantOutbox(tenant.id)]);

  const messages = new Set(await service.redis.zrange(index, 0, -1));
  assert.is(messages.size, total, 'one message per send step');
  const entries = await auditEntries(service, workspace.id);
  assert.equal(oneEntryEach(entries, 'message.created', messages, 'messages'), [], `of ${messages.size} messages (${left} intents left by killed workers)`);
  for (const e of entries.filter((x) => x.type === 'message.created')) {
    assert.equal([e.actor, e.request, e.data.object.run?.workflow], [{ type: 'system', id: null }, null, 'burst'], e.id);
  }
});

kill.run();
