/**
 * Outbound webhook URL safety (spec 2.5, 7 `invalid_url`): refuse URLs and addresses that
 * reach loopback, private, link-local and other non-public networks, unless an operator
 * opened them with `WEBHOOK_ALLOW_PRIVATE_NETWORKS`.
 *
 * Three layers: `checkWebhookUrl` on the URL text, `resolveAndCheck` on every address a
 * name resolves to, and `guardedLookup` inside the HTTP client, so a name that re-resolves
 * to a private address between the check and the send (DNS rebinding) is still refused.
 */
import { lookup as dnsLookup, promises as dnsPromises, type LookupAddress } from 'node:dns';
import { BlockList, isIP, isIPv4, type LookupFunction } from 'node:net';

/** `code` of the error `guardedLookup` fails a connection with. */
export const PRIVATE_ADDRESS_ERROR_CODE = 'ERR_WEBHOOK_PRIVATE_ADDRESS';

export type AllowList = { allows(ip: string): boolean };

export type UrlCheck = { ok: true; url: URL } | { ok: false; reason: string };

export type ResolveCheck = { ok: true; addresses: LookupAddress[] } | { ok: false; reason: string };

/** The promise-style lookup `resolveAndCheck` calls; `dns.promises.lookup` by default. */
export type ResolveAll = (hostname: string, options: { all: true }) => Promise<LookupAddress[]>;

type Family = 'ipv4' | 'ipv6';
type Range = { reason: string; list: BlockList };

function ranges(family: Family, table: [reason: string, cidrs: string[]][]): Range[] {
  return table.map(([reason, cidrs]) => {
    const list = new BlockList();
    for (const cidr of cidrs) {
      const [network, prefix] = cidr.split('/');
      list.addSubnet(network!, Number(prefix), family);
    }
    return { reason, list };
  });
}

// First match wins, so a narrower range sits above the wider one that contains it.
// IPv4 and IPv6 stay in separate lists: a BlockList checks an IPv4 address against its
// IPv6 rules as ::ffff:a.b.c.d, which ::/8 would then match.
const IPV4_RANGES = ranges('ipv4', [
  ['unspecified', ['0.0.0.0/8']],
  ['private', ['10.0.0.0/8', '172.16.0.0/12', '192.168.0.0/16']],
  ['cgnat', ['100.64.0.0/10']],
  ['loopback', ['127.0.0.0/8']],
  ['link-local', ['169.254.0.0/16']],
  ['documentation', ['192.0.2.0/24', '198.51.100.0/24', '203.0.113.0/24']],
  ['benchmarking', ['198.18.0.0/15']],
  ['multicast', ['224.0.0.0/4']],
  ['broadcast', ['255.255.255.255/32']],
  ['reserved', ['192.0.0.0/24', '192.88.99.0/24', '240.0.0.0/4']],
]);

const IPV6_RANGES = ranges('ipv6', [
  ['unspecified', ['::/128']],
  ['loopback', ['::1/128']],
  // The rest of ::/8: IPv4-compatible and IPv4-translated forms, unassigned space.
  ['reserved', ['::/8', '100::/64']],
  ['benchmarking', ['2001:2::/48']],
  // IETF protocol assignments: Teredo (which hides an IPv4 address), ORCHID, and others.
  ['reserved', ['2001::/23']],
  ['documentation', ['2001:db8::/32', '3fff::/20']],
  ['reserved', ['5f00::/16']],
  ['unique-local', ['fc00::/7']],
  ['link-local', ['fe80::/10']],
  ['site-local', ['fec0::/10']],
  ['multicast', ['ff00::/8']],
]);

// Only 2000::/3 is handed out for global unicast; anything outside it is not a webhook receiver.
const [GLOBAL_UNICAST] = ranges('ipv6', [['global-unicast', ['2000::/3']]]);

function stripZone(ip: string): string {
  const percent = ip.indexOf('%');
  return percent < 0 ? ip : ip.slice(0, percent);
}

