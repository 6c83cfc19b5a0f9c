import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { pause } from '../../lib/abortable.js';
import { createLogger } from '../../lib/log.js';
import { connectRedis } from '../../streams/redis.js';
import { StreamConsumer, type StreamEntry } from '../../streams/stream-consumer.js';
import { testRedisUrl, uniquePrefix } from '../helpers/redis.js';
import { waitFor } from '../helpers/wait.js';

/**
 * A stopping consumer leaves the groups of the streams it read (XGROUP DELCONSUMER) where it holds
 * nothing pending: every process start is a new consumer name, and until probe O of session 39 they
 * piled up (1,815 on the partition streams after ~90 worker starts). Where entries it never acked
 * are pending it stays, so another process still claims them.
 */
test('a stopped consumer leaves the groups of the streams it read, except where it holds pending entries', async () => {
  const url = await testRedisUrl();
  const redis = connectRedis({ url });
  const blocking = connectRedis({ url }, { maxRetriesPerRequest: null });
  const prefix = uniquePrefix('consumer-leave');
  const [done, held] = [`${prefix}done`, `${prefix}held`];
  const group = 'leavers';
  const consumer = `test:${process.pid}`;
  try {
    await redis.xadd(done, '*', 'n', '1');
    await redis.xadd(held, '*', 'n', '2');
    const handled: StreamEntry[] = [];
    let refused = 0;
    const c = new StreamConsumer({
      redis, blocking, group, consumer, log: createLogger('error'), blockMs: 100,
      source: { mode: 'shared', claimIdleMs: 60_000, streams: () => [done, held] },
      // the entry of `held` fails its handler: delivered to this consumer and never acked
      handle: async (stream, entries) => {
        if (stream === held) {
          refused++;
          throw new Error('not now');
        }
        handled.push(...entries);
      },
    });
    c.start();
    await waitFor('both streams read', async () => handled.length === 1 && refused >= 1, 5_000, 20);
    await new Promise((r) => setTimeout(r, 500)); // past the retry pause: the streams are adopted again
    await c.stop();
    const names = async (stream: string) => ((await redis.xinfo('CONSUMERS', stream, group)) as unknown[][]).map((row) => row[1]);
    assert.equal(await names(done), [], 'nothing pending: it left');
    assert.equal(await names(held), [consumer], 'an entry pending: it stays for a claim');
    assert.is(Number((await redis.xpending(held, group))[0]), 1);
  } finally {
    await redis.del(done, held);
    redis.disconnect();
    blocking.disconnect();
  }
});

/**
 * A stream that stops being a running consumer's (a partition lease released to a worker that joined)
 * is left at once where it holds nothing pending: until session 52 its name stayed until the hourly
 * pass (probe AU: 171 names after a rolling restart of two workers).
 */
test('a running consumer leaves the group of a stream it no longer reads, where nothing is pending', async () => {
  const url = await testRedisUrl();
  const redis = connectRedis({ url });
  const blocking = connectRedis({ url }, { maxRetriesPerRequest: null });
  const prefix = uniquePrefix('consumer-drop');
  const [kept, released] = [`${prefix}kept`, `${prefix}released`];
  const group = 'droppers';
  const consumer = `test:${process.pid}`;
  let streams = [kept, released];
  try {
    await redis.xadd(kept, '*', 'n', '1');
    await redis.xadd(released, '*', 'n', '2');
    let handled = 0;
    const c = new StreamConsumer({
      redis, blocking, group, consumer, log: createLogger('error'), blockMs: 100,
      source: { mode: 'exclusive', streams: () => streams },
      handle: async (_stream, entries) => void (handled += entries.length),
    });
    c.start();
    const names = async (stream: string) => ((await redis.xinfo('CONSUMERS', stream, group)) as unknown[][]).map((row) => row[1]);
    await waitFor('both streams read', async () => handled === 2 && (await names(released)).length === 1, 5_000, 20);
    streams = [kept];
    await waitFor('the released stream left', async () => (await names(released)).length === 0, 5_000, 20);
    assert.equal(await names(kept), [consumer], 'the stream it still reads keeps it');
    await c.stop();
  } finally {
    await redis.del(kept, released);
    redis.disconnect();
    blocking.disconnect();
  }
});

