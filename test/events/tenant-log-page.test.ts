import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { tenantEventsPage, type LogFilter, type LogPosition } from '../../streams/read-models.js';
import { startTestService, type TestService } from '../helpers/service.js';

type Entry = { p: number; ms: number; seq: number; id: string; name: string; source: string };
type Ctx = { service: TestService; tenant: string };
const page = suite<Ctx>('tenant log pages (threshold merge over partitions)');

page.before(async (ctx) => {
  ctx.service = await startTestService('tenant-log-page');
});
page.after(async (ctx) => ctx.service.stop());

let seed = 42;
const random = () => (seed = (seed * 48_271) % 2_147_483_647) / 2_147_483_647;
const pick = <T>(list: T[]) => list[Math.floor(random() * list.length)]!;

/** Writes `n` log entries of tenant `tenant` over `partitions` as lua/applyEvents does, milliseconds crowded so many collide. */
async function writeLog(ctx: Ctx, tenant: string, partitions: number, n: number, names: () => string, spanMs: number): Promise<Entry[]> {
  const { redis, keys } = ctx.service;
  const base = 1_700_000_000_000;
  const entries: Entry[] = [];
  const bySeq = new Map<number, number>();
  // per partition, log ids must grow: entries are made in time order per partition
  const made: Entry[] = [];
  for (let i = 0; i < n; i++) made.push({ p: Math.floor(random() * partitions), ms: base + Math.floor(random() * spanMs), seq: 0, id: '', name: names(), source: pick(['server', 'ios', 'web']) });
  made.sort((a, b) => a.ms - b.ms);
  const pipeline = redis.pipeline();
  for (const e of made) {
    const key = `${e.p}|${e.ms}`;
    e.seq = bySeq.get(key as unknown as number) ?? 0;
    bySeq.set(key as unknown as number, e.seq + 1);
    // evt ids: time-ordered prefix, random tail, so within a millisecond the id order is not the append order
    e.id = `evt_${e.ms.toString(36)}${Math.floor(random() * 1e9).toString(36).padStart(7, '0')}${entries.length.toString(36).padStart(4, '0')}`;
    entries.push(e);
    pipeline.xadd(keys.tenantLog(e.p, tenant), `${e.ms}-${e.seq}`, 'id', e.id, 'q', '1', 'x', 'u', 'u', 'sub_x', 'n', e.name, 'o', e.source,
      'ts', String(e.ms), 'r', String(e.ms), 'd', '{}', 'ru', '', 'm', '', 'st', '', 'pv', '');
  }
  await pipeline.exec();
  return entries;
}

const newestFirst = (a: Entry, b: Entry) => b.ms - a.ms || (a.id < b.id ? 1 : a.id > b.id ? -1 : 0);

/** Every page of the list under `filter` with page size `limit`: the ids in order, and how many pages came back short of a full one. */
async function walk(ctx: Ctx, tenant: string, partitions: number, limit: number, filter: LogFilter) {
  const ids: string[] = [];
  let after: LogPosition | null = null;
  let short = 0;
  for (let n = 0; n < 10_000; n++) {
    const res = await tenantEventsPage(ctx.service.redis, ctx.service.keys, partitions, tenant, limit, after, filter);
    assert.ok(res.items.length <= limit);
    if (res.next && res.items.length < limit) short++;
    ids.push(...res.items.map((e) => e.id));
    if (!res.next) return { ids, short };
    after = res.next;
  }
  throw new Error('the walk did not end');
}

page('every page walk, filtered or not, lists each matching entry once, newest first, whatever the page size', async (ctx) => {
  const tenant = 'tnt_walks';
  const partitions = 8;
  const entries = await writeLog(ctx, tenant, partitions, 3_000, () => (random() < 0.01 ? 'rare' : pick(['a', 'b', 'c'])), 400);
  for (const filter of [{}, { name: 'a' }, { name: 'rare' }, { source: 'ios' }, { name: 'b', source: 'web' }, { afterMs: 1_700_000_000_200 }, { name: 'none' }] as LogFilter[]) {
    const expected = entries
      .filter((e) => (!filter.name || e.name === filter.name) && (!filter.source || e.source === filter.source) && (filter.afterMs === undefined || e.ms > filter.afterMs))
      .sort(newestFirst).map((e) => e.id);
    // small pages where the list is short (a page of 1 over 3,000 entries is 3,000 reads)
    for (const limit of expected.length <= 200 ? [1, 3, 7, 50, 100] : [13, 50, 100]) {
      const { ids } = await walk(ctx, tenant, partitions, limit, filter);
      assert.equal(ids, expected, `${JSON.stringify(filter)} limit ${limit}`);
    }
  }
});

page('a page reads about what it needs: an unfiltered page of 100 over 64 partitions reads a few hundred entries, not 101 from each (probe I2)', async (ctx) => {
  const tenant = 'tnt_cost';
  await writeLog(ctx, tenant, 64, 12_800, () => 'a', 60_000);
  const first = await tenantEventsPage(ctx.service.redis, ctx.service.keys, 64, tenant, 100, null, {});
  assert.is(first.items.length, 100);
  assert.ok(first.scanned < 1_200, `scanned ${first.scanned} entries (6,464 before)`);
});

page('a filter matching little stops at the scan budget with a cursor where it stopped, and the walk still finds every match once', async (ctx) => {
  const tenant = 'tnt_budget';
  const partitions = 4;
  const entries = await writeLog(ctx, tenant, partitions, 40_000, () => (random() < 0.0005 ? 'needle' : 'hay'), 200_000);
  const needles = entries.filter((e) => e.name === 'needle').sort(newestFirst).map((e) => e.id);
  const first = await tenantEventsPage(ctx.service.redis, ctx.service.keys, partitions, tenant, 50, null, { name: 'needle' });
  assert.ok(first.scanned < 8_000 + partitions * 400, `bounded: ${first.scanned}`);
  assert.ok(first.next !== null, 'more to scan');
  const { ids, short } = await walk(ctx, tenant, partitions, 50, { name: 'needle' });
  assert.equal(ids, needles);
  assert.ok(short > 0, 'some pages stopped at the budget before they were full');
});

page.run();
