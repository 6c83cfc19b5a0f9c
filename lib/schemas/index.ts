import * as apps from './apps.js';
import * as common from './common.js';
import * as events from './events.js';
import * as messages from './messages.js';
import * as subscribers from './subscribers.js';
import * as segments from './segments.js';
import * as sources from './sources.js';
import * as topics from './topics.js';
import * as webhooks from './webhooks.js';
import * as workflows from './workflows.js';
import type { Schema } from './common.js';

export type { Schema } from './common.js';

/** Schemas whose envelopes (`<Name>Response`, `<Name>ListResponse`) the document also carries. */
export const DATA_SCHEMAS: string[] = ['Health', 'Caller', 'ApiKey', 'ApnsCredentials', 'Message', 'Delivery', 'Subscriber', 'ClientSubscriber', 'Subscription', 'Preferences', 'Widget', 'NullableWidget', 'Topic', 'TopicMember', 'TopicMembersAdded', 'TopicMembersRemoved', 'Segment', 'Workflow', 'WorkflowVersion', 'WorkflowRun', 'Event', 'TrackedEvent', 'CatalogEntry', 'CatalogEntryDetail', 'Volume', 'EventsToken', 'Source', 'SourceWithSecret', 'SourceDelivery', 'WebhookEndpoint', 'WebhookEndpointWithSecret', 'WebhookCatalog', 'WebhookEvent', 'WebhookDelivery', 'WebhookDeliveryDetail'];
/** Of those, the lists that carry `total` (record lists); the others paginate by keyset. */
export const RECORD_LISTS: string[] = ['ApiKey', 'Message', 'Delivery', 'Subscriber', 'Subscription', 'Widget', 'Topic', 'TopicMember', 'Segment', 'Workflow', 'WorkflowVersion', 'WorkflowRun', 'Source', 'WebhookEndpoint', 'WebhookDelivery'];

/** Every named schema of the service. */
export const SCHEMAS: Record<string, Schema> = {
  ErrorDetail: common.ErrorDetail,
  ErrorBody: common.ErrorBody,
  Metadata: common.Metadata,
  ErrorEnvelope: common.ErrorEnvelope,
  ListQuery: common.ListQuery,
  Health: common.Health,
  ApiKey: common.ApiKey,
  Caller: common.Caller,
  ...apps,
  ...events,
  ...messages,
  ...subscribers,
  ...segments,
  ...sources,
  ...topics,
  ...webhooks,
  ...workflows,
};

function envelopeOf(data: Schema): Schema {
  return {
    type: 'object',
    additionalProperties: false,
    required: ['success', 'data', 'error', 'metadata'],
    properties: {
      success: { type: 'boolean', enum: [true] },
      data,
      error: { type: 'object', nullable: true, enum: [null] },
      metadata: { $ref: '#/components/schemas/Metadata' },
    },
  };
}

function listOf(name: string, withTotal: boolean): Schema {
  const properties: Record<string, Schema> = {
    items: { type: 'array', items: { $ref: `#/components/schemas/${name}` } },
    hasMore: { type: 'boolean' },
    nextCursor: { type: 'string', nullable: true },
  };
  if (withTotal) properties.total = { type: 'integer', minimum: 0 };
  return { type: 'object', additionalProperties: false, required: Object.keys(properties), properties };
}

/** `SCHEMAS` plus the generated envelope and list schemas: the `components.schemas` of the document. */
export function allSchemas(): Record<string, Schema> {
  const out: Record<string, Schema> = { ...SCHEMAS };
  for (const name of DATA_SCHEMAS) {
    out[`${name}Response`] = envelopeOf({ $ref: `#/components/schemas/${name}` });
    out[`${name}ListResponse`] = envelopeOf(listOf(name, RECORD_LISTS.includes(name)));
  }
  out.NullResponse = envelopeOf({ type: 'object', nullable: true, enum: [null] });
  return out;
}
