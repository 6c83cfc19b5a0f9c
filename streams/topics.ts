import type { Redis } from 'ioredis';
import { isoNow, now } from '../lib/clock.js';
import { ApiError, notFound } from '../lib/errors.js';
import { isId, newId } from '../lib/ids.js';
import { isSlug } from '../lib/slugs.js';
import type { Writer } from './identity.js';
import type { Keys } from './keys.js';
import { auditIntent, settleAudit, writeScope, type AuditDraft } from './audit-outbox.js';
import { diff, type Ref } from './ledger.js';
import { callScript } from './lua-scripts.js';
import { recordOf } from '../lib/field-list.js';
import { PENDING, queueBackfills, segmentsNamingTopic } from './segments.js';

/** A topic: a named set of subscribers of one tenant, addressed by its slug. */
export type Topic = {
  id: string;
  slug: string;
  name: string | null;
  description: string | null;
  /** members now (ZCARD of the member set) */
  subscriberCount: number;
  createdAt: string;
  updatedAt: string;
};

/** The tenant a topic write works in, and the refs its audit entries carry. */
export type TopicScope = { workspace: Ref; tenant: Ref };
export type TopicInput = { slug: string; name?: string | null; description?: string | null };
export type TopicPatch = { name?: string | null; description?: string | null };

/** Fields a PATCH may change; the slug is immutable (it is the topic's address). */
const EDITABLE = ['name', 'description'] as const;

function toTopic(h: Record<string, string>, subscriberCount: number): Topic {
  return {
    id: h.id!,
    slug: h.slug!,
    name: h.name ?? null,
    description: h.description ?? null,
    subscriberCount,
    createdAt: h.createdAt!,
    updatedAt: h.updatedAt!,
  };
}

const editable = (t: Topic) => ({ name: t.name, description: t.description });

/** Loads topics by id in one round trip; null for an id whose topic no longer exists. */
export async function loadTopics(redis: Redis, keys: Keys, tenantId: string, ids: string[]): Promise<(Topic | null)[]> {
  if (ids.length === 0) return [];
  const pipeline = redis.pipeline();
  for (const id of ids) pipeline.hgetall(keys.topic(tenantId, id)).zcard(keys.topicMembers(tenantId, id));
  const replies = (await pipeline.exec()) ?? [];
  return ids.map((_, i) => {
    const [err, h] = replies[i * 2]!;
    const [countErr, count] = replies[i * 2 + 1]!;
    if (err) throw err;
    if (countErr) throw countErr;
    const hash = h as Record<string, string>;
    return hash.id ? toTopic(hash, Number(count)) : null;
  });
}

/** Reads a topic by id, or null (a malformed id is null too). */
export async function findTopicById(redis: Redis, keys: Keys, tenantId: string, id: string): Promise<Topic | null> {
  if (!isId('topic', id)) return null;
  return (await loadTopics(redis, keys, tenantId, [id]))[0] ?? null;
}

/** Reads a topic by slug, or null (a malformed slug is null too: it cannot exist). */
export async function findTopic(redis: Redis, keys: Keys, tenantId: string, slug: string): Promise<Topic | null> {
  if (!isSlug(slug)) return null;
  const id = await redis.hget(keys.topicSlugs(tenantId), slug);
  return id ? findTopicById(redis, keys, tenantId, id) : null;
}

/** Creates a topic; 409 `conflict` when the tenant already has one with this slug. */
export async function createTopic(redis: Redis, keys: Keys, scope: TopicScope, input: TopicInput, by: Writer): Promise<Topic> {
  const tenantId = scope.tenant.id;
  const ms = now();
  const id = newId('topic', ms);
  const at = isoNow(ms);
  const topic: Topic = { id, slug: input.slug, name: input.name ?? null, description: input.description ?? null, subscriberCount: 0, createdAt: at, updatedAt: at };
  const intent = auditIntent(keys.tenantOutbox(tenantId), 'topic.create', writeScope(scope, by), topic);
  const reply = await callScript<[number, string]>(
    redis, 'createTopic',
    [keys.topicSlugs(tenantId), keys.topicIndex(tenantId), keys.topic(tenantId, id), intent.key],
    [id, input.slug, input.name ?? '', input.description ?? '', at, intent.token, intent.json],
  );
  if (reply[0] !== 1) throw new ApiError(409, 'conflict', `A topic with slug "${input.slug}" already exists`, { param: 'slug' });
  await settleAudit(redis, keys, intent, TOPIC_AUDITS['topic.create'](topic, reply));
  return topic;
}

