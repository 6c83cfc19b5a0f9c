import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import type { Redis } from 'ioredis';
import { createLogger } from '../../lib/log.js';
import { partitionOf } from '../../lib/partition.js';
import { commandName } from '../../streams/lua-scripts.js';
import { connectRedis } from '../../streams/redis.js';
import { sweepSubscriberCleanups } from '../../streams/subscriber-cleanup.js';
import { deleteSubscriber, tokenField } from '../../streams/subscribers.js';
import { registerWidget } from '../../streams/widgets.js';
import { client } from '../helpers/api.js';
import { killUnderLoad, startSweeper, startWebProcess, killSuite } from '../helpers/audit.js';
import { bootstrapWorkspace, startTestService, type TestService } from '../helpers/service.js';
import { waitFor } from '../helpers/wait.js';

// Deleting a subscriber removes its partition state in one write, then what the tenant's slot
// refers to it by: its token index entries, its widgets, its topic member entries. The write records
// that cleanup in its partition; a process killed before the cleanup is done leaves it to the
// worker's sweeper, which finishes it once, and a subscriber created again under the same
// externalId meanwhile (the same token, the same topic, the same widget) keeps its own entries.

type Api = ReturnType<typeof client>;
type Boot = Awaited<ReturnType<typeof bootstrapWorkspace>>;

const token = (n: number) => n.toString(16).padStart(64, 'c');
const widgetToken = (n: number) => `widget-token-${n}`;

/** Answers `res` when its status is one of `ok`, else fails with its body. */
function expect(res: { status: number; text: string; body: any }, ...ok: number[]) {
  assert.ok(ok.includes(res.status), `${res.status}: ${res.text}`);
  return res.body.data;
}

/** The externalIds a subscriber exists for, of `names`. */
async function existing(service: TestService, tenantId: string, names: string[]): Promise<Set<string>> {
  const pipeline = service.redis.pipeline();
  for (const x of names) pipeline.hexists(service.keys.subscribers(partitionOf(tenantId, x, service.config.partitions)), `${tenantId}|${x}`);
  const replies = (await pipeline.exec()) ?? [];
  return new Set(names.filter((_, i) => replies[i]![1] === 1));
}

/** The cleanups deletes left in the partitions. */
async function pendingCleanups(service: TestService): Promise<number> {
  const counts = await Promise.all(Array.from({ length: service.config.partitions }, (_, p) => service.redis.hlen(service.keys.subscriberCleanups(p))));
  return counts.reduce((a, b) => a + b, 0);
}

/** The externalIds of the cleanups deletes left in the partitions. */
async function pendingExternalIds(service: TestService): Promise<Set<string>> {
  const all = await Promise.all(Array.from({ length: service.config.partitions }, (_, p) => service.redis.hvals(service.keys.subscriberCleanups(p))));
  return new Set(all.flat().map((json) => JSON.parse(json).externalId as string));
}

/** The widgets of the tenant, by id (SCAN of the widget hashes). */
async function widgets(service: TestService, tenantId: string): Promise<Map<string, Record<string, string>>> {
  const found = new Map<string, Record<string, string>>();
  const prefix = service.keys.widget(tenantId, '');
  let cursor = '0';
  do {
    const [next, keys] = await service.redis.scan(cursor, 'MATCH', `${prefix.replace(/[{}[\]*?]/g, '\\$&')}*`, 'COUNT', 1000);
    cursor = next;
    for (const key of keys) found.set(key.slice(prefix.length), await service.redis.hgetall(key));
  } while (cursor !== '0');
  return found;
}

/**
 * What of the tenant's slot refers to a subscriber that does not exist: token index entries and
 * owner entries naming one, topic member entries, widgets (and widget index entries); `who`: their
 * externalIds.
 */
