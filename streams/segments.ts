import type { Redis } from 'ioredis';
import { MAX_SEGMENTS, needsOf } from './automation-definitions.js';
import { isoNow, now } from '../lib/clock.js';
import { ApiError, notFound } from '../lib/errors.js';
import type { Expression } from '../lib/expressions.js';
import { newId } from '../lib/ids.js';
import { isSlug } from '../lib/slugs.js';
import type { Writer } from './identity.js';
import type { Keys } from './keys.js';
import { auditIntent, settleAudit, writeScope, type AuditDraft } from './audit-outbox.js';
import { diff, type Ref } from './ledger.js';
import { callScript } from './lua-scripts.js';
import { recordOf } from '../lib/field-list.js';
import { loadSubscribers, type Subscriber } from './subscribers.js';
import { indexedExternalId } from './subscriber-list.js';

/** Progress of the pass that computes a segment's membership over the existing subscribers. */
export type Backfill = { status: 'pending' | 'running' | 'completed'; processed: number; total: number | null; startedAt: string | null; completedAt: string | null };

/**
 * A segment: a saved expression over a tenant's subscribers, addressed by its slug. Membership is
 * kept by the workers (per-partition member sets), not computed when read.
 */
export type Segment = {
  id: string;
  slug: string;
  name: string | null;
  description: string | null;
  where: Expression;
  /** members now: the sum of the partitions' member-set sizes */
  memberCount: number;
  backfill: Backfill;
  createdAt: string;
  updatedAt: string;
};

/** The tenant a segment write works in, the refs its audit entries carry, and the partition count. */
export type SegmentScope = { workspace: Ref; tenant: Ref; partitions: number };
/** What names a segment's place in the global backfill queue. */
export type BackfillScope = { workspace: { id: string }; tenant: { id: string } };
export type SegmentInput = { slug: string; name?: string | null; description?: string | null; where: Expression };
export type SegmentPatch = { name?: string | null; description?: string | null; where?: Expression };

/** What a create, or a change of `where`, sets the backfill to; a job runner takes it from there. */
export const PENDING: Backfill = { status: 'pending', processed: 0, total: null, startedAt: null, completedAt: null };

function toSegment(h: Record<string, string>, memberCount: number): Segment {
  return {
    id: h.id!,
    slug: h.slug!,
    name: h.name || null,
    description: h.description || null,
    where: JSON.parse(h.where!) as Expression,
    memberCount,
    backfill: h.backfill ? (JSON.parse(h.backfill) as Backfill) : { ...PENDING },
    createdAt: h.createdAt!,
    updatedAt: h.updatedAt!,
  };
}

const editable = (s: Segment) => ({ name: s.name, description: s.description, where: s.where });

/** The member of the global backfill queue naming one segment. */
export function backfillMember(scope: BackfillScope, segmentId: string): string {
  return `${scope.tenant.id}|${scope.workspace.id}|${segmentId}`;
}

/**
 * Queues the backfill of each segment (the runner of actors/segment-backfill.ts takes it from there);
 * false when Redis did not take it. Never rejects: it follows a write already made (the segments'
 * backfill set pending and the tenant's automation version bumped in the write's script), which is
 * answered as made, and a worker loading the tenant's definitions (at its next event) queues every
 * pending backfill again (`pendingBackfills`). Until session 48 a failure here (Redis out of memory)
 * answered a topic delete or a segment write that had been made 503, and the retry 404 or 409 (probe O).
 */
export async function queueBackfills(redis: Redis, keys: Keys, scope: BackfillScope, segmentIds: string[]): Promise<boolean> {
  if (segmentIds.length === 0) return true;
  return redis.zadd(keys.segmentBackfills, ...segmentIds.flatMap((id) => [0, backfillMember(scope, id)])).then(() => true, () => false);
}

/** The writes whose script makes backfills pending: an intent of one left in the outbox may leave them unqueued. */
export const BACKFILL_AUDIT_OPS: ReadonlySet<string> = new Set(['segment.create', 'segment.update', 'topic.delete']);

/**
 * Queues every backfill of the tenant that is `pending` (at most MAX_SEGMENTS segments read); false
 * when Redis did not take it. The audit outbox sweeper calls it for an intent of BACKFILL_AUDIT_OPS
 * its writer left (a writer whose queueing failed leaves the intent for this), so a tenant that sends
 * no event still gets its backfill run.
 */
