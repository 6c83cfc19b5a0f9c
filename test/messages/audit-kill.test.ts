import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { isoNow } from '../../lib/clock.js';
import { newId } from '../../lib/ids.js';
import { auditIntent, type AuditIntent } from '../../streams/audit-outbox.js';
import { callScript } from '../../streams/lua-scripts.js';
import { MESSAGE_AUDITS, runStepIdempotencyKey, toMessage, type RunRef } from '../../streams/messages.js';
import { client } from '../helpers/api.js';
import { assertSweptOnce, auditEntries, eventIdsByTarget, killUnderLoad, oneEntryEach, outboxesEmptied, startSweeper, startWebProcess, killSuite } from '../helpers/audit.js';
import { BY_TEST, bootstrapWorkspace, startTestService, type TestService } from '../helpers/service.js';

type Boot = Awaited<ReturnType<typeof bootstrapWorkspace>>;
type Ctx = { service: TestService; boot: Boot; api: ReturnType<typeof client> };
const died = suite<Ctx>('message audit intents whose writer died');

died.before(async (ctx) => {
  ctx.service = await startTestService('messages-audit');
  ctx.boot = await bootstrapWorkspace(ctx.service, 'messages-audit');
  ctx.api = client(ctx.service.url);
});
died.after(async ({ service }) => service.stop());

const intentOf = (ctx: Ctx, op: string, input: unknown) =>
  auditIntent(ctx.service.keys.tenantOutbox(ctx.boot.tenant.id), op, { workspace: ctx.boot.workspace, tenant: ctx.boot.tenant, ...BY_TEST }, input);

/** Runs createMessage's script as a writer that dies right after it: the intent is recorded, never settled. */
async function createMessageAndDie(ctx: Ctx, idempotencyKey: string, run?: RunRef) {
  const { keys } = ctx.service;
  const tenantId = ctx.boot.tenant.id;
  const id = newId('message');
  const at = isoNow();
  const fields: Record<string, string> = {
    id, status: 'queued', lane: 'one', to: JSON.stringify({ externalId: 'orphan' }), content: JSON.stringify({ title: 't', body: 'b' }), createdAt: at, updatedAt: at, sendAt: '',
    'n:total': '0', 'n:pending': '0', 'n:sent': '0', 'n:failed': '0', 'n:skipped': '0', 'n:canceled': '0', ...(run ? { run: JSON.stringify(run) } : {}),
  };
  const message = toMessage(fields);
  const intent = intentOf(ctx, 'message.create', message);
  const flat = Object.entries(fields).flat();
  const reply = await callScript<[number, string]>(
    ctx.service.redis, 'createMessage',
    [keys.idempotency(tenantId), keys.message(tenantId, id), keys.messageIndex(tenantId), keys.messagesByStatus(tenantId, 'queued'), keys.messageQueue(tenantId, 'one'), keys.messageDue(tenantId), intent.key],
    [idempotencyKey, 'request-hash', id, '', intent.token, intent.json, flat.length / 2, ...flat],
  );
  return { intent, reply, message };
}

/** Runs the cancel's move as a writer that dies right after it. */
async function cancelMessageAndDie(ctx: Ctx, id: string): Promise<{ intent: AuditIntent; reply: [number, string, string[]?] }> {
  const { keys } = ctx.service;
  const tenantId = ctx.boot.tenant.id;
  const intent = intentOf(ctx, 'message.cancel', null);
  const at = isoNow();
  const reply = await callScript<[number, string, string[]?]>(
    ctx.service.redis, 'moveMessage', [keys.message(tenantId, id), intent.key],
    [keys.tenantBase(tenantId), id, 'scheduled,queued', 'canceled', intent.token, intent.json, 2, 'canceledAt', at, 'updatedAt', at],
  );
  return { intent, reply };
}

died('message.created of a writer that died reaches the ledger once, as the message was created; a replay records nothing', async (ctx) => {
  const { intent, reply, message } = await createMessageAndDie(ctx, 'died-1');
  assert.equal(reply, [1, message.id]);
  const [entry] = await assertSweptOnce(ctx.service, intent, MESSAGE_AUDITS['message.create'](message, reply));
  assert.is(entry.type, 'message.created');
  assert.equal(entry.data.object, (await ctx.api.get(`/v1/messages/${message.id}`, ctx.boot.keys.tenant)).body.data);

  const replay = await createMessageAndDie(ctx, 'died-1');
  assert.equal(replay.reply, [2, message.id]);
  assert.is(await ctx.service.redis.hlen(replay.intent.key), 0, 'a replay writes no intent');
});

