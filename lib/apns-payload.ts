import { createHash } from 'node:crypto';
import { now } from './clock.js';
import type { ErrorDetail } from './errors.js';

/**
 * Turns a message's content into the APNs request of one delivery: the JSON payload and the
 * `apns-*` headers. Pure: no I/O, time from lib/clock.
 */

/** A message's push content, as `POST /v1/messages` stores it (and a workflow's `send` step holds). */
export type PushContent = {
  title: string;
  body: string;
  /** Shown under the title (`aps.alert.subtitle`). */
  subtitle?: string;
  /** Custom keys, copied to the top level of the payload (never `aps` or `herald`). */
  data?: Record<string, unknown>;
  /** The preference category (subscribers who turned it off are skipped); the app reads it in `herald.category`. */
  category?: string;
  /** `aps.category`: the identifier of a notification category the app registered (its action buttons). */
  actionCategory?: string;
  badge?: number;
  sound?: string;
  threadId?: string;
  /** `aps.interruption-level` (iOS 15+): `passive`, `active` (Apple's default) or `time-sensitive`. */
  interruptionLevel?: 'passive' | 'active' | 'time-sensitive';
  /** `aps.content-available`: the app is also woken in the background to fetch content. */
  contentAvailable?: boolean;
  /** `apns-collapse-id`: 1 to 64 printable ASCII characters (the message schema's rule). */
  collapseId?: string;
  /** An image URL for a notification service extension (sets `mutable-content`). */
  image?: string;
  /** A URL the app opens when the notification is tapped. */
  url?: string;
  /** `high` (default) → `apns-priority: 10`, `normal` → 5. */
  priority?: 'high' | 'normal';
  /** Seconds APNs keeps trying an offline device; 0: once, now or never; absent: Apple's default. */
  ttl?: number;
};

/** The content fields of a message, in the order the API documents them (a workflow's `send` step takes the same). */
export const CONTENT_FIELDS = [
  'title', 'subtitle', 'body', 'data', 'category', 'actionCategory', 'badge', 'sound', 'threadId', 'interruptionLevel', 'contentAvailable',
  'collapseId', 'image', 'url', 'priority', 'ttl',
] as const satisfies readonly (keyof PushContent)[];

export type DeliveryIds = { messageId: string; deliveryId: string };

export type ApnsPayload = {
  aps: {
    alert: { title: string; subtitle?: string; body: string };
    category?: string;
    badge?: number;
    sound?: string;
    'thread-id'?: string;
    'interruption-level'?: 'passive' | 'active' | 'time-sensitive';
    'content-available'?: 1;
    'mutable-content'?: 1;
  };
  herald: { messageId: string; deliveryId: string; category?: string; url?: string; image?: string };
  [key: string]: unknown;
};

export type ApnsHeaders = {
  pushType: 'alert';
  /** 10 (send now) or 5 (power-conscious). */
  priority: 10 | 5;
  /** Unix seconds after which APNs stops trying; 0: try once; undefined: no header. */
  expiration: number | undefined;
  collapseId: string | undefined;
  /** A UUID derived from the delivery id: a resend carries the same `apns-id`. */
  apnsId: string;
};

export type ApnsRequest = { payload: ApnsPayload; headers: ApnsHeaders };

/** APNs refuses larger payloads (413 PayloadTooLarge) for alert pushes. */
export const APNS_MAX_PAYLOAD_BYTES = 4096;
/** Keys of `data` that would clash with the payload's own. */
export const RESERVED_DATA_KEYS = ['aps', 'herald'] as const;

/** Name-based UUID namespace of Herald's apns-ids (itself a random UUID, fixed forever). */
const APNS_ID_NAMESPACE = Buffer.from('6f1c9a0e3b7d4e2a9c5f0d8b1a2e3f47', 'hex');

/** The `apns-id` of a delivery: a version-5 (SHA-1, name-based) UUID of the delivery id, lowercase. */
export function apnsIdFor(deliveryId: string): string {
  const hash = createHash('sha1').update(APNS_ID_NAMESPACE).update(deliveryId, 'utf8').digest();
  hash[6] = (hash[6]! & 0x0f) | 0x50;
  hash[8] = (hash[8]! & 0x3f) | 0x80;
  const hex = hash.subarray(0, 16).toString('hex');
  return `${hex.slice(0, 8)}-${hex.slice(8, 12)}-${hex.slice(12, 16)}-${hex.slice(16, 20)}-${hex.slice(20)}`;
}

