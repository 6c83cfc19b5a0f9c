import { randomBytes } from 'node:crypto';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import tls from 'node:tls';
import type { Redis } from 'ioredis';
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { PushSender, type PushJob } from '../../actors/push-sender.js';
import { loadConfig } from '../../lib/config.js';
import type { Logger } from '../../lib/log.js';
import { createSecretBox, type SecretBox } from '../../lib/secret-box.js';
import { setApnsCredentials } from '../../streams/apns-credentials.js';
import { createTenant, ensureWorkspace, type Tenant, type Workspace } from '../../streams/identity.js';
import { createKeys, type Keys } from '../../streams/keys.js';
import { connectRedis } from '../../streams/redis.js';
import { generateProviderKey, startApnsPeer, type ApnsPeer, type ProviderKey } from '../helpers/apns-peer.js';
import { testRedisUrl, uniquePrefix } from '../helpers/redis.js';
import { BY_TEST } from '../helpers/service.js';
import { waitFor } from '../helpers/wait.js';

const BUNDLE = 'com.example.herald';
const quiet: Logger = { debug() {}, info() {}, warn() {}, error() {} };
let deliveries = 0;

type Ctx = {
  redis: Redis; keys: Keys; box: SecretBox; dir: string; key: ProviderKey; peer: ApnsPeer;
  workspace: Workspace; env: Record<string, string>; senders: PushSender[];
};

function job(tenant: Tenant): PushJob {
  const n = String(++deliveries).padStart(6, '0');
  return {
    tenantId: tenant.id, token: randomBytes(32).toString('hex'), environment: 'production', content: { title: 'Hello', body: 'again' },
    messageId: `msg_idle${n}`, deliveryId: `dlv_idle${n}${randomBytes(4).toString('hex')}`,
  };
}

/** A sender over the test's Redis and peer; closed after the test. */
function sender(ctx: Ctx, idleMs: number, overrides: Record<string, string> = {}): PushSender {
  const made = new PushSender({ redis: ctx.redis, keys: ctx.keys, config: loadConfig({ ...ctx.env, ...overrides }, {}), log: quiet, idleMs });
  ctx.senders.push(made);
  return made;
}

/** Sends at once; settled, so that a send that rejects fails the test, not the run, while the test still waits on other things. */
function sendAll(pushes: PushSender, jobs: PushJob[]): Promise<(string | [string, number])[]> {
  return Promise.allSettled(jobs.map((j) => pushes.send(j)))
    .then((settled) => settled.map((s) => (s.status === 'fulfilled' ? [s.value.outcome, s.value.attempts] : `rejected: ${(s.reason as Error).message}`)));
}

async function tenantWith(ctx: Ctx, key: ProviderKey): Promise<Tenant> {
  const { tenant } = await createTenant(ctx.redis, ctx.keys, ctx.workspace, `idle-${++deliveries}`, BY_TEST);
  await storeKey(ctx, tenant, key);
  return tenant;
}

function storeKey(ctx: Ctx, tenant: Tenant, key: ProviderKey) {
  return setApnsCredentials(ctx.redis, ctx.keys, ctx.box, ctx.workspace, tenant, { keyId: key.keyId, teamId: key.teamId, bundleId: BUNDLE, privateKey: key.privateKeyPem }, BY_TEST);
}

const idle = suite<Ctx>('push sender: providers and limiters of idle tenants are closed');

