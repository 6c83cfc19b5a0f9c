import { IGNORED_REASONS, MAPPING_PATH_PATTERN, PROVIDER_PATTERN, SOURCE_FORMATS } from '../source-limits.js';
import type { Schema } from './common.js';
import { Event } from './events.js';

// Every export of this module is a schema: lib/schemas/index.ts registers them all.
// Sources: other services' webhooks turned into events (docs/sources.md).

const path = (what: string): Schema => ({ type: 'string', pattern: MAPPING_PATH_PATTERN, nullable: true, description: `Dot path in the payload to ${what} (keys joined by dots, an array index as a number); null for the format's default.` });

const mappingProperties: Record<string, Schema> = {
  externalId: { type: 'string', pattern: MAPPING_PATH_PATTERN, description: 'Dot path to the subscriber\'s externalId (a string of 1 to 256 characters, or an integer). A delivery without one is `ignored`.' },
  name: path('the event name (before the prefix); default `type`, or for github the X-GitHub-Event header and the payload\'s `action`'),
  id: path('the dedupe key; default the webhook-id header (standard-webhooks), `id` (stripe), the SHA-256 of the body (github: the part GitHub signs; its X-GitHub-Delivery header is not signed)'),
  timestamp: path('when it happened (ISO 8601, unix seconds or ms); default `created` (stripe), else the time of receipt'),
  data: path('the event `data` (a JSON object of at most 8 KB); default the whole payload; a delivery without it (absent or null at the path) gets `{}`, as an event posted without data'),
};

const mappingInput: Schema = {
  type: 'object', additionalProperties: false, required: ['externalId'], properties: mappingProperties,
  description: 'Where each event field is read in a delivery\'s JSON payload.',
};
const name: Schema = { type: 'string', minLength: 1, maxLength: 128 };
const namePrefix: Schema = { type: 'string', maxLength: 41, pattern: '^(?:[a-z0-9][a-z0-9_.-]*)?$', description: 'Put before the mapped name: empty, or a lowercase letter or digit then lowercase letters, digits, `_`, `.`, `-`; default `<provider>.`; `""` for none. At most 41 characters: the longest provider and its dot.' };
const secret: Schema = { type: 'string', minLength: 8, maxLength: 256, description: 'The signing secret. standard-webhooks: `whsec_` + base64 of at least 16 bytes (generated when omitted); stripe: required, the endpoint\'s secret from Stripe; github: any (generated when omitted). A new one in a PATCH leaves the replaced one verifying for 24 hours.' };
const enabled: Schema = { type: 'boolean', description: 'A disabled source answers deliveries `ignored` and stores nothing.' };

export const SourceCreate: Schema = {
  type: 'object',
  additionalProperties: false,
  required: ['name', 'provider', 'format', 'mapping'],
  properties: {
    name,
    provider: { type: 'string', pattern: PROVIDER_PATTERN, description: 'The service sending (`stripe`, `github`, `clerk`); immutable; each event carries it as `provider`.' },
    format: { type: 'string', enum: [...SOURCE_FORMATS], description: 'How deliveries are signed and read; immutable.' },
    secret,
    mapping: mappingInput,
    namePrefix,
    enabled,
  },
};

export const SourceUpdate: Schema = {
  type: 'object',
  additionalProperties: false,
  minProperties: 1,
  properties: {
    name, secret, mapping: mappingInput, namePrefix, enabled,
    revokeOldSecrets: { type: 'boolean', description: '`true`: the secrets earlier changes replaced, which keep verifying for 24 hours, stop verifying now (with a new `secret` in the same PATCH, the one it replaces too): for a secret that leaked. `false` changes nothing.' },
  },
  description: '`provider` and `format` cannot be changed: create another source.',
};

const count: Schema = { type: 'integer', minimum: 0 };
const sourceProperties: Record<string, Schema> = {
  id: { type: 'string', pattern: '^src_' },
  name: { type: 'string' },
  provider: { type: 'string' },
  format: { type: 'string', enum: [...SOURCE_FORMATS] },
  mapping: {
    type: 'object', additionalProperties: false, required: Object.keys(mappingProperties),
    properties: Object.fromEntries(Object.keys(mappingProperties).map((k) => [k, { type: 'string', nullable: k !== 'externalId' }])),
  },
  namePrefix: { type: 'string' },
  enabled: { type: 'boolean' },
  inboundUrl: { type: 'string', description: 'Where the provider sends its webhooks: POST, no Authorization header, signed by the provider.' },
  counts: {
    type: 'object', additionalProperties: false, required: ['accepted', 'duplicate', 'ignored', 'rejected'],
    properties: { accepted: count, duplicate: count, ignored: count, rejected: count },
    description: 'Deliveries received, by outcome.',
  },
  lastReceivedAt: { type: 'string', format: 'date-time', nullable: true, description: 'The last delivery whose signature verified.' },
  lastError: {
    type: 'object', nullable: true, additionalProperties: false, required: ['code', 'message', 'at'],
    properties: { code: { type: 'string' }, message: { type: 'string' }, at: { type: 'string', format: 'date-time' } },
    description: 'The last rejected delivery; one whose signature does not verify does not replace the error of a verified delivery for 24 hours.',
  },
  lastIgnored: {
    type: 'object', nullable: true, additionalProperties: false, required: ['reason', 'at'],
    properties: { reason: { type: 'string', enum: [...IGNORED_REASONS] }, at: { type: 'string', format: 'date-time' } },
    description: 'The last delivery answered 200 `ignored` (its signature verified, nothing stored), and why: a mapping path that finds no `externalId` or name shows here, since the provider, told 200, does not send it again.',
  },
  secretUpdatedAt: { type: 'string', format: 'date-time', nullable: true, description: 'When a PATCH last set the secret.' },
  createdAt: { type: 'string', format: 'date-time' },
  updatedAt: { type: 'string', format: 'date-time' },
};

/** A source as read back: never its secret. */
export const Source: Schema = { type: 'object', additionalProperties: false, required: Object.keys(sourceProperties), properties: sourceProperties };

/** The create answer: the source and its secret, shown this once. */
export const SourceWithSecret: Schema = {
  type: 'object',
  additionalProperties: false,
  required: [...Object.keys(sourceProperties), 'secret'],
  properties: { ...sourceProperties, secret: { type: 'string', description: 'The signing secret, shown only in this answer.' } },
};

/** The answer to an inbound delivery. */
export const SourceDelivery: Schema = {
  type: 'object',
  additionalProperties: false,
  required: ['status', 'reason', 'event'],
  properties: {
    status: { type: 'string', enum: ['accepted', 'duplicate', 'ignored'] },
    reason: { type: 'string', nullable: true, enum: [...IGNORED_REASONS, null], description: 'Why it was ignored; null otherwise.' },
    event: { ...Event, nullable: true, description: 'The stored event (the original one for a duplicate); null when ignored.' },
  },
};
