import { HttpMethodEnum, koaBody } from 'koa-body';
import type { Context, Next } from 'koa';
import { ApiError, validationError, type ErrorDetail } from '../../lib/errors.js';

/** Content types read as JSON: JSON itself, and none or `text/plain` (what `fetch` sends for a string body). */
const READ_AS_JSON = ['application/json', '+json', 'text/plain'];
/** `Content-Type` headers that are JSON exactly as clients send them most often. */
const JSON_AS_SENT = new Set(['application/json', 'application/json; charset=utf-8', 'application/json; charset=UTF-8', 'application/json;charset=utf-8', 'application/json;charset=UTF-8']);

/**
 * The path (`where.__proto__`, `events[0].data.__proto__`) of the first `__proto__` key of a parsed
 * JSON value: such keys are refused (prototype poisoning), and the caller is told which field, like
 * any other field no schema allows. `JSON.parse` itself makes it a plain own property.
 */
function protoKeyOf(value: unknown): string | null {
  const walk = (v: unknown, path: string, depth: number): string | null => {
    if (v === null || typeof v !== 'object' || depth > 64) return null;
    if (Array.isArray(v)) {
      for (let i = 0; i < v.length; i++) {
        const found = walk(v[i], `${path}[${i}]`, depth + 1);
        if (found) return found;
      }
      return null;
    }
    for (const key of Object.keys(v)) {
      const at = path ? `${path}.${key}` : key;
      if (key === '__proto__') return at;
      const found = walk((v as Record<string, unknown>)[key], at, depth + 1);
      if (found) return found;
    }
    return null;
  };
  return walk(value, '', 0);
}

/**
 * A JSON text that may hold a `__proto__` key, escaped or not (`"\u005f_proto__"` parses to one as
 * well): only such a text is walked for one, so every other body costs no walk.
 */
const SUSPECT_PROTO = /"(?:_|\\u005[Ff])(?:_|\\u005[Ff])(?:p|\\u0070)(?:r|\\u0072)(?:o|\\u006[Ff])(?:t|\\u0074)(?:o|\\u006[Ff])(?:_|\\u005[Ff])(?:_|\\u005[Ff])"/;

/** UTF-8 that refuses what is not UTF-8, instead of reading each bad byte as U+FFFD; a leading BOM is dropped. */
const UTF8 = new TextDecoder('utf-8', { fatal: true });

/**
 * The text of a request body's bytes, which JSON requires to be UTF-8 (RFC 8259 8.1); 400 `parse`
 * when they are not. Read leniently, a byte that is not UTF-8 became U+FFFD and was stored so: an
 * externalId or property changed silently, and two message bodies differing only there made one
 * `Idempotency-Key` replay the other (probe BP).
 */
export function utf8Text(bytes: Buffer): string {
  try {
    return UTF8.decode(bytes);
  } catch {
    throw new ApiError(400, 'parse', 'Request body is not valid UTF-8 (JSON must be sent as UTF-8, RFC 8259)', { param: 'body' });
  }
}

/** Any byte outside ASCII in a body read one character per byte (latin1). */
const NOT_ASCII = /[^\x00-\x7f]/;

/**
 * The JSON value of a request body read one character per byte: ASCII as it stands, anything else
 * decoded as UTF-8 first (400 `parse` when it is not UTF-8, or not JSON); a `__proto__` key is 400
 * `validation` naming it. Any JSON value parses (`null` or `42` then fail the route's schema).
 */
function parseBody(bytes: string): unknown {
  const text = NOT_ASCII.test(bytes) ? utf8Text(Buffer.from(bytes, 'latin1')) : bytes;
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch {
    throw new ApiError(400, 'parse', 'Request body is not valid JSON', { param: 'body' });
  }
  const proto = SUSPECT_PROTO.test(text) ? protoKeyOf(value) : null;
  if (proto) throw validationError([{ param: proto, message: 'is not an allowed field' }]);
  return value;
}

/**
 * Deepest nesting of arrays and objects a body may have, the body itself being level 1. Code that
 * walks a value recursively (`JSON.stringify` among it) overflows the stack a few thousand levels
 * down, far below what the body limit lets brackets nest; no field of the API needs more.
 */
export const MAX_BODY_DEPTH = 64;