/**
 * A process killed with SIGKILL never leaves its groups: its consumer name stayed for good (probe O
 * counted 1,815 on the partition streams after ~90 worker starts, cleanly stopped ones included).
 * Each consumer forgets, at its first read and hourly after, the names of its groups that hold
 * nothing pending and read nothing for an hour (here 200 ms); one holding entries stays for a claim.
 */
test('a consumer forgets the names dead processes left in its groups, not one holding pending entries', async () => {
  const url = await testRedisUrl();
  const redis = connectRedis({ url });
  const blocking = connectRedis({ url }, { maxRetriesPerRequest: null });
  const stream = `${uniquePrefix('consumer-forget')}s`;
  const group = 'forgetters';
  try {
    await redis.xgroup('CREATE', stream, group, '0', 'MKSTREAM');
    await redis.xadd(stream, '*', 'n', '1');
    await redis.xadd(stream, '*', 'n', '2');
    // two processes that died: one had acked what it read, the other had not
    const [[, [[acked]]]] = (await redis.xreadgroup('GROUP', group, 'dead-acked', 'COUNT', 1, 'STREAMS', stream, '>')) as any;
    await redis.xack(stream, group, acked);
    await redis.xreadgroup('GROUP', group, 'dead-holding', 'COUNT', 1, 'STREAMS', stream, '>');
    await new Promise((r) => setTimeout(r, 300));
    const handled: StreamEntry[] = [];
    const c = new StreamConsumer({
      redis, blocking, group, consumer: 'alive', log: createLogger('error'), blockMs: 100, deadConsumerIdleMs: 200,
      source: { mode: 'shared', claimIdleMs: 60_000, streams: () => [stream] },
      handle: async (_, entries) => void handled.push(...entries),
    });
    c.start();
    await redis.xadd(stream, '*', 'n', '3');
    await waitFor('the new entry handled', async () => handled.length === 1, 5_000, 20);
    const names = ((await redis.xinfo('CONSUMERS', stream, group)) as unknown[][]).map((row) => row[1]).sort();
    assert.equal(names, ['alive', 'dead-holding']);
    assert.is(Number((await redis.xpending(stream, group))[0]), 1, 'the dead process\'s entry is still pending, for a claim');
    await c.stop();
  } finally {
    await redis.del(stream);
    redis.disconnect();
    blocking.disconnect();
  }
});


/**
 * Probe K2: two dispatchers alive, one fanning a message out for longer than the claim's idle limit
 * (a slow push provider): the other claimed the queue entry and walked the message again, so 500
 * devices got 644 pushes. A shared consumer keeps the claims of the batch it works fresh, so a live
 * one's long batch is never taken over.
 */
test('a live consumer working a batch longer than the claim idle limit keeps it: the other consumer of the group never handles it', async () => {
  const url = await testRedisUrl();
  const redis = connectRedis({ url });
  const blockings = [connectRedis({ url }, { maxRetriesPerRequest: null }), connectRedis({ url }, { maxRetriesPerRequest: null })];
  const stream = `${uniquePrefix('consumer-keep')}s`;
  const group = 'keepers';
  const handled: string[] = [];
  const consumers = blockings.map((blocking, i) => new StreamConsumer({
    redis, blocking, group, consumer: `c${i}`, log: createLogger('error'), blockMs: 50,
    source: { mode: 'shared', claimIdleMs: 300, streams: () => [stream] },
    handle: async (_, entries) => {
      handled.push(...entries.map((e) => `c${i}:${e.fields.n}`));
      await new Promise((r) => setTimeout(r, 1_500)); // five times the idle limit
    },
  }));
  try {
    await redis.xgroup('CREATE', stream, group, '0', 'MKSTREAM');
    await redis.xadd(stream, '*', 'n', '1');
    for (const c of consumers) c.start();
    await waitFor('the entry handled and acked', async () => handled.length > 0 && Number((await redis.xpending(stream, group))[0]) === 0, 10_000, 50);
    await new Promise((r) => setTimeout(r, 700)); // the other's claim passes run meanwhile
    assert.is(handled.length, 1, `handled once: ${handled.join(', ')}`);
  } finally {
    await Promise.all(consumers.map((c) => c.stop()));
    await redis.del(stream);
    redis.disconnect();
  }
});