export async function queuePendingBackfills(redis: Redis, keys: Keys, scope: BackfillScope): Promise<boolean> {
  const tenantId = scope.tenant.id;
  const ids = await redis.zrange(keys.segmentIndex(tenantId), 0, MAX_SEGMENTS - 1);
  if (ids.length === 0) return true;
  const pipeline = redis.pipeline();
  for (const id of ids) pipeline.hget(keys.segment(tenantId, id), 'backfill');
  const backfills = ((await pipeline.exec()) ?? []).map(([, b]) => b as string | null);
  const pending = ids.filter((_, i) => backfills[i] && (JSON.parse(backfills[i]!) as Backfill).status === 'pending');
  return queueBackfills(redis, keys, scope, pending);
}

/** Ids of the tenant's segments whose rule names topic `slug` (a tenant has at most MAX_SEGMENTS). */
export async function segmentsNamingTopic(redis: Redis, keys: Keys, tenantId: string, slug: string): Promise<string[]> {
  const ids = await redis.zrange(keys.segmentIndex(tenantId), 0, MAX_SEGMENTS - 1);
  if (ids.length === 0) return [];
  const pipeline = redis.pipeline();
  for (const id of ids) pipeline.hget(keys.segment(tenantId, id), 'where');
  const wheres = ((await pipeline.exec()) ?? []).map(([, w]) => w as string | null);
  return ids.filter((_, i) => wheres[i] && needsOf([JSON.parse(wheres[i]!) as Expression]).topicSlugs.includes(slug));
}

/** Queues on `pipeline` the ZCARD of each partition's member set of a segment. */
function countMembers(pipeline: ReturnType<Redis['pipeline']>, keys: Keys, tenantId: string, partitions: number, id: string): void {
  for (let p = 0; p < partitions; p++) pipeline.zcard(keys.segmentMembers(p, tenantId, id));
}

async function memberCount(redis: Redis, keys: Keys, tenantId: string, partitions: number, id: string): Promise<number> {
  const pipeline = redis.pipeline();
  countMembers(pipeline, keys, tenantId, partitions, id);
  return ((await pipeline.exec()) ?? []).reduce((sum, [err, n]) => {
    if (err) throw err;
    return sum + Number(n);
  }, 0);
}

/** Loads segments by id in one round trip (record and member counts); null for an id whose segment no longer exists. */
export async function loadSegments(redis: Redis, keys: Keys, tenantId: string, partitions: number, ids: string[]): Promise<(Segment | null)[]> {
  if (ids.length === 0) return [];
  const pipeline = redis.pipeline();
  for (const id of ids) {
    pipeline.hgetall(keys.segment(tenantId, id));
    countMembers(pipeline, keys, tenantId, partitions, id);
  }
  const replies = (await pipeline.exec()) ?? [];
  for (const [err] of replies) if (err) throw err;
  const stride = partitions + 1;
  return ids.map((_, i) => {
    const h = replies[i * stride]![1] as Record<string, string>;
    if (!h.id) return null;
    let count = 0;
    for (let p = 1; p <= partitions; p++) count += Number(replies[i * stride + p]![1]);
    return toSegment(h, count);
  });
}

/** Reads a segment by slug, or null (a malformed slug is null too: it cannot exist). */
export async function findSegment(redis: Redis, keys: Keys, tenantId: string, partitions: number, slug: string): Promise<Segment | null> {
  if (!isSlug(slug)) return null;
  const id = await redis.hget(keys.segmentSlugs(tenantId), slug);
  return id ? ((await loadSegments(redis, keys, tenantId, partitions, [id]))[0] ?? null) : null;
}

/**
 * Creates a segment with its backfill pending, and queues the backfill; 409 `conflict` when the
 * tenant already has a segment with this slug. Audited as `segment.created` (through the tenant's
 * audit outbox, streams/audit-outbox.ts).
 */
