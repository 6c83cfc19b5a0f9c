import type { Context, Next } from 'koa';

/**
 * `X-Forwarded-Host` and `-Proto` read as `X-Forwarded-For` is (TRUST_PROXY_HOPS): the entry `hops`
 * from the right, the one the outermost trusted proxy wrote. Koa takes the first entry, which the
 * caller controls when a proxy appends (probe M: `X-Forwarded-Host: evil.example, real.example` made
 * the events token's `url` and a source's `inboundUrl` point at evil.example). The header is narrowed
 * to that entry before anything reads it; with no trusted proxy Koa ignores both headers.
 */
export function trustedForwarding(hops: number) {
  return function forwarded(ctx: Context, next: Next): Promise<void> {
    if (hops > 0) {
      for (const name of ['x-forwarded-host', 'x-forwarded-proto']) {
        const value = ctx.req.headers[name];
        if (typeof value !== 'string' || !value.includes(',')) continue;
        const entries = value.split(',').map((entry) => entry.trim()).filter(Boolean);
        ctx.req.headers[name] = entries[Math.max(0, entries.length - hops)] ?? '';
      }
    }
    return next();
  };
}