/**
 * A consumer that stalled past the idle limit (here: another consumer takes the entry over while the
 * handler works) is told through the handler's signal, and acks nothing of the batch: XACK would
 * take the entry out of the new owner's pending list.
 */
test('a batch another consumer took over aborts its handler and is not acked by the one that lost it', async () => {
  const url = await testRedisUrl();
  const redis = connectRedis({ url });
  const blocking = connectRedis({ url }, { maxRetriesPerRequest: null });
  const stream = `${uniquePrefix('consumer-lost')}s`;
  const group = 'losers';
  let aborted = false;
  let calls = 0;
  const c = new StreamConsumer({
    redis, blocking, group, consumer: 'slow', log: createLogger('error'), blockMs: 50,
    source: { mode: 'shared', claimIdleMs: 300, streams: () => [stream] },
    handle: async (_, entries, signal) => {
      if (calls++ > 0) return; // claimed back later (the other never worked it): handled then
      // the takeover: another process claims the entry as if this one had stalled
      await redis.xclaim(stream, group, 'other', 0, entries[0]!.id, 'JUSTID');
      await new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, 25_000);
        signal.addEventListener('abort', () => { aborted = true; clearTimeout(timer); resolve(); });
      });
    },
  });
  try {
    await redis.xgroup('CREATE', stream, group, '0', 'MKSTREAM');
    await redis.xadd(stream, '*', 'n', '1');
    c.start();
    await waitFor('the handler aborted', async () => aborted, 5_000, 10);
    // stopped before looking: the stop waits for the batch's end (an ack would be made by then), and no
    // claim pass of this consumer takes the entry back afterwards (one did ~320 ms after the takeover, probe BF)
    await c.stop();
    assert.is(Number((await redis.xpending(stream, group))[0]), 1, 'not acked by the consumer that lost it');
  } finally {
    await c.stop();
    await redis.del(stream);
    redis.disconnect();
  }
});


test('a batch taken over during its retry pause is not worked again by the consumer that lost it', async () => {
  const url = await testRedisUrl();
  const redis = connectRedis({ url });
  const blocking = connectRedis({ url }, { maxRetriesPerRequest: null });
  const stream = `${uniquePrefix('consumer-lost-retry')}s`;
  const group = 'losers';
  const signals: boolean[] = [];
  const c = new StreamConsumer({
    redis, blocking, group, consumer: 'slow', log: createLogger('error'), blockMs: 50,
    // claims touched every 100 ms: the takeover is seen within the 200 ms retry pause
    source: { mode: 'shared', claimIdleMs: 300, streams: () => [stream] },
    handle: async (_, entries, signal) => {
      signals.push(signal.aborted);
      if (signals.length > 1) return;
      await redis.xclaim(stream, group, 'other', 0, entries[0]!.id, 'JUSTID');
      throw new Error('failed once');
    },
  });
  try {
    await redis.xgroup('CREATE', stream, group, '0', 'MKSTREAM');
    await redis.xadd(stream, '*', 'n', '1');
    c.start();
    await waitFor('the first call', async () => signals.length === 1, 5_000, 10);
    await new Promise((r) => setTimeout(r, 600));
    // a later call is this consumer claiming the entry back from 'other', who never works it: a new batch, its signal live
    assert.equal(signals.filter((aborted) => aborted), [], 'never called again with the lost batch\'s aborted signal');
  } finally {
    await c.stop();
    await redis.del(stream);
    redis.disconnect();
  }
});

