import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { sweepAuditOutboxes } from '../../actors/audit-outbox-sweeper.js';
import { createLogger } from '../../lib/log.js';
import { answersPing } from '../../streams/embedded-redis.js';
import { client, type Reply } from '../helpers/api.js';
import { freePort } from '../helpers/redis.js';
import { bootstrapWorkspace, startTestService, type TestService } from '../helpers/service.js';
import { waitFor } from '../helpers/wait.js';
import { startWebProcess } from '../helpers/audit.js';
import { stopRoleProcess } from '../helpers/processes.js';
import { partitionOf } from '../../lib/partition.js';

/**
 * Redis stopped and started again under a running web role (an operator restarting Redis, a
 * managed Redis failing over): requests during the outage are answered at once with the 503
 * `unavailable` envelope (clients retry 5xx, spec Part 7), health says so, and the service carries
 * on by itself once Redis is back. Until audit G a request during the outage waited in ioredis's
 * offline queue until the next flush of its reconnect loop: 11 s at first, then up to 42 s.
 */
type Ctx = { dir: string; port: number; redis: ChildProcess | null; service: TestService; api: ReturnType<typeof client>; key: string };
const outage = suite<Ctx>('redis outage');

async function startRedis(ctx: Ctx): Promise<void> {
  ctx.redis = spawn('redis-server', ['--port', String(ctx.port), '--bind', '127.0.0.1', '--dir', ctx.dir, '--appendonly', 'yes', '--appendfsync', 'always', '--save', ''], { stdio: 'ignore' });
  await waitFor('redis-server to answer', () => answersPing({ host: '127.0.0.1', port: ctx.port }, 200), 10_000);
}

async function stopRedis(ctx: Ctx): Promise<void> {
  const child = ctx.redis;
  if (!child || child.exitCode !== null) return;
  await new Promise<void>((done) => {
    child.once('exit', () => done());
    child.kill('SIGTERM');
  });
  ctx.redis = null;
}

/** The answer within `ms`, or a failure saying the request hung. */
async function within(ms: number, what: string, call: () => Promise<Reply>): Promise<Reply & { ms: number }> {
  const started = Date.now();
  let timer: NodeJS.Timeout | undefined;
  const hung = new Promise<never>((_, fail) => (timer = setTimeout(() => fail(new Error(`${what} did not answer within ${ms} ms`)), ms)));
  try {
    const reply = await Promise.race([call(), hung]);
    return { ...reply, ms: Date.now() - started };
  } finally {
    clearTimeout(timer);
  }
}

outage.before(async (ctx) => {
  ctx.dir = mkdtempSync(join(tmpdir(), 'herald-outage-'));
  ctx.port = await freePort();
  await startRedis(ctx);
  ctx.service = await startTestService('outage', { REDIS_URL: `redis://127.0.0.1:${ctx.port}` });
  ctx.api = client(ctx.service.url);
  ctx.key = (await bootstrapWorkspace(ctx.service, 'outage')).keys.tenant;
});

outage.after(async (ctx) => {
  if (!ctx.redis) await startRedis(ctx).catch(() => undefined); // a graceful stop needs Redis
  await ctx.service?.stop();
  await stopRedis(ctx);
  rmSync(ctx.dir, { recursive: true, force: true });
});

