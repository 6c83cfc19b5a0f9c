import type { Redis } from 'ioredis';
import { isoNow } from '../lib/clock.js';
import { ApiError, notFound } from '../lib/errors.js';
import { recordOf } from '../lib/field-list.js';
import type { AuditDraft } from './audit-outbox.js';
import type { Keys } from './keys.js';
import { diff, sameJson } from './ledger.js';
import type { AuditTrail, WriteReply } from './subscriber-audit.js';
import { changeSubscriber, readSubscriber, type TenantScope } from './subscriber-writes.js';
import { auditedSegments, toSubscriber } from './subscribers.js';

export const CHANNELS = ['push', 'email'] as const;
/** Categories a subscriber's stored preferences hold at most (the merged result of every update). */
export const MAX_CATEGORIES = 100;
export type Channel = (typeof CHANNELS)[number];
type ChannelFlags = Partial<Record<Channel, boolean>>;
/** Per channel and per category; a channel missing from a category follows `channels`. */
export type Preferences = { channels: Record<Channel, boolean>; categories: Record<string, ChannelFlags> };
export type PreferencesUpdate = { channels?: ChannelFlags; categories?: Record<string, ChannelFlags | null> };

/** The stored preferences with defaults filled in (every channel on). */
export function readPreferences(stored: string | undefined): Preferences {
  return preferencesFrom(stored ? JSON.parse(stored) : {});
}

/** Preferences from a parsed value (the record's, or a `$preferences.updated` event's) with defaults filled in. */
export function preferencesFrom(value: unknown): Preferences {
  const parsed = (value !== null && typeof value === 'object' ? value : {}) as Partial<Preferences>;
  return { channels: { push: true, email: true, ...parsed.channels }, categories: parsed.categories ?? {} };
}

/** Whether a message of `category` may reach the subscriber on `channel`. */
export function allows(preferences: Preferences, channel: Channel, category: string | null): boolean {
  const byCategory = category ? preferences.categories[category]?.[channel] : undefined;
  return byCategory ?? preferences.channels[channel];
}

function apply(current: Preferences, update: PreferencesUpdate): Preferences {
  const next: Preferences = { channels: { ...current.channels, ...update.channels }, categories: { ...current.categories } };
  for (const [name, flags] of Object.entries(update.categories ?? {})) {
    const merged = flags === null ? {} : { ...next.categories[name], ...flags };
    // an empty category says nothing (it follows the channels): not stored, so `{}` changes nothing
    if (Object.keys(merged).length === 0) delete next.categories[name];
    else next.categories[name] = merged;
  }
  return next;
}

export async function getPreferences(redis: Redis, keys: Keys, scope: TenantScope, externalId: string): Promise<Preferences> {
  const snapshot = await readSubscriber(redis, keys, scope, externalId);
  if (!snapshot.exists) throw notFound('Subscriber');
  return readPreferences(snapshot.record.preferences);
}

/** The preferences after an update, whether it changed them, the ones it replaced, and whether it created the subscriber (`create`). */
export type PreferencesOutcome = { preferences: Preferences; changed: boolean; previous: Preferences; created: boolean };

/**
 * Applies an update; writes `$preferences.updated` (with the previous values) only when a value
 * really changes. An update that would leave more than MAX_CATEGORIES categories stored (and more
 * than before) is 400 `bad_request` on `categories`, nothing stored: decided on the snapshot
 * the compare-and-set write applies to. With `options.audit`, the write records `subscriber.updated`
 * with the preferences it replaced (`subscriber.created` when it created the subscriber).
 */
export async function updatePreferences(redis: Redis, keys: Keys, scope: TenantScope, externalId: string, update: PreferencesUpdate, options: { create?: boolean; audit?: AuditTrail } = {}): Promise<PreferencesOutcome> {
  return changeSubscriber<PreferencesOutcome, string[]>(redis, keys, scope, externalId, (snapshot, segments, at) => {
    if (!snapshot.exists && !options.create) throw notFound('Subscriber');
    const current = readPreferences(snapshot.record.preferences);
    const next = apply(current, update);
    const count = Object.keys(next.categories).length;
    if (count > MAX_CATEGORIES && count > Object.keys(current.categories).length) {
      throw new ApiError(400, 'bad_request', `A subscriber's preferences hold at most ${MAX_CATEGORIES} categories; remove one (set it to null) first`, { param: 'categories' });
    }
    const same = sameJson(current, next);
    if (snapshot.exists && same) return { skip: { preferences: current, changed: false, previous: current, created: false } };
    const record = keys.subscriber(snapshot.partition, scope.tenantId, externalId);
    // an update that creates the subscriber with the defaults it already has changes no preference:
    // the subscriber is created ($subscriber.created), without $preferences.updated (spec 6.1 rule 3)
    const result = { preferences: next, changed: !same, previous: current, created: !snapshot.exists };
    const input: PreferencesInput = { externalId, segments, created: result.created, preferences: next, previous: current };
    return {
      create: true,
      events: same ? [] : [{ name: '$preferences.updated', data: { preferences: next, previous: current } }],
      ops: same ? [] : [['hset', record, 'preferences', JSON.stringify(next)], ['hset', record, 'updatedAt', isoNow(at)]],
      audit: options.audit && { trail: options.audit, op: 'subscriber.preferences', make: PREFERENCE_AUDITS['subscriber.preferences'], input, needsRecord: true },
      result,
    };
  }, auditedSegments(redis, keys, scope, externalId, options.audit));
}

type PreferencesInput = { externalId: string; segments: string[]; created: boolean; preferences: Preferences; previous: Preferences };

/** The audit entries of preference writes, from lua/writeSubscriber's reply (streams/audit-outbox.ts). */
export const PREFERENCE_AUDITS = {
  'subscriber.preferences': (input: PreferencesInput, reply: WriteReply): AuditDraft[] => {
    if (reply[0] !== 1) return [];
    const subscriber = toSubscriber(input.externalId, recordOf(reply[4] ?? []), input.segments);
    const target = { type: 'subscriber', id: subscriber.id };
    const { preferences, previous } = input;
    // the subscriber this write made has these preferences: without them an endpoint on subscriber.*
    // never learnt that push was off for it (probe BJ)
    if (input.created) return [{ type: 'subscriber.created', target, object: { ...subscriber, preferences } }];
    const changed = preferencesDiff(previous, preferences);
    return [{ type: 'subscriber.updated', target, object: { ...subscriber, preferences }, changes: { preferences: changed.changes }, previousAttributes: { preferences: changed.previousAttributes } }];
  },
};

/**
 * What a preference write changed, as `properties` changes are told: only the channels and the
 * categories that changed (a category's flags whole; null for one added or removed), before and after.
 */
export function preferencesDiff(before: Preferences, after: Preferences): { changes: Partial<Preferences>; previousAttributes: Partial<Preferences> } {
  const channels = diff(before.channels, after.channels);
  const categories = diff(before.categories, after.categories);
  return {
    changes: { ...(channels && { channels: channels.changes }), ...(categories && { categories: categories.changes }) } as Partial<Preferences>,
    previousAttributes: { ...(channels && { channels: channels.previousAttributes }), ...(categories && { categories: categories.previousAttributes }) } as Partial<Preferences>,
  };
}
