import type { Context } from 'koa';
import { ApiError } from '../lib/errors.js';

export const MAX_EXTERNAL_ID_LENGTH = 256;

/** Characters (Unicode code points) of `value`, the way ajv counts a body string's `maxLength`. */
function codePoints(value: string): number {
  let count = value.length;
  for (let i = 0; i < value.length; i++) {
    const unit = value.charCodeAt(i);
    if (unit >= 0xd800 && unit <= 0xdbff && i + 1 < value.length) {
      const next = value.charCodeAt(i + 1);
      if (next >= 0xdc00 && next <= 0xdfff) { count--; i++; }
    }
  }
  return count;
}

/**
 * The `externalId` of a path (spec 2.3 rule 4): 1 to 256 characters after URL decoding, counted
 * as a body's `externalId` is, so every subscriber a write accepted can be addressed by path.
 */
export function externalIdParam(ctx: Context): string {
  const value = ctx.params.externalId ?? '';
  const length = codePoints(value);
  if (length < 1 || length > MAX_EXTERNAL_ID_LENGTH) {
    throw new ApiError(400, 'validation', `externalId: must be 1 to ${MAX_EXTERNAL_ID_LENGTH} characters`, { param: 'externalId', details: [{ param: 'externalId', message: `must be 1 to ${MAX_EXTERNAL_ID_LENGTH} characters` }] });
  }
  return value;
}
