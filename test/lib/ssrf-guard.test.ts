import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { createServer, get, type Server } from 'node:http';
import type { AddressInfo, LookupFunction } from 'node:net';
import {
  PRIVATE_ADDRESS_ERROR_CODE,
  PrivateAddressError,
  checkWebhookUrl,
  classifyAddress,
  createAllowList,
  guardedLookup,
  resolveAndCheck,
} from '../../lib/ssrf-guard.js';

const NONE = createAllowList([]);
const LOOPBACK = createAllowList(['127.0.0.0/8', '::1/128']);

function expectReasons(cases: [ip: string, reason: string | null][]): void {
  for (const [ip, reason] of cases) assert.is(classifyAddress(ip), reason, `${ip} should be ${reason ?? 'public'}`);
}

const classify = suite('address classification');

classify('every special IPv4 range is refused with its reason, edges included', () => {
  expectReasons([
    ['0.0.0.0', 'unspecified'],
    ['0.255.255.255', 'unspecified'],
    ['10.0.0.0', 'private'],
    ['10.255.255.255', 'private'],
    ['100.64.0.0', 'cgnat'],
    ['100.127.255.255', 'cgnat'],
    ['127.0.0.1', 'loopback'],
    ['127.255.255.254', 'loopback'],
    ['169.254.0.1', 'link-local'],
    ['169.254.169.254', 'link-local'],
    ['172.16.0.0', 'private'],
    ['172.31.255.255', 'private'],
    ['192.0.0.8', 'reserved'],
    ['192.0.2.1', 'documentation'],
    ['192.88.99.1', 'reserved'],
    ['192.168.0.1', 'private'],
    ['192.168.255.255', 'private'],
    ['198.18.0.1', 'benchmarking'],
    ['198.19.255.255', 'benchmarking'],
    ['198.51.100.7', 'documentation'],
    ['203.0.113.9', 'documentation'],
    ['224.0.0.1', 'multicast'],
    ['239.255.255.255', 'multicast'],
    ['240.0.0.1', 'reserved'],
    ['255.255.255.254', 'reserved'],
    ['255.255.255.255', 'broadcast'],
  ]);
});

classify('public IPv4 addresses next to the special ranges are allowed', () => {
  expectReasons([
    ['1.1.1.1', null],
    ['8.8.8.8', null],
    ['9.255.255.255', null],
    ['11.0.0.0', null],
    ['100.63.255.255', null],
    ['100.128.0.0', null],
    ['126.255.255.255', null],
    ['128.0.0.0', null],
    ['169.253.255.255', null],
    ['169.255.0.0', null],
    ['172.15.255.255', null],
    ['172.32.0.0', null],
    ['192.0.1.1', null],
    ['192.0.3.1', null],
    ['192.167.255.255', null],
    ['192.169.0.0', null],
    ['198.17.255.255', null],
    ['198.20.0.0', null],
    ['223.255.255.255', null],
  ]);
});

classify('every special IPv6 range is refused with its reason', () => {
  expectReasons([
    ['::', 'unspecified'],
    ['::1', 'loopback'],
    ['0:0:0:0:0:0:0:1', 'loopback'],
    ['::2', 'reserved'],
    ['::127.0.0.1', 'reserved'],
    ['100::1', 'reserved'],
    ['2001::1', 'reserved'],
    ['2001:1ff::1', 'reserved'],
    ['2001:2::1', 'benchmarking'],
    ['2001:db8::1', 'documentation'],
    ['2001:db8:ffff::1', 'documentation'],
    ['3fff::1', 'documentation'],
    ['5f00::1', 'reserved'],
    ['fc00::1', 'unique-local'],
    ['fd12:3456:789a::1', 'unique-local'],
    ['fe80::1', 'link-local'],
    ['fe80::1%eth0', 'link-local'],
    ['febf::1', 'link-local'],
    ['fec0::1', 'site-local'],
    ['ff02::1', 'multicast'],
    ['ff0e::1', 'multicast'],
    ['4000::1', 'reserved'],
    ['1000::1', 'reserved'],
  ]);
});

classify('public IPv6 addresses are allowed', () => {
  expectReasons([
    ['2606:4700:4700::1111', null],
    ['2001:4860:4860::8888', null],
    ['2a00:1450:4001:80b::200e', null],
    ['2001:200::1', null],
    ['2001:db9::1', null],
  ]);
});