/** The eight 16-bit groups of a valid IPv6 address (without zone). */
function ipv6Groups(ip: string): number[] {
  let text = ip;
  const lastColon = text.lastIndexOf(':');
  const tail = text.slice(lastColon + 1);
  if (isIPv4(tail)) {
    const [a, b, c, d] = tail.split('.').map(Number) as [number, number, number, number];
    text = `${text.slice(0, lastColon + 1)}${((a << 8) | b).toString(16)}:${((c << 8) | d).toString(16)}`;
  }
  const [head = '', rest] = text.split('::');
  const words = (part: string | undefined) => (part ? part.split(':').map((word) => parseInt(word, 16)) : []);
  const left = words(head);
  const right = words(rest);
  return [...left, ...new Array<number>(8 - left.length - right.length).fill(0), ...right];
}

function ipv4FromWords(high: number, low: number): string {
  return `${high >> 8}.${high & 255}.${low >> 8}.${low & 255}`;
}

/**
 * The IPv4 address an IPv6 address stands for, when it is one of the forms that reach IPv4:
 * IPv4-mapped `::ffff:0:0/96`, NAT64 `64:ff9b::/96` and 6to4 `2002::/16`.
 */
function embeddedIPv4(ip: string): string | null {
  const g = ipv6Groups(ip);
  const zeros = (from: number, to: number) => g.slice(from, to).every((word) => word === 0);
  if (zeros(0, 5) && g[5] === 0xffff) return ipv4FromWords(g[6]!, g[7]!);
  if (g[0] === 0x64 && g[1] === 0xff9b && zeros(2, 6)) return ipv4FromWords(g[6]!, g[7]!);
  if (g[0] === 0x2002) return ipv4FromWords(g[1]!, g[2]!);
  return null;
}

/**
 * Null when `ip` is publicly routable, else a short reason (`loopback`, `private`, ...).
 * Anything that is not an IP address is `invalid`. IPv6 forms that carry an IPv4 address
 * are judged by that address.
 */
export function classifyAddress(ip: string): string | null {
  const address = stripZone(ip);
  const family = isIP(address);
  if (family === 4) return IPV4_RANGES.find((range) => range.list.check(address, 'ipv4'))?.reason ?? null;
  if (family !== 6) return 'invalid';
  const v4 = embeddedIPv4(address);
  if (v4 !== null) return classifyAddress(v4);
  const match = IPV6_RANGES.find((range) => range.list.check(address, 'ipv6'));
  if (match) return match.reason;
  return GLOBAL_UNICAST!.list.check(address, 'ipv6') ? null : 'reserved';
}

/**
 * An allow list from CIDRs such as `127.0.0.0/8` and `::1/128`; throws on a malformed one.
 * IPv4-mapped IPv6 addresses also match the IPv4 rules.
 */
export function createAllowList(cidrs: string[]): AllowList {
  const v4 = new BlockList();
  const v6 = new BlockList();
  let empty = true;
  for (const raw of cidrs) {
    const cidr = raw.trim();
    const match = /^([^/]+)\/(\d{1,3})$/.exec(cidr);
    const family = match ? isIP(match[1]!) : 0;
    const prefix = match ? Number(match[2]) : NaN;
    if (!match || family === 0 || prefix > (family === 4 ? 32 : 128)) {
      throw new Error(`"${raw}" is not a CIDR like 10.0.0.0/8 or fd00::/8 (a single address is 10.0.0.1/32)`);
    }
    if (family === 4) v4.addSubnet(match[1]!, prefix, 'ipv4');
    else v6.addSubnet(match[1]!, prefix, 'ipv6');
    empty = false;
  }
  return {
    allows(ip: string): boolean {
      if (empty) return false;
      const address = stripZone(ip);
      const family = isIP(address);
      if (family === 4) return v4.check(address, 'ipv4');
      if (family !== 6) return false;
      if (v6.check(address, 'ipv6')) return true;
      const g = ipv6Groups(address);
      const mapped = g.slice(0, 5).every((word) => word === 0) && g[5] === 0xffff;
      return mapped && v4.check(ipv4FromWords(g[6]!, g[7]!), 'ipv4');
    },
  };
}

function refusal(address: string, allow: AllowList): string | null {
  const reason = classifyAddress(address);
  return reason === null || allow.allows(address) ? null : reason;
}

function isLocalhostName(hostname: string): boolean {
  const name = hostname.replace(/\.+$/, '');
  return name === 'localhost' || name.endsWith('.localhost');
}

