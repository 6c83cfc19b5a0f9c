import { randomBytes } from 'node:crypto';
import type { Redis } from 'ioredis';
import { isoNow, now } from '../lib/clock.js';
import { ApiError, lockTimeout, notFound } from '../lib/errors.js';
import type { Logger } from '../lib/log.js';
import { partitionOf } from '../lib/partition.js';
import { sweepAgedEntries } from './hash-sweep.js';
import type { Keys } from './keys.js';
import { callScript } from './lua-scripts.js';
import { entriesAfter, type ScoredPosition } from './scored-index.js';
import { changeSubscriber, type Change, type RecordOp, type TenantScope } from './subscriber-writes.js';

/**
 * Topic membership lives in two places: each subscriber's set of topic ids in its partition
 * (`subscriberTopics`, written with the subscriber's `$subscriber.updated` event, atomically) and
 * the topic's member set in the tenant slot (`topicMembers`, for listing and fan-out). No script
 * can touch both (different hash slots), so a call writes the partition first and the tenant set
 * second, then re-reads the partition and repairs the tenant set where a concurrent call moved
 * the membership meanwhile. Both writes are idempotent: retrying a failed call completes it.
 *
 * A process killed between the two writes would leave the copies disagreeing for good (a removed
 * subscriber still listed and pushed by topic sends, an added one missed), and nobody need retry.
 * So the partition write also records, in the same script, a *mirror* entry (`keys.topicMirrors`:
 * "mirror topic T's membership of externalId X"), removed once the member set mirrors the partition;
 * the worker's sweeper (actors/audit-outbox-sweeper.ts, every `AUDIT_OUTBOX_SWEEP_MS`) mirrors the
 * entries older than that interval, whose writer died (`sweepTopicMirrors`).
 */

export type TopicRef = { id: string; slug: string };
export type TopicMember = { externalId: string; joinedAt: string };
/** A place in a member list: the member's score (as Redis prints it) and the member. */
export type MemberPosition = ScoredPosition;
export type MembersAdded = { added: number; alreadyMembers: number; subscribersCreated: number; subscriberCount: number };
export type MembersRemoved = { removed: number; notMembers: number; subscriberCount: number };

/** Subscribers changed in parallel at a time. */
const CHUNK = 50;
/** Bound on repairing one member whose membership keeps moving under a call. */
const REPAIR_ATTEMPTS = 20;

type Outcome = 'changed' | 'created' | 'unchanged' | 'unknown';
type Sync = { externalId: string; join: boolean; score: number };

/**
 * A membership change written in a subscriber's partition whose copy in the topic's member set is
 * still owed: `at` when the change was computed (ms; the sweep leaves younger ones to their writer),
 * `score` the join score the call gives the member.
 */
export type TopicMirror = { at: number; workspaceId: string; tenantId: string; topicId: string; externalId: string; score: number };
/** Where a partition write recorded its mirror entry (field of `keys.topicMirrors(partition)`). */
type MirrorRef = { partition: number; field: string };

function topicSetOf(keys: Keys, scope: TenantScope, externalId: string): string {
  return keys.subscriberTopics(partitionOf(scope.tenantId, externalId, scope.partitions), scope.tenantId, externalId);
}

/**
 * Joins or leaves one subscriber in its partition: adds or removes the topic id in its topic set
 * and writes `$subscriber.updated` with `{ changes: { topics: { added|removed: [slug] } } }`, only
 * when membership actually changes. A join creates an unknown subscriber; a leave never does. A
 * write that changes membership records its mirror entry with it (`mirror`: where; see above).
 */
async function writeMembership(redis: Redis, keys: Keys, scope: TenantScope, topic: TopicRef, externalId: string, join: boolean, score: number): Promise<{ outcome: Outcome; mirror: MirrorRef | null }> {
  try {
    return await changeSubscriber<{ outcome: Outcome; mirror: MirrorRef | null }, boolean>(
      redis, keys, scope, externalId,
      (snapshot, member, at): Change<{ outcome: Outcome; mirror: MirrorRef | null }> => {
        if (!snapshot.exists && !join) return { skip: { outcome: 'unknown', mirror: null } };
        if (member === join) return { skip: { outcome: 'unchanged', mirror: null } };
        const set = keys.subscriberTopics(snapshot.partition, scope.tenantId, externalId);
        const op: RecordOp = join ? ['sadd', set, topic.id] : ['srem', set, topic.id];
        // one field per write (never overwritten, so removing it after the sync cannot remove a concurrent write's)
        const mirror = { partition: snapshot.partition, field: `${scope.tenantId}|${topic.id}|${randomBytes(8).toString('hex')}` };
        const entry: TopicMirror = { at, workspaceId: scope.workspaceId, tenantId: scope.tenantId, topicId: topic.id, externalId, score };
        const data = { changes: { topics: join ? { added: [topic.slug] } : { removed: [topic.slug] } } };
        return {
          create: join, events: [{ name: '$subscriber.updated', data }],
          ops: [op, ['hset', keys.topicMirrors(snapshot.partition), mirror.field, JSON.stringify(entry)]],
          result: { outcome: snapshot.exists ? 'changed' : 'created', mirror },
        };
      },
      async (p) => (await redis.sismember(keys.subscriberTopics(p, scope.tenantId, externalId), topic.id)) === 1,
    );
  } catch (err) {
    // A leave whose subscriber was deleted between the read and the write: it is not a member.
    if (!join && err instanceof ApiError && err.status === 404) return { outcome: 'unknown', mirror: null };
    throw err;
  }
}

