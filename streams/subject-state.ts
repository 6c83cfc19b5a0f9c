import type { Redis } from 'ioredis';
import { Counters } from '../lib/event-counters.js';
import { conditionKey, evaluate, eventConditions, matchesEvent, type EventCondition, type EventLike, type Expression, type Subject } from '../lib/expressions.js';
import { now } from '../lib/clock.js';
import { parseDuration } from '../lib/durations.js';
import type { Keys } from './keys.js';
import { eventFromLog } from './read-models.js';
import { callScript } from './lua-scripts.js';
import type { KeptCondition } from './automation-definitions.js';

/** How many of a subscriber's newest timeline events seed a counter (or answer an unkept condition). */
export const HISTORY_LIMIT = 1_000;

export type HistoryEvent = EventLike & { ts: number; sequence: number };

/** What expressions are evaluated against, for one subscriber, as loaded from its partition. */
export type SubjectState = {
  externalId: string;
  exists: boolean;
  record: Record<string, string>;
  /** of the topic ids `loadStates` was asked about, those the subscriber is in */
  topicIds: Set<string>;
  subscriptions: { channel: string; enabled: boolean; platform: string | null; invalidated: boolean }[];
  counters: Counters;
  automation: Record<string, string>;
  /** the newest timeline events, loaded on demand (`loadHistory`) */
  history: HistoryEvent[] | null;
};

/** What `loadStates` reads beside the record: `topicIds` are the only topics looked up (those the expressions name). */
export type StateNeeds = { topicIds: string[]; subscriptions: boolean; automation: boolean };

/** Subscribers read per `lua/loadStates` call (measured: Redis spends ~22 µs per subscriber, record, topics, one subscription and ~30 automation fields; ~2 ms per full chunk). */
export const LOAD_STATES_CHUNK = 100;

type LoadedState = { r: Record<string, string>; t?: string[] | object; s?: [string, string, string, string][] | object; a?: Record<string, string>; c?: Record<string, string> };

/**
 * Loads the states of a partition's subscribers: `lua/loadStates` reads each one's record, and
 * when asked which of `needs.topicIds` it is in, the subscriptions it holds and its automation hash (state fields apart
 * from the `<condition key>|…` counter fields), and answers one JSON document per chunk of
 * LOAD_STATES_CHUNK subscribers, so the whole batch costs one round trip and one JSON.parse per
 * chunk instead of four commands per subscriber and a reply decoded element by element. The
 * subscriber exists while its record does.
 */
export async function loadStates(redis: Redis, keys: Keys, p: number, tenantId: string, externalIds: string[], needs: StateNeeds): Promise<Map<string, SubjectState>> {
  const flags = [String(needs.topicIds.length), ...needs.topicIds, needs.subscriptions ? '1' : '0', needs.automation ? '1' : '0'];
  const chunks: string[][] = [];
  for (let i = 0; i < externalIds.length; i += LOAD_STATES_CHUNK) chunks.push(externalIds.slice(i, i + LOAD_STATES_CHUNK));
  const replies = await Promise.all(chunks.map((chunk) => callScript<string>(redis, 'loadStates', [keys.subscribers(p)], [keys.partitionBase(p), tenantId, ...flags, ...chunk])));
  const states = new Map<string, SubjectState>();
  chunks.forEach((chunk, c) => {
    const loaded = JSON.parse(replies[c]!) as LoadedState[] | Record<string, never>;
    chunk.forEach((x, i) => {
      const l = (loaded as LoadedState[])[i]!;
      states.set(x, {
        externalId: x, exists: Boolean(l.r.id), record: l.r,
        topicIds: new Set(Array.isArray(l.t) ? l.t : []),
        subscriptions: (Array.isArray(l.s) ? l.s : []).map(([channel, enabled, platform, invalidatedAt]) => ({ channel, enabled: enabled === '1', platform: platform || null, invalidated: Boolean(invalidatedAt) })),
        counters: new Counters(l.c), automation: l.a ?? {}, history: null,
      });
    });
  });
  return states;
}

/** The ids of the topic slugs that exist (`slugs` are those expressions name), by slug. */
export async function topicIdsBySlug(redis: Redis, keys: Keys, tenantId: string, slugs: readonly string[]): Promise<Map<string, string>> {
  const out = new Map<string, string>();
  if (slugs.length === 0) return out;
  const ids = await redis.hmget(keys.topicSlugs(tenantId), ...slugs);
  slugs.forEach((slug, i) => ids[i] && out.set(slug, ids[i]!));
  return out;
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

const windows = new Map<string, number | null>();
/** A condition's window (ms), null for all time (parsed once per distinct `within`). */
function windowMs(condition: EventCondition): number | null {
  if (!condition.within) return null;
  let ms = windows.get(condition.within);
  if (ms === undefined) {
    ms = parseDuration(condition.within);
    if (windows.size < 1_000) windows.set(condition.within, ms);
  }
  return ms;
}

/** How many history events match a condition within its window at `nowMs`. */
export function countFromHistory(history: readonly HistoryEvent[], condition: EventCondition, nowMs: number): number {
  const within = windowMs(condition);
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
      const within = windowMs(condition);
      const k = kept.get(key);
      if (k && state.counters.covers(key, within, k.since)) return state.counters.countInWindow(key, within, nowMs);
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
    const k = kept.get(key);
    return !k || !state.counters.covers(key, windowMs(c), k.since);
  });
}


/**
 * The subscribers among `externalIds` (of one partition) for whom `where` holds now: used by
 * `to: { where }` fan-outs. Counts come from the counters the actors keep when the tenant keeps the
 * condition (`kept`), otherwise from the subscriber's timeline.
 */
export async function selectWhere(
  redis: Redis, keys: Keys, p: number, tenantId: string, externalIds: string[], where: Expression, kept: ReadonlyMap<string, KeptCondition>,
  needs: { subscriptions: boolean; topicSlugs: string[] },
): Promise<string[]> {
  if (externalIds.length === 0) return [];
  const topicIdBySlug = await topicIdsBySlug(redis, keys, tenantId, needs.topicSlugs);
  const states = await loadStates(redis, keys, p, tenantId, externalIds, { topicIds: [...topicIdBySlug.values()], subscriptions: needs.subscriptions, automation: true });
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
