import type { IncomingMessage } from 'node:http';
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

/**
 * Whether a request carries header `name` (lowercase) on more than one line. Node joins most
 * repeated headers with ", " and keeps the first of some others; a proxy in front may read the
 * last. For a header that holds one value (`Host`, `Authorization`, `Idempotency-Key`) a request
 * with several lines is refused rather than guessed at: two `Idempotency-Key` lines read as one
 * new key "k, k" sent a retried message again (probe T).
 */
export function repeatsHeader(req: IncomingMessage, name: string): boolean {
  const raw = req.rawHeaders;
  let seen = 0;
  for (let i = 0; i < raw.length; i += 2) {
    const line = raw[i]!;
    if (line.length === name.length && line.toLowerCase() === name && ++seen > 1) return true;
  }
  return false;
}
