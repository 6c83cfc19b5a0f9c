import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { writeScope } from '../../streams/audit-outbox.js';
import { IdentityRefs } from '../../streams/identity.js';
import { createMessage, runStepIdempotencyKey } from '../../streams/messages.js';
import { client } from '../helpers/api.js';
import { bootstrapWorkspace, runSendsMade, startTestService, type TestService } from '../helpers/service.js';
import { startReceiver, type Receiver } from '../helpers/webhook-receiver.js';
import { waitFor } from '../helpers/wait.js';

type Boot = Awaited<ReturnType<typeof bootstrapWorkspace>>;
type Ctx = { service: TestService; api: ReturnType<typeof client>; boot: Boot; receiver: Receiver };
const sends = suite<Ctx>('a workflow run\'s send is announced by message.created');

const ENV = { WEBHOOK_ALLOW_PRIVATE_NETWORKS: '127.0.0.0/8,::1/128', WEBHOOK_RETRY_SCHEDULE: '1s' };

sends.before(async (ctx) => {
  ctx.service = await startTestService('wf-send-audit', ENV, ['web', 'worker', 'dispatcher']);
  ctx.api = client(ctx.service.url);
  ctx.boot = await bootstrapWorkspace(ctx.service, 'wf-send-audit');
  ctx.receiver = await startReceiver();
});
sends.after(async (ctx) => {
  await ctx.receiver.close();
  await ctx.service.stop();
});

sends('the message a run sends reaches the ledger once as message.created (system actor, the run in the message) and an endpoint subscribed to message.created', async (ctx) => {
  const { api, boot, receiver, service } = ctx;
  const hook = await api.post(`/v1/workspaces/${boot.workspace.slug}/webhooks`, boot.keys.workspace, { url: `${receiver.url}/hook`, events: ['message.created'] });
  assert.is(hook.status, 201, hook.text);
  receiver.secrets.push(hook.body.data.secret);
  const created = await api.post('/v1/workflows', boot.keys.tenant, { slug: 'greet', trigger: { event: 'user.signed_up' }, steps: [{ type: 'send', message: { title: 'Hello', body: 'From a workflow' } }] });
  assert.is(created.status, 201, created.text);
  const workflow = created.body.data;
  assert.is((await api.post('/v1/events', boot.keys.tenant, { externalId: 'greeted', name: 'user.signed_up' })).status, 202);

  const run = await waitFor('the run to complete', async () => (await api.get('/v1/workflows/greet/runs?status=completed', boot.keys.tenant)).body.data.items[0]);
  const messageId = run.history.find((h: any) => h.type === 'send').messageId;
  await runSendsMade(ctx.service);
  const message = (await api.get(`/v1/messages/${messageId}`, boot.keys.tenant)).body.data;
  assert.equal(message.run, { runId: run.id, step: 'steps[0]', workflowId: workflow.id, workflow: 'greet', versionId: workflow.versionId });

  const [delivered] = await waitFor('message.created at the endpoint', async () => receiver.requests.length > 0 && receiver.requests);
  assert.equal(delivered!.failures, [], 'verified with the endpoint secret');
  const event = delivered!.body;
  assert.is(event.type, 'message.created');
  assert.is(delivered!.id, event.id);
  assert.equal(event.actor, { type: 'system', id: null });
  assert.is(event.request, null);
  assert.equal(event.target, { type: 'message', id: messageId });
  assert.equal([event.workspace, event.tenant], [{ id: boot.workspace.id, slug: boot.workspace.slug }, { id: boot.tenant.id, slug: boot.tenant.slug }]);
  // the message as created, as the API reads it: the dispatcher of this process may have taken it (no device:
  // skipped) before it was read above, which changes only what a send changes (a loaded run read it completed)
  const asCreated = { ...message, status: 'queued', counts: { total: 0, pending: 0, sent: 0, failed: 0, skipped: 0, canceled: 0 }, error: null, startedAt: null, completedAt: null, updatedAt: message.createdAt };
  assert.equal(event.data.object, asCreated, 'the message as the API reads it, its run included');

  // the ledger is trimmed once its entries are delivered: the endpoint's deliveries tell what it held
  const deliveries = async () => (await api.get(`/v1/workspaces/${boot.workspace.slug}/webhooks/${hook.body.data.id}/deliveries`, boot.keys.workspace)).body.data;
  const first = await deliveries();
  assert.equal([first.total, first.items[0].eventId, first.items[0].eventType], [1, event.id, 'message.created'], 'one entry, the one delivered');
  assert.is(await service.redis.hlen(service.keys.tenantOutbox(boot.tenant.id)), 0, 'the worker settled its intent');

  // the step retried after a crash (same key): the same message, no second intent or entry
  const retried = await createMessage(service.redis, service.keys, { workspaceId: boot.workspace.id, tenantId: boot.tenant.id }, {
    to: { externalId: 'greeted' }, content: { title: 'Hello', body: 'From a workflow' }, sendAt: null, run: message.run,
  }, { key: runStepIdempotencyKey(run.id, 'steps[0]'), request: { run: run.id, step: 'steps[0]' } }, writeScope(
    { workspace: event.workspace, tenant: event.tenant }, { actor: { type: 'system', id: null }, request: null },
  ), { warn: (msg) => assert.unreachable(msg) });
  assert.equal([retried.replayed, retried.message.id], [true, messageId]);
  assert.is(await service.redis.hlen(service.keys.tenantOutbox(boot.tenant.id)), 0, 'a replay records no intent');
  await new Promise((r) => setTimeout(r, 500));
  assert.is((await deliveries()).total, 1, 'nothing more to deliver');
  assert.equal(receiver.requests.map((r) => r.body.type), ['message.created'], 'the endpoint got that one event, and none of the stream events');
});

