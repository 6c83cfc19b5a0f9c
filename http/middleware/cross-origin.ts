import type { Context, Next } from 'koa';
import { respond } from '../envelope.js';

/** Request headers a preflight allows when it names none (besides the CORS-safelisted ones). */
const ALLOWED_HEADERS = 'Authorization, Content-Type, Content-Encoding, Service-Tenant, Idempotency-Key';
/** Response headers a browser page may read. */
// Retry-After is not a safelisted response header: a web page could not read the wait a 429 or 503 asks for (probe EB)
const EXPOSED_HEADERS = 'Request-Id, Idempotent-Replayed, Allow, WWW-Authenticate, Retry-After';
/** Every method some route of the API takes; the actual request learns its route's own (404, or 405 with `Allow`). */
const METHODS = ['GET', 'HEAD', 'POST', 'PUT', 'PATCH', 'DELETE', 'OPTIONS'];
/** `Access-Control-Request-Headers` as browsers send it: header names (RFC 9110 tokens) separated by commas. */
const HEADER_LIST = /^[!#$%&'*+.^_`|~0-9A-Za-z-]+(?:\s*,\s*[!#$%&'*+.^_`|~0-9A-Za-z-]+)*$/;
/** The longest `Access-Control-Request-Headers` reflected (a page names a handful). */
const HEADER_LIST_MAX = 1024;

/** The CORS headers of every answer (crossOrigin and the HTTP server's answer to an unparsable request). */
export const CROSS_ORIGIN_HEADERS: Readonly<Record<string, string>> = {
  'Access-Control-Allow-Origin': '*',
  'Access-Control-Expose-Headers': EXPOSED_HEADERS,
};

/**
 * Cross-origin requests from browsers (CORS): a web app tracks with its client key (`source`
 * `web`) and a dashboard reads the event read models with an events token, both from pages on
 * other origins. Every credential is a bearer header, never a cookie, so any origin may call:
 *
 * - every answer carries `Access-Control-Allow-Origin: *` and the exposed headers, with or without
 *   an `Origin`, errors included (the page reads their envelope and `Request-Id`); being the same
 *   for every request, a shared cache can serve it to any (no `Vary: Origin` needed);
 * - a preflight (`OPTIONS` with `Origin` and `Access-Control-Request-Method`) is answered here, 200
 *   in the envelope, before Redis or the routes are consulted: every method, and the headers the
 *   page asked for. A path that does not exist, a method its route does not take or Redis being
 *   down is then told by the actual request's own answer (404, 405, 503), which the page can read;
 *   a refused preflight would reach it only as a network failure, which clients retry (Part 7).
 *
 * It runs inside the envelope middleware (the preflight answer has a request id).
 */
export function crossOrigin() {
  return function cors(ctx: Context, next: Next): Promise<void> {
    ctx.set(CROSS_ORIGIN_HEADERS);
    if (ctx.method !== 'OPTIONS' || ctx.get('Access-Control-Request-Method') === '' || ctx.get('Origin') === '') return next();
    const asked = ctx.get('Access-Control-Request-Headers').trim();
    ctx.set('Access-Control-Allow-Methods', METHODS.join(', '));
    ctx.set('Access-Control-Allow-Headers', asked !== '' && asked.length <= HEADER_LIST_MAX && HEADER_LIST.test(asked) ? asked : ALLOWED_HEADERS);
    ctx.set('Access-Control-Max-Age', '600');
    ctx.set('Vary', 'Access-Control-Request-Headers');
    respond(ctx, 200, { allow: METHODS });
    return Promise.resolve();
  };
}
