import { MAX_URL_LENGTH } from '../webhook-policy.js';
import { LIST_QUERY_PROPERTIES, type Schema } from './common.js';

/** Outbound webhooks (spec 2.5, 2.6, 3.2, 3.3, 4.6). */

const pattern: Schema = {
  type: 'string',
  minLength: 1,
  maxLength: 103,
  // the shape lib/webhook-events.ts patternProblem checks, in the document too (probe F1: `*.completed` passed it)
  pattern: '^(?:\\*|\\$?[a-z0-9][a-z0-9_.-]{0,99}|\\$?[a-z0-9](?:[a-z0-9_.-]{0,98}[a-z0-9_-])?\\.\\*)$',
  'x-errorMessage': 'must be *, an event name, or an event name prefix followed by .*',
  description: '`*` (every public event), an exact event name, or a name prefix followed by `.*` (`subscriber.*`, `$subscription.*`, `order.*`).',
};
const events: Schema = {
  type: 'array',
  minItems: 1,
  maxItems: 100,
  items: pattern,
  description: 'Which events the endpoint receives; `["*"]` when omitted. Private audit events (`key.*`, `webhook.*`, `profile.*`) are `400 invalid_event`.',
};
const url: Schema = { type: 'string', minLength: 1, maxLength: MAX_URL_LENGTH, description: 'http(s) URL without credentials on a public address; https only when the service runs with NODE_ENV=production. At most 2,048 characters as sent and once normalised (WHATWG: non-ASCII characters percent-encoded, `é` becoming `%C3%A9`; a longer one is 400 `validation`).' };
const description: Schema = { type: 'string', maxLength: 512, nullable: true };
const tenant: Schema = { type: 'string', minLength: 1, maxLength: 64, nullable: true, description: 'A tenant slug: the endpoint then only receives that tenant\'s events.' };

export const CreateWebhookRequest: Schema = {
  type: 'object',
  additionalProperties: false,
  required: ['url'],
  properties: { url, description, events, tenant },
};

export const UpdateWebhookRequest: Schema = {
  type: 'object',
  additionalProperties: false,
  minProperties: 1,
  properties: {
    url, description, events, tenant,
    enabled: { type: 'boolean', description: '`true` on a disabled endpoint clears its failure streak and re-queues its pending and failed deliveries.' },
  },
};

const endpointProperties: Record<string, Schema> = {
  id: { type: 'string', pattern: '^whk_' },
  url: { type: 'string' },
  description: { type: 'string', nullable: true },
  events: { type: 'array', items: { type: 'string' } },
  tenant: { type: 'string', nullable: true, description: 'The tenant slug it is narrowed to, or null for every tenant.' },
  enabled: { type: 'boolean' },
  createdAt: { type: 'string', format: 'date-time' },
  updatedAt: { type: 'string', format: 'date-time' },
  disabledAt: { type: 'string', format: 'date-time', nullable: true },
  failingSince: { type: 'string', format: 'date-time', nullable: true, description: 'Start of the current failure streak; three days of it disable the endpoint. Null after any success.' },
  secretRotatedAt: { type: 'string', format: 'date-time', nullable: true, description: 'The last rotation. Each secret a rotation retires signs too for 24 hours after that rotation (at most 10 retired secrets).' },
};

/** An endpoint as read back: never its secret. */
export const WebhookEndpoint: Schema = {
  type: 'object',
  additionalProperties: false,
  required: Object.keys(endpointProperties),
  properties: endpointProperties,
};

/** The answer to create and rotate: the endpoint and its signing secret in full, shown this once. */
export const WebhookEndpointWithSecret: Schema = {
  type: 'object',
  additionalProperties: false,
  required: [...Object.keys(endpointProperties), 'secret'],
  properties: {
    ...endpointProperties,
    secret: { type: 'string', pattern: '^whsec_', description: 'The signing secret (Standard Webhooks). Shown only in this answer.' },
  },
};

export const WebhookCatalog: Schema = {
  type: 'object',
  additionalProperties: false,
  required: ['groups'],
  properties: {
    groups: {
      type: 'array',
      items: {
        type: 'object',
        additionalProperties: false,
        required: ['resource', 'source', 'pattern', 'events'],
        properties: {
          resource: { type: 'string' },
          source: { type: 'string', enum: ['audit', 'stream'], description: '`audit`: control-plane events; `stream`: subscriber stream events.' },
          pattern: { type: 'string', nullable: true, description: 'The `resource.*` pattern that subscribes to the whole group.' },
          events: {
            type: 'array',
            items: {
              type: 'object',
              additionalProperties: false,
              required: ['name', 'description'],
              properties: { name: { type: 'string' }, description: { type: 'string', nullable: true } },
            },
          },
        },
      },
    },
  },
};

const ref: Schema = { type: 'object', required: ['id', 'slug'], properties: { id: { type: 'string' }, slug: { type: 'string' } } };