async function dangling(service: TestService, tenantId: string, topicIds: string[], names: string[]): Promise<{ problems: string[]; who: Set<string> }> {
  const { redis, keys } = service;
  const problems: string[] = [];
  const who = new Set<string>();
  const problem = (x: string, what: string) => {
    who.add(x);
    problems.push(what);
  };
  const tokens = await redis.hgetall(keys.tokens(tenantId));
  const owners = await redis.hgetall(keys.subscriptionOwners(tenantId));
  const members = await Promise.all(topicIds.map((id) => redis.zrange(keys.topicMembers(tenantId, id), 0, -1)));
  const all = await widgets(service, tenantId);
  const referred = new Set([...Object.values(tokens).map((v) => v.slice(v.indexOf('|') + 1)), ...Object.values(owners), ...members.flat(), ...[...all.values()].map((w) => w.externalId!), ...names]);
  const live = await existing(service, tenantId, [...referred]);
  for (const [field, v] of Object.entries(tokens)) if (!live.has(v.slice(v.indexOf('|') + 1))) problem(v.slice(v.indexOf('|') + 1), `token ${field} → ${v}`);
  for (const [id, x] of Object.entries(owners)) if (!live.has(x)) problem(x, `owner of ${id} → ${x}`);
  members.forEach((list, i) => list.filter((x) => !live.has(x)).forEach((x) => problem(x, `member ${x} of ${topicIds[i]}`)));
  for (const [id, w] of all) if (!w.deletedAt && !live.has(w.externalId!)) problem(w.externalId!, `widget ${id} of ${w.externalId}`);
  for (const x of names) if (!live.has(x) && (await redis.zcard(keys.subscriberWidgets(tenantId, x)))) problem(x, `widget index of ${x}`);
  return { problems, who };
}

type Ctx = { service: TestService; api: Api; boot: Boot; dying?: Redis };
const once = suite<Ctx>('the cleanup of a subscriber delete killed right after its write');

once.before(async (ctx) => {
  ctx.service = await startTestService('delete-cleanup');
  ctx.api = client(ctx.service.url);
  ctx.boot = await bootstrapWorkspace(ctx.service, 'delete-cleanup');
});
once.after(async (ctx) => {
  ctx.dying?.disconnect();
  await ctx.service.stop();
});

