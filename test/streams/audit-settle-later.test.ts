import { Redis, type Command } from 'ioredis';
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { auditIntent, auditsSettled, settleAudit, settleAuditLater, type AuditDraft, type AuditIntent } from '../../streams/audit-outbox.js';
import { createKeys, type Keys } from '../../streams/keys.js';
import { LEDGER_FIELDS } from '../../streams/ledger.js';
import { BY_TEST } from '../helpers/service.js';
import { testRedisUrl } from '../helpers/redis.js';

// settleAuditLater queues the settles of one event-loop turn per connection and sends them together:
// one pipeline of ledger appends, then one HDEL per outbox of the intents whose appends succeeded.

type Ctx = { redis: Redis; keys: Keys; sent: string[] };
const later = suite<Ctx>('audit settles after the answer, batched per turn');

later.before(async (ctx) => {
  ctx.redis = new Redis(await testRedisUrl());
  ctx.keys = createKeys(`test:settle-later:${process.pid}:${Date.now()}`);
  ctx.sent = [];
  // the commands this connection sends, by name
  const send = ctx.redis.sendCommand.bind(ctx.redis);
  ctx.redis.sendCommand = ((command: Command, stream?: unknown) => {
    ctx.sent.push(command.name);
    return send(command, stream as never);
  }) as typeof ctx.redis.sendCommand;
});
later.before.each((ctx) => {
  ctx.sent.length = 0;
});
later.after(async (ctx) => {
  await ctx.redis.quit();
});

const refs = (ws: string) => ({ workspace: { id: ws, slug: ws }, tenant: null });
const draft = (n: number): AuditDraft => ({ type: 'subscriber.updated', target: { type: 'subscriber', id: `sub_${n}` }, object: { n } });

/** An intent as a write's script leaves it in outbox `outbox` (the intent's JSON). */
async function written(ctx: Ctx, ws: string, outbox: number, n: number): Promise<AuditIntent> {
  const intent = auditIntent(ctx.keys.partitionOutbox(outbox), 'test', { ...refs(ws), ...BY_TEST }, { n });
  await ctx.redis.hset(intent.key, intent.token, intent.json);
  return intent;
}

const ledgerNumbers = async (ctx: Ctx, ws: string) =>
  (await ctx.redis.xrange(ctx.keys.ledger(ws), '-', '+')).map(([, f]) => JSON.parse(f[f.indexOf(LEDGER_FIELDS.payload) + 1]!).data.object.n as number);

later('the settles of one turn leave together: their appends in queue order, then one HDEL per outbox', async (ctx) => {
  const intents = [];
  for (let n = 0; n < 60; n++) intents.push(await written(ctx, 'ws_batch', n % 3, n));
  ctx.sent.length = 0;
  const failures: unknown[] = [];
  intents.forEach((intent, n) => settleAuditLater(ctx.redis, ctx.keys, intent, [draft(n)], (err) => failures.push(err)));
  assert.equal(ctx.sent, [], 'nothing leaves before the turn ends');
  await auditsSettled(5_000);
  assert.equal(failures, []);
  assert.equal(await ledgerNumbers(ctx, 'ws_batch'), Array.from({ length: 60 }, (_, n) => n));
  assert.equal(ctx.sent.filter((c) => c === 'xadd').length, 60);
  assert.equal(ctx.sent.filter((c) => c === 'hdel').length, 3, 'one HDEL per outbox');
  for (let p = 0; p < 3; p++) assert.is(await ctx.redis.hlen(ctx.keys.partitionOutbox(p)), 0, `outbox ${p} emptied`);
});

later('an append that fails leaves its intent to the sweeper and reports it; the rest of the batch settles', async (ctx) => {
  const good = await written(ctx, 'ws_good', 0, 1);
  const bad = await written(ctx, 'ws_bad', 0, 2);
  const also = await written(ctx, 'ws_good', 0, 3);
  await ctx.redis.set(ctx.keys.ledger('ws_bad'), 'not a stream'); // XADD answers WRONGTYPE
  const failed: string[] = [];
  for (const [intent, n] of [[good, 1], [bad, 2], [also, 3]] as const) {
    settleAuditLater(ctx.redis, ctx.keys, intent, [draft(n)], (err) => failed.push(`${n}: ${(err as Error).message.slice(0, 9)}`));
  }
  await auditsSettled(5_000);
  assert.equal(failed, ['2: WRONGTYPE']);
  assert.equal(await ledgerNumbers(ctx, 'ws_good'), [1, 3]);
  assert.equal(await ctx.redis.hkeys(ctx.keys.partitionOutbox(0)), [bad.token], 'only the failed intent stays');
  await ctx.redis.del(ctx.keys.ledger('ws_bad'), ctx.keys.partitionOutbox(0));
});

later('a lost connection reports every settle of the batch and deletes no intent', async (ctx) => {
  const intents = [await written(ctx, 'ws_lost', 1, 1), await written(ctx, 'ws_lost', 1, 2)];
  // a closed connection, as for a writer whose Redis went away after the write
  const dead = new Redis(await testRedisUrl(), { lazyConnect: true });
  dead.on('error', () => undefined);
  dead.disconnect();
  let failures = 0;
  for (const intent of intents) settleAuditLater(dead, ctx.keys, intent, [draft(1)], () => failures++);
  await auditsSettled(5_000);
  assert.is(failures, 2);
  assert.is(await ctx.redis.hlen(ctx.keys.partitionOutbox(1)), 2);
  await ctx.redis.del(ctx.keys.partitionOutbox(1));
});

later(`more settles than one flush sends (512) go in several, all of them`, async (ctx) => {
  const intents = [];
  for (let n = 0; n < 1_100; n++) intents.push(auditIntent(ctx.keys.partitionOutbox(2), 'test', { ...refs('ws_many'), ...BY_TEST }, { n }));
  const fill = ctx.redis.pipeline();
  for (const intent of intents) fill.hset(intent.key, intent.token, intent.json);
  await fill.exec();
  ctx.sent.length = 0;
  intents.forEach((intent, n) => settleAuditLater(ctx.redis, ctx.keys, intent, [draft(n)], () => assert.unreachable('no failure')));
  await auditsSettled(10_000);
  assert.equal(await ledgerNumbers(ctx, 'ws_many'), Array.from({ length: 1_100 }, (_, n) => n));
  assert.equal(ctx.sent.filter((c) => c === 'hdel').length, 3, '512 + 512 + 76');
  assert.is(await ctx.redis.hlen(ctx.keys.partitionOutbox(2)), 0);
});

later('a settle with no entries deletes its intent; settleAudit (awaited) still settles alone', async (ctx) => {
  const empty = await written(ctx, 'ws_empty', 3, 0);
  settleAuditLater(ctx.redis, ctx.keys, empty, [], () => assert.unreachable('no failure'));
  await auditsSettled(5_000);
  assert.is(await ctx.redis.hlen(ctx.keys.partitionOutbox(3)), 0);
  assert.equal(ctx.sent.filter((c) => c === 'xadd'), []);
  const direct = await written(ctx, 'ws_empty', 3, 7);
  await settleAudit(ctx.redis, ctx.keys, direct, [draft(7)]);
  assert.equal(await ledgerNumbers(ctx, 'ws_empty'), [7]);
  assert.is(await ctx.redis.hlen(ctx.keys.partitionOutbox(3)), 0);
});

later.run();