idle.before(async (ctx) => {
  ctx.key = generateProviderKey();
  ctx.peer = await startApnsPeer({ keyId: ctx.key.keyId, teamId: ctx.key.teamId, publicKey: ctx.key.publicKey, topic: BUNDLE });
  ctx.dir = mkdtempSync(join(tmpdir(), 'herald-push-idle-'));
  const caFile = join(ctx.dir, 'apns-ca.pem');
  writeFileSync(caFile, ctx.peer.ca);
  const encryptionKey = randomBytes(32).toString('hex');
  ctx.box = createSecretBox(Buffer.from(encryptionKey, 'hex'));
  ctx.redis = connectRedis({ url: await testRedisUrl() });
  ctx.keys = createKeys(uniquePrefix('push-idle'));
  ({ workspace: ctx.workspace } = await ensureWorkspace(ctx.redis, ctx.keys, 'push-idle', BY_TEST));
  ctx.env = {
    APNS_HOST: '127.0.0.1', APNS_SANDBOX_HOST: '127.0.0.1', APNS_PORT: String(ctx.peer.port), APNS_CA_FILE: caFile,
    HERALD_ENCRYPTION_KEY: encryptionKey, APNS_RETRY_BASE_MS: '20', APNS_CREDENTIALS_CHECK_SECONDS: '0', LOG_LEVEL: 'error',
  };
  ctx.senders = [];
});
idle.before.each(async (ctx) => {
  // sessions of the previous test's senders end a moment after their close
  await waitFor('the previous sessions to end', async () => ctx.peer.openSessions === 0);
  ctx.peer.reset();
});
idle.after.each(async (ctx) => {
  await Promise.all(ctx.senders.map((s) => s.close()));
  ctx.senders = [];
});
idle.after(async (ctx) => {
  await ctx.peer?.close();
  await ctx.redis?.quit();
  if (ctx.dir) rmSync(ctx.dir, { recursive: true, force: true });
});

/**
 * Probe D: with APNS_CA_FILE each tenant's session built a TLS context of its own from Node's ~140
 * root certificates and the extra CA (about 1 MB and a burst of CPU each; 1,350 tenants at once
 * pinned the dispatcher). The providers share one context: opening many tenants' sessions makes none.
 */
idle('the sessions of many tenants share one TLS context: opening them builds none', async (ctx) => {
  const tenants = [];
  for (let i = 0; i < 6; i++) tenants.push(await tenantWith(ctx, ctx.key));
  const pushes = sender(ctx, 60_000);
  const original = tls.createSecureContext;
  let built = 0;
  tls.createSecureContext = (...args: Parameters<typeof original>) => {
    built++;
    return original(...args);
  };
  try {
    const results = await Promise.all(tenants.map((t) => pushes.send(job(t))));
    assert.equal(results.map((r) => r.outcome), tenants.map(() => 'sent'));
    assert.is(ctx.peer.sessionsOpened, tenants.length, 'a session per tenant');
  } finally {
    tls.createSecureContext = original;
  }
  assert.is(built, 0, 'no TLS context built per session');
});

idle('an unused provider and limiter are closed after the idle period; the next push opens a new session and is sent', async (ctx) => {
  const tenant = await tenantWith(ctx, ctx.key);
  const pushes = sender(ctx, 200);
  assert.is((await pushes.send(job(tenant))).outcome, 'sent');
  assert.equal(pushes.cached(), { providers: 1, limiters: 1 });
  assert.is(ctx.peer.openSessions, 1);
  await waitFor('the idle provider and limiter to close, and the peer to see the session end', async () => {
    const cached = pushes.cached();
    return cached.providers === 0 && cached.limiters === 0 && ctx.peer.openSessions === 0;
  });
  const again = await pushes.send(job(tenant));
  assert.equal([again.outcome, again.attempts], ['sent', 1]);
  assert.is(ctx.peer.sessionsOpened, 2, 'a new session for the later push');
  assert.equal(pushes.cached(), { providers: 1, limiters: 1 });
});

idle('pushes waiting in the limiter far longer than the idle period keep their provider and limiter, and go out on the first session', async (ctx) => {
  const tenant = await tenantWith(ctx, ctx.key);
  // one push a second: the third waits about two seconds, twenty idle periods
  const pushes = sender(ctx, 100, { APNS_RATE_PER_TENANT_PER_SECOND: '1' });
  let done = false;
  const all = sendAll(pushes, [job(tenant), job(tenant), job(tenant)]).finally(() => (done = true));
  await waitFor('the first push to reach the peer', async () => ctx.peer.received > 0);
  const seen = new Set<string>();
  while (!done) {
    seen.add(JSON.stringify(pushes.cached()));
    await new Promise((r) => setTimeout(r, 20));
  }
  assert.equal(await all, [['sent', 1], ['sent', 1], ['sent', 1]]);
  assert.equal([...seen], [JSON.stringify({ providers: 1, limiters: 1 })], 'never closed while pushes waited');
  assert.is(ctx.peer.sessionsOpened, 1);
  await waitFor('both to close once nothing waits', async () => pushes.cached().providers === 0 && pushes.cached().limiters === 0);
});