once('left for the sweeper; a retried DELETE answers 404; the sweep frees the tokens, widgets and topic entries of the deleted subscriber and keeps those of the externalId created again meanwhile, and another subscriber may register its address', async (ctx) => {
  const { api, boot, service } = ctx;
  const scope = { workspaceId: boot.workspace.id, tenantId: boot.tenant.id, partitions: service.config.partitions };
  const topics = await Promise.all(['cl-one', 'cl-two'].map(async (slug) => expect(await api.post('/v1/topics', boot.keys.tenant, { slug }), 201)));
  const x = 'leaving';
  expect(await api.post('/v1/client/subscriptions', boot.keys.client, { externalId: x, channel: 'push', token: token(1), platform: 'ios' }), 201);
  expect(await api.post('/v1/client/subscriptions', boot.keys.client, { externalId: x, channel: 'email', address: 'leaving@example.com' }), 201);
  const live = expect(await api.post('/v1/client/widgets', boot.keys.client, { externalId: x, kind: 'k', pushToken: widgetToken(1) }), 201);
  const plain = expect(await api.post('/v1/client/widgets', boot.keys.client, { externalId: x, kind: 'k', configuration: { n: 1 } }), 201);
  for (const t of topics) expect(await api.post(`/v1/topics/${t.slug}/subscribers`, boot.keys.tenant, { externalIds: [x, 'staying'] }), 200);

  // the delete's write applies, then its process dies (its first cleanup step fails)
  ctx.dying = connectRedis({ url: service.env.REDIS_URL! });
  (ctx.dying as unknown as Record<string, unknown>)[commandName('releaseToken')] = () => Promise.reject(new Error('killed'));
  await deleteSubscriber(ctx.dying, service.keys, scope, x).then(() => assert.unreachable('the cleanup cannot run'), (err: Error) => assert.is(err.message, 'killed'));
  assert.is(await pendingCleanups(service), 1, 'the cleanup waits in the partition');
  assert.is((await api.del(`/v1/subscribers/${x}`, boot.keys.tenant)).status, 404, 'a retried delete finds no subscriber');
  // meanwhile readers still see the deleted member in the topic (until the sweep)
  const listed = expect(await api.get(`/v1/topics/${topics[1].slug}/subscribers`, boot.keys.tenant), 200);
  assert.equal(listed.items.map((m: any) => m.externalId).sort(), [x, 'staying']);

  // created again under the same externalId: the same device, the first topic, the same widget token
  const again = expect(await api.post('/v1/client/subscriptions', boot.keys.client, { externalId: x, channel: 'push', token: token(1), platform: 'ios' }), 201);
  expect(await api.post(`/v1/topics/${topics[0].slug}/subscribers`, boot.keys.tenant, { externalIds: [x] }), 200);
  const kept = expect(await api.post('/v1/client/widgets', boot.keys.client, { externalId: x, kind: 'k', family: 'systemSmall', pushToken: widgetToken(1) }), 200, 201);
  // another subscriber registers the deleted subscriber's address: not blocked, it is theirs
  const address = expect(await api.post('/v1/client/subscriptions', boot.keys.client, { externalId: 'other', channel: 'email', address: 'leaving@example.com' }), 201);

  const log = createLogger('error');
  assert.equal(await sweepSubscriberCleanups(service.redis, service.keys, service.config.partitions, 0, log), { finished: 1, kept: 0 });
  assert.is(await pendingCleanups(service), 0);
  assert.equal(await sweepSubscriberCleanups(service.redis, service.keys, service.config.partitions, 0, log), { finished: 0, kept: 0 }, 'once');

  const { redis, keys } = service;
  const tenantId = boot.tenant.id;
  assert.is(await redis.hget(keys.tokens(tenantId), `push:${token(1)}`), `${again.id}|${x}`, 'the device stays with the subscriber created again');
  assert.is(await redis.hget(keys.subscriptionOwners(tenantId), again.id), x);
  assert.is(await redis.hget(keys.tokens(tenantId), tokenField('email', 'leaving@example.com', 'other')), `${address.id}|other`, 'the address stays with the other subscriber');
  assert.is(await redis.hget(keys.tokens(tenantId), tokenField('email', 'leaving@example.com', x)), null, 'the deleted subscriber\'s is freed');
  assert.equal((expect(await api.get(`/v1/subscribers/${x}/subscriptions`, boot.keys.tenant), 200)).items.map((s: any) => s.id), [again.id]);
  assert.equal((expect(await api.get('/v1/subscribers/other/subscriptions', boot.keys.tenant), 200)).items.map((s: any) => s.id), [address.id]);
  assert.equal(await redis.zrange(keys.topicMembers(tenantId, topics[0].id), 0, -1), ['staying', x].sort(), 'rejoined: still a member');
  assert.equal(await redis.zrange(keys.topicMembers(tenantId, topics[1].id), 0, -1), ['staying'], 'not rejoined: gone');
  const shown = expect(await api.get(`/v1/client/widgets?externalId=${x}`, boot.keys.client), 200);
  assert.equal(shown.items.map((w: any) => w.id), [kept.id], 'the widget registered again stays, the other went');
  assert.is(await redis.exists(keys.widget(tenantId, plain.id)), 0);
  assert.ok(kept.id === live.id || (await redis.exists(keys.widget(tenantId, live.id))) === 0);
  assert.equal((await dangling(service, tenantId, topics.map((t) => t.id), [x, 'other', 'staying'])).problems, []);
});

once('an externalId holding `$SUB` (lua/writeSubscriber rewrites only a leading `$SUB|` of index members) is recorded as it is', async (ctx) => {
  const { api, boot, service } = ctx;
  const scope = { workspaceId: boot.workspace.id, tenantId: boot.tenant.id, partitions: service.config.partitions };
  const x = 'odd$SUB$id';
  const address = 'odd@example.com';
  expect(await api.post('/v1/client/subscriptions', boot.keys.client, { externalId: x, channel: 'email', address }), 201);
  await deleteSubscriber(ctx.dying!, service.keys, scope, x).catch((err: Error) => assert.is(err.message, 'killed'));
  const [json] = await service.redis.hvals(service.keys.subscriberCleanups(partitionOf(scope.tenantId, x, scope.partitions)));
  const cleanup = JSON.parse(json!);
  assert.is(cleanup.externalId, x);
  assert.equal(await sweepSubscriberCleanups(service.redis, service.keys, service.config.partitions, 0, createLogger('error')), { finished: 1, kept: 0 });
  assert.is(await service.redis.hget(service.keys.tokens(scope.tenantId), tokenField('email', address, x)), null, 'the address is free');
});