died('a workflow run\'s send whose worker died: message.created (system actor, the message\'s run) reaches the ledger once; the step retried under its key records nothing', async (ctx) => {
  const run: RunRef = { runId: newId('run'), step: 'steps[0]', workflowId: newId('workflow'), workflow: 'died-send', versionId: newId('workflowVersion') };
  const key = runStepIdempotencyKey(run.runId, run.step);
  const { intent, reply, message } = await createMessageAndDie(ctx, key, run);
  assert.equal(reply, [1, message.id]);
  const [entry] = await assertSweptOnce(ctx.service, intent, MESSAGE_AUDITS['message.create'](message, reply));
  assert.equal([entry.type, entry.actor, entry.request, entry.data.object.run], ['message.created', { type: 'system', id: null }, null, run]);

  const retried = await createMessageAndDie(ctx, key, run);
  assert.equal(retried.reply, [2, message.id]);
  assert.is(await ctx.service.redis.hlen(retried.intent.key), 0, 'a replay writes no intent');
});

died('message.canceled of a writer that died reaches the ledger once, with the message as canceled; a second cancel records nothing', async (ctx) => {
  const sent = await ctx.api.post('/v1/messages', ctx.boot.keys.tenant, { to: 'later', title: 't', body: 'b', sendAt: new Date(Date.now() + 3_600_000).toISOString() });
  const id = sent.body.data.id;
  const { intent, reply } = await cancelMessageAndDie(ctx, id);
  assert.equal(reply.slice(0, 2), [1, 'scheduled']);
  const [entry] = await assertSweptOnce(ctx.service, intent, MESSAGE_AUDITS['message.cancel'](null, reply));
  assert.is(entry.type, 'message.canceled');
  const now = (await ctx.api.get(`/v1/messages/${id}`, ctx.boot.keys.tenant)).body.data;
  assert.is(now.status, 'canceled');
  assert.equal(entry.data.object, now);

  const again = await cancelMessageAndDie(ctx, id);
  assert.equal(again.reply, [0, 'canceled']);
  assert.is(await ctx.service.redis.hlen(again.intent.key), 0, 'a cancel that moved nothing writes no intent');
  const answered = await ctx.api.post(`/v1/messages/${id}/cancel`, ctx.boot.keys.tenant);
  assert.equal(answered.body.data, now);
  assert.is(eventIdsByTarget(await auditEntries(ctx.service, ctx.boot.workspace.id), 'message.canceled').get(id)?.size, 1);
});

died.run();

const ROUNDS = 3;
/** Messages near the 4 KB APNs limit: each request keeps the web process busy a little longer. */
const PAYLOAD = { note: 'x'.repeat(3_000) };

const kill = killSuite('message audit entries survive a web process killed mid-write', 'messages-audit-kill');

kill('after a SIGKILL under sends and cancels, every message has one message.created, every canceled one one message.canceled, and no other has either', async (ctx) => {
  const { service } = ctx;
  const { workspace, tenant, keys: apiKeys } = await bootstrapWorkspace(service, 'kill');
  const key = apiKeys.tenant;
  const index = service.keys.messageIndex(tenant.id);
  const canceledIndex = service.keys.messagesByStatus(tenant.id, 'canceled');

  // each step sends one message (a third of them twice at once under one Idempotency-Key: one is
  // created, the other replayed) and cancels every other one (twice at once: one moves it)
  const step = (api: ReturnType<typeof client>, round: number) => async (c: number, n: number) => {
    const body = { to: `user-${c}`, title: 'kill', body: `${round}-${c}-${n}`, data: PAYLOAD, ...(n % 2 ? { sendAt: new Date(Date.now() + 3_600_000).toISOString() } : {}) };
    const send = () => api.post('/v1/messages', key, body, { 'Idempotency-Key': `kill-${round}-${c}-${n}` });
    const sent = await Promise.all(n % 3 === 0 ? [send(), send()] : [send()]);
    const id = sent[0]!.body.data.id;
    assert.ok(sent.every((r) => r.status === 202 && r.body.data.id === id));
    if (n % 2 === 0) return;
    const cancels = await Promise.all([0, 1].map(() => api.post(`/v1/messages/${id}/cancel`, key)));
    assert.ok(cancels.every((r) => r.status === 200));
  };
  // a kill lands between a write and its ledger append now and then: three web processes, each killed under load
  for (let round = 1; round <= ROUNDS; round++) {
    const { web, api } = await startWebProcess(service);
    ctx.web = web;
    await killUnderLoad(web, 32, step(api, round), async () => (await service.redis.zcard(index)) >= round * 150 && (await service.redis.zcard(canceledIndex)) >= round * 50);
  }
  ctx.worker = startSweeper(service);
  await outboxesEmptied(service, [service.keys.tenantOutbox(tenant.id)]);

  const messages = new Set(await service.redis.zrange(index, 0, -1));
  const canceled = new Set(await service.redis.zrange(canceledIndex, 0, -1));
  const entries = await auditEntries(service, workspace.id);
  const problems = [...oneEntryEach(entries, 'message.created', messages, 'messages'), ...oneEntryEach(entries, 'message.canceled', canceled, 'messages')];
  assert.equal(problems, [], `of ${messages.size} messages, ${canceled.size} canceled`);
});

kill.run();