test('a shared batch\'s signal takes many waits at once without a MaxListenersExceededWarning (probe BE: a fan-out\'s 12 sendAll)', async () => {
  const url = await testRedisUrl();
  const redis = connectRedis({ url });
  const blocking = connectRedis({ url }, { maxRetriesPerRequest: null });
  const stream = `${uniquePrefix('consumer-waits')}s`;
  const warnings: string[] = [];
  const onWarning = (w: Error) => warnings.push(`${w.name}: ${w.message}`);
  process.on('warning', onWarning);
  let handled = 0;
  const c = new StreamConsumer({
    redis, blocking, group: 'waits', consumer: 'one', log: createLogger('error'), blockMs: 50,
    source: { mode: 'shared', claimIdleMs: 30_000, streams: () => [stream] },
    handle: async (_, entries, signal) => {
      await Promise.all(Array.from({ length: 12 }, () => pause(30, signal)));
      handled += entries.length;
    },
  });
  try {
    await redis.xgroup('CREATE', stream, 'waits', '0', 'MKSTREAM');
    await redis.xadd(stream, '*', 'n', '1');
    c.start();
    await waitFor('the batch handled', async () => handled === 1, 5_000, 10);
    await new Promise((r) => setImmediate(r));
    assert.equal(warnings, []);
  } finally {
    process.off('warning', onWarning);
    await c.stop();
    await redis.del(stream);
    redis.disconnect();
  }
});

/**
 * Probe D: a read's batches were all worked before the next read, so one stream's slow batch (a
 * tenant whose push provider is cold or unreachable) held up every other stream's entries. With
 * `overlapStreams` the next read names the other streams at once; the slow stream's next entries
 * wait for its batch (one batch at a time per stream, in order), and a stop waits for the work.
 */
test('with overlapStreams, one stream\'s slow batch does not hold up another stream\'s entries', async () => {
  const url = await testRedisUrl();
  const redis = connectRedis({ url });
  const blocking = connectRedis({ url }, { maxRetriesPerRequest: null });
  const prefix = uniquePrefix('consumer-overlap');
  const [slow, quick] = [`${prefix}slow`, `${prefix}quick`];
  let release!: () => void;
  let holding = false;
  const held = new Promise<void>((done) => (release = done));
  const handled: string[] = [];
  // reads issued while the slow batch is held do not block: a blocked read would hold up that
  // stream's next batch after its batch ends (probe: +35 ms per message with 1,500 idle tenants)
  const blockedWhileHeld: number[] = [];
  const readGroup = blocking.xreadgroup.bind(blocking) as (...args: unknown[]) => Promise<unknown>;
  (blocking as unknown as { xreadgroup: (...args: unknown[]) => Promise<unknown> }).xreadgroup = (...args: unknown[]) => {
    if (holding && args.includes('BLOCK')) blockedWhileHeld.push(args.length);
    return readGroup(...args);
  };
  const c = new StreamConsumer({
    redis, blocking, group: 'overlap', consumer: `test:${process.pid}`, log: createLogger('error'), blockMs: 1_000, overlapStreams: 4,
    source: { mode: 'shared', claimIdleMs: 60_000, streams: () => [slow, quick] },
    handle: async (stream, entries) => {
      if (stream === slow && entries.some((e) => e.fields.n === '1')) {
        holding = true;
        await held;
        holding = false;
      }
      handled.push(...entries.map((e) => `${stream === slow ? 'slow' : 'quick'}:${e.fields.n}`));
    },
  });
  try {
    await redis.xadd(slow, '*', 'n', '1');
    c.start();
    await new Promise((r) => setTimeout(r, 300)); // the slow batch is taken and held
    await redis.xadd(slow, '*', 'n', '2');
    await redis.xadd(quick, '*', 'n', '1');
    await waitFor('the other stream\'s entry handled while the slow batch is held', async () => handled.includes('quick:1'), 3_000, 20);
    assert.not.ok(handled.includes('slow:2'), 'the slow stream\'s next entry waits for its batch');
    assert.equal(blockedWhileHeld, [], 'no blocking read while a batch is worked');
    release();
    await waitFor('the slow stream in order', async () => handled.includes('slow:2'), 3_000, 20);
    assert.equal(handled.filter((h) => h.startsWith('slow')), ['slow:1', 'slow:2']);
    await waitFor('all acked', async () => Number((await redis.xpending(slow, 'overlap'))[0]) === 0 && Number((await redis.xpending(quick, 'overlap'))[0]) === 0, 3_000, 20);
  } finally {
    release();
    await c.stop();
    await redis.del(slow, quick);
    redis.disconnect();
    blocking.disconnect();
  }
});

