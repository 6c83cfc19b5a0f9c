import type { Context, Next } from 'koa';

/** Request headers a browser may send cross-origin (besides the CORS-safelisted ones). */
const ALLOWED_HEADERS = 'Authorization, Content-Type, Content-Encoding, Service-Tenant, Idempotency-Key';
/** Response headers a browser page may read. */
const EXPOSED_HEADERS = 'Request-Id, Idempotent-Replayed, Allow';

/**
 * Cross-origin requests from browsers (CORS): a web app tracks with its client key (`source`
 * `web`) and a dashboard reads the event read models with an events token, both from pages on
 * other origins. Every credential is a bearer header, never a cookie, so any origin may call:
 * `Access-Control-Allow-Origin: *` on every answer to a request with an `Origin`, errors included
 * (the page can read their envelope); a preflight (`OPTIONS` with `Access-Control-Request-Method`)
 * is answered as any OPTIONS is, in the envelope with `Allow`, plus the methods and headers it may
 * use. Requests without `Origin` (servers, the SDK) are untouched.
 */
export function crossOrigin() {
  return async function cors(ctx: Context, next: Next): Promise<void> {
    if (ctx.get('Origin') === '') return next();
    ctx.set('Access-Control-Allow-Origin', '*');
    ctx.set('Access-Control-Expose-Headers', EXPOSED_HEADERS);
    if (ctx.method !== 'OPTIONS' || ctx.get('Access-Control-Request-Method') === '') return next();
    ctx.set('Access-Control-Allow-Headers', ALLOWED_HEADERS);
    ctx.set('Access-Control-Max-Age', '600');
    await next();
    const allow = ctx.response.get('Allow');
    if (allow) ctx.set('Access-Control-Allow-Methods', allow);
  };
}
