import { isoNow } from '../lib/clock.js';
import { callScript } from '../streams/lua-scripts.js';
import type { RoleContext, Stop } from '../streams/role-context.js';
import { ACTOR_GROUP } from './subscriber-actor.js';
import { SEGMENT_RECHECK_REF, timerMember } from './automation.js';
import { indexedExternalId } from '../streams/subscriber-list.js';
import type { Redis } from 'ioredis';

const CHUNKS_PER_TURN = 20;
const TURN_EVERY_MS = 250;
const LOCK_MS = 10_000; // a turn takes well under a second; a killed holder delays the next by at most this

type Backfill = { status: 'pending' | 'running' | 'completed'; processed: number; total: number | null; startedAt: string | null; completedAt: string | null };
/** `timerMarks`, then `marks`: the tails of the partitions' timer inboxes, then of their event inboxes (see `backfillTurn`) */
type Cursor = { p: number; after: string | null; timerMarks?: string[]; marks?: string[] };

/** Compares stream ids (`ms-seq`). */
function idAtLeast(a: string, b: string): boolean {
  const [am, as] = a.split('-').map(Number) as [number, number];
  const [bm, bs] = b.split('-').map(Number) as [number, number];
  return am > bm || (am === bm && as >= bs);
}

/** The tail entry id of every partition's stream (`0-0` when empty). */
async function tails(redis: Redis, partitions: number, stream: (p: number) => string): Promise<string[]> {
  const pipeline = redis.pipeline();
  for (let p = 0; p < partitions; p++) pipeline.xrevrange(stream(p), '+', '-', 'COUNT', 1);
  return ((await pipeline.exec()) ?? []).map(([, r]) => ((r as [string, string[]][])[0]?.[0] ?? '0-0'));
}

/** True once every partition's actors have read and acked its stream up to `marks[p]`. */
async function drained(redis: Redis, partitions: number, stream: (p: number) => string, marks: string[]): Promise<boolean> {
  for (let p = 0; p < partitions; p++) {
    const mark = marks[p]!;
    if (mark === '0-0') continue;
    const groups = (await redis.xinfo('GROUPS', stream(p)).catch(() => [])) as unknown[][];
    const group = groups.map((g) => {
      const o: Record<string, unknown> = {};
      for (let i = 0; i < g.length; i += 2) o[String(g[i])] = g[i + 1];
      return o;
    }).find((g) => g.name === ACTOR_GROUP);
    if (!group || !idAtLeast(String(group['last-delivered-id']), mark)) return false;
    const pending = (await redis.xpending(stream(p), ACTOR_GROUP)) as [number, string | null, string | null, unknown];
    if (Number(pending[0]) > 0 && pending[1] && !(idAtLeast(pending[1], mark) && pending[1] !== mark)) return false;
  }
  return true;
}

/**
 * One turn of a segment's backfill: a new segment (or one whose `where` changed) is evaluated for
 * every existing subscriber of its tenant. The job walks each partition's subscriber index in
 * chunks and arms each subscriber's segment timer at 0 (due now), so the scheduler fires it and the
 * subscriber's own actor re-evaluates its segments: membership has one writer. Progress and the
 * cursor are stored on the segment (lua/updateBackfill), so a killed job resumes where it stopped;
 * the backfill is `completed` once the actors have handled every timer it armed.
 */
