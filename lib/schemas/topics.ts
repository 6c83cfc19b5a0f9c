import { SLUG_MAX_LENGTH, SLUG_MIN_LENGTH, SLUG_PATTERN } from '../slugs.js';
import type { Schema } from './common.js';

// Every export of this module is a schema: lib/schemas/index.ts registers them all.

/** Most externalIds one membership call takes. */
const MAX_MEMBERS_PER_CALL = 1000;

const slug: Schema = {
  type: 'string', minLength: SLUG_MIN_LENGTH, maxLength: SLUG_MAX_LENGTH, pattern: SLUG_PATTERN,
  description: 'Lowercase letters and digits in groups joined by single hyphens, 3 to 48 characters. Immutable.',
};
const name: Schema = { type: 'string', nullable: true, minLength: 1, maxLength: 128, description: 'Display name; null for none.' };
const description: Schema = { type: 'string', nullable: true, minLength: 1, maxLength: 1024, description: 'Free text; null for none.' };
const count: Schema = { type: 'integer', minimum: 0 };

export const TopicCreate: Schema = {
  type: 'object',
  additionalProperties: false,
  required: ['slug'],
  properties: { slug, name, description },
};

export const TopicUpdate: Schema = {
  type: 'object',
  additionalProperties: false,
  minProperties: 1,
  properties: { name, description },
  description: 'The slug cannot be changed: create a new topic and move the members.',
};

export const Topic: Schema = {
  type: 'object',
  additionalProperties: false,
  required: ['id', 'slug', 'name', 'description', 'subscriberCount', 'createdAt', 'updatedAt'],
  properties: {
    id: { type: 'string', pattern: '^tpc_' },
    slug: { type: 'string' },
    name: { type: 'string', nullable: true },
    description: { type: 'string', nullable: true },
    subscriberCount: { ...count, description: 'Members now.' },
    createdAt: { type: 'string', format: 'date-time' },
    updatedAt: { type: 'string', format: 'date-time' },
  },
};

export const TopicMembersRequest: Schema = {
  type: 'object',
  additionalProperties: false,
  required: ['externalIds'],
  properties: {
    externalIds: {
      type: 'array', minItems: 1, maxItems: MAX_MEMBERS_PER_CALL,
      items: { type: 'string', minLength: 1, maxLength: 256 },
      description: 'Subscribers by the caller\'s id, 1 to 1,000 per call; a repeated id counts once.',
    },
  },
};

export const TopicMember: Schema = {
  type: 'object',
  additionalProperties: false,
  required: ['externalId', 'joinedAt'],
  properties: {
    externalId: { type: 'string' },
    joinedAt: { type: 'string', format: 'date-time', description: 'When the subscriber joined (the first join, while it stays a member).' },
  },
};

export const TopicMembersAdded: Schema = {
  type: 'object',
  additionalProperties: false,
  required: ['added', 'alreadyMembers', 'subscribersCreated', 'subscriberCount'],
  properties: {
    added: { ...count, description: 'Distinct externalIds that joined with this call.' },
    alreadyMembers: { ...count, description: 'Distinct externalIds that were members already (nothing written for them).' },
    subscribersCreated: { ...count, description: 'Of `added`, the subscribers this call created.' },
    subscriberCount: { ...count, description: 'Members of the topic after the call.' },
  },
};

export const TopicMembersRemoved: Schema = {
  type: 'object',
  additionalProperties: false,
  required: ['removed', 'notMembers', 'subscriberCount'],
  properties: {
    removed: { ...count, description: 'Distinct externalIds that left with this call.' },
    notMembers: { ...count, description: 'Distinct externalIds that were not members (unknown subscribers included; none is created).' },
    subscriberCount: { ...count, description: 'Members of the topic after the call.' },
  },
};