/** Forgets mirror entries whose member set now mirrors the partition. */
async function mirrored(redis: Redis, keys: Keys, refs: MirrorRef[]): Promise<void> {
  if (refs.length === 0) return;
  const pipeline = redis.pipeline();
  for (const r of refs) pipeline.hdel(keys.topicMirrors(r.partition), r.field);
  for (const [err] of (await pipeline.exec()) ?? []) if (err) throw err;
}

/** Applies joins and leaves to the topic's member set (lua/syncTopicMembers); 404 once the topic is deleted. */
async function syncMembers(redis: Redis, keys: Keys, tenantId: string, topicId: string, changes: Sync[]): Promise<void> {
  const args: (string | number)[] = [changes.length];
  for (const c of changes) args.push(c.join ? '+' : '-', c.join ? c.score : '', c.externalId);
  const [ok] = await callScript<[number, number?]>(redis, 'syncTopicMembers', [keys.topic(tenantId, topicId), keys.topicMembers(tenantId, topicId)], args);
  if (ok !== 1) throw notFound('Topic');
}

async function memberships(redis: Redis, keys: Keys, scope: TenantScope, topicId: string, externalIds: string[]): Promise<boolean[]> {
  const pipeline = redis.pipeline();
  for (const x of externalIds) pipeline.sismember(topicSetOf(keys, scope, x), topicId);
  return ((await pipeline.exec()) ?? []).map(([err, n]) => {
    if (err) throw err;
    return n === 1;
  });
}

/**
 * Makes the member set agree with the partition for one subscriber whose membership changed
 * under this call: mirror what the partition says, then check it still says so. The last write
 * to the member set always follows the last partition change and mirrors it, so both agree.
 */
async function repair(redis: Redis, keys: Keys, scope: TenantScope, topicId: string, externalId: string, score: number): Promise<void> {
  for (let attempt = 0; attempt < REPAIR_ATTEMPTS; attempt++) {
    const [member] = await memberships(redis, keys, scope, topicId, [externalId]);
    await syncMembers(redis, keys, scope.tenantId, topicId, [{ externalId, join: member!, score }]);
    const [still] = await memberships(redis, keys, scope, topicId, [externalId]);
    if (still === member) return;
  }
  throw lockTimeout('The membership of a subscriber');
}

/**
 * Makes the member sets of `topicIds` agree with `externalId`'s partition (the tenant-wide half of
 * a subscriber delete, streams/subscriber-cleanup.ts, and of a membership write whose writer died,
 * `sweepTopicMirrors`): an entry goes unless the subscriber now in the partition (created again
 * under the same externalId since) is a member, an entry missing for a member is added with `score`
 * (its join score; default now), then, as `repair` does, a member whose partition changed under the
 * call is mirrored again. A deleted topic has no member set left to clean: its id leaves the
 * subscriber's set instead. Idempotent.
 */
export async function mirrorMemberships(redis: Redis, keys: Keys, scope: TenantScope, externalId: string, topicIds: string[], score = now() * 1000): Promise<void> {
  // a chunk at a time: a subscriber in 50,000 topics made 50,000 script calls at once, the process
  // holding them all (RSS 106 -> 386 MB) and the web role's other requests waiting 2 s (probe T)
  for (let i = 0; i < topicIds.length; i += MIRROR_CHUNK) await mirrorChunk(redis, keys, scope, externalId, topicIds.slice(i, i + MIRROR_CHUNK), score);
}

/** Topics `mirrorMemberships` works through at once. */
const MIRROR_CHUNK = 500;