outage('requests while Redis is down answer 503 unavailable at once; once it is back the service carries on by itself', async (ctx) => {
  const { api, key } = ctx;
  const before = await api.post('/v1/events', key, { externalId: 'outage-1', name: 'before.outage' });
  assert.is(before.status, 202);

  await stopRedis(ctx);
  await waitFor('the service to see Redis gone', async () => ctx.service.redis.status !== 'ready', 5_000);
  // long enough for the reconnect loop to be past its first flush of queued commands
  await new Promise((r) => setTimeout(r, 1_500));
  for (const [what, call] of [
    ['POST /v1/events', () => api.post('/v1/events', key, { externalId: 'outage-1', name: 'during.outage' })],
    ['GET /v1/events', () => api.get('/v1/events', key)],
    ['GET /v1/subscribers/outage-1/timeline', () => api.get('/v1/subscribers/outage-1/timeline', key)],
  ] as const) {
    const reply = await within(5_000, what, call);
    assert.is(reply.status, 503, `${what}: ${reply.text}`);
    assert.is(reply.body.success, false);
    assert.is(reply.body.error.code, 'unavailable', what);
    assert.is(reply.headers.get('retry-after'), '5', `${what} says when to retry`);
    assert.ok(reply.ms < 3_000, `${what} answered in ${reply.ms} ms`);
  }
  // a page's preflight is answered all the same, so the page reads the 503 and retries (a refused preflight is a network error)
  const preflight = await fetch(`${ctx.service.url}/v1/client/events`, { method: 'OPTIONS', headers: { origin: 'https://app.example.com', 'access-control-request-method': 'POST' } });
  assert.is(preflight.status, 200);
  assert.is(preflight.headers.get('access-control-allow-origin'), '*');
  const health = await within(5_000, 'GET /v1/health', () => api.get('/v1/health'));
  // an error in the envelope like any other 503 (spec 2.1: success false, data null)
  assert.is(health.status, 503);
  assert.is(health.body.success, false);
  assert.is(health.body.data, null);
  assert.is(health.body.error.code, 'unavailable');

  await startRedis(ctx);
  await waitFor('the service to answer again', async () => (await within(5_000, 'GET /v1/health', () => api.get('/v1/health'))).status === 200, 15_000, 200);
  const after = await within(5_000, 'POST /v1/events', () => api.post('/v1/events', key, { externalId: 'outage-1', name: 'after.outage' }));
  assert.is(after.status, 202, after.text);
  const events = await api.get('/v1/events?limit=100', key);
  assert.is(events.status, 200);
});

outage('a Redis whose memory is full answers writes 503 unavailable, health says it refuses writes, and all carries on once it has room (probe X)', async (ctx) => {
  const { api, key } = ctx;
  assert.is((await api.post('/v1/events', key, { externalId: 'full-1', name: 'before.full' })).status, 202);
  const admin = ctx.service.redis;
  await admin.config('SET', 'maxmemory-policy', 'noeviction');
  await admin.config('SET', 'maxmemory', '1');
  try {
    for (const [what, call] of [
      ['POST /v1/events', () => api.post('/v1/events', key, { externalId: 'full-1', name: 'during.full' })],
      ['POST /v1/subscribers', () => api.post('/v1/subscribers', key, { externalId: 'full-2' })],
    ] as const) {
      const reply = await within(5_000, what, call);
      assert.equal([reply.status, reply.body.error?.code], [503, 'unavailable'], `${what}: ${reply.text}`);
    }
    assert.is((await api.get('/v1/events', key)).status, 200, 'reads go on');
    const health = await api.get('/v1/health');
    assert.is(health.status, 200);
    assert.is(health.body.data.status, 'degraded');
    assert.is(health.body.data.redis.writable, false);
    assert.match(health.body.data.redis.writeError, /^OOM/);
  } finally {
    await admin.config('SET', 'maxmemory', '0');
  }
  const health = await api.get('/v1/health');
  assert.equal([health.body.data.redis.writable, health.body.data.redis.writeError], [true, null]);
  assert.is((await api.post('/v1/events', key, { externalId: 'full-1', name: 'after.full' })).status, 202);
});

outage('a Redis pausing writes: health answers within about a second that writes do not go through (probe G: it waited for the 5 s command timeout)', async (ctx) => {
  const admin = ctx.service.redis;
  await admin.client('PAUSE', 3_000, 'WRITE');
  try {
    const t0 = performance.now();
    const health = await ctx.api.get('/v1/health');
    const tookMs = performance.now() - t0;
    assert.equal([health.status, health.body.data.status, health.body.data.redis.writable], [200, 'degraded', false]);
    assert.match(health.body.data.redis.writeError, /no answer within 1000 ms/);
    assert.ok(tookMs < 2_500, `answered in ${Math.round(tookMs)} ms, before the pause ended`);
  } finally {
    await admin.client('UNPAUSE');
  }
  await waitFor('writes go through again', async () => (await ctx.api.get('/v1/health')).body.data?.redis?.writable === true, 10_000);
});

