import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { purgeDeleted, sweepWebhooks } from '../../actors/webhook-dispatcher.js';
import { now } from '../../lib/clock.js';
import { createLogger } from '../../lib/log.js';
import { deliveryKeepMs } from '../../lib/webhook-policy.js';
import { callScript } from '../../streams/lua-scripts.js';
import type { RoleContext } from '../../streams/role-context.js';
import { scoreAt } from '../../streams/scored-index.js';
import { purgeDeletedEndpoint } from '../../streams/webhook-deliveries.js';
import { client } from '../helpers/api.js';
import { bootstrapWorkspace, startTestService, type TestService } from '../helpers/service.js';
import { startReceiver, type Receiver } from '../helpers/webhook-receiver.js';
import { waitFor } from '../helpers/wait.js';

/*
 * Deleting an endpoint leaves its delivery records and payloads to the dispatchers' sweep, which
 * removes them in batches (probes BW, EG: they stayed until their keep, ~15 MB per 30 s of endpoint
 * churn). Web, worker and dispatcher run here against a real Redis and local receivers.
 */

type Ctx = { service: TestService; role: RoleContext; api: ReturnType<typeof client>; receivers: Receiver[] };
type Workspace = Awaited<ReturnType<typeof bootstrapWorkspace>>;

// a timeout above the in-flight test's answer delay (8 s), so its attempts are answered, not timed out
const ENV = { WEBHOOK_ALLOW_PRIVATE_NETWORKS: '127.0.0.0/8', WEBHOOK_RETRY_SCHEDULE: '1s', WEBHOOK_ATTEMPT_TIMEOUT_MS: '10000' };
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

const purge = suite<Ctx>('deleted webhook endpoints\' deliveries');

purge.before(async (ctx) => {
  ctx.service = await startTestService('wh-purge', ENV, ['web', 'worker', 'dispatcher']);
  const { config, redis, keys } = ctx.service;
  ctx.role = { config, redis, keys, log: createLogger('error'), target: { url: ctx.service.env.REDIS_URL! } };
  ctx.api = client(ctx.service.url);
  ctx.receivers = [];
  // the sweeps are the test's own: the dispatcher's minute timer must not run one between its steps
  await redis.set(keys.lock('webhook-sweep'), 'test', 'PX', 600_000);
});
purge.after(async (ctx) => {
  for (const r of ctx.receivers) await r.close();
  await ctx.service.stop();
});

async function endpoint(ctx: Ctx, ws: Workspace, r: Receiver, events: string[]): Promise<string> {
  const res = await ctx.api.post(`/v1/workspaces/${ws.workspace.slug}/webhooks`, ws.keys.workspace, { url: `${r.url}/hook`, events });
  assert.is(res.status, 201, res.text);
  r.secrets.push(res.body.data.secret);
  return res.body.data.id;
}

async function track(ctx: Ctx, ws: Workspace, names: string[]): Promise<void> {
  for (let i = 0; i < names.length; i += 100) {
    const events = names.slice(i, i + 100).map((name, j) => ({ externalId: `p-${(i + j) % 7}`, name, data: { n: i + j } }));
    const res = await ctx.api.post('/v1/events', ws.keys.tenant, { events });
    assert.is(res.status, 202, res.text);
  }
}

/** Every key of the workspace whose name matches `pattern` after its tag (SCAN, a test's look). */
async function keysOf(ctx: Ctx, workspaceId: string, pattern: string): Promise<string[]> {
  const found: string[] = [];
  let cursor = '0';
  do {
    const [next, page] = await ctx.service.redis.scan(cursor, 'MATCH', `${ctx.service.keys.webhookBase(workspaceId)}:${pattern}`, 'COUNT', 1000);
    cursor = next;
    found.push(...page);
  } while (cursor !== '0');
  return found;
}

const floor = (ctx: Ctx) => `(${scoreAt(now() - deliveryKeepMs(ctx.service.config.retentionMs, ctx.service.config.webhookRetryScheduleMs))}`;

