import type { Redis } from 'ioredis';
import { countInWindow, covers } from '../lib/event-counters.js';
import { conditionKey, evaluate, eventConditions, matchesEvent, type EventCondition, type EventLike, type Expression, type Subject } from '../lib/expressions.js';
import { now } from '../lib/clock.js';
import { parseDuration } from '../lib/durations.js';
import type { Keys } from './keys.js';
import { eventFromLog } from './read-models.js';
import { heldBy } from './subscriptions.js';
import type { KeptCondition } from './automation-definitions.js';

/** How many of a subscriber's newest timeline events seed a counter (or answer an unkept condition). */
export const HISTORY_LIMIT = 1_000;

export type HistoryEvent = EventLike & { ts: number; sequence: number };

/** What expressions are evaluated against, for one subscriber, as loaded from its partition. */
export type SubjectState = {
  externalId: string;
  exists: boolean;
  record: Record<string, string>;
  topicIds: Set<string>;
  subscriptions: { channel: string; enabled: boolean; platform: string | null; invalidated: boolean }[];
  counters: Record<string, string>;
  automation: Record<string, string>;
  /** the newest timeline events, loaded on demand (`loadHistory`) */
  history: HistoryEvent[] | null;
};

export type StateNeeds = { topics: boolean; subscriptions: boolean; automation: boolean };

/**
 * Loads the states of a partition's subscribers in one pipelined round trip (a second one only for
 * their subscriptions). The subscriber exists while its record does; the automation hash holds the
 * automation state and, in its `<condition key>|…` fields, the event counters.
 */
export async function loadStates(redis: Redis, keys: Keys, p: number, tenantId: string, externalIds: string[], needs: StateNeeds): Promise<Map<string, SubjectState>> {
  const pipeline = redis.pipeline();
  for (const x of externalIds) {
    pipeline.hgetall(keys.subscriber(p, tenantId, x));
    if (needs.topics) pipeline.smembers(keys.subscriberTopics(p, tenantId, x));
    if (needs.subscriptions) pipeline.smembers(keys.subscriberSubscriptions(p, tenantId, x));
    if (needs.automation) pipeline.hgetall(keys.automation(p, tenantId, x));
  }
  const replies = (await pipeline.exec()) ?? [];
  let r = 0;
  const next = <T>() => {
    const [err, value] = replies[r++]!;
    if (err) throw err;
    return value as T;
  };
  const states = new Map<string, SubjectState>();
  const subscriptionIds = new Map<string, string[]>();
  for (const x of externalIds) {
    const record = next<Record<string, string>>();
    const topicIds = needs.topics ? new Set(next<string[]>()) : new Set<string>();
    if (needs.subscriptions) subscriptionIds.set(x, next<string[]>());
    const automation: Record<string, string> = {};
    const counters: Record<string, string> = {};
    if (needs.automation) for (const [field, value] of Object.entries(next<Record<string, string>>())) (field.includes('|') ? counters : automation)[field] = value;
    states.set(x, { externalId: x, exists: Boolean(record.id), record, topicIds, subscriptions: [], counters, automation, history: null });
  }
  if (needs.subscriptions) {
    const second = redis.pipeline();
    const order: string[] = [];
    for (const [x, ids] of subscriptionIds) for (const id of ids) {
      second.hgetall(keys.subscription(p, tenantId, id));
      order.push(x);
    }
    if (order.length) {
      ((await second.exec()) ?? []).forEach(([, h], i) => {
        const s = h as Record<string, string>;
        // a set entry whose record another subscriber of the partition holds (a token moving) is not this one's
        if (!s || !heldBy(s, order[i]!)) return;
        states.get(order[i]!)!.subscriptions.push({ channel: s.channel!, enabled: s.enabled === '1', platform: s.platform || null, invalidated: Boolean(s.invalidatedAt) });
      });
    }
  }
  return states;
}

/** The subscriber's newest timeline events (at most HISTORY_LIMIT) with a sequence ≤ `maxSequence`, newest first. */
export async function loadHistory(redis: Redis, keys: Keys, p: number, tenantId: string, externalId: string, maxSequence: number | null): Promise<HistoryEvent[]> {
  const logIds = await redis.zrevrangebyscore(keys.timeline(p, tenantId, externalId), maxSequence === null ? '+inf' : maxSequence, '-inf', 'LIMIT', 0, HISTORY_LIMIT);
  if (!logIds.length) return [];
  const pipeline = redis.pipeline();
  for (const id of logIds) pipeline.xrange(keys.tenantLog(p, tenantId), id, id);
  const out: HistoryEvent[] = [];
  for (const [err, reply] of (await pipeline.exec()) ?? []) {
    const entries = reply as [string, string[]][] | undefined;
    if (err || !entries?.[0]) continue;
    const e = eventFromLog(entries[0][1]);
    // the timeline outlives a deleted subscriber: what came before the deletion was another subscriber's
    if (e.name === '$subscriber.deleted') break;
    out.push({ name: e.name, data: e.data, ts: Date.parse(e.timestamp), sequence: e.sequence });
  }
  return out;
}

