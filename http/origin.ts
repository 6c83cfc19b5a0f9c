import type { Context } from 'koa';

/**
 * The origin the caller reached (`https://api.example.com`), for the URLs an answer gives (the events
 * token's `url`, a source's `inboundUrl`). Behind TRUST_PROXY_HOPS proxies `X-Forwarded-Proto` and
 * `-Host` are read as `X-Forwarded-For` is: the entry `hops` from the right, the one the outermost
 * trusted proxy wrote. Koa's `ctx.origin` takes the first entry, which the caller controls when a proxy
 * appends (probe M: `X-Forwarded-Host: evil.example, real.example` gave evil.example). Without a trusted
 * proxy, the request's own scheme and `Host`.
 */
export function requestOrigin(ctx: Context, hops: number): string {
  if (hops === 0) return ctx.origin;
  const trusted = (name: string): string | undefined => {
    const entries = ctx.get(name).split(',').map((entry) => entry.trim()).filter(Boolean);
    return entries.length ? entries[Math.max(0, entries.length - hops)] : undefined;
  };
  const proto = trusted('X-Forwarded-Proto') ?? ctx.protocol;
  return `${proto}://${trusted('X-Forwarded-Host') ?? ctx.get('Host')}`;
}