/** A lone surrogate: with the `u` flag a surrogate pair is one code point, so only an unpaired half matches. */
const LONE_SURROGATE = /\p{Cs}/u;

/**
 * The first problem (in document order) of a parsed body that no schema sees: nesting deeper than
 * MAX_BODY_DEPTH, a number too large for a double (`1e999` parses as Infinity, which JSON.stringify
 * stores as `null`: the caller's value would change silently), or a string, value or key, holding a lone surrogate. JSON's `\ud800` escape can
 * carry one, UTF-8 cannot: Redis would store U+FFFD instead, so a subscriber's externalId would no
 * longer match its partition (counted, never listed, never addressable) and Lua's cjson refuses the
 * escape (a message fan-out failing on every retry). Iterative: a body may nest thousands deep.
 */
function bodyProblem(body: unknown): ErrorDetail | null {
  return wellFormed(body) ? null : whereIllFormed(body);
}

/**
 * Whether a parsed body passes bodyProblem's checks, walking it without building paths: every
 * request's body goes through here, a 100-event batch in ~45 µs against ~180 µs with paths.
 */
function wellFormed(body: unknown): boolean {
  const values: unknown[] = [body];
  const levels: number[] = [1];
  while (values.length > 0) {
    const value = values.pop();
    const level = levels.pop()!;
    if (typeof value === 'string') {
      if (LONE_SURROGATE.test(value)) return false;
      continue;
    }
    if (typeof value === 'number' && !Number.isFinite(value)) return false;
    if (value === null || typeof value !== 'object') continue;
    if (level > MAX_BODY_DEPTH) return false;
    if (Array.isArray(value)) {
      for (const item of value) {
        values.push(item);
        levels.push(level + 1);
      }
      continue;
    }
    for (const [key, item] of Object.entries(value)) {
      if (LONE_SURROGATE.test(key)) return false;
      values.push(item);
      levels.push(level + 1);
    }
  }
  return true;
}

/** The first problem of a body that is not wellFormed, with its path. */
function whereIllFormed(body: unknown): ErrorDetail | null {
  const notWellFormed = (param: string): ErrorDetail => ({ param, message: 'must be well-formed Unicode: it holds a lone surrogate' });
  const stack: { value: unknown; path: string; level: number; badKey?: boolean }[] = [{ value: body, path: '', level: 1 }];
  while (stack.length > 0) {
    const { value, path, level, badKey } = stack.pop()!;
    if (badKey || (typeof value === 'string' && LONE_SURROGATE.test(value))) return notWellFormed(path || 'body');
    if (typeof value === 'number' && !Number.isFinite(value)) return { param: path || 'body', message: 'must be a number within the range of a double (it overflows to infinity)' };
    if (value === null || typeof value !== 'object') continue;
    if (level > MAX_BODY_DEPTH) return { param: path || 'body', message: `nests arrays and objects deeper than ${MAX_BODY_DEPTH} levels` };
    const children = Array.isArray(value)
      ? value.map((item, i) => ({ value: item as unknown, path: `${path}[${i}]`, level: level + 1 }))
      : Object.entries(value).map(([key, item]) => ({ value: item, path: path ? `${path}.${key}` : key, level: level + 1, badKey: LONE_SURROGATE.test(key) }));
    for (let i = children.length - 1; i >= 0; i--) stack.push(children[i]!);
  }
  return null;
}

/**
 * The first problem of a JSON value parsed outside koa-body (a source's delivery, read as exact
 * bytes) that every request body is refused for: a `__proto__` key, or what bodyProblem finds.
 */
export function parsedJsonProblem(value: unknown): ErrorDetail | null {
  const proto = protoKeyOf(value);
  return proto ? { param: proto, message: 'is not an allowed field' } : bodyProblem(value);
}

