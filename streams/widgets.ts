import type { Redis } from 'ioredis';
import { isoNow } from '../lib/clock.js';
import { ApiError, validationError } from '../lib/errors.js';
import { isId, newId } from '../lib/ids.js';
import { canonicalJson } from '../lib/canonical-json.js';
import type { Keys } from './keys.js';
import { callScript } from './lua-scripts.js';
import { recordOf } from '../lib/field-list.js';
import { partitionOf } from '../lib/partition.js';
import { apnsTokenForm } from '../lib/apns-token.js';
import type { TenantScope } from './subscriber-writes.js';

export const MAX_WIDGETS_PER_SUBSCRIBER = 50;
export const MAX_WIDGET_CONFIGURATION_BYTES = 4 * 1024;

export type WidgetInput = { kind: string; family?: string; pushToken?: string; configuration?: Record<string, unknown> };
export type Widget = { id: string; externalId: string; kind: string; family: string | null; pushToken: string | null; configuration: Record<string, unknown>; createdAt: string };

function toWidget(h: Record<string, string>): Widget {
  return { id: h.id!, externalId: h.externalId!, kind: h.kind!, family: h.family || null, pushToken: h.pushToken || null, configuration: JSON.parse(h.configuration || '{}'), createdAt: h.createdAt! };
}

/** The hash fields of a script reply `[status, field, value, …]` as a widget. */
function widgetOfReply(reply: string[]): Widget {
  return toWidget(recordOf(reply, 1));
}

/**
 * Registers a widget of the app for `externalId`, idempotently (lua/registerWidget): a widget with
 * the same `pushToken` is updated in place, and without a `pushToken` one with the same kind, family
 * and configuration (canonical JSON, key order does not matter) is the same widget; `created` says
 * whether a new one was stored. At most MAX_WIDGETS_PER_SUBSCRIBER per subscriber (409 `conflict`
 * beyond, checked in the same script). The widget is tagged with the subscriber's sub_ id
 * (`subscriberId`), which the cleanup of a deleted subscriber of the same externalId checks.
 *
 * A delete of that subscriber racing the registration cannot leave the widget behind: the widget is
 * written first, then the subscriber is read again. Still there: its delete (if any) comes later,
 * and its cleanup, which runs after the delete's write, finds the widget tagged with its id. Gone
 * or another sub_ id: the delete came first and its cleanup may already have run, so the widgets
 * tagged with the deleted id are removed here (the registration answers what it wrote, ordered
 * before the delete). Only a process killed between the two steps can still leave one.
 */
export async function registerWidget(redis: Redis, keys: Keys, scope: Pick<TenantScope, 'tenantId' | 'partitions'>, externalId: string, subscriberId: string, input: WidgetInput): Promise<{ widget: Widget; created: boolean }> {
  const { tenantId } = scope;
  const configuration = canonicalJson(input.configuration ?? {});
  if (Buffer.byteLength(configuration) > MAX_WIDGET_CONFIGURATION_BYTES) throw validationError([{ param: 'configuration', message: `must be at most ${MAX_WIDGET_CONFIGURATION_BYTES} bytes serialized` }]);
  const reply = await callScript<string[]>(redis, 'registerWidget', [keys.subscriberWidgets(tenantId, externalId)], [
    keys.tenantBase(tenantId), newId('widget'), externalId, input.kind, input.family ?? '', input.pushToken === undefined ? '' : apnsTokenForm(input.pushToken), configuration, isoNow(), MAX_WIDGETS_PER_SUBSCRIBER, subscriberId,
  ]);
  if (reply[0] === 'full') throw widgetLimit('remove one first');
  const holder = await redis.hget(keys.subscribers(partitionOf(tenantId, externalId, scope.partitions)), `${tenantId}|${externalId}`);
  if (holder !== subscriberId) await deleteWidgetsOf(redis, keys, tenantId, externalId, subscriberId);
  return { widget: widgetOfReply(reply), created: reply[0] === 'created' };
}