/**
 * Probe V: when every stream the source listed was busy (below the overlap), the loop waited for one
 * of those batches to end before it looked at the source again, so a stream listed meanwhile (a
 * tenant's first message) waited for it: 25 s behind pushes that timed out, for ever behind one that
 * never ended. It is read within the idle sleep now.
 */
test('with overlapStreams, a stream the source lists while every known one is busy is read at once', async () => {
  const url = await testRedisUrl();
  const redis = connectRedis({ url });
  const blocking = connectRedis({ url }, { maxRetriesPerRequest: null });
  const prefix = uniquePrefix('consumer-new-stream');
  const [slow, late] = [`${prefix}slow`, `${prefix}late`];
  let release!: () => void;
  const held = new Promise<void>((done) => (release = done));
  const listed = [slow];
  const handled: string[] = [];
  const c = new StreamConsumer({
    redis, blocking, group: 'overlap', consumer: `test:${process.pid}`, log: createLogger('error'), blockMs: 1_000, overlapStreams: 4,
    source: { mode: 'shared', claimIdleMs: 60_000, streams: () => [...listed] },
    handle: async (stream, entries) => {
      if (stream === slow) await held;
      handled.push(...entries.map((e) => `${stream === slow ? 'slow' : 'late'}:${e.fields.n}`));
    },
  });
  try {
    await redis.xadd(slow, '*', 'n', '1');
    c.start();
    await new Promise((r) => setTimeout(r, 300)); // the only known stream's batch is taken and held
    await redis.xadd(late, '*', 'n', '1');
    listed.push(late);
    await waitFor('the newly listed stream read while the other batch is held', async () => handled.includes('late:1'), 3_000, 20);
    assert.not.ok(handled.includes('slow:1'));
  } finally {
    release();
    await c.stop();
    await redis.del(slow, late);
    redis.disconnect();
    blocking.disconnect();
  }
});

/**
 * Probe V (session 44): one push that never answered held its batch for its five attempts (~29 s),
 * and with it every later message of the tenant. With `batchesPerStream` a busy stream is read again
 * while it has batches to spare: its later entries are worked beside the held batch, and past the
 * limit they wait for one of them to end.
 */
test('with batchesPerStream, a stream\'s held batch does not hold up its later entries, up to the limit', async () => {
  const url = await testRedisUrl();
  const redis = connectRedis({ url });
  const blocking = connectRedis({ url }, { maxRetriesPerRequest: null });
  const stream = `${uniquePrefix('consumer-per-stream')}queue`;
  const releases = new Map<string, () => void>();
  const handled: string[] = [];
  const heldSince = new Map<string, number>();
  const c = new StreamConsumer({
    redis, blocking, group: 'overlap', consumer: `test:${process.pid}`, log: createLogger('error'), blockMs: 1_000, overlapStreams: 4, batchesPerStream: 2, slowBatchMs: 400,
    source: { mode: 'shared', claimIdleMs: 60_000, streams: () => [stream] },
    handle: async (_stream, entries) => {
      for (const e of entries) {
        // when the hold began, not when the test's poll saw it (probe BF: ~10 ms late, the margin ~95 ms)
        if (e.fields.hold) heldSince.set(e.fields.n!, Date.now());
        if (e.fields.hold) await new Promise<void>((done) => releases.set(e.fields.n!, done));
        handled.push(e.fields.n!);
      }
    },
  });
  try {
    await redis.xadd(stream, '*', 'n', '1', 'hold', '1');
    c.start();
    await waitFor('the first batch held', async () => releases.has('1'), 3_000, 10);
    const heldAt = heldSince.get('1')!;
    await redis.xadd(stream, '*', 'n', '2');
    await waitFor('a later entry worked beside the held batch', async () => handled.includes('2'), 3_000, 10);
    // only once the held batch has run slowBatchMs: batches that end quickly keep their stream one at a time
    assert.ok(Date.now() - heldAt >= 300, `read again after ${Date.now() - heldAt} ms`);
    await redis.xadd(stream, '*', 'n', '3', 'hold', '1');
    await waitFor('a second batch held', async () => releases.has('3'), 3_000, 10);
    await redis.xadd(stream, '*', 'n', '4');
    await new Promise((r) => setTimeout(r, 300));
    assert.not.ok(handled.includes('4'), 'two batches of the stream held: the third waits');
    releases.get('1')!();
    await waitFor('the next entry once a batch ended', async () => handled.includes('4'), 3_000, 10);
    releases.get('3')!();
    await waitFor('all acked', async () => Number((await redis.xpending(stream, 'overlap'))[0]) === 0, 3_000, 20);
    assert.equal(handled, ['2', '1', '4', '3']);
  } finally {
    for (const release of releases.values()) release();
    await c.stop();
    await redis.del(stream);
    redis.disconnect();
    blocking.disconnect();
  }
});