export async function createSegment(redis: Redis, keys: Keys, scope: SegmentScope, input: SegmentInput, by: Writer): Promise<Segment> {
  const tenantId = scope.tenant.id;
  const ms = now();
  const id = newId('segment', ms);
  const at = isoNow(ms);
  const segment: Segment = {
    id, slug: input.slug, name: input.name ?? null, description: input.description ?? null, where: input.where,
    memberCount: 0, backfill: { ...PENDING }, createdAt: at, updatedAt: at,
  };
  const intent = auditIntent(keys.tenantOutbox(tenantId), 'segment.create', writeScope(scope, by), segment);
  const reply = await callScript<CreateReply>(
    redis, 'createSegment',
    [keys.segmentSlugs(tenantId), keys.segmentIndex(tenantId), keys.segment(tenantId, id), keys.automationVersion(tenantId), intent.key],
    [id, input.slug, input.name ?? '', input.description ?? '', JSON.stringify(input.where), JSON.stringify(PENDING), at, MAX_SEGMENTS, intent.token, intent.json],
  );
  if (reply[0] === -1) throw new ApiError(400, 'bad_request', `A tenant has at most ${MAX_SEGMENTS} segments; delete one first`);
  if (reply[0] !== 1) throw new ApiError(409, 'conflict', `A segment with slug "${input.slug}" already exists`, { param: 'slug' });
  // a backfill not queued leaves the intent to the sweeper, which queues it (queuePendingBackfills)
  if (await queueBackfills(redis, keys, scope, [id])) await settleAudit(redis, keys, intent, SEGMENT_AUDITS['segment.create'](segment, reply));
  return segment;
}

/**
 * Changes a segment's name, description or rule (null clears name and description). A new rule
 * restarts the backfill. Audited as `segment.updated` with `changes` and `previousAttributes` only
 * when a value actually changed. 404 for an unknown slug. `memberCount` (of the answer and the
 * entry) is the one read just before the change: the members live in the partitions' slots, which
 * the script cannot read, and the entry is made from what the script answers.
 */
export async function updateSegment(redis: Redis, keys: Keys, scope: SegmentScope, slug: string, patch: SegmentPatch, by: Writer): Promise<Segment> {
  const tenantId = scope.tenant.id;
  const current = await findSegment(redis, keys, tenantId, scope.partitions, slug);
  if (!current) throw notFound('Segment');
  const intent = auditIntent(keys.tenantOutbox(tenantId), 'segment.update', writeScope(scope, by), current.memberCount);
  const args: string[] = [isoNow(), JSON.stringify(PENDING), intent.token, intent.json];
  const fields: [string, string][] = [];
  if (patch.name !== undefined) fields.push(['name', patch.name ?? '']);
  if (patch.description !== undefined) fields.push(['description', patch.description ?? '']);
  // compared in the script (the same rule spelled with other key order is no change there)
  if (patch.where !== undefined) fields.push(['where', JSON.stringify(patch.where)]);
  args.push(String(fields.length), ...fields.flat());
  const reply = await callScript<UpdateReply>(redis, 'updateSegment', [keys.segment(tenantId, current.id), keys.automationVersion(tenantId), intent.key], args);
  if (reply[0] !== 1) throw notFound('Segment');
  const queued = reply[3] !== 1 || await queueBackfills(redis, keys, scope, [current.id]);
  const drafts = SEGMENT_AUDITS['segment.update'](current.memberCount, reply);
  if (drafts.length && queued) await settleAudit(redis, keys, intent, drafts);
  return toSegment(recordOf(reply[2]!), current.memberCount);
}

/**
 * Deletes a segment: record, slug, index entry, backfill queue entry and every partition's member
 * set (`dropSegmentMembers`). Members get no stream event; the id leaves their automation state's
 * `segs` by the sweeper (`sweepDeletedSegments`), and until then readers drop ids of segments that
 * no longer exist. Returns the segment as it was (its `memberCount` read just before the delete),
 * audited as `segment.deleted`; 404 for an unknown slug.
 */