export async function backfillTurn(ctx: RoleContext, member: string): Promise<'done' | 'more'> {
  const { redis, keys, config } = ctx;
  const [tenantId, workspaceId, segmentId] = member.split('|') as [string, string, string];
  const segmentKey = keys.segment(tenantId, segmentId);
  const [raw, rawCursor] = await redis.hmget(segmentKey, 'backfill', 'backfillCursor');
  if (!raw) {
    await redis.zrem(keys.segmentBackfills, member);
    return 'done';
  }
  let backfill = JSON.parse(raw) as Backfill;
  let cursor: Cursor = rawCursor ? JSON.parse(rawCursor) : { p: 0, after: null };
  if (backfill.status === 'completed') {
    await redis.zrem(keys.segmentBackfills, member);
    return 'done';
  }
  if (backfill.status === 'pending') {
    const pipeline = redis.pipeline();
    for (let p = 0; p < config.partitions; p++) pipeline.zcard(keys.subscriberIndex(p, tenantId));
    const total = ((await pipeline.exec()) ?? []).reduce((sum, [, n]) => sum + Number(n), 0);
    const started: Backfill = { status: 'running', processed: 0, total, startedAt: isoNow(), completedAt: null };
    cursor = { p: 0, after: null };
    if ((await callScript<number>(redis, 'updateBackfill', [segmentKey], ['', JSON.stringify(started), JSON.stringify(cursor)])) !== 1) return 'more';
    backfill = started;
  }
  const token = backfill.startedAt!;
  for (let chunk = 0; chunk < CHUNKS_PER_TURN && cursor.p < config.partitions; chunk++) {
    const p = cursor.p;
    const members = await redis.zrange(keys.subscriberIndex(p, tenantId), cursor.after === null ? '-' : `(${cursor.after}`, '+', 'BYLEX', 'LIMIT', 0, config.segmentBackfillChunk);
    if (members.length) {
      const pipeline = redis.pipeline();
      for (const m of members) pipeline.zadd(keys.timers(p), 0, timerMember('seg', workspaceId, tenantId, SEGMENT_RECHECK_REF, indexedExternalId(m)));
      await pipeline.exec();
    }
    cursor = members.length < config.segmentBackfillChunk ? { p: p + 1, after: null } : { p, after: members[members.length - 1]! };
    // subscribers created during the walk are found too: `total` grows with them, so `processed`
    // never passes it and never drops back when completion sets it to `total` (probe Z: 3,095/3,035, then 3,035)
    const processed = backfill.processed + members.length;
    backfill = { ...backfill, processed, total: Math.max(backfill.total ?? 0, processed) };
    if ((await callScript<number>(redis, 'updateBackfill', [segmentKey], [token, JSON.stringify(backfill), JSON.stringify(cursor)])) !== 1) return 'more';
  }
  if (cursor.p < config.partitions) return 'more';
  // every subscriber is queued: completed once the timers fired and the actors handled them
  const pipeline = redis.pipeline();
  for (let p = 0; p < config.partitions; p++) pipeline.zcount(keys.timers(p), 0, 0);
  if (((await pipeline.exec()) ?? []).some(([, n]) => Number(n) > 0)) return 'more';
  // the fired timers are handled from the timer inboxes, or moved to the event inboxes behind their
  // subscribers' waiting events (actors/timer-order.ts) before being acked: the event inboxes' tails
  // are marked once the timer inboxes are drained, so a moved timer is within the marks
  if (!cursor.timerMarks) {
    cursor = { ...cursor, timerMarks: await tails(redis, config.partitions, (p) => keys.timerInbox(p)) };
    await callScript<number>(redis, 'updateBackfill', [segmentKey], [token, JSON.stringify(backfill), JSON.stringify(cursor)]);
    return 'more';
  }
  if (!cursor.marks) {
    if (!(await drained(redis, config.partitions, (p) => keys.timerInbox(p), cursor.timerMarks))) return 'more';
    cursor = { ...cursor, marks: await tails(redis, config.partitions, (p) => keys.inbox(p)) };
    await callScript<number>(redis, 'updateBackfill', [segmentKey], [token, JSON.stringify(backfill), JSON.stringify(cursor)]);
    return 'more';
  }
  if (!(await drained(redis, config.partitions, (p) => keys.inbox(p), cursor.marks))) return 'more';
  const done: Backfill = { ...backfill, status: 'completed', processed: backfill.total ?? backfill.processed, completedAt: isoNow() };
  await callScript<number>(redis, 'updateBackfill', [segmentKey], [token, JSON.stringify(done), JSON.stringify(cursor)]);
  await redis.zrem(keys.segmentBackfills, member);
  return 'done';
}

/** Runs the pending segment backfills, one process at a time per segment (a short lock). */
export async function startSegmentBackfills(ctx: RoleContext): Promise<Stop> {
  const { redis, keys, log } = ctx;
  let stopped = false;
  let timer: NodeJS.Timeout | null = null;
  let running: Promise<void> = Promise.resolve();
  const turn = async () => {
    const members = await redis.zrange(keys.segmentBackfills, 0, 9);
    for (const member of members) {
      if (stopped) return;
      const lock = keys.lock(`segment-backfill:${member}`);
      if ((await redis.set(lock, String(process.pid), 'PX', LOCK_MS, 'NX')) !== 'OK') continue;
      try {
        await backfillTurn(ctx, member);
      } finally {
        await redis.del(lock);
      }
    }
  };
  const tick = () => {
    if (stopped) return;
    running = turn()
      .catch((err) => log.warn('segment backfill failed', { err: (err as Error).message }))
      .finally(() => {
        if (!stopped) timer = setTimeout(tick, TURN_EVERY_MS);
      });
  };
  tick();
  return async () => {
    stopped = true;
    if (timer) clearTimeout(timer);
    await running;
  };
}
