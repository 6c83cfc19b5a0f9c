/**
 * The name resolution webhook URLs go through, at save time (`resolveAndCheck`) and at send
 * time (`guardedLookup`): the system resolver, which tests replace with `setWebhookResolver`
 * (as they move time with `setClockOffset`) to make a name's answer move to a private address.
 */
import { lookup as dnsLookup, promises as dnsPromises, type LookupAddress } from 'node:dns';
import type { LookupFunction } from 'node:net';
import type { ResolveAll } from './ssrf-guard.js';

/** Every address of a host name; rejects like `dns.lookup` (an `ENOTFOUND` error) when there is none. */
export type WebhookResolver = (hostname: string) => Promise<LookupAddress[]>;

let override: WebhookResolver | null = null;

/** Replaces the system resolver for webhook hosts in this process (tests only); null restores it. */
export function setWebhookResolver(resolver: WebhookResolver | null): void {
  override = resolver;
}

/** The promise-style lookup for `resolveAndCheck`. */
export function resolveAllFor(): ResolveAll {
  const current = override;
  return current ? (hostname) => current(hostname) : dnsPromises.lookup;
}

/** The callback-style lookup `guardedLookup` wraps (the `lookup` option of `http.request`). */
export const webhookLookup: LookupFunction = (hostname, options, callback) => {
  const current = override;
  if (!current) return dnsLookup(hostname, options, callback);
  current(hostname).then(
    (addresses) => {
      const wanted = options.family === 4 || options.family === 6 ? addresses.filter((a) => a.family === options.family) : addresses;
      if (wanted.length === 0) {
        const err = Object.assign(new Error(`getaddrinfo ENOTFOUND ${hostname}`), { code: 'ENOTFOUND', hostname });
        return callback(err, options.all ? [] : '', 0);
      }
      if (options.all) return callback(null, wanted);
      return callback(null, wanted[0]!.address, wanted[0]!.family);
    },
    (err: NodeJS.ErrnoException) => callback(err, options.all ? [] : '', 0),
  );
};