export async function deleteSegment(redis: Redis, keys: Keys, scope: SegmentScope, slug: string, by: Writer): Promise<Segment> {
  const tenantId = scope.tenant.id;
  const id = isSlug(slug) ? await redis.hget(keys.segmentSlugs(tenantId), slug) : null;
  if (!id) throw notFound('Segment');
  // the members live in other slots: counted before, for the answer and the audit entry
  const count = await memberCount(redis, keys, tenantId, scope.partitions, id);
  const intent = auditIntent(keys.tenantOutbox(tenantId), 'segment.delete', writeScope(scope, by), count);
  const reply = await callScript<DeleteReply>(
    redis, 'deleteSegment',
    [keys.segmentSlugs(tenantId), keys.segmentIndex(tenantId), keys.segment(tenantId, id), keys.automationVersion(tenantId), intent.key],
    [id, intent.token, intent.json],
  );
  if (reply[0] !== 1) throw notFound('Segment');
  // other slots: the global backfill queue and each partition's members; a process killed before
  // the intent is settled leaves them to the audit outbox sweeper (DELETE_AUDIT_OPS)
  await Promise.all([redis.zrem(keys.segmentBackfills, backfillMember(scope, id)), dropSegmentMembers(redis, keys, tenantId, id, scope.partitions)]);
  await settleAudit(redis, keys, intent, SEGMENT_AUDITS['segment.delete'](count, reply));
  return toSegment(recordOf(reply[1]!), count);
}

/**
 * How long a partition remembers a deleted segment (`deletedSegments`): far longer than a worker
 * batch runs, from loading the definitions (read at the tenant's automation version, per batch) to
 * its commit (a worker that stalls loses its lease and commits nothing), so no commit computed
 * before a delete adds members after it. Every delete lists the segment in every partition, with
 * members or not: kept a day, 11.6 KB of Redis per delete stayed that long (probe EI: 96 deletes a
 * second held 3.5 MB after 300).
 */
export const DELETED_SEGMENT_KEEP_MS = 600_000;

/**
 * The partition half of a segment delete, in every partition (lua/dropSegmentMembers): the segment
 * is listed as deleted there, so a worker that loaded the definitions before the delete and
 * commits after it adds no member and no `segs` id of it (probe EF: a delete during a backfill, or
 * while events made subscribers join, left member sets behind, for good for idle subscribers), and
 * the member set moves to the gone-members set that `sweepDeletedSegments` visits. Idempotent.
 */
export async function dropSegmentMembers(redis: Redis, keys: Keys, tenantId: string, segmentId: string, partitions: number): Promise<void> {
  const pipeline = redis.pipeline();
  const at = now();
  for (let p = 0; p < partitions; p++) {
    callScript(pipeline, 'dropSegmentMembers',
      [keys.segmentMembers(p, tenantId, segmentId), keys.deletedSegments(p), keys.deletedSegmentMembers(p, tenantId, segmentId), keys.deletedSegmentVisits(p)],
      [`${tenantId}|${segmentId}`, at]);
  }
  for (const [err] of (await pipeline.exec()) ?? []) if (err) throw err;
}

/** The writes whose partition half the audit outbox sweeper makes again when their writer left the intent. */
export const DELETE_AUDIT_OPS: ReadonlySet<string> = new Set(['segment.delete']);

/** The segment id of a `segment.delete` intent's script reply (null when it deleted nothing). */
export function deletedSegmentOf(reply: unknown): string | null {
  const r = reply as DeleteReply | null;
  return r && r[0] === 1 && r[1] ? (recordOf(r[1]).id ?? null) : null;
}

/** Former members whose `segs` one sweep visits, over all partitions; the rest wait for the next sweep. */
const DELETED_SEGMENT_MEMBERS_PER_SWEEP = 50_000;
/** Members visited per script call. */
const DELETED_SEGMENT_PAGE = 1_000;
/** Deleted segments of one partition looked at per sweep. */
const DELETED_SEGMENTS_PER_PARTITION = 100;

/**
 * Takes each deleted segment's id out of its former members' `segs` (lua/dropSegmentMembers moved
 * the member set to the gone-members set and listed it to visit): a page at a time, in one script
 * per page (lua/forgetSegmentMembers), until the set is empty; and forgets the partitions' deleted
 * segments older than DELETED_SEGMENT_KEEP_MS. Run by the worker's sweeper
 * (actors/audit-outbox-sweeper.ts), at most DELETED_SEGMENT_MEMBERS_PER_SWEEP members a sweep
 * (probe EF: an id stayed until its subscriber was evaluated again, for an idle one for good).
 */