purge('a deleted endpoint\'s records and payloads go in batches; another endpoint\'s deliveries and the payloads they share stay (probe EG)', async (ctx) => {
  const { redis, keys } = ctx.service;
  const ws = await bootstrapWorkspace(ctx.service, 'whp-batches');
  const w = ws.workspace.id;
  const [ra, rb] = [await startReceiver(), await startReceiver()];
  ctx.receivers.push(ra, rb);
  const a = await endpoint(ctx, ws, ra, ['purge.*']);
  const b = await endpoint(ctx, ws, rb, ['purge.shared']);
  // 250 events for A only, 50 that A and B both get (one payload each, shared)
  await track(ctx, ws, Array.from({ length: 300 }, (_, i) => (i % 6 === 0 ? 'purge.shared' : 'purge.solo')));
  await waitFor('every delivery made and answered', async () =>
    (await redis.zcard(keys.webhookDeliveries(w, a, 'success'))) === 300 && (await redis.zcard(keys.webhookDeliveries(w, b, 'success'))) === 50, 30_000, 100);

  const aIds = await redis.zrange(keys.webhookDeliveries(w, a), 0, -1);
  const bIds = await redis.zrange(keys.webhookDeliveries(w, b), 0, -1);
  const eventOf = async (id: string) => (await redis.hget(keys.webhookDelivery(w, id), 'eventId'))!;
  const bEvents = new Set(await Promise.all(bIds.map(eventOf)));
  const aEvents = await Promise.all(aIds.map(eventOf));
  const soloEvents = aEvents.filter((e) => !bEvents.has(e));
  assert.equal([aEvents.length, soloEvents.length, bEvents.size], [300, 250, 50]);

  assert.is((await ctx.api.del(`/v1/workspaces/whp-batches/webhooks/${a}`, ws.keys.workspace)).status, 200);
  assert.is((await ctx.api.get(`/v1/workspaces/whp-batches/webhooks/${a}/deliveries/${aIds[0]}`, ws.keys.workspace)).status, 404);
  assert.is(await redis.zcard(keys.webhookPurge(w, a)), 300, 'the delete moved the index whole, nothing walked');
  assert.equal(await redis.smembers(keys.webhookPurges(w)), [a]);
  assert.is((await ctx.api.del(`/v1/workspaces/whp-batches/webhooks/${a}`, ws.keys.workspace)).status, 404, 'a second delete changes nothing');
  assert.is(await redis.zcard(keys.webhookPurge(w, a)), 300);

  // a batch whose endpoints changed after it read them does nothing (the payloads it spares depend on them)
  const stale = await callScript<number>(redis, 'purgeWebhookDeliveries', [keys.webhookPurge(w, a), keys.webhookPurges(w), keys.webhookVersion(w)],
    [keys.webhookBase(w), a, 'stale', 1, aIds[0]!, aEvents[0]!, 0]);
  assert.is(stale, -1);
  assert.is(await redis.exists(keys.webhookDelivery(w, aIds[0]!)), 1);

  // a sweep stopped after one batch (killed, or out of budget): what it did is done, the rest is listed
  const first = await purgeDeletedEndpoint(redis, keys, w, a, floor(ctx), 100);
  assert.equal([first.walked, first.records, first.finished], [100, 100, false]);
  assert.is(await redis.zcard(keys.webhookPurge(w, a)), 200);
  assert.equal(await redis.smembers(keys.webhookPurges(w)), [a]);

  const { purged } = await sweepWebhooks(ctx.role);
  assert.equal([purged.endpoints, purged.records, purged.payloads + first.payloads], [1, 200, 250]);
  const exists = async (names: string[]) => (await Promise.all(names.map((n) => redis.exists(n)))).filter((x) => x === 1).length;
  assert.is(await exists(aIds.map((id) => keys.webhookDelivery(w, id))), 0, 'every record of the deleted endpoint is gone');
  assert.is(await exists(soloEvents.map((e) => keys.webhookEvent(w, e))), 0, 'so is every payload only it had');
  assert.is(await exists([...bEvents].map((e) => keys.webhookEvent(w, e))), 50, 'the payloads B\'s deliveries carry stay');
  assert.is(await exists(bIds.map((id) => keys.webhookDelivery(w, id))), 50, 'B\'s records stay');
  assert.equal(await keysOf(ctx, w, `whk:${a}*`), [], 'no key of the deleted endpoint is left');
  assert.is(await redis.exists(keys.webhookPurges(w)), 0);
  const list = await ctx.api.get(`/v1/workspaces/whp-batches/webhooks/${b}/deliveries`, ws.keys.workspace);
  assert.is(list.body.data.total, 50);
  assert.is((await ctx.api.get(`/v1/workspaces/whp-batches/webhooks/events/${[...bEvents][0]}`, ws.keys.workspace)).status, 200);
  assert.is((await ctx.api.get(`/v1/workspaces/whp-batches/webhooks/events/${soloEvents[0]}`, ws.keys.workspace)).status, 404);

  const again = await sweepWebhooks(ctx.role);
  assert.equal(again.purged, { endpoints: 0, records: 0, payloads: 0 }, 'a second sweep has nothing to do');
});

