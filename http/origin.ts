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
  const own = { proto: ctx.protocol, host: ctx.get('Host') };
  const trusted = (name: string): string | undefined => {
    const entries = ctx.get(name).split(',').map((entry) => entry.trim()).filter(Boolean);
    return entries.length ? entries[Math.max(0, entries.length - hops)] : undefined;
  };
  const proto = hops === 0 ? own.proto : trusted('X-Forwarded-Proto')?.toLowerCase() ?? own.proto;
  const host = hops === 0 ? own.host : trusted('X-Forwarded-Host') ?? own.host;
  // only a URL's own parts: a host such as `a b` or `x/y?z#`, or a scheme such as `javascript`, made
  // the URL given out something else (probe CI); then the service's own address as the socket has it,
  // with the socket's own scheme (a forwarded https beside it named a URL nobody serves, probe DA)
  if (!HOST.test(host)) return `${ctx.req.socket && 'encrypted' in ctx.req.socket ? 'https' : 'http'}://${localHost(ctx)}`;
  return `${proto === 'https' ? 'https' : 'http'}://${host.toLowerCase().replace(/\.(?=:|$)/, '')}`;
}

/**
 * A host and optional port as a URL's authority holds it: a host name (labels of letters, digits,
 * `-` and `_`, as container and compose service names have them; a final dot, dropped) or IPv4
 * address, or a bracketed IPv6 one.
 */
const HOST = /^(?:[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?(?:\.[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?)*\.?|\[[0-9A-Fa-f:.]+\])(?::\d{1,5})?$/;

/** This service's address as the request's socket reached it. */
function localHost(ctx: Context): string {
  const socket = ctx.req.socket;
  const address = (socket?.localAddress ?? '127.0.0.1').replace(/^::ffff:/, '');
  return `${address.includes(':') ? `[${address}]` : address}:${socket?.localPort ?? 80}`;
}