async function mirrorChunk(redis: Redis, keys: Keys, scope: TenantScope, externalId: string, topicIds: string[], score: number): Promise<void> {
  if (topicIds.length === 0) return;
  const set = topicSetOf(keys, scope, externalId);
  const deleted = new Set<string>();
  const gone = (id: string) => (err: unknown) => {
    if (!(err instanceof ApiError && err.status === 404)) throw err;
    deleted.add(id);
  };
  const member = await redis.smismember(set, ...topicIds);
  await Promise.all(topicIds.map((id, i) => syncMembers(redis, keys, scope.tenantId, id, [{ externalId, join: member[i] === 1, score }]).catch(gone(id))));
  const still = await redis.smismember(set, ...topicIds);
  for (const [i, id] of topicIds.entries()) {
    if (still[i] !== member[i] && !deleted.has(id)) await repair(redis, keys, scope, id, externalId, score).catch(gone(id));
  }
  // A deleted topic's id leaves the subscriber's own set, as `sweepDeletedTopics` takes it from the
  // members the delete listed: a join written after the delete took the member set away (the call
  // answered 404) was in no list, and stayed for good (probe BE). Topic ids are never reused.
  if (deleted.size > 0) await redis.srem(set, ...deleted);
}

async function apply(redis: Redis, keys: Keys, scope: TenantScope, topic: TopicRef, externalIds: string[], join: boolean) {
  // A repeated externalId counts once, at its first position; the score keeps one call's members distinct and ordered.
  const position = new Map<string, number>();
  externalIds.forEach((x, i) => position.has(x) || position.set(x, i));
  const unique = [...position.keys()];
  const joinMs = now();
  const scoreOf = (x: string) => joinMs * 1000 + position.get(x)!;
  const counts: Record<Outcome, number> = { changed: 0, created: 0, unchanged: 0, unknown: 0 };
  for (let i = 0; i < unique.length; i += CHUNK) {
    const chunk = unique.slice(i, i + CHUNK);
    // every write of the chunk is waited for: one refused (503 over INBOX_MAX_BACKLOG) must not leave
    // the others' member set copies unwritten until the sweeper comes (probe EC: topic sends missed
    // them); the chunk is mirrored as it stands (a refused member is repaired out), then the refusal thrown
    const settled = await Promise.allSettled(chunk.map((x) => writeMembership(redis, keys, scope, topic, x, join, scoreOf(x))));
    const written = settled.flatMap((r) => (r.status === 'fulfilled' ? [r.value] : []));
    for (const w of written) counts[w.outcome]++;
    await syncMembers(redis, keys, scope.tenantId, topic.id, chunk.map((x) => ({ externalId: x, join, score: scoreOf(x) })));
    const state = await memberships(redis, keys, scope, topic.id, chunk);
    for (const [j, x] of chunk.entries()) {
      if (state[j] !== join) await repair(redis, keys, scope, topic.id, x, scoreOf(x));
    }
    // the member set mirrors these writes now; a process killed before this line (or a failure of
    // this cleanup, which must not fail a call whose changes are made) leaves them to the sweeper
    await mirrored(redis, keys, written.flatMap((w) => (w.mirror ? [w.mirror] : []))).catch(() => undefined);
    const refused = settled.find((r): r is PromiseRejectedResult => r.status === 'rejected');
    if (refused) throw refused.reason;
  }
  return { counts, subscriberCount: await redis.zcard(keys.topicMembers(scope.tenantId, topic.id)) };
}

/** Most mirror entries handled per partition and sweep; the rest wait for the next sweep. */
const MIRRORS_PER_PARTITION = 1_000;

/**
 * Mirrors the membership changes whose writer died between the partition write and the member set
 * (their mirror entries older than `minAgeMs`, which a live writer has long removed): the member
 * set is made to agree with what the partition says now (`mirrorMemberships`, with the call's join
 * score), then the entry goes. One that fails is kept for the next sweep and reported. Idempotent:
 * a live writer and a sweep may both mirror one change.
 */
export async function sweepTopicMirrors(redis: Redis, keys: Keys, partitions: number, minAgeMs: number, log: Logger): Promise<{ mirrored: number; kept: number }> {
  const hashes = Array.from({ length: partitions }, (_, p) => keys.topicMirrors(p));
  const { finished, kept } = await sweepAgedEntries<TopicMirror>(redis, hashes, MIRRORS_PER_PARTITION, minAgeMs, log, 'topic membership mirror', async (m, key, field) => {
    await mirrorMemberships(redis, keys, { workspaceId: m.workspaceId, tenantId: m.tenantId, partitions }, m.externalId, [m.topicId], m.score);
    await redis.hdel(key, field);
  });
  return { mirrored: finished, kept };
}