/** The APNs payload of one delivery of `content` (what `buildApnsRequest` sends). */
function buildApnsPayload(content: PushContent, ids: DeliveryIds): ApnsPayload {
  const alert: ApnsPayload['aps']['alert'] = content.subtitle === undefined ? { title: content.title, body: content.body } : { title: content.title, subtitle: content.subtitle, body: content.body };
  const aps: ApnsPayload['aps'] = { alert };
  if (content.actionCategory !== undefined) aps.category = content.actionCategory;
  if (content.badge !== undefined) aps.badge = content.badge;
  if (content.sound !== undefined) aps.sound = content.sound;
  if (content.threadId !== undefined) aps['thread-id'] = content.threadId;
  if (content.interruptionLevel !== undefined) aps['interruption-level'] = content.interruptionLevel;
  if (content.contentAvailable) aps['content-available'] = 1;
  if (content.image !== undefined) aps['mutable-content'] = 1;
  const herald: ApnsPayload['herald'] = { messageId: ids.messageId, deliveryId: ids.deliveryId };
  if (content.category !== undefined) herald.category = content.category;
  if (content.url !== undefined) herald.url = content.url;
  if (content.image !== undefined) herald.image = content.image;
  const custom: Record<string, unknown> = {};
  for (const [key, value] of Object.entries(content.data ?? {})) {
    if (!(RESERVED_DATA_KEYS as readonly string[]).includes(key)) custom[key] = value;
  }
  return { aps, ...custom, herald };
}

/** The APNs payload and headers of one delivery of `content`. */
export function buildApnsRequest(content: PushContent, ids: DeliveryIds, at: number = now()): ApnsRequest {
  const payload = buildApnsPayload(content, ids);
  let expiration: number | undefined;
  if (content.ttl !== undefined) expiration = content.ttl === 0 ? 0 : Math.floor(at / 1000) + Math.floor(content.ttl);
  return {
    payload,
    headers: {
      pushType: 'alert',
      priority: content.priority === 'normal' ? 5 : 10,
      expiration,
      collapseId: content.collapseId,
      apnsId: apnsIdFor(ids.deliveryId),
    },
  };
}

/** Bytes of a payload as sent (compact JSON, UTF-8). */
export function payloadSize(payload: ApnsPayload): number {
  return Buffer.byteLength(JSON.stringify(payload), 'utf8');
}

// Ids are a prefix and 26 characters; sizes are measured with ids of that length.
const PLACEHOLDER_IDS: DeliveryIds = { messageId: 'msg_' + '0'.repeat(26), deliveryId: 'dlv_' + '0'.repeat(26) };

/** Bytes of the payload `content` makes for any of its deliveries. */
export function apnsPayloadSize(content: PushContent): number {
  return payloadSize(buildApnsPayload(content, PLACEHOLDER_IDS)); // no headers: the apns-id is a SHA-1 per call
}

/**
 * The keys of `data` that would clash with the payload's own, one detail each (`data.aps`,
 * `data.herald`); checked on any object, whatever else of the request is wrong.
 */
export function reservedDataProblems(data: unknown): ErrorDetail[] {
  if (typeof data !== 'object' || data === null || Array.isArray(data)) return [];
  return RESERVED_DATA_KEYS.filter((key) => Object.hasOwn(data, key)).map((key) => ({ param: `data.${key}`, message: `is reserved: the payload's own "${key}" key` }));
}

/** APNs-specific problems of well-formed `content`, one detail per field (none when it can be sent). */
export function apnsContentProblems(content: PushContent): ErrorDetail[] {
  const details = reservedDataProblems(content.data);
  if (details.length === 0) {
    const size = apnsPayloadSize(content);
    if (size > APNS_MAX_PAYLOAD_BYTES) {
      const param = content.data && Object.keys(content.data).length > 0 ? 'data' : 'body';
      details.push({ param, message: `makes the APNs payload ${size} bytes; the limit is ${APNS_MAX_PAYLOAD_BYTES}` });
    }
  }
  return details;
}

