import { LIST_QUERY_PROPERTIES, externalIdField as externalId, type Schema } from './common.js';

const nullableString = (maxLength: number, extra: Schema = {}): Schema => ({ type: 'string', nullable: true, minLength: 1, maxLength, ...extra });

/** Attributes a subscriber carries; `null` removes one. */
const attributes: Record<string, Schema> = {
  email: nullableString(254, { format: 'idn-email' }),
  phone: nullableString(16, { pattern: '^\\+[1-9][0-9]{1,14}$', description: 'E.164, e.g. +14155550100.' }),
  locale: nullableString(35, { pattern: '^[A-Za-z]{2,3}(?:[-_][A-Za-z0-9]{1,8})*$', description: 'BCP 47, e.g. en-US (extensions such as en-US-u-ca-gregory included). An `_` separator, as Apple and Java write locales (en_US), is stored as `-` (en-US).' }),
  timezone: nullableString(64, { 'x-timeZone': true, description: 'IANA time zone, e.g. Europe/Paris.' }),
  properties: {
    type: 'object', nullable: true,
    description: 'Custom properties, merged key by key into the stored ones (a null value removes a key); at most 8 KB serialized, the merged result too.',
  },
};

export const SubscriberUpsert: Schema = {
  type: 'object',
  additionalProperties: false,
  required: ['externalId'],
  properties: { externalId, ...attributes },
};

export const SubscriberUpdate: Schema = {
  type: 'object',
  additionalProperties: false,
  minProperties: 1,
  properties: attributes,
};

export const SubscribersQuery: Schema = {
  type: 'object',
  additionalProperties: false,
  properties: {
    ...LIST_QUERY_PROPERTIES,
    email: { type: 'string', minLength: 1, maxLength: 254, description: 'Only subscribers with this email (case-insensitive).' },
  },
};

export const Subscriber: Schema = {
  type: 'object',
  additionalProperties: false,
  required: ['id', 'externalId', 'email', 'phone', 'locale', 'timezone', 'properties', 'verified', 'segments', 'createdAt', 'updatedAt'],
  properties: {
    id: { type: 'string', pattern: '^sub_' },
    externalId: { type: 'string' },
    email: { type: 'string', nullable: true },
    phone: { type: 'string', nullable: true },
    locale: { type: 'string', nullable: true },
    timezone: { type: 'string', nullable: true },
    properties: { type: 'object' },
    verified: { type: 'boolean', description: 'True once a client call carried a valid identityHash.' },
    segments: { type: 'array', items: { type: 'string' }, description: 'Slugs of the segments the subscriber belongs to, sorted (kept by the workers, so it trails events by a moment).' },
    createdAt: { type: 'string', format: 'date-time' },
    updatedAt: { type: 'string', format: 'date-time' },
  },
};

/** The subscriber as the app sees it (client routes): without `segments`, which are the backend's business. */
export const ClientSubscriber: Schema = {
  ...Subscriber,
  required: (Subscriber.required as string[]).filter((f) => f !== 'segments'),
  properties: Object.fromEntries(Object.entries(Subscriber.properties as Record<string, Schema>).filter(([f]) => f !== 'segments')),
};

const channelPreference: Schema = {
  type: 'object',
  additionalProperties: false,
  properties: { push: { type: 'boolean' }, email: { type: 'boolean' } },
};

export const Preferences: Schema = {
  type: 'object',
  additionalProperties: false,
  required: ['channels', 'categories'],
  properties: {
    channels: { ...channelPreference, required: ['push', 'email'], description: 'Opt-in per channel; true unless turned off.' },
    categories: {
      type: 'object',
      description: 'Per message category, per channel; a channel not listed follows `channels`.',
      additionalProperties: channelPreference,
    },
  },
};

export const PreferencesUpdate: Schema = {
  type: 'object',
  additionalProperties: false,
  minProperties: 1,
  properties: {
    channels: channelPreference,
    categories: {
      type: 'object',
      maxProperties: 100,
      propertyNames: { pattern: '^[a-z0-9][a-z0-9_.-]{0,63}$' },
      additionalProperties: { ...channelPreference, nullable: true },
      description: 'Keyed by category name, `^[a-z0-9][a-z0-9_.-]{0,63}$` (another name is 400 validation naming `categories.<name>`). A category set to null goes back to following `channels`. At most 100 per request (400 validation beyond) and 100 stored in total (400 bad_request for an update that would store more).',
    },
  },
};

/** The id the app used before sign-in, merged into `externalId` by identify and registration. */
const anonymousId: Schema = {
  type: 'string', minLength: 1, maxLength: 256,
  description: 'The id the app used before sign-in: that subscriber is merged into externalId (its subscriptions, widgets, topics and missing attributes move, then it is deleted). '
    + 'Needs anonymousIdentityHash when the tenant requires identity verification; without it, a verified subscriber is never merged (403 forbidden).',
};

const anonymousIdentityHash: Schema = {
  type: 'string', minLength: 1, maxLength: 128,
  description: 'Hex HMAC-SHA256 of anonymousId under the tenant identity secret, checked like identityHash: proves the caller may merge that subscriber (without a valid one, a verified subscriber is not merged: 403 forbidden).',
};

const device: Schema = {
  type: 'object',
  additionalProperties: false,
  properties: Object.fromEntries(['appVersion', 'appBuild', 'sdkVersion', 'osVersion', 'model', 'locale', 'installedAt'].map((k) => [k, { type: 'string', maxLength: 128 }])),
};

