/** Every error code the API can answer with; clients branch on these. */
export type ErrorCode =
  | 'validation'
  | 'bad_request'
  | 'parse'
  | 'invalid_timestamp'
  | 'reserved_event'
  | 'event_data_too_large'
  | 'invalid_url'
  | 'invalid_event'
  | 'endpoint_disabled'
  | 'missing_authorization'
  | 'invalid_api_key'
  | 'api_key_expired'
  | 'invalid_session'
  | 'invalid_signature'
  | 'missing_permission'
  | 'forbidden'
  | 'not_found'
  | 'method_not_allowed'
  | 'not_implemented'
  | 'idempotency_key_reused'
  | 'conflict'
  | 'payload_too_large'
  | 'rate_limited'
  | 'lock_timeout'
  | 'internal'
  | 'unavailable';

export type ErrorDetail = { param: string; message: string };

/** The codes whose `details` always list the failing fields (spec Part 7); the others carry details only when they have some. */
const LISTS_FIELDS = new Set<ErrorCode>(['validation', 'bad_request', 'parse']);

/**
 * 429 `lock_timeout`: a write that kept losing to concurrent writes of the same record (its
 * compare-and-set retried a bounded number of times). Retry it, as every 429 (spec Part 7); the
 * name is Stripe's for the same case. Not 409 `conflict`, which says what state refused the write
 * and must not be retried as it stands.
 */
export function lockTimeout(what: string): ApiError {
  return new ApiError(429, 'lock_timeout', `${what} is changing too fast; retry`);
}

/** 503 `unavailable`: a partition inbox is over `INBOX_MAX_BACKLOG` (ingest, and the API's subscriber writes); retried after `Retry-After`. */
export function processingBehind(): ApiError {
  return new ApiError(503, 'unavailable', 'Event processing is behind; retry the request later');
}

/** Details one answer lists at most, however many lists of them it joins (probe BV: body and query, 1,000 each). */
export const MAX_DETAILS = 1_000;
/** Longest `param` (a field's path) and `message` an error carries; longer ones are cut, ending in `…`. */
const MAX_PARAM_CHARS = 256;
const MAX_MESSAGE_CHARS = 1_024;

function clipped(text: string, max: number): string {
  return text.length > max ? `${text.slice(0, max - 1)}…` : text;
}

/** The one error type of the service: a status, a stable code, a human message. */
export class ApiError extends Error {
  readonly status: number;
  readonly code: ErrorCode;
  readonly param: string | null;
  readonly details: ErrorDetail[] | null;

  constructor(status: number, code: ErrorCode, message: string, options: { param?: string | null; details?: ErrorDetail[] | null } = {}) {
    // A field's path and the message naming it come from the request: a body's 200,000-character
    // key made a 600 KB answer, and a source kept it as its `lastError` (probe BD). Both are bounded.
    message = clipped(message, MAX_MESSAGE_CHARS);
    super(message);
    this.name = 'ApiError';
    this.status = status;
    this.code = code;
    const param = options.param == null ? options.param : clipped(options.param, MAX_PARAM_CHARS);
    // spec Part 7: for the three 400 request codes `details` lists each failing field, always (the
    // whole request, `request`, when no one field is at fault); `param` names the first of them unless the
    // error names its own (the field behind its code, e.g. `invalid_timestamp` among other failures)
    this.details = options.details?.slice(0, MAX_DETAILS).map((d) => ({ param: clipped(d.param, MAX_PARAM_CHARS), message: clipped(d.message, MAX_MESSAGE_CHARS) }))
      ?? (LISTS_FIELDS.has(code) ? [{ param: param ?? 'request', message }] : null);
    this.param = param ?? this.details?.[0]?.param ?? null;
  }
}

/** 400 `validation` with one detail per failing field; `param` names the first. */
export function validationError(all: ErrorDetail[], code: ErrorCode = 'validation'): ApiError {
  const details = all.slice(0, MAX_DETAILS);
  const first = details[0];
  const message = details.length === 1 && first ? `${first.param}: ${first.message}` : `${details.length} fields are invalid`;
  return new ApiError(400, code, message, { param: first?.param ?? null, details });
}

/** 404 `not_found`, the same answer for a malformed, foreign or missing id. */
export function notFound(what: string): ApiError {
  return new ApiError(404, 'not_found', `${what} not found`);
}