/**
 * Synchronous checks of a webhook URL: absolute http(s), https in production, no
 * credentials, and no IP literal or `localhost` name outside the public internet.
 * Names are checked when they resolve (`resolveAndCheck`, `guardedLookup`).
 */
export function checkWebhookUrl(raw: string, options: { production: boolean; allow: AllowList }): UrlCheck {
  let url: URL;
  try {
    url = new URL(raw);
  } catch {
    return { ok: false, reason: 'is not a valid absolute URL' };
  }
  if (url.protocol !== 'http:' && url.protocol !== 'https:') return { ok: false, reason: 'must use http or https' };
  if (options.production && url.protocol !== 'https:') return { ok: false, reason: 'must use https' };
  if (url.username !== '' || url.password !== '') return { ok: false, reason: 'must not contain credentials' };
  // port 0 reaches nothing: no attempt could ever connect (probe S)
  if (url.port === '0') return { ok: false, reason: 'must not use port 0' };
  // WHATWG URL has already turned 2130706433, 0x7f.1 and 0177.0.0.1 into 127.0.0.1.
  const host = url.hostname.replace(/^\[(.*)\]$/, '$1');
  if (host === '') return { ok: false, reason: 'has no host' };
  if (isIP(host) !== 0) {
    const reason = refusal(host, options.allow);
    return reason === null ? { ok: true, url } : { ok: false, reason: `points to ${article(reason)} ${reason} address (${host})` };
  }
  // localhost always means loopback (RFC 6761); open it by allowing a loopback address.
  if (isLocalhostName(host) && !options.allow.allows('127.0.0.1') && !options.allow.allows('::1')) {
    return { ok: false, reason: `points to a loopback address (${host})` };
  }
  return { ok: true, url };
}

/**
 * Resolves every address of `hostname` and refuses when any one of them is not public and
 * not allowed. DNS failures reject as they come from the lookup; they are not refusals.
 */
export async function resolveAndCheck(
  hostname: string,
  options: { allow: AllowList; lookup?: ResolveAll },
): Promise<ResolveCheck> {
  const host = hostname.replace(/^\[(.*)\]$/, '$1');
  const family = isIP(host);
  const resolveAll: ResolveAll = options.lookup ?? dnsPromises.lookup;
  const addresses = family !== 0 ? [{ address: host, family }] : await resolveAll(host, { all: true });
  if (addresses.length === 0) return { ok: false, reason: `${hostname} resolves to no address` };
  for (const { address } of addresses) {
    const reason = refusal(address, options.allow);
    if (reason !== null) return { ok: false, reason: `${hostname} resolves to ${article(reason)} ${reason} address (${address})` };
  }
  return { ok: true, addresses };
}

/** The error a refused connection fails with; `code` is `ERR_WEBHOOK_PRIVATE_ADDRESS`. */
export class PrivateAddressError extends Error {
  readonly code = PRIVATE_ADDRESS_ERROR_CODE;
  constructor(
    readonly hostname: string,
    readonly address: string,
    readonly reason: string,
  ) {
    super(`refusing to connect to ${address} (${reason}) for ${hostname}`);
    this.name = 'PrivateAddressError';
  }
}

/**
 * A `dns.lookup` replacement for the `lookup` option of `http.request` or an Agent that
 * fails the connection with `PrivateAddressError` when the address about to be used is not
 * public and not allowed. With `all: true` (Node's happy-eyeballs path) every address must pass.
 * Node does not call `lookup` for IP-literal hosts: check those with `checkWebhookUrl` at send time.
 */
export function guardedLookup(allow: AllowList, lookup: LookupFunction = dnsLookup): LookupFunction {
  return (hostname, options, callback) => {
    lookup(hostname, options, (err, result, family) => {
      if (err) return callback(err, result, family);
      const found = typeof result === 'string' ? [{ address: result, family: family ?? isIP(result) }] : result;
      for (const { address } of found) {
        const reason = refusal(address, allow);
        if (reason !== null) {
          return callback(new PrivateAddressError(hostname, address, reason), typeof result === 'string' ? '' : []);
        }
      }
      return callback(null, result, family);
    });
  };
}

/** `an` before a reason starting with a vowel (`an unspecified address`), else `a`. */
const article = (word: string) => (/^[aeiou]/i.test(word) ? 'an' : 'a');
