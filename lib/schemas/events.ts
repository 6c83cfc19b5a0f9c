import { EXPRESSION_EVENT_PATTERN } from '../expressions.js';
import { PROVIDER_PATTERN } from '../source-limits.js';
import { LIST_QUERY_PROPERTIES, externalIdField as externalId, type Schema } from './common.js';

/** A `name` filter of the read routes: an event name as ingest takes it (`$` only in front), else 400. */
const eventNameFilter: Schema = { type: 'string', minLength: 1, maxLength: 101, pattern: EXPRESSION_EVENT_PATTERN };

const name: Schema = {
  type: 'string',
  minLength: 1,
  // a `$` name of any length or characters passes the schema, so that it is answered `reserved_event`
  // (spec Part 7: "A `$` name sent to `POST /v1/events`"), never `validation`; the body limit bounds it
  pattern: '^(?:\\$[\\s\\S]*|[a-z0-9][a-z0-9_.-]{0,99})$',
  'x-errorMessage': 'must be 1 to 100 characters of a-z, 0-9, "_", "." and "-", the first a letter or digit (matching [a-z0-9][a-z0-9_.-]{0,99})',
  description: 'Matches `[a-z0-9][a-z0-9_.-]{0,99}`. Names beginning with `$` are reserved: `POST /v1/events` answers any of them 400 `reserved_event`; the app may send only the SDK\'s own (spec 6.1), any other `$` name is 400 `reserved_event` too.',
};
const eventFields: Record<string, Schema> = {
  name,
  data: { type: 'object', description: 'A JSON object of at most 8 KB serialized.' },
  timestamp: { type: 'string', format: 'date-time', description: 'When it happened on the sender\'s clock; at most 7 days back and 1 hour ahead. Defaults to the time of receipt (the event\'s `receivedAt`, which a `$subscriber.created` it makes has too).' },
  id: { type: 'string', minLength: 1, maxLength: 256, description: 'Optional dedupe key, unique per subscriber. Not the event id.' },
};

export const TrackEvent: Schema = {
  type: 'object',
  additionalProperties: false,
  required: ['externalId', 'name'],
  properties: { externalId, ...eventFields },
};

export const TrackEventsRequest: Schema = {
  type: 'object',
  additionalProperties: false,
  required: ['events'],
  properties: { events: { type: 'array', minItems: 1, maxItems: 100, items: { $ref: '#/components/schemas/TrackEvent' } } },
};

export const ClientEvent: Schema = {
  type: 'object',
  additionalProperties: false,
  required: ['name'],
  properties: eventFields,
};

export const ClientEventsRequest: Schema = {
  type: 'object',
  additionalProperties: false,
  required: ['externalId', 'source', 'events'],
  properties: {
    externalId,
    identityHash: { type: 'string', minLength: 1, maxLength: 128 },
    source: { type: 'string', enum: ['ios', 'android', 'web'] },
    events: { type: 'array', minItems: 1, maxItems: 100, items: { $ref: '#/components/schemas/ClientEvent' } },
  },
};

const eventProperties: Record<string, Schema> = {
  id: { type: 'string', pattern: '^evt_' },
  sequence: { type: 'integer', minimum: 1, description: "The subscriber's own arrival order." },
  externalId: { type: 'string' },
  name: { type: 'string' },
  source: { type: 'string', enum: ['server', 'ios', 'android', 'web', 'system', 'webhook'] },
  timestamp: { type: 'string', format: 'date-time' },
  receivedAt: { type: 'string', format: 'date-time' },
  data: { type: 'object' },
  provider: { type: 'string', nullable: true, description: 'The other service whose webhook a Source turned into this event (source `webhook`); null for every other source.' },
  runId: { type: 'string', nullable: true },
  messageId: { type: 'string', nullable: true },
  step: { type: 'string', nullable: true },
};
const eventRequired = Object.keys(eventProperties);

/** A stored event of spec 2.4. */
export const Event: Schema = { type: 'object', additionalProperties: false, required: eventRequired, properties: eventProperties };

/** One item of the answer to a tracking call: the stored event and whether this call stored it. */
export const TrackedEvent: Schema = {
  type: 'object',
  additionalProperties: false,
  required: [...eventRequired, 'status'],
  properties: {
    ...eventProperties,
    status: { type: 'string', enum: ['accepted', 'duplicate'], description: '`duplicate` when the caller\'s `id` was seen before for this subscriber: the original event, nothing stored.' },
  },
};


