import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { bucketWidthMs, counterField, Counters, initField, parseInit } from '../../lib/event-counters.js';

const MIN = 60_000;
const HOUR = 3_600_000;
const DAY = 86_400_000;
const T0 = Date.UTC(2025, 0, 15, 12, 0, 0); // a day boundary + 12h, a multiple of every width

/** Increments fields as the worker would for events at the given times. */
function counted(key: string, withinMs: number | null, times: number[], fields: Record<string, string> = {}): Record<string, string> {
  for (const ts of times) {
    const field = counterField(key, withinMs, ts);
    fields[field] = String(Number(fields[field] ?? 0) + 1);
  }
  return fields;
}

const widths = suite('bucket widths');

widths('the largest width at most a 48th of the window, at least 1m', () => {
  assert.is(bucketWidthMs(MIN), MIN);
  assert.is(bucketWidthMs(HOUR), MIN);
  assert.is(bucketWidthMs(4 * HOUR), 5 * MIN);
  assert.is(bucketWidthMs(12 * HOUR), 15 * MIN);
  assert.is(bucketWidthMs(2 * DAY), HOUR);
  assert.is(bucketWidthMs(7 * DAY), HOUR);
  assert.is(bucketWidthMs(12 * DAY), 6 * HOUR);
  assert.is(bucketWidthMs(30 * DAY), 6 * HOUR);
  assert.is(bucketWidthMs(48 * DAY), DAY);
  assert.is(bucketWidthMs(90 * DAY), DAY);
});

widths('all-time counters have width 0', () => {
  assert.is(bucketWidthMs(null), 0);
});

widths('fields name the bucket start, or all, or init', () => {
  assert.is(counterField('k', HOUR, T0 + 59_999), `k|${T0}`);
  assert.is(counterField('k', HOUR, T0 + 60_000), `k|${T0 + MIN}`);
  assert.is(counterField('k', 7 * DAY, T0 + 90 * MIN), `k|${T0 + HOUR}`);
  assert.is(counterField('k', 90 * DAY, T0), `k|${T0 - 12 * HOUR}`);
  assert.is(counterField('k', null, T0), 'k|all');
  assert.is(initField('k'), 'k|init');
});

widths.run();

const counts = suite('counting in a window');

counts('an all-time counter reads its one field', () => {
  const fields = counted('k', null, [T0 - 400 * DAY, T0, T0 + 5]);
  assert.is(new Counters(fields).countInWindow('k', null, T0), 3);
  assert.is(new Counters({}).countInWindow('k', null, T0), 0);
  assert.is(new Counters(fields).nextExpiry('k', null, T0), null);
  assert.equal(new Counters(fields).expiredFields('k', null, T0 + 1000 * DAY), []);
});

counts('only the fields of the key count; init and all are not buckets', () => {
  const fields = counted('k', HOUR, [T0, T0 + 1]);
  counted('k2', HOUR, [T0], fields);
  counted('other', HOUR, [T0], fields);
  fields[initField('k')] = '1';
  fields['k|all'] = '7';
  assert.is(new Counters(fields).countInWindow('k', HOUR, T0 + MIN), 2);
  assert.is(new Counters(fields).countInWindow('k2', HOUR, T0 + MIN), 1);
});

counts('a bucket counts while its end is after now - window', () => {
  const fields = counted('k', HOUR, [T0 + 30_000]); // bucket [T0, T0+1m)
  assert.is(new Counters(fields).countInWindow('k', HOUR, T0 + 30_000), 1);
  // exact expiry of the event: T0 + 30s + 1h; still counted until the bucket end leaves
  assert.is(new Counters(fields).countInWindow('k', HOUR, T0 + HOUR + 30_000), 1);
  assert.is(new Counters(fields).countInWindow('k', HOUR, T0 + HOUR + MIN - 1), 1);
  assert.is(new Counters(fields).countInWindow('k', HOUR, T0 + HOUR + MIN), 0);
});