classify('IPv4-mapped IPv6 addresses are judged by the IPv4 address they carry', () => {
  expectReasons([
    ['::ffff:127.0.0.1', 'loopback'],
    ['::ffff:7f00:1', 'loopback'],
    ['::FFFF:7F00:0001', 'loopback'],
    ['0:0:0:0:0:ffff:7f00:1', 'loopback'],
    ['::ffff:10.1.2.3', 'private'],
    ['::ffff:a9fe:a9fe', 'link-local'],
    ['::ffff:0.0.0.0', 'unspecified'],
    ['::ffff:8.8.8.8', null],
    ['::ffff:808:808', null],
  ]);
});

classify('NAT64 and 6to4 addresses are judged by the IPv4 address they carry', () => {
  expectReasons([
    ['64:ff9b::127.0.0.1', 'loopback'],
    ['64:ff9b::a00:1', 'private'],
    ['64:ff9b::8.8.8.8', null],
    ['64:ff9b:1::1', 'reserved'],
    ['2002:7f00:1::', 'loopback'],
    ['2002:c0a8:101::1', 'private'],
    ['2002:808:808::1', null],
  ]);
});

classify('anything that is not an IP address is invalid', () => {
  expectReasons([
    ['example.com', 'invalid'],
    ['', 'invalid'],
    ['010.0.0.1', 'invalid'],
    ['1.2.3', 'invalid'],
    ['[::1]', 'invalid'],
  ]);
});

classify.run();

const allowList = suite('private network allow list');

allowList('an allow list opens exactly the CIDRs it names, IPv4 and IPv6', () => {
  const allow = createAllowList(['127.0.0.0/8', ' 10.1.0.0/16 ', '::1/128', 'fd00::/8']);
  assert.ok(allow.allows('127.0.0.1'));
  assert.ok(allow.allows('127.200.0.9'));
  assert.ok(allow.allows('10.1.255.1'));
  assert.not.ok(allow.allows('10.2.0.1'));
  assert.ok(allow.allows('::1'));
  assert.ok(allow.allows('fd00::5'));
  assert.not.ok(allow.allows('fc00::5'));
  assert.not.ok(allow.allows('192.168.1.1'));
  assert.not.ok(allow.allows('not-an-ip'));
});

allowList('an IPv4 rule also opens the IPv4-mapped IPv6 form of its addresses', () => {
  const allow = createAllowList(['127.0.0.0/8']);
  assert.ok(allow.allows('::ffff:127.0.0.1'));
  assert.ok(allow.allows('::ffff:7f00:1'));
  assert.not.ok(allow.allows('::1'));
});

allowList('an IPv6 rule never opens IPv4 addresses', () => {
  const allow = createAllowList(['::/0']);
  assert.ok(allow.allows('fe80::1'));
  assert.not.ok(allow.allows('127.0.0.1'));
  assert.not.ok(allow.allows('10.0.0.1'));
});

allowList('an empty allow list allows nothing', () => {
  assert.not.ok(NONE.allows('127.0.0.1'));
  assert.not.ok(NONE.allows('::1'));
});

allowList('a malformed CIDR is refused with a message naming it', () => {
  for (const bad of ['127.0.0.1', '127.0.0.0/33', '::1/129', 'localhost/8', '10.0.0.0/', '/8', '10.0.0.0/8/8', '10.0.0.0/-1', '']) {
    assert.throws(() => createAllowList([bad]), (err: Error) => err.message.includes(`"${bad}"`), bad);
  }
});

allowList.run();

const urls = suite('webhook URL check');

function refused(raw: string, production = false, allow = NONE): string {
  const result = checkWebhookUrl(raw, { production, allow });
  assert.not.ok(result.ok, `${raw} should be refused`);
  return result.ok ? '' : result.reason;
}

urls('a public https URL passes and comes back parsed', () => {
  const result = checkWebhookUrl('https://hooks.example.com:8443/in?x=1', { production: true, allow: NONE });
  assert.ok(result.ok);
  if (result.ok) assert.is(result.url.href, 'https://hooks.example.com:8443/in?x=1');
});

