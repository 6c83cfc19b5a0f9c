import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { sweepAuditOutboxes } from '../../actors/audit-outbox-sweeper.js';
import { asScriptReply, auditIntent } from '../../streams/audit-outbox.js';
import { callScript } from '../../streams/lua-scripts.js';
import { auditEntries, startWebProcess, roleContext, sweepWithWorker, killSuite } from '../helpers/audit.js';
import { BY_TEST, bootstrapWorkspace, startTestService, type TestService } from '../helpers/service.js';
import { waitFor } from '../helpers/wait.js';

type Ctx = { service: TestService; workspace: { id: string; slug: string }; tenant: { id: string; slug: string } };
const outbox = suite<Ctx>('audit intents left in an outbox');

outbox.before(async (ctx) => {
  ctx.service = await startTestService('audit-outbox');
  const boot = await bootstrapWorkspace(ctx.service, 'outbox');
  ctx.workspace = { id: boot.workspace.id, slug: boot.workspace.slug };
  ctx.tenant = { id: boot.tenant.id, slug: boot.tenant.slug };
});
outbox.after(async ({ service }) => service.stop());

/** Runs createTopic's script as a writer that dies right after it would: the intent is recorded, never settled. */
async function createTopicAndDie(ctx: Ctx, slug: string) {
  const { redis, keys } = ctx.service;
  const id = `tpc_${'0'.repeat(9)}${slug.length}${'a'.repeat(16)}`;
  const at = new Date().toISOString();
  const topic = { id, slug, name: null, description: null, subscriberCount: 0, createdAt: at, updatedAt: at };
  const intent = auditIntent(keys.tenantOutbox(ctx.tenant.id), 'topic.create', { workspace: ctx.workspace, tenant: ctx.tenant, ...BY_TEST }, topic);
  const reply = await callScript<[number, string]>(redis, 'createTopic',
    [keys.topicSlugs(ctx.tenant.id), keys.topicIndex(ctx.tenant.id), keys.topic(ctx.tenant.id, id), intent.key],
    [id, slug, '', '', at, intent.token, intent.json]);
  return { intent, reply, topic };
}

outbox('the sweeper settles an intent whose writer died: the entry reaches the ledger once, under the intent\'s id', async (ctx) => {
  const { service } = ctx;
  const { intent, reply, topic } = await createTopicAndDie(ctx, 'orphaned');
  assert.equal(reply, [1, topic.id]);
  assert.is((await auditEntries(service, ctx.workspace.id)).filter((e) => e.target.id === topic.id).length, 0);
  assert.is(await service.redis.hlen(intent.key), 1);

  const first = await sweepAuditOutboxes(roleContext(service), 0);
  assert.equal(first, { settled: 1, kept: 0 });
  const entries = (await auditEntries(service, ctx.workspace.id)).filter((e) => e.target.id === topic.id);
  assert.is(entries.length, 1);
  assert.is(entries[0].id, intent.token);
  assert.is(entries[0].type, 'topic.created');
  assert.equal(entries[0].data.object, topic);
  assert.equal(entries[0].tenant, ctx.tenant);
  assert.is(entries[0].createdAt, new Date(intent.record.at).toISOString());
  assert.is(await service.redis.hlen(intent.key), 0);

  assert.equal(await sweepAuditOutboxes(roleContext(service), 0), { settled: 0, kept: 0 });
  assert.is((await auditEntries(service, ctx.workspace.id)).filter((e) => e.target.id === topic.id).length, 1);
});

outbox('a write that changed nothing leaves no intent; a young intent is left to its writer', async (ctx) => {
  const { service } = ctx;
  await createTopicAndDie(ctx, 'taken');
  await sweepAuditOutboxes(roleContext(service), 0);
  const again = await createTopicAndDie(ctx, 'taken');
  assert.is(again.reply[0], 0);
  assert.is(await service.redis.hlen(again.intent.key), 0);

  const young = await createTopicAndDie(ctx, 'young');
  assert.equal(await sweepAuditOutboxes(roleContext(service), 60_000), { settled: 0, kept: 0 });
  assert.is(await service.redis.hlen(young.intent.key), 1);
  await sweepAuditOutboxes(roleContext(service), 0);
  assert.is(await service.redis.hlen(young.intent.key), 0);
});

outbox('an intent of an operation this version does not know is kept and reported, not dropped', async (ctx) => {
  const { service } = ctx;
  const intent = auditIntent(service.keys.tenantOutbox(ctx.tenant.id), 'topic.renamedInAFutureVersion', { workspace: ctx.workspace, tenant: ctx.tenant, ...BY_TEST }, null);
  await service.redis.hset(intent.key, intent.token, intent.json);
  assert.equal(await sweepAuditOutboxes(roleContext(service), 0), { settled: 0, kept: 1 });
  assert.is(await service.redis.hget(intent.key, intent.token), intent.json);
  await service.redis.hdel(intent.key, intent.token);
});

outbox('a reply read back from the outbox has the shape ioredis gives the writer', () => {
  assert.equal(asScriptReply([1, {}, [false, 'a', true], 2.9]), [1, [], [null, 'a', 1], 2]);
});

outbox.run();

const kill = killSuite('audit entries survive a web process killed mid-write', 'audit-kill');

kill('every topic that exists after a SIGKILL under load has exactly one topic.created entry, and no other topic has one', async (ctx) => {
  const { service } = ctx;
  const boot = await bootstrapWorkspace(service, 'kill');
  const { web, api, env } = await startWebProcess(service);
  ctx.web = web;

  let n = 0;
  let stop = false;
  const load = async () => {
    while (!stop) {
      const slug = `t-${n++}`;
      const ok = await api.post('/v1/topics', boot.keys.tenant, { slug }).then(() => true, () => false);
      if (!ok) return;
    }
  };
  const clients = Array.from({ length: 32 }, load);
  await waitFor('topics to be created', async () => (await service.redis.zcard(service.keys.topicIndex(boot.tenant.id))) >= 300, 20_000, 5);
  web.child.kill('SIGKILL');
  await web.exited;
  stop = true;
  await Promise.all(clients);
  ctx.worker = (await sweepWithWorker(env, service.redis, service.keys.tenantOutbox(boot.tenant.id))).worker;

  const topics = new Set(await service.redis.zrange(service.keys.topicIndex(boot.tenant.id), 0, -1));
  const created = (await auditEntries(service, boot.workspace.id)).filter((e) => e.type === 'topic.created');
  const idsByTopic = new Map<string, Set<string>>();
  for (const e of created) idsByTopic.set(e.target.id, (idsByTopic.get(e.target.id) ?? new Set()).add(e.id));
  const missing = [...topics].filter((id) => !idsByTopic.has(id));
  assert.equal(missing, [], `${missing.length} of ${topics.size} topics have no topic.created entry`);
  assert.equal([...idsByTopic.keys()].filter((id) => !topics.has(id)), [], 'entries only for topics that exist');
  for (const [topic, ids] of idsByTopic) assert.is(ids.size, 1, `one event id for ${topic}`);
});

kill.run();