counts('a 7d window counts hour buckets, a 90d window day buckets', () => {
  const week = counted('w', 7 * DAY, [T0 - 7 * DAY + 10, T0 - 3 * DAY, T0]);
  assert.is(new Counters(week).countInWindow('w', 7 * DAY, T0), 3);
  assert.is(new Counters(week).countInWindow('w', 7 * DAY, T0 + HOUR - 1), 3);
  assert.is(new Counters(week).countInWindow('w', 7 * DAY, T0 + HOUR), 2);
  const quarter = counted('q', 90 * DAY, [T0 - 90 * DAY, T0 - 45 * DAY, T0]);
  // T0 is 12:00 UTC, so the oldest event's day bucket ends 12h after T0 - 90d
  assert.is(new Counters(quarter).countInWindow('q', 90 * DAY, T0 + 12 * HOUR - 1), 3);
  assert.is(new Counters(quarter).countInWindow('q', 90 * DAY, T0 + 12 * HOUR), 2);
});

counts('events dated after now count in their own bucket', () => {
  const fields = counted('k', 30 * DAY, [T0 + HOUR, T0 + 2 * DAY]);
  assert.is(new Counters(fields).countInWindow('k', 30 * DAY, T0), 2);
});

counts('several events in one bucket add up', () => {
  const fields = counted('k', MIN, [T0, T0 + 1, T0 + 59_999, T0 + 60_000]);
  assert.is(fields[`k|${T0}`], '3');
  assert.is(new Counters(fields).countInWindow('k', MIN, T0 + 60_000), 4);
  assert.is(new Counters(fields).countInWindow('k', MIN, T0 + 120_000), 1);
});

counts.run();

const expiry = suite('expiry');

expiry('nextExpiry is the end of the earliest counted bucket plus the window', () => {
  const fields = counted('k', HOUR, [T0 + 10, T0 + 5 * MIN, T0 + 7 * MIN]);
  assert.is(new Counters(fields).nextExpiry('k', HOUR, T0 + 10 * MIN), T0 + MIN + HOUR);
  // at that time the first bucket has left: the next is the 5m bucket
  assert.is(new Counters(fields).nextExpiry('k', HOUR, T0 + MIN + HOUR), T0 + 6 * MIN + HOUR);
  assert.is(new Counters(fields).nextExpiry('k', HOUR, T0 + 8 * MIN + HOUR), null);
  assert.is(new Counters({}).nextExpiry('k', HOUR, T0), null);
});

expiry('nextExpiry is always after now and matches where the count drops', () => {
  const fields = counted('k', 30 * DAY, [T0 - 29 * DAY, T0 - 2 * DAY, T0 + HOUR]);
  let now = T0;
  let n = new Counters(fields).countInWindow('k', 30 * DAY, now);
  assert.is(n, 3);
  for (;;) {
    const at = new Counters(fields).nextExpiry('k', 30 * DAY, now);
    if (at === null) break;
    assert.ok(at > now);
    assert.is(new Counters(fields).countInWindow('k', 30 * DAY, at - 1), n);
    const after = new Counters(fields).countInWindow('k', 30 * DAY, at);
    assert.ok(after < n);
    n = after;
    now = at;
  }
  assert.is(n, 0);
});

expiry('nextExpiry ignores empty buckets and other keys', () => {
  const fields: Record<string, string> = { [`k|${T0}`]: '0', [`j|${T0 - HOUR}`]: '4', [initField('k')]: '1' };
  assert.is(new Counters(fields).nextExpiry('k', HOUR, T0), null);
});

expiry('expiredFields lists the buckets that left the window, only of the key', () => {
  const fields = counted('k', HOUR, [T0, T0 + 30 * MIN, T0 + 2 * HOUR]);
  counted('j', HOUR, [T0], fields);
  fields[initField('k')] = '1';
  assert.equal(new Counters(fields).expiredFields('k', HOUR, T0 + HOUR + MIN - 1), []);
  assert.equal(new Counters(fields).expiredFields('k', HOUR, T0 + HOUR + MIN), [`k|${T0}`]);
  assert.equal(new Counters(fields).expiredFields('k', HOUR, T0 + 2 * HOUR + MIN).sort(), [`k|${T0}`, `k|${T0 + 30 * MIN}`].sort());
  assert.equal(new Counters(fields).expiredFields('k', HOUR, T0 + 10 * HOUR).sort(), [`k|${T0}`, `k|${T0 + 30 * MIN}`, `k|${T0 + 2 * HOUR}`].sort());
});