/** What reading a body throws (http-errors shaped, or a zlib error for a corrupt compressed body), as the service's error. */
function bodyError(err: unknown, limitBytes: number): ApiError {
  if (err instanceof ApiError) return err;
  const e = err as { status?: number; type?: string; code?: string; message?: string };
  if (e?.type === 'entity.too.large' || e?.status === 413) return new ApiError(413, 'payload_too_large', `Request body is larger than the limit of ${limitBytes} bytes`);
  if (e?.type === 'encoding.unsupported' || e?.status === 415) return new ApiError(400, 'bad_request', 'Unsupported Content-Encoding; send the body uncompressed, gzip, deflate or br', { param: 'Content-Encoding' });
  // zlib's Z_DATA_ERROR, Z_BUF_ERROR, ERR_BROTLI_…, ERR__ERROR_FORMAT_… (probe BP: said "not valid JSON")
  if (typeof e?.code === 'string' && /^(Z_|ERR_BROTLI|ERR__|ERR_ZLIB)/.test(e.code)) {
    return new ApiError(400, 'parse', 'Request body is not valid for its Content-Encoding (a corrupt or truncated compressed stream)', { param: 'body' });
  }
  return new ApiError(400, 'parse', 'Request body is not valid JSON', { param: 'body' });
}

/**
 * A body the JSON layer refused (not UTF-8, not JSON, a `__proto__` key, beyond what any body may
 * hold), handed to a route that must weigh it before answering its problem: under an
 * `Idempotency-Key` already used, any other body is 409 `idempotency_key_reused` (spec 4.2), this
 * one too (probe X2: it was 400). The route throws `error` otherwise.
 */
export class RefusedBody {
  constructor(readonly error: ApiError) {}
}

/**
 * Reads a request's JSON body within `limitBytes`. Runs inside `authorize`, after the caller is
 * authenticated, so an anonymous request is answered 401 without its body being read.
 * GET and HEAD read none. Any JSON value parses (`null` or `42` then fail the route's schema
 * with `validation`); a body in another media type (a form, multipart) is 400 `bad_request`.
 * With `refusedToRoute`, a body it refuses reaches the route as a `RefusedBody` instead of its 400.
 */
export function jsonBody(limitBytes: number, options: { refusedToRoute?: boolean } = {}) {
  // read as text one character per byte, then decoded as UTF-8 strictly by parseBody (`binary`:
  // iconv-lite's `latin1` is a table lookup in JavaScript, 25 times slower on a large body; probe BV):
  // koa-body's JSON reading decodes leniently (a byte that is not UTF-8 becomes U+FFFD, silently)
  const read = koaBody({ json: false, urlencoded: false, text: true, multipart: false, textLimit: limitBytes, encoding: 'binary', parsedMethods: [HttpMethodEnum.POST, HttpMethodEnum.PUT, HttpMethodEnum.PATCH, HttpMethodEnum.DELETE] });
  return async function body(ctx: Context, next: Next): Promise<void> {
    if (ctx.method === 'GET' || ctx.method === 'HEAD') return next();
    const hasBody = Number(ctx.get('Content-Length') || 0) > 0 || Boolean(ctx.get('Transfer-Encoding'));
    if (!hasBody) {
      ctx.request.body = {}; // no body reads as an empty object, as a body-less POST (replay, rotate) expects
      return next();
    }
    const type = ctx.get('Content-Type');
    // none, text/plain and every +json type are read as JSON (probe M: application/merge-patch+json
    // bodies went unread and were answered "body: must be object"); the usual headers need no
    // media-type parsing (type-is)
    if (!JSON_AS_SENT.has(type) && type && !ctx.is(READ_AS_JSON)) throw new ApiError(400, 'bad_request', 'Send the request body as JSON (Content-Type: application/json)', { param: 'Content-Type' });
    ctx.request.headers['content-type'] = 'text/plain';
    // content codings are case-insensitive, and x-gzip is gzip (RFC 9110 8.4.1); the inflater knows only the lowercase names
    const coding = ctx.get('Content-Encoding');
    if (coding) ctx.request.headers['content-encoding'] = coding.toLowerCase().replace(/\bx-gzip\b/g, 'gzip');
    try {
      await read(ctx, async () => {});
    } catch (err) {
      throw bodyError(err, limitBytes);
    }
    const bytes = ctx.request.body as unknown;
    try {
      // a chunked body with nothing in it reads as an empty object, as a Content-Length: 0 one does
      ctx.request.body = typeof bytes === 'string' && bytes !== '' ? parseBody(bytes) : {};
      const problem = bodyProblem(ctx.request.body);
      if (problem) throw validationError([problem]);
    } catch (err) {
      if (!options.refusedToRoute || !(err instanceof ApiError)) throw err;
      ctx.request.body = new RefusedBody(err);
    }
    return next();
  };
}