/**
 * Changes a topic's name or description (null clears one). Audited as `topic.updated` with
 * `changes` and `previousAttributes` only when a value actually changed. 404 for an unknown slug.
 */
export async function updateTopic(redis: Redis, keys: Keys, scope: TopicScope, slug: string, patch: TopicPatch, by: Writer): Promise<Topic> {
  const tenantId = scope.tenant.id;
  const current = await findTopic(redis, keys, tenantId, slug);
  if (!current) throw notFound('Topic');
  const fields = EDITABLE.filter((f) => patch[f] !== undefined);
  const intent = auditIntent(keys.tenantOutbox(tenantId), 'topic.update', writeScope(scope, by), null);
  const args: string[] = [isoNow(), intent.token, intent.json, String(fields.length)];
  for (const f of fields) args.push(f, patch[f] ?? '');
  const reply = await callScript<UpdateReply>(redis, 'updateTopic', [keys.topic(tenantId, current.id), keys.topicMembers(tenantId, current.id), intent.key], args);
  if (reply[0] !== 1) throw notFound('Topic');
  const drafts = TOPIC_AUDITS['topic.update'](null, reply);
  if (drafts.length) await settleAudit(redis, keys, intent, drafts);
  return toTopic(recordOf(reply[2]!), reply[3]!);
}

/**
 * Deletes a topic: record, slug and member set. Members are not told (no stream event per
 * member); their own topic sets keep the id until the worker's sweeper takes it out
 * (`sweepDeletedTopics`), and every reader ignores it once the topic is gone.
 * Returns the topic as it was; 404 for an unknown slug.
 */
export async function deleteTopic(redis: Redis, keys: Keys, scope: TopicScope, slug: string, by: Writer): Promise<Topic> {
  const tenantId = scope.tenant.id;
  const id = isSlug(slug) ? await redis.hget(keys.topicSlugs(tenantId), slug) : null;
  if (!id) throw notFound('Topic');
  // segments whose rule names the slug are evaluated again without the topic (their backfill restarts)
  const naming = await segmentsNamingTopic(redis, keys, tenantId, slug);
  const intent = auditIntent(keys.tenantOutbox(tenantId), 'topic.delete', writeScope(scope, by), null);
  const reply = await callScript<DeleteReply>(
    redis, 'deleteTopic',
    [keys.topicSlugs(tenantId), keys.topicIndex(tenantId), keys.topic(tenantId, id), keys.topicMembers(tenantId, id), keys.automationVersion(tenantId), intent.key, keys.deletedTopicMembers(tenantId, id), keys.deletedTopics(tenantId)],
    [id, JSON.stringify(PENDING), intent.token, intent.json, ...naming.map((segmentId) => keys.segment(tenantId, segmentId))],
  );
  if (reply[0] !== 1) throw notFound('Topic');
  // a backfill not queued leaves the intent to the sweeper, which queues it (queuePendingBackfills)
  if (await queueBackfills(redis, keys, scope, naming)) await settleAudit(redis, keys, intent, TOPIC_AUDITS['topic.delete'](null, reply));
  return toTopic(recordOf(reply[1]!), reply[2]!);
}

type UpdateReply = [number, string[]?, string[]?, number?];
type DeleteReply = [number, string[]?, number?, number?];

/** The audit entries of topic writes, from their scripts' replies (streams/audit-outbox.ts). */
export const TOPIC_AUDITS = {
  'topic.create': (topic: Topic, reply: [number, string]): AuditDraft[] =>
    reply[0] === 1 ? [{ type: 'topic.created', target: { type: 'topic', id: topic.id }, object: { ...topic } }] : [],
  'topic.update': (_: null, reply: UpdateReply): AuditDraft[] => {
    if (reply[0] !== 1) return [];
    const before = toTopic(recordOf(reply[1]!), reply[3]!);
    const after = toTopic(recordOf(reply[2]!), reply[3]!);
    const changed = diff(editable(before), editable(after));
    return changed ? [{ type: 'topic.updated', target: { type: 'topic', id: after.id }, object: { ...after }, ...changed }] : [];
  },
  'topic.delete': (_: null, reply: DeleteReply): AuditDraft[] => {
    if (reply[0] !== 1) return [];
    const topic = toTopic(recordOf(reply[1]!), reply[2]!);
    return [{ type: 'topic.deleted', target: { type: 'topic', id: topic.id }, object: { ...topic } }];
  },
};