urls('a relative or unparseable URL is refused', () => {
  assert.match(refused('/hooks'), /valid absolute URL/);
  assert.match(refused('hooks.example.com/in'), /valid absolute URL/);
  assert.match(refused('http://'), /valid absolute URL/);
  assert.match(refused('http://1.2.3.4.5/'), /valid absolute URL/);
});

urls('only http and https schemes are accepted', () => {
  for (const raw of ['ftp://example.com/', 'file:///etc/passwd', 'gopher://example.com/', 'javascript:alert(1)', 'data:text/plain,x']) {
    assert.match(refused(raw), /http or https/, raw);
  }
});

urls('plain http is refused in production and accepted outside it', () => {
  assert.match(refused('http://hooks.example.com/', true), /https/);
  assert.ok(checkWebhookUrl('http://hooks.example.com/', { production: false, allow: NONE }).ok);
});

urls('a URL carrying a username or password is refused, not rewritten', () => {
  assert.match(refused('https://user:pass@hooks.example.com/'), /credentials/);
  assert.match(refused('https://user@hooks.example.com/'), /credentials/);
  assert.match(refused('https://:pass@hooks.example.com/'), /credentials/);
});

urls('port 0 is refused in every spelling (no attempt could connect); other ports stand (probe S)', () => {
  for (const raw of ['https://hooks.example.com:0/hook', 'https://hooks.example.com:00/', 'http://hooks.example.com:000/']) assert.match(refused(raw), /port 0/, raw);
  for (const raw of ['https://hooks.example.com:1/', 'https://hooks.example.com:8443/', 'https://hooks.example.com:65535/']) {
    assert.ok(checkWebhookUrl(raw, { production: false, allow: NONE }).ok, raw);
  }
});

urls('private IP literals are refused in every spelling URL parsing accepts', () => {
  const cases: [string, string][] = [
    ['http://127.0.0.1/', 'loopback'],
    ['http://2130706433/', 'loopback'],
    ['http://0x7f.1/', 'loopback'],
    ['http://0177.0.0.1/', 'loopback'],
    ['http://127.1/', 'loopback'],
    ['http://0x7f000001/', 'loopback'],
    ['http://[::1]:8080/', 'loopback'],
    ['http://[::ffff:127.0.0.1]/', 'loopback'],
    ['http://[::ffff:7f00:1]/', 'loopback'],
    ['http://0/', 'unspecified'],
    ['http://169.254.169.254/latest/meta-data/', 'link-local'],
    ['http://[fd00::1]/', 'unique-local'],
    ['http://10.0.0.1:9200/', 'private'],
    ['http://100.100.100.200/', 'cgnat'],
  ];
  for (const [raw, reason] of cases) {
    const why = refused(raw);
    assert.ok(why.includes(reason), `${raw}: ${why}`);
  }
});

urls('public IP literals pass', () => {
  assert.ok(checkWebhookUrl('https://8.8.8.8/', { production: true, allow: NONE }).ok);
  assert.ok(checkWebhookUrl('https://[2606:4700:4700::1111]/', { production: true, allow: NONE }).ok);
});

urls('localhost and names under .localhost are refused as loopback', () => {
  for (const raw of ['http://localhost/', 'http://LOCALHOST:3000/', 'http://localhost./', 'http://api.localhost/', 'http://a.b.localhost../']) {
    assert.match(refused(raw), /loopback/, raw);
  }
  assert.ok(checkWebhookUrl('http://localhostx.example/', { production: false, allow: NONE }).ok);
});

urls('an allow list opening 127.0.0.0/8 lets loopback URLs through', () => {
  const allow = createAllowList(['127.0.0.0/8']);
  for (const raw of ['http://127.0.0.1:8080/hook', 'http://2130706433/', 'http://[::ffff:127.0.0.1]/', 'http://localhost:3000/']) {
    assert.ok(checkWebhookUrl(raw, { production: false, allow }).ok, raw);
  }
  assert.match(refused('http://[::1]/', false, allow), /loopback/);
  assert.match(refused('http://10.0.0.1/', false, allow), /private/);
});

urls.run();

const resolving = suite('resolved address check');

