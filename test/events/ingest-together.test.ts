import type { Redis } from 'ioredis';
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { ApiError } from '../../lib/errors.js';
import { now } from '../../lib/clock.js';
import { partitionOf } from '../../lib/partition.js';
import { ingestEvents } from '../../streams/ingest.js';
import { createKeys, type Keys } from '../../streams/keys.js';
import { connectRedis } from '../../streams/redis.js';
import { testRedisUrl, uniquePrefix } from '../helpers/redis.js';

/**
 * streams/ingest.ts writes the calls made in one turn of the event loop together (one script call
 * per tenant and partition): each call still gets its own answer, in its input order, with the
 * sequences, dedupe and backlog refusals it would get alone.
 */
type Ctx = { redis: Redis; keys: Keys };
const together = suite<Ctx>('ingest: concurrent calls written together');

const scope = (partitions: number, maxBacklog = 1_000_000) => ({ workspaceId: 'ws_tog', tenantId: 'tnt_tog', partitions, maxBacklog });
const event = (externalId: string, name: string, callerId: string | null = null) => ({ externalId, name, source: 'server' as const, timestampMs: now(), data: '{}', callerId, provider: null, runId: null, messageId: null, step: null });

together.before.each(async (ctx) => {
  ctx.redis ??= connectRedis({ url: await testRedisUrl() });
  ctx.keys = createKeys(uniquePrefix('together'));
});
together.after(async (ctx) => ctx.redis.disconnect());

together('twenty calls in one tick: each answered in its order, one subscriber\'s sequences contiguous and in inbox order', async ({ redis, keys }) => {
  const calls = Array.from({ length: 20 }, (_, c) => [event('shared', `c${c}.a`), event(`own-${c}`, `c${c}.b`), event('shared', `c${c}.c`)]);
  const evalshaCalls = async () => Number(/cmdstat_evalsha:calls=(\d+)/.exec(await redis.info('commandstats'))?.[1] ?? 0);
  const before = await evalshaCalls();
  const answers = await Promise.all(calls.map((events) => ingestEvents(redis, keys, scope(4), events)));
  // alone, each call would make a script call per partition it touches (~2 each, ~40 in all)
  assert.ok((await evalshaCalls()) - before <= 8, 'one script call per partition touched (4), not per call and partition');
  const shared: number[] = [];
  answers.forEach((items, c) => {
    assert.equal(items.map((i) => i.name), [`c${c}.a`, `c${c}.b`, `c${c}.c`], 'input order');
    assert.ok(items.every((i) => i.status === 'accepted'));
    assert.ok(items[0]!.sequence < items[2]!.sequence, 'a call\'s events of one subscriber keep their order');
    shared.push(items[0]!.sequence, items[2]!.sequence);
  });
  assert.equal([...shared].sort((a, b) => a - b), Array.from({ length: 40 }, (_, i) => i + 2), 'sequences 2..41 ($subscriber.created is 1), no gap, none twice');
  const p = partitionOf('tnt_tog', 'shared', 4);
  const inbox = (await redis.xrange(keys.inbox(p), '-', '+')) as [string, string[]][];
  const seqs = inbox.map(([, f]) => f).filter((f) => f[f.indexOf('x') + 1] === 'shared').map((f) => Number(f[f.indexOf('q') + 1]));
  assert.equal(seqs, Array.from({ length: 41 }, (_, i) => i + 1), 'the inbox holds them in sequence order');
});

together('the same caller id in two calls of one tick: one accepted, the other the duplicate of it', async ({ redis, keys }) => {
  const [a, b] = await Promise.all([
    ingestEvents(redis, keys, scope(2), [event('dup', 'first', 'id-1')]),
    ingestEvents(redis, keys, scope(2), [event('dup', 'second', 'id-1')]),
  ]);
  assert.is(a[0]!.status, 'accepted');
  assert.is(b[0]!.status, 'duplicate');
  assert.is(b[0]!.id, a[0]!.id);
  assert.is(b[0]!.name, 'first', 'the original event is answered');
});

together('a partition over its backlog refuses only the calls that write to it', async ({ redis, keys }) => {
  const full = ['a', 'b', 'c', 'd', 'e', 'f', 'g', 'h'].find((x) => partitionOf('tnt_tog', x, 2) === 0)!;
  const free = ['a', 'b', 'c', 'd', 'e', 'f', 'g', 'h'].find((x) => partitionOf('tnt_tog', x, 2) === 1)!;
  await ingestEvents(redis, keys, scope(2), [event(full, 'fill'), event(full, 'fill')]); // 3 entries in partition 0
  const [refused, accepted, spanning] = await Promise.allSettled([
    ingestEvents(redis, keys, scope(2, 2), [event(full, 'late')]),
    ingestEvents(redis, keys, scope(2, 2), [event(free, 'fine')]),
    ingestEvents(redis, keys, scope(2, 2), [event(free, 'half'), event(full, 'half')]),
  ]);
  assert.is(refused.status, 'rejected');
  assert.ok((refused as PromiseRejectedResult).reason instanceof ApiError);
  assert.is(((refused as PromiseRejectedResult).reason as ApiError).status, 503);
  assert.is(accepted.status, 'fulfilled');
  assert.is((accepted as PromiseFulfilledResult<{ status: string }[]>).value[0]!.status, 'accepted');
  assert.is(spanning.status, 'rejected', 'a call with any event refused is refused (its other events may be stored: retry with ids)');
  assert.is(await redis.xlen(keys.inbox(0)), 3, 'nothing appended to the full partition');
});

// Calls of successive turns, each written before the previous one is answered: a flush counts the
// events sent and not yet answered, and measures after they are written, so a burst spread over
// turns is counted against itself too (a lone call goes through auto-pipelining, written from a
// setImmediate: the next flush's measure must still come after it).
together('sixteen 100-event calls for one subscriber in sixteen turns: 3 accepted at limit 250, 13 refused 429', async ({ redis, keys }) => {
  const limited = { ...scope(4), subscriberMaxBacklog: 250, tenantMaxBacklog: 1_000_000 };
  const answers: Promise<number>[] = [];
  for (let c = 0; c < 16; c++) {
    answers.push(ingestEvents(redis, keys, limited, Array.from({ length: 100 }, (_, i) => event('turns', `c${c}`, `c${c}-${i}`))).then(() => 202, (err: ApiError) => err.status));
    await new Promise((next) => setImmediate(next));
  }
  assert.equal(await Promise.all(answers), [202, 202, 202, ...Array(13).fill(429)]);
  const p = partitionOf('tnt_tog', 'turns', 4);
  assert.is(await redis.hget(keys.sequences(p), 'tnt_tog|turns'), '301');
});

together('forty 100-event calls of one tenant over one partition in forty turns: 5 accepted at limit 500', async ({ redis, keys }) => {
  const limited = { ...scope(4), tenantMaxBacklog: 500, subscriberMaxBacklog: 1_000_000 };
  const ids: string[] = [];
  for (let n = 0; ids.length < 4 && n < 1_000; n++) if (partitionOf('tnt_tog', `u${n}`, 4) === 1) ids.push(`u${n}`);
  const answers: Promise<number>[] = [];
  for (let c = 0; c < 40; c++) {
    answers.push(ingestEvents(redis, keys, limited, Array.from({ length: 100 }, (_, i) => event(ids[i % 4]!, `c${c}`))).then(() => 202, (err: ApiError) => err.status));
    await new Promise((next) => setImmediate(next));
  }
  assert.equal(await Promise.all(answers), [...Array(5).fill(202), ...Array(35).fill(429)]);
});

together.run();
