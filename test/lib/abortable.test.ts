import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { ABORTED, pause, untilAborted } from '../../lib/abortable.js';

test('pause ends at its time, or at once when any of its signals aborts (already aborted: at once)', async () => {
  let started = Date.now();
  await pause(30);
  assert.ok(Date.now() - started >= 25);
  const a = new AbortController();
  const b = new AbortController();
  started = Date.now();
  setTimeout(() => b.abort(), 20);
  await pause(10_000, a.signal, undefined, b.signal);
  assert.ok(Date.now() - started < 5_000, 'the second signal ended it');
  started = Date.now();
  await pause(10_000, b.signal);
  assert.ok(Date.now() - started < 1_000, 'an aborted signal ends it at once');
});

test('untilAborted answers the work, or ABORTED once the signal aborts; a failure is passed on', async () => {
  assert.is(await untilAborted(Promise.resolve(7)), 7);
  const c = new AbortController();
  assert.is(await untilAborted(new Promise((r) => setTimeout(() => r(1), 10)), c.signal), 1);
  setTimeout(() => c.abort(), 10);
  assert.is(await untilAborted(new Promise(() => undefined), c.signal), ABORTED);
  assert.is(await untilAborted(Promise.resolve(2), c.signal), ABORTED, 'already aborted');
  await untilAborted(Promise.reject(new Error('no')), new AbortController().signal).then(() => assert.unreachable(), (err: Error) => assert.is(err.message, 'no'));
});

test.run();