function fakeResolver(addresses: string[]) {
  const calls: string[] = [];
  const lookup = async (hostname: string, _options: { all: true }) => {
    calls.push(hostname);
    return addresses.map((address) => ({ address, family: address.includes(':') ? 6 : 4 }));
  };
  return { lookup, calls };
}

resolving('a name resolving to a private address is refused with that address', async () => {
  const { lookup, calls } = fakeResolver(['10.0.0.7']);
  const result = await resolveAndCheck('hooks.example.com', { allow: NONE, lookup });
  assert.equal(calls, ['hooks.example.com']);
  assert.is(result.ok, false);
  if (!result.ok) assert.is(result.reason, 'hooks.example.com resolves to a private address (10.0.0.7)');
});

resolving('one private address among public ones is enough to refuse', async () => {
  const { lookup } = fakeResolver(['93.184.216.34', '2606:2800:220:1::1', '::ffff:169.254.169.254']);
  const result = await resolveAndCheck('hooks.example.com', { allow: NONE, lookup });
  assert.is(result.ok, false);
  if (!result.ok) assert.match(result.reason, /link-local/);
});

resolving('a name resolving only to public addresses passes with all of them', async () => {
  const { lookup } = fakeResolver(['93.184.216.34', '2606:2800:220:1::1']);
  const result = await resolveAndCheck('hooks.example.com', { allow: NONE, lookup });
  assert.equal(result, {
    ok: true,
    addresses: [
      { address: '93.184.216.34', family: 4 },
      { address: '2606:2800:220:1::1', family: 6 },
    ],
  });
});

resolving('allowed private addresses pass', async () => {
  const { lookup } = fakeResolver(['127.0.0.1', '::1']);
  assert.ok((await resolveAndCheck('receiver.internal', { allow: LOOPBACK, lookup })).ok);
  assert.not.ok((await resolveAndCheck('receiver.internal', { allow: createAllowList(['127.0.0.0/8']), lookup })).ok);
});

resolving('an IP literal is checked without a lookup', async () => {
  const { lookup, calls } = fakeResolver(['8.8.8.8']);
  assert.not.ok((await resolveAndCheck('[::1]', { allow: NONE, lookup })).ok);
  assert.not.ok((await resolveAndCheck('192.168.1.1', { allow: NONE, lookup })).ok);
  assert.equal(await resolveAndCheck('1.1.1.1', { allow: NONE, lookup }), { ok: true, addresses: [{ address: '1.1.1.1', family: 4 }] });
  assert.equal(calls, []);
});

resolving('no addresses is a refusal and a DNS failure rejects as it came', async () => {
  const { lookup } = fakeResolver([]);
  assert.not.ok((await resolveAndCheck('empty.example', { allow: NONE, lookup })).ok);
  const failing = async () => {
    throw Object.assign(new Error('getaddrinfo ENOTFOUND nowhere.invalid'), { code: 'ENOTFOUND' });
  };
  try {
    await resolveAndCheck('nowhere.invalid', { allow: NONE, lookup: failing });
    assert.unreachable('should have rejected');
  } catch (err) {
    assert.is((err as NodeJS.ErrnoException).code, 'ENOTFOUND');
  }
});

resolving('the real resolver is used by default and localhost resolves to loopback', async () => {
  const result = await resolveAndCheck('localhost', { allow: NONE });
  assert.is(result.ok, false);
  if (!result.ok) assert.match(result.reason, /^localhost resolves to a loopback address/);
});

resolving.run();

type LookupResult = { err: NodeJS.ErrnoException | null; address: unknown; family?: number };

/** A callback-style lookup that answers every name with `addresses`. */
function fakeLookup(addresses: string[]): LookupFunction {
  return (_hostname, options, callback) => {
    const all = addresses.map((address) => ({ address, family: address.includes(':') ? 6 : 4 }));
    if (options.all) callback(null, all);
    else callback(null, all[0]!.address, all[0]!.family);
  };
}

function runLookup(lookup: LookupFunction, hostname: string, all: boolean): Promise<LookupResult> {
  return new Promise((resolve) => lookup(hostname, { all }, (err, address, family) => resolve({ err, address, family })));
}

function fetchStatus(port: number, host: string, lookup: LookupFunction, family?: number): Promise<number> {
  return new Promise((resolve, reject) => {
    const req = get({ host, port, path: '/hook', lookup, family, agent: false }, (res) => {
      res.resume();
      res.on('end', () => resolve(res.statusCode ?? 0));
    });
    req.on('error', reject);
  });
}