/** Widgets by id (null for one that is gone), for a page of a subscriber's widget index. */
export async function loadWidgets(redis: Redis, keys: Keys, tenantId: string, ids: string[]): Promise<(Widget | null)[]> {
  if (ids.length === 0) return [];
  const pipeline = redis.pipeline();
  for (const id of ids) pipeline.hgetall(keys.widget(tenantId, id));
  return ((await pipeline.exec()) ?? []).map(([err, h]) => {
    if (err) throw err;
    const w = h as Record<string, string>;
    return w.id && !w.deletedAt ? toWidget(w) : null;
  });
}

/** The externalId of the widget `id` this tenant holds or held (its record or tombstone), or null. */
export async function widgetOwner(redis: Redis, keys: Keys, tenantId: string, id: string): Promise<string | null> {
  return isId('widget', id) ? redis.hget(keys.widget(tenantId, id), 'externalId') : null;
}

/**
 * Deletes a widget of `externalId` (lua/deleteWidget): the deleted widget, or null when it was
 * deleted before (its tombstone is kept `tombstoneMs`, so deleting twice is fine). A malformed id,
 * an id this tenant never held (another tenant's) and a widget of another subscriber are 'not_found'
 * (404, spec 2.3 rule 2).
 */
export async function deleteWidget(redis: Redis, keys: Keys, tenantId: string, externalId: string, id: string, tombstoneMs: number): Promise<Widget | null | 'not_found'> {
  if (!isId('widget', id)) return 'not_found';
  const reply = await callScript<string[]>(redis, 'deleteWidget', [keys.subscriberWidgets(tenantId, externalId)], [keys.tenantBase(tenantId), id, externalId, isoNow(), tombstoneMs]);
  if (reply[0] === 'deleted') return widgetOfReply(reply);
  return reply[0] === 'gone' ? null : 'not_found';
}

/**
 * Removes the widgets of the deleted subscriber `subscriberId` of `externalId` (lua/deleteWidgets):
 * part of its cleanup (streams/subscriber-cleanup.ts). A widget of a subscriber created again under
 * the same externalId since (another sub_ id) stays.
 */
export async function deleteWidgetsOf(redis: Redis, keys: Keys, tenantId: string, externalId: string, subscriberId: string): Promise<number> {
  return callScript<number>(redis, 'deleteWidgets', [keys.subscriberWidgets(tenantId, externalId)], [keys.tenantBase(tenantId), subscriberId]);
}

/**
 * Moves every widget of `from` to `to` (lua/moveWidgets): an anonymous subscriber merged into the
 * identified one. A widget `to` already has (same pushToken, or the same kind, family and
 * configuration) is removed instead, keeping `to`'s. When `to` would hold more than
 * MAX_WIDGETS_PER_SUBSCRIBER, nothing changes and this is 409 `conflict`. `check` only answers
 * whether it would fit, writing nothing. A moved widget is tagged with `toId`, `to`'s sub_ id.
 */
export async function moveWidgets(redis: Redis, keys: Keys, tenantId: string, from: string, to: string, options: { check?: boolean; toId?: string } = {}): Promise<{ moved: number; removed: number }> {
  const [moved, removed] = await callScript<[number, number]>(redis, 'moveWidgets', [keys.subscriberWidgets(tenantId, from), keys.subscriberWidgets(tenantId, to)], [keys.tenantBase(tenantId), to, MAX_WIDGETS_PER_SUBSCRIBER, options.check ? '1' : '0', options.toId ?? '']);
  if (moved === -1) throw widgetLimit(`merging would give the subscriber ${removed}`);
  return { moved, removed };
}

/** 409 `conflict`: the per-subscriber widget limit. */
export const widgetLimit = (why: string) => new ApiError(409, 'conflict', `A subscriber holds at most ${MAX_WIDGETS_PER_SUBSCRIBER} widgets; ${why}`);
