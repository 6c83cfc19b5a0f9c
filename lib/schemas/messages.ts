import { LIST_QUERY_PROPERTIES, externalIdField as externalId, type Schema } from './common.js';

const slug: Schema = { type: 'string', minLength: 3, maxLength: 48, pattern: '^[a-z0-9]+(?:-[a-z0-9]+)*$' };

export const MessageTarget: Schema = {
  description: 'An externalId, or an object with exactly one of `externalId`, `topic` (a topic slug), `segment` (a segment slug) or `where` (an inline expression, docs/expressions.md, evaluated over the tenant\'s subscribers when the message fans out).',
  'x-errorMessage': 'must be an externalId string or an object with exactly one of externalId, topic, segment, where',
  oneOf: [
    externalId,
    { type: 'object', additionalProperties: false, required: ['externalId'], properties: { externalId } },
    { type: 'object', additionalProperties: false, required: ['topic'], properties: { topic: slug } },
    { type: 'object', additionalProperties: false, required: ['segment'], properties: { segment: slug } },
    { type: 'object', additionalProperties: false, required: ['where'], properties: { where: { type: 'object' } } },
  ],
};

export const MessageCreate: Schema = {
  type: 'object',
  additionalProperties: false,
  required: ['to', 'title', 'body'],
  properties: {
    to: { $ref: '#/components/schemas/MessageTarget' },
    title: { type: 'string', minLength: 1, maxLength: 256 },
    subtitle: { type: 'string', minLength: 1, maxLength: 256, description: 'Shown under the title (`aps.alert.subtitle`).' },
    body: { type: 'string', minLength: 1, maxLength: 4096 },
    data: { type: 'object', description: 'Custom payload keys delivered with the notification (not `aps`, not `herald`).' },
    category: { type: 'string', pattern: '^[a-z0-9][a-z0-9_.-]{0,63}$', description: 'Preference category: subscribers who turned it off are skipped; the app reads it in the payload\'s `herald.category`.' },
    actionCategory: { type: 'string', minLength: 1, maxLength: 64, pattern: '^[!-~](?:[ -~]*[!-~])?$', description: '`aps.category`: the identifier of a notification category the app registered (UNNotificationCategory: its action buttons); printable ASCII.' },
    badge: { type: 'integer', minimum: 0, maximum: 99999 },
    sound: { type: 'string', minLength: 1, maxLength: 128 },
    threadId: { type: 'string', minLength: 1, maxLength: 64 },
    interruptionLevel: { type: 'string', enum: ['passive', 'active', 'time-sensitive'], description: '`aps.interruption-level` (iOS 15+); absent: Apple\'s default, `active`. `time-sensitive` needs the app\'s Time Sensitive Notifications capability.' },
    contentAvailable: { type: 'boolean', description: 'true: `aps.content-available` 1, the app is also woken in the background to fetch content.' },
    // an HTTP/2 header value: printable ASCII, no space at either end (probe I: an emoji broke every delivery, a control character dropped the header)
    collapseId: { type: 'string', minLength: 1, maxLength: 64, pattern: '^[!-~](?:[ -~]*[!-~])?$', description: 'apns-collapse-id: 1 to 64 printable ASCII characters (64 bytes), no space at either end (400 validation otherwise); defaults to the message id.' },
    image: { type: 'string', format: 'uri', maxLength: 2048 },
    url: { type: 'string', format: 'uri', maxLength: 2048, description: 'A link (or deep link) to open on tap.' },
    priority: { type: 'string', enum: ['high', 'normal'], default: 'high' },
    ttl: { type: 'integer', minimum: 0, maximum: 2419200, description: 'Seconds APNs keeps trying an offline device (0: only now).' },
    sendAt: { type: 'string', format: 'date-time', description: 'Send later (at most 30 days ahead); cancelable until due. A time already past sends now (the message is queued, its sendAt null).' },
  },
};

export const MessagesQuery: Schema = {
  type: 'object',
  additionalProperties: false,
  properties: {
    ...LIST_QUERY_PROPERTIES,
    status: { type: 'string', enum: ['scheduled', 'queued', 'sending', 'completed', 'canceled', 'failed'] },
  },
};