/** How many history events match a condition within its window at `nowMs`. */
export function countFromHistory(history: readonly HistoryEvent[], condition: EventCondition, nowMs: number): number {
  const within = condition.within ? parseDuration(condition.within) : null;
  let n = 0;
  for (const e of history) if ((within === null || e.ts > nowMs - within) && matchesEvent(condition, e)) n++;
  return n;
}

/** The attributes expressions read, from a subscriber record hash. */
export function subscriberView(externalId: string, record: Record<string, string>): Subject['subscriber'] {
  return {
    externalId, email: record.email || null, phone: record.phone || null, locale: record.locale || null, timezone: record.timezone || null,
    verified: record.verified === '1', createdAt: record.createdAt ?? null, properties: record.properties ? JSON.parse(record.properties) : {},
  };
}

/**
 * The evaluation subject of a loaded state. Event counts come from the kept counters once seeded
 * (`<key>|init`), otherwise from the loaded history (the caller loads it first when any condition
 * it evaluates is not kept).
 */
export function subjectOf(state: SubjectState, topicIdBySlug: ReadonlyMap<string, string>, kept: ReadonlyMap<string, KeptCondition>, nowMs: number, event?: EventLike): Subject {
  const topics = new Set<string>();
  for (const [slug, id] of topicIdBySlug) if (state.topicIds.has(id)) topics.add(slug);
  return {
    subscriber: subscriberView(state.externalId, state.record),
    topics,
    subscriptions: state.subscriptions,
    event,
    count(condition: EventCondition): number {
      const key = conditionKey(condition);
      const within = condition.within ? parseDuration(condition.within) : null;
      if (kept.has(key) && covers(state.counters, key, within)) return countInWindow(state.counters, key, within, nowMs);
      return countFromHistory(state.history ?? [], condition, nowMs);
    },
  };
}

/**
 * True when evaluating these conditions for this state needs its history: a condition not kept, not
 * yet seeded, or with a longer window than its shared counter keeps.
 */
export function needsHistory(state: SubjectState, conditions: readonly EventCondition[], kept: ReadonlyMap<string, KeptCondition>): boolean {
  if (state.history) return false;
  return conditions.some((c) => {
    const key = conditionKey(c);
    return !kept.has(key) || !covers(state.counters, key, c.within ? parseDuration(c.within) : null);
  });
}


/**
 * The subscribers among `externalIds` (of one partition) for whom `where` holds now: used by
 * `to: { where }` fan-outs. Counts come from the counters the actors keep when the tenant keeps the
 * condition (`kept`), otherwise from the subscriber's timeline.
 */
export async function selectWhere(
  redis: Redis, keys: Keys, p: number, tenantId: string, externalIds: string[], where: Expression, kept: ReadonlyMap<string, KeptCondition>,
  needs: { topics: boolean; subscriptions: boolean; topicSlugs: string[] },
): Promise<string[]> {
  if (externalIds.length === 0) return [];
  const [states, topicIds] = await Promise.all([
    loadStates(redis, keys, p, tenantId, externalIds, { topics: needs.topics, subscriptions: needs.subscriptions, automation: true }),
    needs.topicSlugs.length ? redis.hmget(keys.topicSlugs(tenantId), ...needs.topicSlugs) : Promise.resolve([] as (string | null)[]),
  ]);
  const topicIdBySlug = new Map<string, string>();
  needs.topicSlugs.forEach((slug, i) => topicIds[i] && topicIdBySlug.set(slug, topicIds[i]!));
  const conditions = eventConditions(where);
  const nowMs = now();
  const out: string[] = [];
  for (const x of externalIds) {
    const state = states.get(x)!;
    if (!state.exists) continue;
    if (needsHistory(state, conditions, kept)) state.history = await loadHistory(redis, keys, p, tenantId, x, null);
    if (evaluate(where, subjectOf(state, topicIdBySlug, kept, nowMs))) out.push(x);
  }
  return out;
}