/** Members whose topic sets one sweep takes a deleted topic's id out of, over all tenants; the rest wait for the next sweep. */
const DELETED_TOPIC_MEMBERS_PER_SWEEP = 50_000;
/** Members read and visited per round trip. */
const DELETED_TOPIC_PAGE = 1_000;
/** Deleted topics of one tenant looked at per sweep. */
const DELETED_TOPICS_PER_TENANT = 100;
/** Tenants asked for their deleted topics per round trip. */
const TENANTS_PER_PIPELINE = 500;

/**
 * Takes each deleted topic's id out of its former members' own topic sets (lua/deleteTopic renamed
 * its member set to `deletedTopicMembers` and listed it in the tenant's `deletedTopics`): a page of
 * members at a time, the id removed from each one's set in its partition, then the page from the
 * gone-members set; once that is empty the topic leaves the list. Run by the worker's sweeper
 * (actors/audit-outbox-sweeper.ts), at most DELETED_TOPIC_MEMBERS_PER_SWEEP members a sweep. Idempotent:
 * a sweep killed midway repeats a page. Until session 52 the ids stayed for good (probe AR).
 */
export async function sweepDeletedTopics(redis: Redis, keys: Keys, tenants: { tenantId: string }[], partitions: number): Promise<{ visited: number; finished: number }> {
  let budget = DELETED_TOPIC_MEMBERS_PER_SWEEP;
  let visited = 0;
  let finished = 0;
  for (let i = 0; i < tenants.length && budget > 0; i += TENANTS_PER_PIPELINE) {
    const chunk = tenants.slice(i, i + TENANTS_PER_PIPELINE);
    const replies = (await redis.pipeline(chunk.map(({ tenantId }) => ['srandmember', keys.deletedTopics(tenantId), DELETED_TOPICS_PER_TENANT])).exec()) ?? [];
    for (const [k, { tenantId }] of chunk.entries()) {
      const [err, ids] = replies[k] ?? [];
      if (err) throw err;
      for (const topicId of (ids as string[] | undefined) ?? []) {
        if (budget <= 0) break;
        const gone = keys.deletedTopicMembers(tenantId, topicId);
        for (let page = 0; budget > 0 && page < DELETED_TOPIC_MEMBERS_PER_SWEEP / DELETED_TOPIC_PAGE; page++) {
          const members = await redis.zrange(gone, 0, DELETED_TOPIC_PAGE - 1);
          if (members.length === 0) {
            await redis.srem(keys.deletedTopics(tenantId), topicId);
            finished++;
            break;
          }
          const visit = redis.pipeline();
          for (const x of members) visit.srem(keys.subscriberTopics(partitionOf(tenantId, x, partitions), tenantId, x), topicId);
          visit.zrem(gone, ...members); // after every member's set: a sweep killed before it visits them again
          for (const [e] of (await visit.exec()) ?? []) if (e) throw e;
          visited += members.length;
          budget -= members.length;
        }
      }
    }
  }
  return { visited, finished };
}

/**
 * Adds subscribers to a topic (creating unknown ones with `$subscriber.created`). Each one that
 * was not a member gets `$subscriber.updated` on its stream; a member already is left alone and
 * keeps its first join time. Throws 404 when the topic is deleted meanwhile.
 */
export async function addTopicMembers(redis: Redis, keys: Keys, scope: TenantScope, topic: TopicRef, externalIds: string[]): Promise<MembersAdded> {
  const { counts, subscriberCount } = await apply(redis, keys, scope, topic, externalIds, true);
  return { added: counts.changed + counts.created, alreadyMembers: counts.unchanged, subscribersCreated: counts.created, subscriberCount };
}

/** Removes subscribers from a topic; each real member gets `$subscriber.updated`. Unknown subscribers are not created. */
export async function removeTopicMembers(redis: Redis, keys: Keys, scope: TenantScope, topic: TopicRef, externalIds: string[]): Promise<MembersRemoved> {
  const { counts, subscriberCount } = await apply(redis, keys, scope, topic, externalIds, false);
  return { removed: counts.changed, notMembers: counts.unchanged + counts.unknown, subscriberCount };
}

/** One page of a topic's members, newest joined first, with `total` (the member count). */
export async function topicMemberPage(redis: Redis, keys: Keys, tenantId: string, topicId: string, limit: number, after: MemberPosition | null): Promise<{ items: TopicMember[]; next: MemberPosition | null; total: number }> {
  const key = keys.topicMembers(tenantId, topicId);
  const [entries, total] = await Promise.all([entriesAfter(redis, key, after, limit + 1), redis.zcard(key)]);
  const page = entries.slice(0, limit);
  const last = page[page.length - 1];
  return {
    items: page.map(([externalId, score]) => ({ externalId, joinedAt: isoNow(Math.floor(Number(score) / 1000)) })),
    next: entries.length > limit && last ? { member: last[0], score: last[1] } : null,
    total,
  };
}