export const DeliveriesQuery: Schema = {
  type: 'object',
  additionalProperties: false,
  properties: {
    ...LIST_QUERY_PROPERTIES,
    status: { type: 'string', enum: ['pending', 'sent', 'failed', 'skipped', 'canceled'] },
  },
};

const counts: Schema = {
  type: 'object',
  additionalProperties: false,
  required: ['total', 'pending', 'sent', 'failed', 'skipped', 'canceled'],
  properties: Object.fromEntries(['total', 'pending', 'sent', 'failed', 'skipped', 'canceled'].map((k) => [k, { type: 'integer', minimum: 0 }])),
};

export const Message: Schema = {
  type: 'object',
  additionalProperties: false,
  required: ['id', 'status', 'to', 'content', 'counts', 'error', 'createdAt', 'sendAt', 'startedAt', 'completedAt', 'canceledAt', 'updatedAt', 'run'],
  properties: {
    id: { type: 'string', pattern: '^msg_' },
    status: { type: 'string', enum: ['scheduled', 'queued', 'sending', 'completed', 'canceled', 'failed'] },
    to: { type: 'object', description: 'The target, normalised to an object.' },
    content: { type: 'object', description: 'title, body and every push option of the request.' },
    counts,
    error: { type: 'string', nullable: true, description: 'Why a message failed as a whole (topic_not_found, segment_not_found: its audience was deleted before it reached anyone), or, on a completed message, why it reached only part of its audience (topic_deleted, segment_deleted: deleted while the message was sent). Null otherwise.' },
    createdAt: { type: 'string', format: 'date-time' },
    sendAt: { type: 'string', format: 'date-time', nullable: true, description: 'When a scheduled message is due; null for one sent at once (a sendAt already past included).' },
    startedAt: { type: 'string', format: 'date-time', nullable: true },
    completedAt: { type: 'string', format: 'date-time', nullable: true },
    canceledAt: { type: 'string', format: 'date-time', nullable: true },
    updatedAt: { type: 'string', format: 'date-time' },
    run: {
      type: 'object', nullable: true, additionalProperties: false, required: ['runId', 'step', 'workflowId', 'workflow', 'versionId'],
      description: 'The workflow run step that sent this message (null for messages sent through the API).',
      properties: { runId: { type: 'string' }, step: { type: 'string' }, workflowId: { type: 'string' }, workflow: { type: 'string' }, versionId: { type: 'string' } },
    },
  },
};

export const Delivery: Schema = {
  type: 'object',
  additionalProperties: false,
  required: ['id', 'messageId', 'externalId', 'subscriptionId', 'channel', 'status', 'reason', 'provider', 'attempts', 'createdAt', 'updatedAt', 'sentAt'],
  properties: {
    id: { type: 'string', pattern: '^dlv_' },
    messageId: { type: 'string' },
    externalId: { type: 'string' },
    subscriptionId: { type: 'string', nullable: true },
    channel: { type: 'string', enum: ['push', 'email'] },
    status: { type: 'string', enum: ['pending', 'sent', 'failed', 'skipped', 'canceled'] },
    reason: { type: 'string', nullable: true, description: 'Why it was skipped (`subscriber_not_found`, `no_subscription`, `subscription_removed`, `subscription_disabled`, `token_invalidated`, `notifications_denied`, `channel_opt_out`, `category_opt_out`, `channel_not_supported`, `platform_not_supported`; docs/messages.md) or failed (the reason APNs gave, such as `BadDeviceToken`, or one of Herald: `malformed_token`, `payload_too_large`, `request_timeout`, `connection_error`, …; docs/messages.md).' },
    provider: {
      type: 'object', nullable: true, additionalProperties: false, required: ['status', 'apnsId', 'reason', 'timestamp'],
      description: 'The last APNs answer.',
      properties: { status: { type: 'integer', nullable: true }, apnsId: { type: 'string', nullable: true }, reason: { type: 'string', nullable: true }, timestamp: { type: 'string', format: 'date-time', nullable: true } },
    },
    attempts: { type: 'integer', minimum: 0, description: 'Requests to APNs made by the dispatcher that settled the delivery (one that died or stopped mid-retry leaves its own uncounted); 0 when refused before sending.' },
    createdAt: { type: 'string', format: 'date-time' },
    updatedAt: { type: 'string', format: 'date-time' },
    sentAt: { type: 'string', format: 'date-time', nullable: true },
  },
};