export async function sweepDeletedSegments(redis: Redis, keys: Keys, partitions: number): Promise<{ visited: number; finished: number }> {
  let budget = DELETED_SEGMENT_MEMBERS_PER_SWEEP;
  let visited = 0;
  let finished = 0;
  for (let p = 0; p < partitions; p++) {
    await redis.zremrangebyscore(keys.deletedSegments(p), '-inf', now() - DELETED_SEGMENT_KEEP_MS);
    if (budget <= 0) continue;
    for (const entry of await redis.srandmember(keys.deletedSegmentVisits(p), DELETED_SEGMENTS_PER_PARTITION)) {
      const [tenantId, segmentId] = entry.split('|') as [string, string];
      for (let page = 0; budget > 0 && page < DELETED_SEGMENT_MEMBERS_PER_SWEEP / DELETED_SEGMENT_PAGE; page++) {
        const [n, left] = await callScript<[number, number]>(redis, 'forgetSegmentMembers',
          [keys.deletedSegmentMembers(p, tenantId, segmentId), keys.deletedSegmentVisits(p)],
          [keys.partitionBase(p), tenantId, segmentId, DELETED_SEGMENT_PAGE]);
        visited += n;
        budget -= n;
        if (left === 0) {
          finished++;
          break;
        }
      }
      if (budget <= 0) break;
    }
  }
  return { visited, finished };
}

type CreateReply = [number, string?];
type UpdateReply = [number, string[]?, string[]?, number?];
type DeleteReply = [number, string[]?];

/**
 * The audit entries of segment writes, from their scripts' replies (streams/audit-outbox.ts). The
 * member count comes with the input: the writer reads it before the write (other slots).
 */
export const SEGMENT_AUDITS = {
  'segment.create': (segment: Segment, reply: CreateReply): AuditDraft[] =>
    reply[0] === 1 ? [{ type: 'segment.created', target: { type: 'segment', id: segment.id }, object: { ...segment } }] : [],
  'segment.update': (memberCount: number, reply: UpdateReply): AuditDraft[] => {
    if (reply[0] !== 1) return [];
    const before = toSegment(recordOf(reply[1]!), memberCount);
    const after = toSegment(recordOf(reply[2]!), memberCount);
    const changed = diff(editable(before), editable(after));
    return changed ? [{ type: 'segment.updated', target: { type: 'segment', id: after.id }, object: { ...after }, ...changed }] : [];
  },
  'segment.delete': (memberCount: number, reply: DeleteReply): AuditDraft[] => {
    if (reply[0] !== 1) return [];
    const segment = toSegment(recordOf(reply[1]!), memberCount);
    return [{ type: 'segment.deleted', target: { type: 'segment', id: segment.id }, object: { ...segment } }];
  },
};

/**
 * One page of a segment's members, newest subscriber first across all partitions (members are
 * `<sub_ id>|<externalId>`, `indexMember`, as in the subscriber index): each partition's member set
 * is read from before `after` down (`limit + 1` of them), merged, and cut. `total` is the member
 * count; `next` the last member of the page when there are more. Members whose subscriber no
 * longer exists are left out of the page.
 */
export async function segmentMemberPage(
  redis: Redis, keys: Keys, scope: SegmentScope, segmentId: string, limit: number, after: string | null,
): Promise<{ items: Subscriber[]; next: string | null; total: number }> {
  const tenantId = scope.tenant.id;
  const max = after === null ? '+' : `(${after}`;
  const pipeline = redis.pipeline();
  for (let p = 0; p < scope.partitions; p++) {
    pipeline.zrange(keys.segmentMembers(p, tenantId, segmentId), max, '-', 'BYLEX', 'REV', 'LIMIT', 0, limit + 1);
    pipeline.zcard(keys.segmentMembers(p, tenantId, segmentId));
  }
  const replies = (await pipeline.exec()) ?? [];
  const candidates: string[] = [];
  let total = 0;
  for (let p = 0; p < scope.partitions; p++) {
    const [err, members] = replies[2 * p]!;
    if (err) throw err;
    candidates.push(...(members as string[]));
    total += Number(replies[2 * p + 1]![1]);
  }
  // Redis orders members by their bytes; so must the merge (ids are ASCII, externalIds need not be)
  candidates.sort((a, b) => Buffer.compare(Buffer.from(b), Buffer.from(a)));
  const page = candidates.slice(0, limit);
  const items = (await loadSubscribers(redis, keys, { workspaceId: scope.workspace.id, tenantId, partitions: scope.partitions }, page.map(indexedExternalId))).filter((s): s is Subscriber => s !== null);
  return { items, next: candidates.length > limit ? page[page.length - 1]! : null, total };
}