once('a widget registration that read the subscriber before its delete and writes after the delete\'s cleanup leaves no widget behind', async (ctx) => {
  const { api, boot, service } = ctx;
  const scope = { workspaceId: boot.workspace.id, tenantId: boot.tenant.id, partitions: service.config.partitions };
  const x = 'widget-racer';
  const first = expect(await api.post('/v1/client/widgets', boot.keys.client, { externalId: x, kind: 'k', configuration: { n: 1 } }), 201);
  const subscriberId = (await service.redis.hget(service.keys.subscribers(partitionOf(scope.tenantId, x, scope.partitions)), `${scope.tenantId}|${x}`))!;
  assert.match(subscriberId, /^sub_/);
  // the delete and its whole cleanup happen between the registration's read and its write
  await deleteSubscriber(service.redis, service.keys, scope, x);
  assert.not.ok((await widgets(service, scope.tenantId)).has(first.id), 'the cleanup removed the widget it found');
  const late = await registerWidget(service.redis, service.keys, scope, x, subscriberId, { kind: 'k', configuration: { n: 2 } });
  assert.is(late.created, true);
  assert.equal(await service.redis.zrange(service.keys.subscriberWidgets(scope.tenantId, x), 0, -1), [], 'the late widget is not listed');
  assert.not.ok((await widgets(service, scope.tenantId)).has(late.widget.id), 'nor stored');
  assert.equal((await dangling(service, scope.tenantId, [], [x])).problems, []);
  // a subscriber created again under the externalId keeps the widget it registers
  const again = expect(await api.post('/v1/client/widgets', boot.keys.client, { externalId: x, kind: 'k', configuration: { n: 2 } }), 201);
  assert.equal(await service.redis.zrange(service.keys.subscriberWidgets(scope.tenantId, x), 0, -1), [again.id]);
});

once.run();

const SUBSCRIBERS = 240;
const CLIENTS = 24;
const TOPICS = 3;
const ROUNDS = 3;

const kill = killSuite('the cleanup of subscriber deletes survives a web process killed mid-delete', 'delete-cleanup-kill');