export const SubscriptionRegister: Schema = {
  type: 'object',
  additionalProperties: false,
  required: ['externalId'],
  properties: {
    externalId,
    identityHash: { type: 'string', minLength: 1, maxLength: 128 },
    anonymousId,
    anonymousIdentityHash,
    channel: { type: 'string', enum: ['push', 'email'], description: 'Default: `push` with a `token` and no `address`, `email` with an `address` and no `token`; required otherwise.' },
    token: { type: 'string', minLength: 8, maxLength: 1024, description: 'Device token (push). An APNs token (hex; not on `platform` android) is kept in lowercase, without spaces or angle brackets, so `AB12…`, `ab12…` and `<ab12 …>` are one device; at least 8 characters besides spaces and angle brackets (400 `validation` otherwise).' },
    address: { type: 'string', minLength: 3, maxLength: 254, format: 'idn-email', description: 'Email address (email): ASCII or internationalised (RFC 6531); its local part at most 64 bytes (RFC 5321).' },
    platform: { type: 'string', enum: ['ios', 'android'] },
    environment: { type: 'string', enum: ['production', 'sandbox'], description: 'APNs environment of the token; default production.' },
    authorizationStatus: { type: 'string', enum: ['notDetermined', 'denied', 'authorized', 'provisional', 'ephemeral'] },
    device,
  },
};

export const SubscriptionEnabled: Schema = {
  type: 'object',
  additionalProperties: false,
  required: ['enabled'],
  properties: { enabled: { type: 'boolean' } },
};

export const Subscription: Schema = {
  type: 'object',
  additionalProperties: false,
  required: ['id', 'externalId', 'channel', 'token', 'address', 'platform', 'environment', 'authorizationStatus', 'device', 'enabled', 'invalidatedAt', 'createdAt', 'updatedAt'],
  properties: {
    id: { type: 'string', pattern: '^scr_' },
    externalId: { type: 'string' },
    channel: { type: 'string', enum: ['push', 'email'] },
    token: { type: 'string', nullable: true },
    address: { type: 'string', nullable: true },
    platform: { type: 'string', nullable: true, enum: ['ios', 'android', null] },
    environment: { type: 'string', nullable: true, enum: ['production', 'sandbox', null] },
    authorizationStatus: { type: 'string', nullable: true, enum: ['notDetermined', 'denied', 'authorized', 'provisional', 'ephemeral', null] },
    device: device,
    enabled: { type: 'boolean' },
    invalidatedAt: { type: 'string', format: 'date-time', nullable: true, description: 'When APNs declared the token gone (410, BadDeviceToken; `enabled` false meanwhile, unless the user turns it on); cleared when the app registers the token again, which turns `enabled` back to what the user chose' },
    createdAt: { type: 'string', format: 'date-time' },
    updatedAt: { type: 'string', format: 'date-time' },
  },
};

export const Identify: Schema = {
  type: 'object',
  additionalProperties: false,
  required: ['externalId'],
  properties: {
    externalId,
    identityHash: { type: 'string', minLength: 1, maxLength: 128 },
    anonymousId,
    anonymousIdentityHash,
    source: { type: 'string', enum: ['ios', 'android', 'web'], default: 'ios' },
    attributes: { type: 'object', additionalProperties: false, properties: attributes },
  },
};

export const ClientSubscriberQuery: Schema = {
  type: 'object',
  additionalProperties: false,
  required: ['externalId'],
  properties: { externalId, identityHash: { type: 'string', minLength: 1, maxLength: 128 } },
};

/** Query of the app user's widget list: whose, and a page of it (spec 2.2). */
export const ClientWidgetsQuery: Schema = {
  ...ClientSubscriberQuery,
  properties: { ...(ClientSubscriberQuery.properties as Record<string, Schema>), ...LIST_QUERY_PROPERTIES },
};

export const ClientPreferencesUpdate: Schema = {
  type: 'object',
  additionalProperties: false,
  required: ['externalId'],
  properties: {
    externalId,
    identityHash: { type: 'string', minLength: 1, maxLength: 128 },
    channels: (PreferencesUpdate.properties as Record<string, Schema>).channels!,
    categories: (PreferencesUpdate.properties as Record<string, Schema>).categories!,
  },
};

export const WidgetRegister: Schema = {
  type: 'object',
  additionalProperties: false,
  required: ['externalId', 'kind'],
  properties: {
    externalId,
    identityHash: { type: 'string', minLength: 1, maxLength: 128 },
    kind: { type: 'string', minLength: 1, maxLength: 128, description: 'The widget kind as the app declares it, e.g. com.example.OrderStatusWidget.' },
    family: { type: 'string', minLength: 1, maxLength: 64, description: 'e.g. systemSmall, accessoryCircular.' },
    pushToken: { type: 'string', minLength: 8, maxLength: 1024, description: 'A widget or Live Activity push token, when the app has one; a hex one is kept in lowercase, without spaces or angle brackets.' },
    configuration: { type: 'object', description: 'The widget configuration, at most 4 KB serialized.' },
  },
};

export const Widget: Schema = {
  type: 'object',
  additionalProperties: false,
  required: ['id', 'externalId', 'kind', 'family', 'pushToken', 'configuration', 'createdAt'],
  properties: {
    id: { type: 'string', pattern: '^wdg_' },
    externalId: { type: 'string' },
    kind: { type: 'string' },
    family: { type: 'string', nullable: true },
    pushToken: { type: 'string', nullable: true },
    configuration: { type: 'object' },
    createdAt: { type: 'string', format: 'date-time' },
  },
};

export const NullableWidget: Schema = { ...Widget, nullable: true, description: 'The deleted widget, or null when there was none.' };

export const ClientOwnerQuery: Schema = {
  type: 'object',
  additionalProperties: false,
  properties: { externalId, identityHash: { type: 'string', minLength: 1, maxLength: 128 } },
};