expiry('expiredFields and countInWindow agree: deleting expired fields keeps the count', () => {
  const fields = counted('k', 7 * DAY, Array.from({ length: 200 }, (_, i) => T0 - i * 3_700_000));
  const now = T0 + 2 * DAY;
  const before = new Counters(fields).countInWindow('k', 7 * DAY, now);
  for (const f of new Counters(fields).expiredFields('k', 7 * DAY, now)) delete fields[f];
  assert.is(new Counters(fields).countInWindow('k', 7 * DAY, now), before);
  assert.equal(new Counters(fields).expiredFields('k', 7 * DAY, now), []);
});

expiry.run();

const changes = suite('changes through Counters');

changes('increment, setInit and remove keep the index equal to the hash they write', () => {
  // the hash as Redis holds it after the same writes (HINCRBY, HSET, HDEL), and the index kept alongside
  const hash: Record<string, string> = { 'k|init': String(DAY), [`k|${T0 - HOUR}`]: '2', 'a|all': '5', 'a|init': 'all', 'x|odd': '1' };
  const index = new Counters(hash);
  let seed = 7;
  const random = () => (seed = (seed * 48271) % 2147483647) / 2147483647;
  for (let i = 0; i < 500; i++) {
    const r = random();
    const key = ['k', 'a', 'w'][Math.floor(random() * 3)]!;
    const withinMs = key === 'a' ? null : key === 'k' ? DAY : 7 * DAY;
    if (r < 0.6) {
      const field = index.increment(key, withinMs, T0 - Math.floor(random() * 10 * DAY));
      hash[field] = String(Number(hash[field] ?? 0) + 1);
    } else if (r < 0.7) {
      const [field, value] = index.setInit(key, withinMs, Math.floor(random() * 4));
      hash[field] = value;
    } else {
      const fields = index.fieldsOf(key);
      const field = fields[Math.floor(random() * fields.length)];
      if (field) {
        index.remove(field);
        delete hash[field];
      }
    }
    const fresh = new Counters(hash);
    for (const k of ['k', 'a', 'w', 'x']) {
      const w = k === 'a' ? null : k === 'k' ? DAY : 7 * DAY;
      assert.equal(index.fieldsOf(k).sort(), Object.keys(hash).filter((f) => f.startsWith(`${k}|`)).sort(), `fields of ${k} after step ${i}`);
      assert.is(index.countInWindow(k, w, T0), fresh.countInWindow(k, w, T0));
      assert.is(index.nextExpiry(k, w, T0), fresh.nextExpiry(k, w, T0));
      assert.equal(index.expiredFields(k, w, T0).sort(), fresh.expiredFields(k, w, T0).sort());
      for (const since of [0, 2]) assert.is(index.covers(k, w, since), fresh.covers(k, w, since));
    }
    assert.equal(index.keys().sort(), fresh.keys().sort());
  }
});

changes('an init mark tells the window and the definitions version a counter was seeded under; covers needs both', () => {
  const c = new Counters();
  assert.equal(c.setInit('k', DAY, 5), ['k|init', `${DAY}@5`]);
  assert.ok(c.covers('k', DAY, 5));
  assert.ok(c.covers('k', DAY, 3), 'seeded after the condition was kept again');
  assert.not.ok(c.covers('k', DAY, 6), 'seeded before a break in keeping its condition: stale');
  assert.not.ok(c.covers('k', 2 * DAY, 0), 'a longer window than it keeps');
  c.setInit('a', null, 2);
  assert.ok(c.covers('a', null, 2));
  assert.equal(parseInit('all@7'), { withinMs: null, seededVersion: 7 });
  // a mark written before versions were recorded reads as version 0
  const legacy = new Counters({ 'k|init': String(DAY), 'a|init': 'all' });
  assert.equal(legacy.initOf('k'), { withinMs: DAY, seededVersion: 0 });
  assert.ok(legacy.covers('k', DAY, 0));
  assert.ok(legacy.covers('a', null, 0));
  assert.not.ok(legacy.covers('a', null, 1));
});

changes.run();
