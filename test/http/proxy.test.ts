import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { auditEntries } from '../helpers/audit.js';
import { client } from '../helpers/api.js';
import { bootstrapWorkspace, startTestService, type TestService } from '../helpers/service.js';
import { waitFor } from '../helpers/wait.js';

/** Which forwarded headers the web role believes (TRUST_PROXY_HOPS): the audit's request.ip and the events token url. */
const proxy = suite('forwarded headers');

async function topicAudit(service: TestService, name: string, headers: Record<string, string>) {
  const api = client(service.url);
  const boot = await bootstrapWorkspace(service, name);
  assert.is((await api.post('/v1/topics', boot.keys.tenant, { slug: 'proxied' }, headers)).status, 201);
  const entry = await waitFor('topic.created audited', async () => (await auditEntries(service, boot.workspace.id)).find((e) => e.type === 'topic.created'), 5_000);
  const token = await api.get('/v1/events/token', boot.keys.tenant, headers);
  return { ip: entry.request.ip as string, url: token.body.data.url as string };
}

const FORWARDED = { 'x-forwarded-for': '6.6.6.6, 198.51.100.9', 'x-forwarded-proto': 'https', 'x-forwarded-host': 'api.example.com' };

proxy('by default one proxy is trusted: the address it appended (the rightmost), not what the caller wrote before it', async () => {
  const service = await startTestService('proxy-one');
  try {
    const seen = await topicAudit(service, 'proxy-one', FORWARDED);
    assert.is(seen.ip, '198.51.100.9');
    assert.is(seen.url, 'https://api.example.com/v1/events');
  } finally {
    await service.stop();
  }
});

proxy('TRUST_PROXY_HOPS=2 believes two entries from the right; 0 believes no forwarded header', async () => {
  const two = await startTestService('proxy-two', { TRUST_PROXY_HOPS: '2' });
  try {
    assert.is((await topicAudit(two, 'proxy-two', FORWARDED)).ip, '6.6.6.6');
  } finally {
    await two.stop();
  }
  const none = await startTestService('proxy-none', { TRUST_PROXY_HOPS: '0' });
  try {
    const seen = await topicAudit(none, 'proxy-none', FORWARDED);
    assert.match(seen.ip, /^127\.0\.0\.1$|^::1$/, 'an IPv4 peer as IPv4, not ::ffff:127.0.0.1');
    assert.match(seen.url, /^http:\/\/(127\.0\.0\.1|localhost):\d+\/v1\/events$/);
  } finally {
    await none.stop();
  }
});

proxy('X-Forwarded-Host and -Proto are read from the right as X-Forwarded-For is: what a caller writes before the trusted proxy\'s entry is ignored (probe M)', async () => {
  const service = await startTestService('proxy-host');
  try {
    const seen = await topicAudit(service, 'proxy-host', { 'x-forwarded-for': '6.6.6.6, 198.51.100.9', 'x-forwarded-proto': 'https, http', 'x-forwarded-host': 'evil.example, api.example.com' });
    assert.is(seen.url, 'http://api.example.com/v1/events');
  } finally {
    await service.stop();
  }
});

proxy('a forwarded or own Host, or a forwarded Proto, that is not a URL\'s part gives the service\'s own address in the URLs answers give (probe CI: http://a b/…, javascript://…)', async () => {
  const service = await startTestService('proxy-bad-host');
  try {
    const { port } = new URL(service.url);
    const api = client(service.url);
    const boot = await bootstrapWorkspace(service, 'proxy-bad-host');
    const urlWith = async (headers: Record<string, string>) => (await api.get('/v1/events/token', boot.keys.tenant, headers)).body.data.url as string;
    for (const host of ['a b', 'x/y?z#', 'evil.example/path', 'user@evil.example']) assert.is(await urlWith({ 'x-forwarded-host': host }), `http://127.0.0.1:${port}/v1/events`, host);
    assert.is(await urlWith({ 'x-forwarded-proto': 'javascript', 'x-forwarded-host': 'api.example.com' }), 'http://api.example.com/v1/events');
    assert.is(await urlWith({ 'x-forwarded-proto': 'HTTPS', 'x-forwarded-host': 'API.example.com:8443' }), 'https://api.example.com:8443/v1/events');
    assert.is(await urlWith({ 'x-forwarded-host': '[::1]:9000' }), 'http://[::1]:9000/v1/events');
    // the service's own address goes with its own scheme, whatever Proto came with the bad host (probe DA)
    assert.is(await urlWith({ 'x-forwarded-proto': 'https', 'x-forwarded-host': 'a b' }), `http://127.0.0.1:${port}/v1/events`);
    // container and compose service names have underscores; a final dot is the same name
    assert.is(await urlWith({ 'x-forwarded-host': 'herald_web:3000' }), 'http://herald_web:3000/v1/events');
    assert.is(await urlWith({ 'x-forwarded-host': 'api.example.com.' }), 'http://api.example.com/v1/events');
    assert.is(await urlWith({ 'x-forwarded-host': 'api.example.com.:8443' }), 'http://api.example.com:8443/v1/events');
  } finally {
    await service.stop();
  }
});

proxy.run();