/**
 * Probe C1: the linger (a read less than half full waits before the next) looked at the read as a
 * whole, so one stream's backlog among many idle streams was read one small batch per linger: one
 * subscriber's burst drained at ~430 events/s, and its partition's other subscribers waited behind
 * it. A stream whose batch comes back full is read again at once.
 */
test('one stream\'s backlog among idle streams is read without lingering', async () => {
  const url = await testRedisUrl();
  const redis = connectRedis({ url });
  const blocking = connectRedis({ url }, { maxRetriesPerRequest: null });
  const prefix = uniquePrefix('consumer-linger');
  const streams = Array.from({ length: 64 }, (_, i) => `${prefix}p${i}`);
  const hot = streams[7]!;
  const pipeline = redis.pipeline();
  for (let i = 0; i < 320; i++) pipeline.xadd(hot, '*', 'n', String(i));
  await pipeline.exec();
  const batches: number[] = [];
  // 64 streams sharing a budget of 256: 16 per stream per read; 320 entries are 20 reads, which
  // lingering 500 ms after each would take 10 s
  const c = new StreamConsumer({
    redis, blocking, group: 'linger', consumer: `test:${process.pid}`, log: createLogger('error'), blockMs: 1_000, lingerMs: 500, readBudget: 256,
    source: { mode: 'exclusive', streams: () => streams },
    handle: async (_stream, entries) => void batches.push(entries.length),
  });
  try {
    const started = Date.now();
    c.start();
    await waitFor('the backlog handled', async () => batches.reduce((a, b) => a + b, 0) === 320, 15_000, 20);
    const took = Date.now() - started;
    assert.ok(batches.length >= 20, `read in batches of at most 16 (${batches.length} batches)`);
    assert.ok(took < 4_000, `handled in ${took} ms (lingering after each read: ~10 s)`);
  } finally {
    await c.stop();
    await redis.del(...streams);
    redis.disconnect();
    blocking.disconnect();
  }
});

/**
 * An approximate XTRIM removes at most 10,000 entries a call (Redis's default LIMIT): after a burst
 * of 25,000, one trim left 15,000 applied entries, and with no later ack no later trim (probe K1:
 * 280,879 applied entries kept in a quiet partition, where they counted against INBOX_MAX_BACKLOG).
 */
test('a trim after a burst removes every acked entry, not 10,000 of them', async () => {
  const url = await testRedisUrl();
  const redis = connectRedis({ url });
  const blocking = connectRedis({ url }, { maxRetriesPerRequest: null });
  const stream = `${uniquePrefix('consumer-trim')}burst`;
  try {
    const pipeline = redis.pipeline();
    for (let i = 0; i < 25_000; i++) pipeline.xadd(stream, '*', 'n', String(i));
    await pipeline.exec();
    let handled = 0;
    const c = new StreamConsumer({
      redis, blocking, group: 'trimmers', consumer: `test:${process.pid}`, log: createLogger('error'), blockMs: 100, trimEveryMs: 1_000,
      source: { mode: 'shared', claimIdleMs: 60_000, streams: () => [stream] },
      handle: async (_stream, entries) => void (handled += entries.length),
    });
    c.start();
    await waitFor('every entry handled', async () => handled === 25_000, 30_000, 20);
    await waitFor('the acked entries trimmed', async () => (await redis.xlen(stream)) < 200, 10_000, 50);
    await c.stop();
  } finally {
    await redis.del(stream);
    redis.disconnect();
    blocking.disconnect();
  }
});

test.run();