/**
 * Streams a topic's externalIds in chunks of at most `chunk`, newest joined first, never holding
 * the whole set (for the messages fan-out). Members joining during the walk may be missed and
 * members leaving may still be yielded; each member is yielded at most once.
 */
export async function* topicMembers(redis: Redis, keys: Keys, tenantId: string, topicId: string, chunk = 1000): AsyncGenerator<string[], void, undefined> {
  const key = keys.topicMembers(tenantId, topicId);
  let after: MemberPosition | null = null;
  for (;;) {
    const entries = await entriesAfter(redis, key, after, chunk);
    if (entries.length) yield entries.map(([m]) => m);
    if (entries.length < chunk) return;
    const [member, score] = entries[entries.length - 1]!;
    after = { member, score };
  }
}

/**
 * The topics a subscriber belongs to, by slug. Its topic set may still hold ids of deleted topics
 * (until the sweeper visits it, `sweepDeletedTopics`); those are ignored here, as every reader must.
 */
export async function topicsOfSubscriber(redis: Redis, keys: Keys, scope: TenantScope, externalId: string): Promise<TopicRef[]> {
  const ids = await redis.smembers(topicSetOf(keys, scope, externalId));
  if (ids.length === 0) return [];
  const pipeline = redis.pipeline();
  for (const id of ids) pipeline.hget(keys.topic(scope.tenantId, id), 'slug');
  const slugs = (await pipeline.exec()) ?? [];
  return ids
    .map((id, i) => ({ id, slug: slugs[i]?.[1] as string | null }))
    .filter((t): t is TopicRef => typeof t.slug === 'string')
    .sort((a, b) => (a.slug < b.slug ? -1 : a.slug > b.slug ? 1 : 0));
}

/** Topic ids of the tenant's index read at a time by `subscriberTopicPage`. */
const TOPIC_SCAN_CHUNK = 200;
/** Most topic ids one `subscriberTopicPage` call reads: a page may hold fewer than asked, with `hasMore`. */
export const TOPIC_SCAN_BUDGET = 2_000;

/**
 * One page of the topics a subscriber belongs to, newest topic first (the tenant's topic index order,
 * as `GET /v1/topics`), with `total`. A subscriber's topics are not bounded, so its topic set is not
 * read whole: the tenant's topic index is walked from `after` (a topic id, exclusive) and each chunk
 * tested against the set (SMISMEMBER), reading at most TOPIC_SCAN_BUDGET ids a call; a page that
 * ran out of that budget holds what it found (maybe nothing) and `next` where to go on. `total`
 * is the set's size less the ids of deleted topics it still names (until the sweeper visits it).
 */
export async function subscriberTopicPage(redis: Redis, keys: Keys, scope: TenantScope, externalId: string, limit: number, after: string | null): Promise<{ ids: string[]; next: string | null; total: number }> {
  const set = topicSetOf(keys, scope, externalId);
  const index = keys.topicIndex(scope.tenantId);
  const [size, gone] = await Promise.all([redis.scard(set), redis.smembers(keys.deletedTopics(scope.tenantId))]);
  const stale = gone.length && size ? (await redis.smismember(set, ...gone)).filter(Boolean).length : 0;
  const total = Math.max(0, size - stale);
  const ids: string[] = [];
  let from = after;
  for (let read = 0; size > 0 && read < TOPIC_SCAN_BUDGET;) {
    const chunk = await redis.zrange(index, from === null ? '+' : `(${from}`, '-', 'BYLEX', 'REV', 'LIMIT', 0, TOPIC_SCAN_CHUNK);
    if (chunk.length === 0) return { ids, next: null, total };
    const member = await redis.smismember(set, ...chunk);
    for (let i = 0; i < chunk.length; i++) {
      if (!member[i]) continue;
      // one more than the page: there is a next page, which starts after the page's last
      if (ids.length === limit) return { ids, next: ids[ids.length - 1]!, total };
      ids.push(chunk[i]!);
    }
    read += chunk.length;
    from = chunk[chunk.length - 1]!;
    if (chunk.length < TOPIC_SCAN_CHUNK) return { ids, next: null, total };
  }
  // the budget ran out with more of the index to read (or the set is empty: nothing to find)
  return { ids, next: size > 0 ? from : null, total };
}
