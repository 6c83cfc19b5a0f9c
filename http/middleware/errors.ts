import type { Context, Next } from 'koa';
import { ApiError } from '../../lib/errors.js';
import { newRequestId } from '../../lib/ids.js';
import type { Logger } from '../../lib/log.js';
import { respondError } from '../envelope.js';
import { isRedisUnavailable } from '../../streams/redis.js';

/** Turns what routing throws (http-errors shaped) into the service's errors; body errors are mapped where bodies are read (json-body.ts). */
function toApiError(err: unknown): ApiError | null {
  if (err instanceof ApiError) return err;
  const e = err as { status?: number; type?: string; expose?: boolean; message?: string };
  if (e?.status === 405) return new ApiError(405, 'method_not_allowed', 'Method not allowed on this path');
  if (e?.status === 404) return new ApiError(404, 'not_found', 'Not found');
  if (typeof e?.status === 'number' && e.status >= 400 && e.status < 500 && e.expose) return new ApiError(e.status, 'bad_request', e.message ?? 'Bad request');
  return null;
}

/**
 * The outermost middleware: assigns the request id (also the `Request-Id` header), answers
 * unknown routes with 404 `not_found`, and turns every thrown error into the envelope.
 * Unexpected errors answer 500 `internal` with a generic message; the real one is logged.
 */
export function envelopeErrors(log: Logger) {
  return async function envelope(ctx: Context, next: Next): Promise<void> {
    ctx.state.requestId = newRequestId();
    ctx.set('Request-Id', ctx.state.requestId);
    try {
      await next();
      if (ctx.body === undefined && ctx.status === 404) throw new ApiError(404, 'not_found', `No route for ${ctx.method} ${ctx.path}`);
    } catch (err) {
      const known = toApiError(err);
      if (known) return respondError(ctx, known);
      log.error('unexpected error', { requestId: ctx.state.requestId, method: ctx.method, path: ctx.path, err });
      const status = isRedisUnavailable(err) ? 503 : 500;
      respondError(ctx, status === 503
        ? new ApiError(503, 'unavailable', 'The service is temporarily unavailable; retry later')
        : new ApiError(500, 'internal', 'Internal error; quote the request id when reporting it'));
    }
  };
}
