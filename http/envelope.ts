import type { Context } from 'koa';
import { isoNow } from '../lib/clock.js';
import type { ApiError } from '../lib/errors.js';
import { bindCursor, listTag } from './list.js';

/** metadata of spec 2.1, with the request id the `Request-Id` header also carries. */
function metadata(ctx: Context) {
  return { timestamp: isoNow(), requestId: ctx.state.requestId as string };
}

/**
 * Answers `status` with `data` in the envelope of spec 2.1. The only way a handler answers. A list's
 * `nextCursor` leaves bound to the list that issued it (http/list.ts `bindCursor`).
 */
export function respond(ctx: Context, status: number, data: unknown): void {
  ctx.status = status;
  const next = (data as { nextCursor?: unknown } | null)?.nextCursor;
  const body = typeof next === 'string' ? { ...(data as object), nextCursor: bindCursor(next, listTag(ctx)) } : data;
  ctx.body = { success: true, data: body, error: null, metadata: metadata(ctx) };
}

/** The error envelope of `err` for the request `requestId`. */
export function errorEnvelope(err: ApiError, requestId: string) {
  return {
    success: false,
    data: null,
    error: { code: err.code, message: err.message, param: err.param, details: err.details },
    metadata: { timestamp: isoNow(), requestId },
  };
}

/** Writes `err` as the error envelope. */
/**
 * `Retry-After` (seconds) of the answers a client retries: 429 (`lock_timeout`, a record changing
 * too fast) after a second; 503 (`unavailable`: event processing behind, Redis unreachable or full)
 * after a few, giving the backlog time to drain.
 */
const RETRY_AFTER_SECONDS: Record<number, number> = { 429: 1, 503: 5 };

export function respondError(ctx: Context, err: ApiError): void {
  ctx.status = err.status;
  // RFC 9110 11.6.1: a 401 names the scheme that would be accepted (every credential is a Bearer token)
  if (err.status === 401) ctx.set('WWW-Authenticate', err.code === 'missing_authorization' ? 'Bearer' : 'Bearer error="invalid_token"');
  // RFC 9110 10.2.3: what to wait before the retry spec Part 7 asks for (probe B1: none said it)
  const retryAfter = RETRY_AFTER_SECONDS[err.status];
  if (retryAfter !== undefined && !ctx.response.get('Retry-After')) ctx.set('Retry-After', String(retryAfter));
  ctx.body = errorEnvelope(err, ctx.state.requestId as string);
}