idle('a push that waited in the limiter longer than the idle period counts as a use when it ends, not when it was queued', async (ctx) => {
  const tenant = await tenantWith(ctx, ctx.key);
  // idle 1 s, swept every 500 ms; one push a second: the third waits about two seconds in the limiter
  const pushes = sender(ctx, 1_000, { APNS_RATE_PER_TENANT_PER_SECOND: '1' });
  assert.is((await pushes.send(job(tenant))).outcome, 'sent');
  const queuedAt = Date.now();
  assert.equal((await Promise.all([pushes.send(job(tenant)), pushes.send(job(tenant))])).map((r) => r.outcome), ['sent', 'sent']);
  assert.ok(Date.now() - queuedAt > 1_500, 'the third push waited past the idle period');
  // a sweep runs in these 600 ms: a limiter used 600 ms ago is kept (it was closed when its use dated from the queueing, 2 s before)
  await new Promise((r) => setTimeout(r, 600));
  assert.equal(pushes.cached(), { providers: 1, limiters: 1 });
  await waitFor('both to close once idle', async () => pushes.cached().providers === 0 && pushes.cached().limiters === 0);
});

idle('new credentials while pushes wait in the limiter: the waiting pushes still go out on the old provider, which closes after them', async (ctx) => {
  const tenant = await tenantWith(ctx, ctx.key);
  const pushes = sender(ctx, 60_000, { APNS_RATE_PER_TENANT_PER_SECOND: '1' });
  const waiting = sendAll(pushes, [job(tenant), job(tenant), job(tenant)]);
  await waitFor('the first push to reach the peer', async () => ctx.peer.received > 0);
  await storeKey(ctx, tenant, generateProviderKey());
  // this push reads the new (wrong) credentials: a new provider replaces the old one, still held by two pushes
  const rotated = await pushes.send(job(tenant));
  assert.equal([rotated.httpStatus, rotated.reason], [403, 'InvalidProviderToken']);
  assert.equal(await waiting, [['sent', 1], ['sent', 1], ['sent', 1]]);
  assert.is(ctx.peer.sessionsOpened, 2);
  await waitFor('the old session to end', async () => ctx.peer.openSessions === 1);
  assert.is(pushes.cached().providers, 1);
});

/**
 * A fan-out taken over by another dispatcher (the consumer runtime aborts its signal) must not go
 * on sending what waits in its limiter: the new owner sends those deliveries (probe S2: a dispatcher
 * stopped past the claim limit, then resumed, sent 76 pushes the new owner sent too).
 */
idle('once the signal aborts, pushes still waiting in the limiter are not sent and get no result', async (ctx) => {
  const tenant = await tenantWith(ctx, ctx.key);
  // one push at a time, each answered after 150 ms: the others wait in the limiter
  const pushes = sender(ctx, 60_000, { APNS_MAX_CONCURRENT_PER_TENANT: '1' });
  ctx.peer.respondWith({ delayMs: 150 });
  const controller = new AbortController();
  const heard: number[] = [];
  const sending = pushes.sendAll(Array.from({ length: 10 }, () => job(tenant)), (i) => heard.push(i), controller.signal);
  await waitFor('the first push answered', async () => heard.length >= 1, 5_000, 5);
  controller.abort();
  const results = await sending;
  const sent = results.filter((r) => r?.outcome === 'sent').length;
  assert.ok(sent >= 1 && sent <= 2, `only what was under way when it aborted was sent (${sent})`);
  assert.is(results.filter((r) => r === undefined).length, 10 - sent, 'the rest have no result');
  assert.is(ctx.peer.requests.length, sent, 'and never reached APNs');
});

idle.run();