sends('the slugs a send\'s entry carries are read once per process: a warm lookup asks Redis nothing; an unknown id has none', async ({ service, boot }) => {
  const { redis, keys } = service;
  const refs = new IdentityRefs(redis, keys);
  const expected = { workspace: { id: boot.workspace.id, slug: boot.workspace.slug }, tenant: { id: boot.tenant.id, slug: boot.tenant.slug } };
  const [a, b] = await Promise.all([refs.scope(boot.workspace.id, boot.tenant.id), refs.scope(boot.workspace.id, boot.tenant.id)]);
  assert.equal([a, b], [expected, expected]);
  // slugs never change; were a record rewritten, a warm cache would not see it: proof that it reads nothing
  const workspaceKey = keys.workspace(boot.workspace.id);
  const tenantKey = keys.tenant(boot.workspace.id, boot.tenant.id);
  await redis.hset(workspaceKey, 'slug', 'renamed');
  await redis.hset(tenantKey, 'slug', 'renamed');
  try {
    assert.equal(await refs.scope(boot.workspace.id, boot.tenant.id), expected);
    assert.equal((await new IdentityRefs(redis, keys).workspace(boot.workspace.id))?.slug, 'renamed', 'another process reads the record');
  } finally {
    await redis.hset(workspaceKey, 'slug', boot.workspace.slug);
    await redis.hset(tenantKey, 'slug', boot.tenant.slug);
  }
  const missing = 'tnt_01m8000000aaaaaaaaaaaaaaaa';
  assert.is(await refs.scope(boot.workspace.id, missing), null);
});

sends('run events and $send reach an endpoint with runId, workflow and versionId at the top of data.object (spec 6.1 rule 5)', async (ctx) => {
  const { api, boot } = ctx;
  const receiver = await startReceiver();
  try {
    const hook = await api.post(`/v1/workspaces/${boot.workspace.slug}/webhooks`, boot.keys.workspace, { url: `${receiver.url}/hook`, events: ['$run.*', '$send'] });
    assert.is(hook.status, 201, hook.text);
    receiver.secrets.push(hook.body.data.secret);
    const created = await api.post('/v1/workflows', boot.keys.tenant, { slug: 'announce', trigger: { event: 'user.announced' }, steps: [{ type: 'send', message: { title: 'Hi', body: 'there' } }] });
    assert.is(created.status, 201, created.text);
    assert.is((await api.post('/v1/events', boot.keys.tenant, { externalId: 'announced', name: 'user.announced' })).status, 202);
    const wanted = ['$run.started', '$run.step', '$run.completed', '$send'];
    // this run's (the first test's may still be on their way)
    const ours = () => receiver.requests.filter((r) => r.body.data.object.subscriber.externalId === 'announced');
    const got = await waitFor('the run events and $send at the endpoint', async () => {
      const names = new Set(ours().map((r) => r.body.type));
      return wanted.every((n) => names.has(n)) && ours();
    });
    for (const { body, failures } of got) {
      assert.equal(failures, [], 'verified with the endpoint secret');
      const object = body.data.object;
      assert.match(object.runId, /^run_/, body.type);
      assert.equal([object.workflow, object.versionId], ['announce', created.body.data.versionId], body.type);
    }
  } finally {
    await receiver.close();
  }
});

sends.run();