outage('a write made under a full memory, only its audit append refused, is answered as made, and the sweeper appends the entry once there is room (probe O)', async (ctx) => {
  const { api } = ctx;
  const { keys: k, workspace } = await bootstrapWorkspace(ctx.service, 'outage-del');
  assert.is((await api.post('/v1/topics', k.tenant, { slug: 'full-topic', name: 'Full' })).status, 201);
  const segment = await api.post('/v1/segments', k.tenant, { slug: 'full-readers', where: { topic: 'full-topic' } });
  assert.is(segment.status, 201, segment.text);
  const hook = await api.post('/v1/workspaces/outage-del/webhooks', k.workspace, { url: 'https://8.8.8.8/hooks' });
  assert.is(hook.status, 201);
  const admin = ctx.service.redis;
  const ledger = ctx.service.keys.ledger(workspace.id);
  const backfillQueued = async () => (await admin.zrange(ctx.service.keys.segmentBackfills, 0, -1)).some((m) => m.endsWith(`|${segment.body.data.id}`));
  // no worker here: the create's queued backfill is taken out, as a backfill runner would
  await admin.zremrangebyscore(ctx.service.keys.segmentBackfills, '-inf', '+inf');
  const deletedInLedger = async () => (await admin.xrange(ledger, '-', '+')).filter(([, f]) => f.join(' ').includes('"topic.deleted"')).length;
  await admin.config('SET', 'maxmemory-policy', 'noeviction');
  await admin.config('SET', 'maxmemory', '1');
  try {
    // the deletes' scripts are let through (their first writes free memory); the ledger appends after them are not
    const topic = await within(5_000, 'DELETE topic', () => api.del('/v1/topics/full-topic', k.tenant));
    assert.is(topic.status, 200, topic.text);
    assert.is(topic.body.data.slug, 'full-topic');
    const endpoint = await within(5_000, 'DELETE webhook endpoint', () => api.del(`/v1/workspaces/outage-del/webhooks/${hook.body.data.id}`, k.workspace));
    assert.is(endpoint.status, 200, endpoint.text);
    assert.is(await deletedInLedger(), 0, 'not appended while memory is full');
  } finally {
    await admin.config('SET', 'maxmemory', '0');
  }
  // the segment naming the topic was made pending again by the delete's script; its queueing was refused
  assert.not.ok(await backfillQueued(), 'not queued while memory is full');
  assert.is((await api.get('/v1/segments/full-readers', k.tenant)).body.data.backfill.status, 'pending');
  assert.is((await api.get('/v1/topics/full-topic', ctx.key)).status, 404);
  // the intent stayed in the outbox with the delete: the worker's sweeper (run here) appends it
  const { config, keys } = ctx.service;
  const swept = await sweepAuditOutboxes({ config, redis: admin, keys, log: createLogger('error'), target: { url: ctx.service.env.REDIS_URL! } }, 0);
  assert.is(swept.settled, 1);
  assert.is(await deletedInLedger(), 1);
  assert.ok(await backfillQueued(), 'the sweeper queued the pending backfill');
});

outage('a Redis refusing writes for want of replicas (NOREPLICAS) answers writes 503 unavailable, not 500 (probe O)', async (ctx) => {
  const { api, key } = ctx;
  const admin = ctx.service.redis;
  await admin.config('SET', 'min-replicas-to-write', '1');
  try {
    for (const [what, call] of [
      ['POST /v1/events', () => api.post('/v1/events', key, { externalId: 'norepl-1', name: 'during.norepl' })],
      ['POST /v1/topics', () => api.post('/v1/topics', key, { slug: 'norepl-topic' })],
    ] as const) {
      const reply = await within(5_000, what, call);
      assert.equal([reply.status, reply.body.error?.code, reply.headers.get('retry-after')], [503, 'unavailable', '5'], `${what}: ${reply.text}`);
    }
    assert.is((await api.get('/v1/events', key)).status, 200, 'reads go on');
  } finally {
    await admin.config('SET', 'min-replicas-to-write', '0');
  }
  assert.is((await api.post('/v1/topics', key, { slug: 'norepl-topic' })).status, 201);
});