/** The body of every delivery (spec 2.6), exactly as sent. */
export const WebhookEvent: Schema = {
  type: 'object',
  required: ['id', 'type', 'apiVersion', 'createdAt', 'workspace', 'tenant', 'data'],
  properties: {
    id: { type: 'string', pattern: '^whe_' },
    type: { type: 'string' },
    apiVersion: { type: 'string', enum: ['v1'] },
    createdAt: { type: 'string', format: 'date-time' },
    workspace: ref,
    tenant: { ...ref, description: 'The tenant the event belongs to (spec 2.6). Every event delivered has one: the one workspace-level event, `workspace.created`, is written before any endpoint of its workspace can exist, so none receives it.' },
    data: { type: 'object', required: ['object'], properties: { object: { type: 'object' } } },
    actor: {
      type: 'object', required: ['type', 'id'], description: 'Audit events: who made the change (an API key, the operator CLI, or the service itself).',
      properties: { type: { type: 'string', enum: ['api_key', 'cli', 'system'] }, id: { type: 'string', nullable: true, description: 'The `key_` id for api_key; null otherwise.' } },
    },
    target: { type: 'object', required: ['type', 'id'], description: 'Audit events: the record changed.', properties: { type: { type: 'string' }, id: { type: 'string' } } },
    request: {
      type: 'object', nullable: true, required: ['id', 'ip', 'userAgent'], description: 'Audit events: the API request that made the change (its `Request-Id`); null for the CLI and the service.',
      properties: { id: { type: 'string' }, ip: { type: 'string', nullable: true }, userAgent: { type: 'string', nullable: true } },
    },
    changes: { type: 'object', description: '`*.updated` audit events: the changed fields with their new values.' },
    previousAttributes: { type: 'object', description: '`*.updated` audit events: the same fields with their values before the change.' },
  },
  description: 'Audit events add actor, target and request; *.updated events add changes and previousAttributes.',
};

const deliveryProperties: Record<string, Schema> = {
  id: { type: 'string', pattern: '^whd_' },
  endpointId: { type: 'string', pattern: '^whk_' },
  eventId: { type: 'string', pattern: '^whe_' },
  eventType: { type: 'string' },
  status: { type: 'string', enum: ['pending', 'success', 'failed', 'exhausted'] },
  attemptCount: { type: 'integer', minimum: 0, description: 'Scheduled attempts made, out of ten (replays not counted).' },
  replayCount: { type: 'integer', minimum: 0 },
  nextAttemptAt: { type: 'string', format: 'date-time', nullable: true, description: 'When the next scheduled attempt is due; null when none is queued, and while the endpoint is disabled (it goes out on the re-enable).' },
  lastAttemptAt: { type: 'string', format: 'date-time', nullable: true },
  lastStatusCode: { type: 'integer', nullable: true },
  createdAt: { type: 'string', format: 'date-time', description: 'When the delivery was made (its event reached a dispatcher); lists are newest first by it.' },
  updatedAt: { type: 'string', format: 'date-time' },
};

export const WebhookDelivery: Schema = {
  type: 'object',
  additionalProperties: false,
  required: Object.keys(deliveryProperties),
  properties: deliveryProperties,
};

export const WebhookAttempt: Schema = {
  type: 'object',
  additionalProperties: false,
  required: ['attempt', 'trigger', 'startedAt', 'statusCode', 'success', 'error', 'durationMs', 'response'],
  properties: {
    attempt: { type: 'integer', minimum: 1, description: 'Position among all attempts of the delivery, replays included.' },
    trigger: { type: 'string', enum: ['schedule', 'replay'] },
    startedAt: { type: 'string', format: 'date-time' },
    statusCode: { type: 'integer', nullable: true, description: 'The receiver\'s status; null when no answer came.' },
    success: { type: 'boolean', description: 'The receiver answered 2xx.' },
    error: { type: 'string', nullable: true, description: 'Timeout, connection error, refused address, or a redirect that was not followed.' },
    durationMs: { type: 'integer', minimum: 0 },
    response: { type: 'string', nullable: true, description: 'The first 4 KB of the response body.' },
  },
};

export const WebhookDeliveryDetail: Schema = {
  type: 'object',
  additionalProperties: false,
  required: [...Object.keys(deliveryProperties), 'attempts', 'event'],
  properties: {
    ...deliveryProperties,
    attempts: { type: 'array', items: { $ref: '#/components/schemas/WebhookAttempt' } },
    event: { ...WebhookEvent, nullable: true, description: 'The payload sent (null once expired).' },
  },
};

export const WebhookDeliveriesQuery: Schema = {
  type: 'object',
  additionalProperties: false,
  properties: {
    ...LIST_QUERY_PROPERTIES,
    status: { type: 'string', enum: ['pending', 'success', 'failed', 'exhausted'] },
  },
};
