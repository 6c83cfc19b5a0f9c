import { SLUG_MAX_LENGTH, SLUG_MIN_LENGTH, SLUG_PATTERN } from '../slugs.js';
import type { Schema } from './common.js';

// Every export of this module is a schema: lib/schemas/index.ts registers them all.

const slug: Schema = {
  type: 'string', minLength: SLUG_MIN_LENGTH, maxLength: SLUG_MAX_LENGTH, pattern: SLUG_PATTERN,
  description: 'Lowercase letters and digits in groups joined by single hyphens, 3 to 48 characters. Immutable.',
};
const name: Schema = { type: 'string', nullable: true, minLength: 1, maxLength: 128, description: 'Display name; null for none.' };
const description: Schema = { type: 'string', nullable: true, minLength: 1, maxLength: 1024, description: 'Free text; null for none.' };
const where: Schema = {
  type: 'object',
  description: 'The membership rule: an expression (docs/expressions.md) over attributes, event counts in windows, topics and '
    + 'subscriptions. Checked by the service; a problem is a `validation` detail naming its path (`where.all[2].count`).',
};
const count: Schema = { type: 'integer', minimum: 0 };
const nullableTime: Schema = { type: 'string', format: 'date-time', nullable: true };

export const SegmentCreate: Schema = {
  type: 'object',
  additionalProperties: false,
  required: ['slug', 'where'],
  properties: { slug, name, description, where },
};

export const SegmentUpdate: Schema = {
  type: 'object',
  additionalProperties: false,
  minProperties: 1,
  properties: { name, description, where: { ...where, description: 'A new rule: membership is recomputed by a new backfill.' } },
  description: 'The slug cannot be changed: create a new segment.',
};

export const SegmentBackfill: Schema = {
  type: 'object',
  additionalProperties: false,
  required: ['status', 'processed', 'total', 'startedAt', 'completedAt'],
  description: 'Progress of the pass over the existing subscribers that computes membership after a create or a change of `where`.',
  properties: {
    status: { type: 'string', enum: ['pending', 'running', 'completed'] },
    processed: { ...count, description: 'Subscribers evaluated so far.' },
    total: { ...count, nullable: true, description: 'Subscribers to evaluate; null until the pass starts.' },
    startedAt: nullableTime,
    completedAt: nullableTime,
  },
};

export const Segment: Schema = {
  type: 'object',
  additionalProperties: false,
  required: ['id', 'slug', 'name', 'description', 'where', 'memberCount', 'backfill', 'createdAt', 'updatedAt'],
  properties: {
    id: { type: 'string', pattern: '^seg_' },
    slug: { type: 'string' },
    name: { type: 'string', nullable: true },
    description: { type: 'string', nullable: true },
    where: { type: 'object' },
    memberCount: { ...count, description: 'Members now.' },
    backfill: { $ref: '#/components/schemas/SegmentBackfill' },
    createdAt: { type: 'string', format: 'date-time' },
    updatedAt: { type: 'string', format: 'date-time' },
  },
};