export const EventsListQuery: Schema = {
  type: 'object',
  additionalProperties: false,
  properties: {
    ...LIST_QUERY_PROPERTIES,
    name: eventNameFilter,
    source: { type: 'string', enum: ['server', 'ios', 'android', 'web', 'system', 'webhook'] },
    provider: { type: 'string', minLength: 1, maxLength: 40, pattern: PROVIDER_PATTERN, description: 'A source\'s provider: its pattern, so a misspelt one is 400, not an empty list.' },
    after: { type: 'string', format: 'date-time', description: 'Only events received (receivedAt) strictly after this time. Events appear as the worker applies them, not in receivedAt order, so to follow the list poll with `after` a few seconds before the newest receivedAt seen and drop the ids already seen (docs/events.md).' },
  },
};

export const CatalogQuery: Schema = { type: 'object', additionalProperties: false, properties: LIST_QUERY_PROPERTIES };

export const VolumeQuery: Schema = {
  type: 'object',
  additionalProperties: false,
  properties: {
    range: { type: 'string', enum: ['24h', '7d', '30d'], default: '24h' },
    name: eventNameFilter,
  },
};

export const CatalogEntry: Schema = {
  type: 'object',
  additionalProperties: false,
  required: ['name', 'counts', 'subscribers7d', 'sources', 'providers', 'firstAt', 'lastAt'],
  properties: {
    name: { type: 'string' },
    counts: {
      type: 'object',
      additionalProperties: false,
      required: ['last24h', 'last7d', 'last30d', 'allTime'],
      description: 'Rolling windows of 24 hours, 7 and 30 days by event timestamp, exact to the hour (each starts at the hour holding its start and reaches the hour ahead timestamps may name); all time.',
      properties: { last24h: { type: 'integer' }, last7d: { type: 'integer' }, last30d: { type: 'integer' }, allTime: { type: 'integer' } },
    },
    subscribers7d: { type: 'integer', description: 'Distinct subscribers over 7 days, by UTC day from the day holding now − 7 days (HyperLogLog estimate, exact for small counts).' },
    sources: { type: 'array', items: { type: 'string' } },
    providers: { type: 'array', items: { type: 'string' } },
    firstAt: { type: 'string', format: 'date-time' },
    lastAt: { type: 'string', format: 'date-time' },
  },
};

export const VolumeBucket: Schema = {
  type: 'object',
  additionalProperties: false,
  required: ['start', 'count', 'subscribers'],
  properties: { start: { type: 'string', format: 'date-time' }, count: { type: 'integer' }, subscribers: { type: 'integer' } },
};

export const Volume: Schema = {
  type: 'object',
  additionalProperties: false,
  required: ['range', 'unit', 'name', 'buckets'],
  properties: {
    range: { type: 'string', enum: ['24h', '7d', '30d'] },
    unit: { type: 'string', enum: ['hour', 'day'] },
    name: { type: 'string', nullable: true },
    buckets: { type: 'array', items: { $ref: '#/components/schemas/VolumeBucket' } },
  },
};

export const CatalogEntryDetail: Schema = {
  type: 'object',
  additionalProperties: false,
  required: ['entry', 'series', 'samples'],
  properties: {
    entry: { $ref: '#/components/schemas/CatalogEntry' },
    series: { $ref: '#/components/schemas/Volume' },
    samples: { type: 'array', maxItems: 20, items: { $ref: '#/components/schemas/Event' }, description: 'The 20 newest events of the name.' },
  },
};

export const EventsToken: Schema = {
  type: 'object',
  additionalProperties: false,
  required: ['token', 'url', 'expiresAt'],
  properties: {
    token: { type: 'string', description: 'A JWT to send as `Authorization: Bearer <token>`.' },
    url: { type: 'string', description: 'The URL of `GET /v1/events` on this service (its origin as the request reached it); the token also reads `/v1/events/names`, `/v1/events/volume` and `/v1/subscribers/{externalId}/timeline` on that origin.' },
    expiresAt: { type: 'string', format: 'date-time' },
  },
};
