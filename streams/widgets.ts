import type { Redis } from 'ioredis';
import { isoNow } from '../lib/clock.js';
import { ApiError, validationError } from '../lib/errors.js';
import { isId, newId } from '../lib/ids.js';
import type { Keys } from './keys.js';

export const MAX_WIDGETS_PER_SUBSCRIBER = 50;
export const MAX_WIDGET_CONFIGURATION_BYTES = 4 * 1024;

export type WidgetInput = { kind: string; family?: string; pushToken?: string; configuration?: Record<string, unknown> };
export type Widget = { id: string; externalId: string; kind: string; family: string | null; pushToken: string | null; configuration: Record<string, unknown>; createdAt: string };

function toWidget(h: Record<string, string>): Widget {
  return { id: h.id!, externalId: h.externalId!, kind: h.kind!, family: h.family || null, pushToken: h.pushToken || null, configuration: JSON.parse(h.configuration || '{}'), createdAt: h.createdAt! };
}

/** Registers a widget of the app for `externalId` (at most 50 per subscriber: 409 `conflict` beyond). */
export async function registerWidget(redis: Redis, keys: Keys, tenantId: string, externalId: string, input: WidgetInput): Promise<Widget> {
  const configuration = JSON.stringify(input.configuration ?? {});
  if (Buffer.byteLength(configuration) > MAX_WIDGET_CONFIGURATION_BYTES) throw validationError([{ param: 'configuration', message: `must be at most ${MAX_WIDGET_CONFIGURATION_BYTES} bytes serialized` }]);
  const index = keys.subscriberWidgets(tenantId, externalId);
  if ((await redis.zcard(index)) >= MAX_WIDGETS_PER_SUBSCRIBER) throw new ApiError(409, 'conflict', `A subscriber holds at most ${MAX_WIDGETS_PER_SUBSCRIBER} widgets; remove one first`);
  const widget: Widget = { id: newId('widget'), externalId, kind: input.kind, family: input.family ?? null, pushToken: input.pushToken ?? null, configuration: input.configuration ?? {}, createdAt: isoNow() };
  await redis.pipeline()
    .hset(keys.widget(tenantId, widget.id), { id: widget.id, externalId, kind: widget.kind, family: widget.family ?? '', pushToken: widget.pushToken ?? '', configuration, createdAt: widget.createdAt })
    .zadd(index, 0, widget.id)
    .exec();
  return widget;
}

/** Widgets by id (null for one that is gone), for a page of a subscriber's widget index. */
export async function loadWidgets(redis: Redis, keys: Keys, tenantId: string, ids: string[]): Promise<(Widget | null)[]> {
  if (ids.length === 0) return [];
  const pipeline = redis.pipeline();
  for (const id of ids) pipeline.hgetall(keys.widget(tenantId, id));
  return ((await pipeline.exec()) ?? []).map(([err, h]) => {
    if (err) throw err;
    return (h as Record<string, string>).id ? toWidget(h as Record<string, string>) : null;
  });
}

/**
 * Deletes a widget of `externalId`: the deleted widget, or null when there is none (deleting twice
 * is fine). A malformed id, or a widget of another subscriber, is 404.
 */
export async function deleteWidget(redis: Redis, keys: Keys, tenantId: string, externalId: string, id: string): Promise<Widget | null | 'foreign'> {
  if (!isId('widget', id)) return 'foreign';
  const h = await redis.hgetall(keys.widget(tenantId, id));
  if (!h.id) return null;
  if (h.externalId !== externalId) return 'foreign';
  await redis.pipeline().del(keys.widget(tenantId, id)).zrem(keys.subscriberWidgets(tenantId, externalId), id).exec();
  return toWidget(h);
}
