import type { Context } from 'koa';
import { codePoints } from '../lib/code-points.js';
import { notFound } from '../lib/errors.js';

export const MAX_EXTERNAL_ID_LENGTH = 256;

/**
 * The `externalId` of a path (spec 2.3 rule 4): 1 to 256 characters after URL decoding, counted
 * as a body's `externalId` is, so every subscriber a write accepted can be addressed by path. The
 * externalId is the subscriber's id in a path (spec 2.3's table), so a longer one is a malformed id:
 * 404 `not_found` (rule 2), as a malformed slug is; in a body it is 400 `validation`.
 */
export function externalIdParam(ctx: Context): string {
  const value = ctx.params.externalId ?? '';
  const length = codePoints(value);
  if (length < 1 || length > MAX_EXTERNAL_ID_LENGTH) throw notFound('Subscriber');
  return value;
}
