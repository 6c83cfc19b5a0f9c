import type { Socket } from 'node:net';
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { coalesceWrites, connectRedis, isRedisUnavailable } from '../../streams/redis.js';
import { testRedisUrl } from '../helpers/redis.js';

// coalesceWrites: the commands a connection issues in one event-loop turn leave in one socket write,
// in order, without waiting for earlier replies; again after a reconnection.

type Ctx = { url: string; prefix: string };
const coalesce = suite<Ctx>('commands of one turn in one socket write');

coalesce.before(async (ctx) => {
  ctx.url = await testRedisUrl();
  ctx.prefix = `test:coalesce:${process.pid}:${Date.now()}`;
});

/** Counts the socket's system-level writes: one `_writev` or `_write` call each. */
function countWrites(socket: Socket): { writes: number } {
  const counter = { writes: 0 };
  const s = socket as unknown as Record<'_write' | '_writev', (...args: unknown[]) => unknown>;
  for (const name of ['_write', '_writev'] as const) {
    const original = s[name]!.bind(socket);
    s[name] = (...args: unknown[]) => {
      counter.writes++;
      return original(...args);
    };
  }
  return counter;
}

coalesce('200 commands issued in one turn go out in one write, in order, each with its reply', async ({ url, prefix }) => {
  const redis = coalesceWrites(connectRedis({ url }, { enableAutoPipelining: false }));
  try {
    await redis.ping();
    const counter = countWrites(redis.stream as Socket);
    const key = `${prefix}:list`;
    const replies = await Promise.all(Array.from({ length: 200 }, (_, i) => redis.rpush(key, String(i))));
    assert.equal(replies, Array.from({ length: 200 }, (_, i) => i + 1), 'each reply in order');
    assert.equal(await redis.lrange(key, 0, -1), Array.from({ length: 200 }, (_, i) => String(i)));
    assert.is(counter.writes, 2, 'the 200 pushes in one write, then the LRANGE');
    await redis.del(key);
  } finally {
    redis.disconnect();
  }
});

coalesce('without it, every command is a write of its own', async ({ url, prefix }) => {
  const redis = connectRedis({ url }, { enableAutoPipelining: false });
  try {
    await redis.ping();
    const counter = countWrites(redis.stream as Socket);
    await Promise.all(Array.from({ length: 20 }, (_, i) => redis.set(`${prefix}:k${i}`, 'v')));
    assert.is(counter.writes, 20);
    await redis.del(...Array.from({ length: 20 }, (_, i) => `${prefix}:k${i}`));
  } finally {
    redis.disconnect();
  }
});

coalesce('a command issued while an earlier one awaits its reply is written at once, not held back', async ({ url, prefix }) => {
  const redis = coalesceWrites(connectRedis({ url }, { enableAutoPipelining: false }));
  const other = connectRedis({ url });
  try {
    await redis.ping();
    const counter = countWrites(redis.stream as Socket);
    const key = `${prefix}:blocked`;
    const blocked = redis.blpop(key, 5);
    await new Promise((resolve) => setImmediate(resolve));
    await new Promise((resolve) => setImmediate(resolve));
    assert.is(counter.writes, 1, 'BLPOP written');
    // a later turn's command, while BLPOP still waits for its reply
    const read = redis.llen(key);
    await new Promise((resolve) => setImmediate(resolve));
    await new Promise((resolve) => setImmediate(resolve));
    assert.is(counter.writes, 2, 'LLEN written without waiting for the BLPOP reply');
    await other.rpush(key, 'x');
    assert.equal(await blocked, [key, 'x']);
    assert.is(await read, 0, 'Redis answers in order: LLEN after the BLPOP took the item');
  } finally {
    redis.disconnect();
    other.disconnect();
  }
});

coalesce('after a reconnection the new socket coalesces too', async ({ url, prefix }) => {
  const redis = coalesceWrites(connectRedis({ url }, { enableAutoPipelining: false }));
  try {
    await redis.ping();
    const first = redis.stream;
    first.destroy();
    await new Promise<void>((resolve) => redis.once('ready', () => resolve()));
    assert.ok(redis.stream !== first, 'a new socket');
    const counter = countWrites(redis.stream as Socket);
    const key = `${prefix}:after`;
    await Promise.all(Array.from({ length: 30 }, (_, i) => redis.rpush(key, String(i))));
    assert.is(counter.writes, 1);
    assert.is(await redis.llen(key), 30);
    await redis.del(key);
  } finally {
    redis.disconnect();
  }
});

/**
 * Probe X2: a command whose connection closed before its reply (ioredis's AbortError) was answered
 * 500 `internal`; like every other sign of Redis being unreachable it is 503 `unavailable`, which
 * clients retry (spec Part 7).
 */
coalesce('a command aborted by its connection\'s close counts as Redis unavailable (503, retried), as a timeout does', () => {
  assert.ok(isRedisUnavailable(new Error('Command aborted due to connection close')));
  assert.ok(isRedisUnavailable(new Error('Command timed out')));
  assert.not.ok(isRedisUnavailable(new Error('ERR wrong number of arguments')));
});

coalesce.run();