kill('deletes of subscribers with devices, an address, widgets and topics, SIGKILLed under load, some created again before the sweep: nothing refers to a deleted subscriber, the ones created again keep theirs', async (ctx) => {
  const { service } = ctx;
  const boot = await bootstrapWorkspace(service, 'kill');
  const tenantId = boot.tenant.id;
  const api = client(service.url);
  const topics: { id: string; slug: string }[] = [];
  for (let k = 0; k < TOPICS; k++) topics.push(expect(await api.post('/v1/topics', boot.keys.tenant, { slug: `kill-${k}` }), 201));
  const names = Array.from({ length: SUBSCRIBERS }, (_, i) => `c-${i}`);
  const survivor = 'c-survivor';
  await Promise.all([...names, survivor].map(async (x, i) => {
    for (const body of [{ channel: 'push', token: token(1000 + 2 * i), platform: 'ios' }, { channel: 'push', token: token(1001 + 2 * i), platform: 'android' }, { channel: 'email', address: `${x}@example.com` }]) {
      expect(await api.post('/v1/client/subscriptions', boot.keys.client, { externalId: x, ...body }), 201);
    }
    expect(await api.post('/v1/client/widgets', boot.keys.client, { externalId: x, kind: 'k', pushToken: widgetToken(i) }), 201);
    expect(await api.post('/v1/client/widgets', boot.keys.client, { externalId: x, kind: 'k', configuration: { i } }), 201);
  }));
  const everyone = [...names, survivor];
  for (let k = 0; k < TOPICS; k++) {
    const joining = everyone.filter((_, i) => i % TOPICS !== k); // each in two topics
    expect(await api.post(`/v1/topics/${topics[k]!.slug}/subscribers`, boot.keys.tenant, { externalIds: joining }), 200);
  }

  // a web process deleting under load is killed, again on a new one (up to ROUNDS) until a kill
  // leaves a deleted subscriber referred to from the tenant's slot (or a cleanup to finish)
  let next = 0, deleted = 0, kills = 0;
  let leftovers = new Set<string>();
  while (kills < ROUNDS && leftovers.size === 0 && (await pendingCleanups(service)) === 0) {
    const { web, api: webApi } = await startWebProcess(service);
    ctx.web = web;
    kills++;
    const enough = deleted + 30;
    await killUnderLoad(web, CLIENTS, async () => {
      const x = names[next++];
      if (x === undefined) throw new Error('every delete was answered before the kill');
      expect(await webApi.del(`/v1/subscribers/${x}`, boot.keys.tenant), 200);
      deleted++;
    }, async () => deleted >= enough);
    ctx.web = undefined;
    leftovers = (await dangling(service, tenantId, topics.map((t) => t.id), names)).who;
  }
  const live = await existing(service, tenantId, names);
  const pending = await pendingExternalIds(service);

  // half of the deleted ones are created again before any sweep (half of those the kill left
  // referred to or with a cleanup to finish, half of the others): the same device, the first of
  // their old topics, the same widget token
  const recreated = new Map<string, { subscription: string; topic: string; widget: string }>();
  const gone = names.filter((x) => !live.has(x));
  const unfinished = (x: string) => leftovers.has(x) || pending.has(x);
  const half = (list: string[]) => list.filter((_, j) => j % 2 === 0);
  for (const x of [...half(gone.filter(unfinished)), ...half(gone.filter((x) => !unfinished(x)))]) {
    const i = names.indexOf(x);
    const subscription = expect(await api.post('/v1/client/subscriptions', boot.keys.client, { externalId: x, channel: 'push', token: token(1000 + 2 * i), platform: 'ios' }), 201).id;
    const topic = topics.find((_, k) => i % TOPICS !== k)!;
    expect(await api.post(`/v1/topics/${topic.slug}/subscribers`, boot.keys.tenant, { externalIds: [x] }), 200);
    const widget = expect(await api.post('/v1/client/widgets', boot.keys.client, { externalId: x, kind: 'k', family: 'again', pushToken: widgetToken(i) }), 200, 201).id;
    recreated.set(x, { subscription, topic: topic.id, widget });
  }

  ctx.worker = startSweeper(service);
  // the worker process takes seconds to start on a loaded CI machine before its first sweep
  await waitFor('the sweeper to finish the cleanups', async () => (await pendingCleanups(service)) === 0, 45_000, 100);
  // the deletes the kill interrupted (or never sent) are retried on a new process
  const retry = await startWebProcess(service);
  ctx.web = retry.web;
  for (const x of names.filter((x) => !recreated.has(x))) expect(await retry.api.del(`/v1/subscribers/${x}`, boot.keys.tenant), 200, 404);
  await waitFor('the sweeper to finish the cleanups', async () => (await pendingCleanups(service)) === 0, 45_000, 100);
  const raced = [...recreated.keys()].filter((x) => pending.has(x)).length;
  console.log(`  ${kills} kill(s), ${deleted} deletes answered; ${pending.size} cleanups left for the sweeper, ${leftovers.size} deleted subscribers referred to then; ${recreated.size} created again, ${raced} of them before the sweep of their cleanup`);

  assert.equal((await dangling(service, tenantId, topics.map((t) => t.id), [...names, survivor])).problems, [], 'nothing refers to a deleted subscriber');
  assert.equal([...await existing(service, tenantId, everyone)].sort(), [...recreated.keys(), survivor].sort());
  const { redis, keys } = service;
  const tokens = await redis.hgetall(keys.tokens(tenantId));
  const members = await Promise.all(topics.map((t) => redis.zrange(keys.topicMembers(tenantId, t.id), 0, -1)));
  for (const [x, own] of recreated) {
    const i = names.indexOf(x);
    assert.is(tokens[`push:${token(1000 + 2 * i)}`], `${own.subscription}|${x}`, `${x} keeps its device`);
    assert.not.ok(tokens[`push:${token(1001 + 2 * i)}`], `${x}'s old device is free`);
    assert.not.ok(tokens[tokenField('email', `${x}@example.com`, x)], `${x}'s old address is free`);
    topics.forEach((t, k) => assert.is(members[k]!.includes(x), t.id === own.topic, `${x} in ${t.slug}`));
    assert.equal(await redis.zrange(keys.subscriberWidgets(tenantId, x), 0, -1), [own.widget], `${x} keeps the widget it registered again, alone`);
  }
  // the survivor keeps everything
  const s = everyone.length - 1;
  assert.is(tokens[`push:${token(1000 + 2 * s)}`]?.endsWith(`|${survivor}`), true);
  assert.is(tokens[tokenField('email', `${survivor}@example.com`, survivor)]?.endsWith(`|${survivor}`), true);
  assert.is(members.filter((m) => m.includes(survivor)).length, 2);
  assert.is(await redis.zcard(keys.subscriberWidgets(tenantId, survivor)), 2);
  // the kill left cleanups, and subscribers were created again before theirs ran (else this proved nothing)
  assert.ok(pending.size > 0 && raced > 0, `${pending.size} cleanups left, ${raced} raced`);
});

kill.run();