const guarded = suite<{ server: Server; port: number; hits: number }>('guarded lookup at send time');

guarded.before(async (ctx) => {
  ctx.hits = 0;
  ctx.server = createServer((_req, res) => {
    ctx.hits++;
    res.end('ok');
  });
  await new Promise<void>((resolve) => ctx.server.listen(0, '127.0.0.1', resolve));
  ctx.port = (ctx.server.address() as AddressInfo).port;
});

guarded.after(async (ctx) => {
  ctx.server.closeAllConnections();
  await new Promise((resolve) => ctx.server.close(resolve));
});

guarded('a request to a name that resolves to 127.0.0.1 is refused before connecting', async (ctx) => {
  const lookup = guardedLookup(NONE, fakeLookup(['127.0.0.1']));
  try {
    await fetchStatus(ctx.port, 'receiver.example', lookup);
    assert.unreachable('the request should have failed');
  } catch (err) {
    assert.instance(err, PrivateAddressError);
    assert.is((err as NodeJS.ErrnoException).code, PRIVATE_ADDRESS_ERROR_CODE);
    assert.is((err as Error).message, 'refusing to connect to 127.0.0.1 (loopback) for receiver.example');
  }
  assert.is(ctx.hits, 0);
});

guarded('the same request succeeds when the allow list opens 127.0.0.0/8', async (ctx) => {
  const lookup = guardedLookup(createAllowList(['127.0.0.0/8']), fakeLookup(['127.0.0.1']));
  assert.is(await fetchStatus(ctx.port, 'receiver.example', lookup), 200);
  assert.is(ctx.hits, 1);
});

guarded('the real resolver is used by default: localhost is refused, then allowed', async (ctx) => {
  const before = ctx.hits;
  try {
    await fetchStatus(ctx.port, 'localhost', guardedLookup(NONE), 4);
    assert.unreachable('the request should have failed');
  } catch (err) {
    assert.is((err as NodeJS.ErrnoException).code, PRIVATE_ADDRESS_ERROR_CODE);
  }
  assert.is(await fetchStatus(ctx.port, 'localhost', guardedLookup(createAllowList(['127.0.0.0/8'])), 4), 200);
  assert.is(ctx.hits, before + 1);
});

guarded('a single-address lookup checks the one address it returns', async () => {
  const refusedOne = await runLookup(guardedLookup(NONE, fakeLookup(['192.168.0.10'])), 'nas.example', false);
  assert.is(refusedOne.err?.code, PRIVATE_ADDRESS_ERROR_CODE);
  assert.match(refusedOne.err?.message ?? '', /192\.168\.0\.10 \(private\)/);
  const passed = await runLookup(guardedLookup(NONE, fakeLookup(['93.184.216.34', '10.0.0.1'])), 'hooks.example', false);
  assert.equal(passed, { err: null, address: '93.184.216.34', family: 4 });
});

guarded('an all-addresses lookup is refused when any address is private', async () => {
  const mixed = await runLookup(guardedLookup(NONE, fakeLookup(['93.184.216.34', 'fe80::1'])), 'hooks.example', true);
  assert.is(mixed.err?.code, PRIVATE_ADDRESS_ERROR_CODE);
  assert.match(mixed.err?.message ?? '', /fe80::1 \(link-local\)/);
  const clean = await runLookup(guardedLookup(NONE, fakeLookup(['93.184.216.34', '2606:2800:220:1::1'])), 'hooks.example', true);
  assert.equal(clean.err, null);
  assert.equal(clean.address, [
    { address: '93.184.216.34', family: 4 },
    { address: '2606:2800:220:1::1', family: 6 },
  ]);
});

guarded('a resolver error is passed through unchanged', async () => {
  const failure = Object.assign(new Error('getaddrinfo ENOTFOUND nowhere.invalid'), { code: 'ENOTFOUND' });
  const failing: LookupFunction = (_hostname, _options, callback) => callback(failure, '');
  const result = await runLookup(guardedLookup(NONE, failing), 'nowhere.invalid', false);
  assert.is(result.err, failure);
});

guarded.run();