outage('a Redis that stalls with its connection open (paused) is answered 503 after the web\'s 5 s command limit, not for the whole stall', async (ctx) => {
  const { api, key } = ctx;
  assert.is((await api.post('/v1/events', key, { externalId: 'stall-1', name: 'before.stall' })).status, 202);
  ctx.redis!.kill('SIGSTOP');
  try {
    const reply = await within(12_000, 'POST /v1/events during a stall', () => api.post('/v1/events', key, { externalId: 'stall-1', name: 'during.stall' }));
    assert.is(reply.status, 503, reply.text);
    assert.is(reply.body.error.code, 'unavailable');
    assert.ok(reply.ms >= 4_500 && reply.ms < 8_000, `answered in ${reply.ms} ms`);
  } finally {
    ctx.redis!.kill('SIGCONT');
  }
  await waitFor('the service to answer again', async () => (await within(8_000, 'POST /v1/events', () => api.post('/v1/events', key, { externalId: 'stall-1', name: 'after.stall' }))).status === 202, 15_000, 200);
});

outage('a web process stopped past its command limit while Redis answered reads the answers before its timers reject them: 202, stored once (probe N)', async (ctx) => {
  const { web, api } = await startWebProcess(ctx.service);
  const sleep = (ms: number) => new Promise((done) => setTimeout(done, ms));
  try {
    assert.is((await api.post('/v1/events', ctx.key, { externalId: 'frozen-1', name: 'before.freeze' })).status, 202);
    // the web's script call waits in a stopped Redis; the web stops; Redis answers into its socket
    ctx.redis!.kill('SIGSTOP');
    const answer = api.post('/v1/events', ctx.key, { externalId: 'frozen-1', name: 'during.freeze' });
    await sleep(500);
    web.child.kill('SIGSTOP');
    ctx.redis!.kill('SIGCONT');
    await sleep(6_000); // past the web's 5 s command limit
    web.child.kill('SIGCONT');
    const reply = await answer;
    assert.is(reply.status, 202, reply.text);
    const tenantId = (await api.get('/v1/whoami', ctx.key)).body.data.tenant.id as string;
    const p = partitionOf(tenantId, 'frozen-1', ctx.service.config.partitions);
    assert.is(await ctx.service.redis.hget(ctx.service.keys.sequences(p), `${tenantId}|frozen-1`), '3', '$subscriber.created and two events, each once');
  } finally {
    ctx.redis!.kill('SIGCONT');
    web.child.kill('SIGCONT');
    await stopRoleProcess(web);
  }
});

outage('a web role stopped while Redis is down stops taking connections at once', async (ctx) => {
  const web = await startTestService('outage-web-stop', { REDIS_URL: `redis://127.0.0.1:${ctx.port}` }, ['web', 'worker']);
  await stopRedis(ctx);
  try {
    await waitFor('the service to see Redis gone', async () => web.redis.status !== 'ready', 5_000);
    const stopping = web.stop();
    await new Promise((r) => setTimeout(r, 500));
    // the heartbeat's last write waits for Redis until the stop's deadline: the server must be closed by then
    const refused = await fetch(`${web.url}/v1/health`, { signal: AbortSignal.timeout(2_000) }).then(() => false, () => true);
    assert.ok(refused, 'a new connection 0.5 s into the stop is refused');
    await stopping;
  } finally {
    await startRedis(ctx);
  }
});

outage('a service whose Redis is down stops within its limit instead of waiting for Redis to come back', async (ctx) => {
  const all = await startTestService('outage-stop', { REDIS_URL: `redis://127.0.0.1:${ctx.port}` }, ['web', 'worker', 'dispatcher', 'scheduler']);
  await stopRedis(ctx);
  try {
    await waitFor('the service to see Redis gone', async () => all.redis.status !== 'ready', 5_000);
    const started = Date.now();
    // before the bound, stop() waited on QUIT and the roles' commands until Redis answered again: forever here
    await within(20_000, 'stop()', async () => (await all.stop(), { status: 0, body: null, text: '', headers: {} } as unknown as Reply));
    const ms = Date.now() - started;
    assert.ok(ms < 12_000, `stopped in ${ms} ms (limit 8 s: the web grace of 5 s, then 3 s more)`);
  } finally {
    await startRedis(ctx);
  }
  // and it stays stopped: its client does not connect again once Redis is back
  await new Promise((r) => setTimeout(r, 1_500));
  assert.is.not(all.redis.status, 'ready');
});

outage.run();