purge('attempts in flight when their endpoint (the workspace\'s last) is deleted leave no record, lease or key behind', async (ctx) => {
  const { redis, keys } = ctx.service;
  const ws = await bootstrapWorkspace(ctx.service, 'whp-inflight');
  const w = ws.workspace.id;
  // long enough that the first request is still unanswered when the third arrives: the three events may
  // reach the dispatcher in separate ledger reads, seconds apart on a loaded machine (2 s was not)
  const ANSWER_AFTER_MS = 8_000;
  const r = await startReceiver({ behaviour: () => ({ status: 204, delayMs: ANSWER_AFTER_MS }) });
  ctx.receivers.push(r);
  const e = await endpoint(ctx, ws, r, ['slow.*']);
  await track(ctx, ws, ['slow.one', 'slow.two', 'slow.three']);
  await waitFor('three requests in flight', async () => r.requests.length >= 3, 15_000);
  assert.is(await redis.zcard(keys.webhookInflight(w)), 3);

  assert.is((await ctx.api.del(`/v1/workspaces/whp-inflight/webhooks/${e}`, ws.keys.workspace)).status, 200);
  assert.not.ok((await redis.zrange(keys.webhookWorkspaces, 0, -1)).includes(w), 'no endpoint left: no dispatcher claims from it');
  const { purged } = await sweepWebhooks(ctx.role);
  assert.equal([purged.endpoints, purged.records, purged.payloads], [1, 3, 3]);
  assert.equal([await redis.zcard(keys.webhookInflight(w)), await redis.hlen(keys.webhookLeases(w))], [0, 0], 'their leases went with them');

  // the answers come now: the dispatcher records nothing, and writes no record back
  await sleep(Math.max(0, Math.max(...r.requests.map((q) => q.at)) + ANSWER_AFTER_MS + 1_000 - Date.now()));
  for (const pattern of ['whd*', 'whe:*', `whk:${e}*`]) assert.equal(await keysOf(ctx, w, pattern), [], `no ${pattern} key (records, leases, payloads, the endpoint's)`);
});

purge('each deleted endpoint gets its share of a sweep: one with many deliveries does not hold back another workspace\'s (probe EI)', async (ctx) => {
  const { redis, keys } = ctx.service;
  // two workspaces' deleted endpoints, as the delete leaves them (purge indexes of deliveries whose records are gone)
  const big = { ws: 'ws_fairbig', endpoint: 'whk_big', n: 1_200 };
  const small = { ws: 'ws_fairsmall', endpoint: 'whk_small', n: 200 };
  for (const { ws, endpoint, n } of [big, small]) {
    const entries = Array.from({ length: n }, (_, i) => [scoreAt(now()), `whd_fair_${endpoint}_${i}`]).flat();
    await redis.zadd(keys.webhookPurge(ws, endpoint), ...(entries as (string | number)[]));
    await redis.sadd(keys.webhookPurges(ws), endpoint);
    await redis.sadd(keys.webhookForwarding, ws); // the big one first in the registry's order
  }
  await purgeDeleted(ctx.role, floor(ctx), 1_000);
  assert.is(await redis.zcard(keys.webhookPurge(small.ws, small.endpoint)), 0, 'the small one is done in the same sweep');
  assert.is(await redis.sismember(keys.webhookPurges(small.ws), small.endpoint), 0);
  assert.is(await redis.zcard(keys.webhookPurge(big.ws, big.endpoint)), 700, 'the big one had its share, 500');
  for (const { ws } of [big, small]) await redis.srem(keys.webhookForwarding, ws);
});

purge.run();
