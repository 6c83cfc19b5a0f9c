import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { client } from '../helpers/api.js';
import { bootstrapWorkspace, startTestService, type TestService } from '../helpers/service.js';
import { startReceiver, type Receiver } from '../helpers/webhook-receiver.js';
import { waitFor } from '../helpers/wait.js';

/**
 * Attempts a dispatcher has claimed wait in their endpoint's lanes (WEBHOOK_ENDPOINT_CONCURRENCY
 * at a time) until a lane is free. A disable, a delete or a new URL made meanwhile reaches them
 * before they start: nothing more goes to a disabled or deleted endpoint, and a moved endpoint's
 * waiting attempts go to its new URL. Until probe N they went out as claimed, up to a timeout later.
 * One lane here, and a receiver slow to answer, so three of four attempts wait behind the first.
 */
type Ctx = { service: TestService; api: ReturnType<typeof client>; receivers: Receiver[] };
const changes = suite<Ctx>('webhook endpoint changes reach claimed attempts');

const ANSWER_MS = 800;
const ENV = {
  WEBHOOK_ALLOW_PRIVATE_NETWORKS: '127.0.0.0/8,::1/128', WEBHOOK_RETRY_SCHEDULE: '1s', WEBHOOK_ATTEMPT_TIMEOUT_MS: '5000', WEBHOOK_ENDPOINT_CONCURRENCY: '1',
};
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

changes.before(async (ctx) => {
  ctx.service = await startTestService('wh-changes', ENV, ['web', 'worker', 'dispatcher']);
  ctx.api = client(ctx.service.url);
  ctx.receivers = [];
});
changes.after(async (ctx) => {
  for (const r of ctx.receivers) await r.close();
  await ctx.service.stop();
});

/** A workspace, a slow receiver with an endpoint for it, and four events tracked at once; resolves once the first request arrived. */
async function fourWaiting(ctx: Ctx, slug: string) {
  const ws = await bootstrapWorkspace(ctx.service, slug);
  const slow = await startReceiver({ behaviour: () => ({ status: 200, delayMs: ANSWER_MS }) });
  ctx.receivers.push(slow);
  const created = await ctx.api.post(`/v1/workspaces/${slug}/webhooks`, ws.keys.workspace, { url: `${slow.url}/hook`, events: ['change.*'] });
  assert.is(created.status, 201, created.text);
  slow.secrets.push(created.body.data.secret);
  const events = Array.from({ length: 4 }, (_, i) => ({ externalId: 'u1', name: 'change.made', data: { i } }));
  assert.is((await ctx.api.post('/v1/events', ws.keys.tenant, { events })).status, 202);
  await waitFor('the first request', async () => slow.requests.length >= 1, 10_000, 20);
  return { ws, slow, endpoint: created.body.data as { id: string; secret: string }, path: `/v1/workspaces/${slug}/webhooks/${created.body.data.id}` };
}

changes('a disabled endpoint gets none of the attempts waiting behind the one in flight; re-enabled, it gets each once', async (ctx) => {
  const { ws, slow, path } = await fourWaiting(ctx, 'wh-change-disable');
  assert.is((await ctx.api.patch(path, ws.keys.workspace, { enabled: false })).status, 200);
  await sleep(3 * ANSWER_MS);
  assert.is(slow.requests.length, 1, 'only the request in flight at the disable');

  assert.is((await ctx.api.patch(path, ws.keys.workspace, { enabled: true })).status, 200);
  // the attempt claimed and waiting in the lane at the disable was skipped, and its lease given back,
  // so the re-enable sends it with the others at once; until probe A1 it waited out its lease (three
  // attempt timeouts after the claim: 15 s here, 90 s by default)
  await waitFor('every event delivered soon after the re-enable', async () => new Set(slow.requests.map((r) => r.id)).size === 4, 6_000, 50);
  await sleep(ANSWER_MS);
  assert.is(slow.requests.length, 4, 'each event once');
  for (const r of slow.requests) assert.equal(r.failures, []);
});

changes('a deleted endpoint gets none of the attempts waiting behind the one in flight', async (ctx) => {
  const { ws, slow, path } = await fourWaiting(ctx, 'wh-change-delete');
  assert.is((await ctx.api.del(path, ws.keys.workspace)).status, 200);
  await sleep(3 * ANSWER_MS);
  assert.is(slow.requests.length, 1, 'only the request in flight at the delete');
});

changes('an endpoint moved to a new URL gets the waiting attempts there, signed with its secret', async (ctx) => {
  const { ws, slow, path, endpoint } = await fourWaiting(ctx, 'wh-change-url');
  const moved = await startReceiver({ secrets: [endpoint.secret] });
  ctx.receivers.push(moved);
  assert.is((await ctx.api.patch(path, ws.keys.workspace, { url: `${moved.url}/hook` })).status, 200);
  await waitFor('the waiting attempts at the new URL', async () => moved.requests.length >= 3, 10_000, 50);
  await sleep(ANSWER_MS);
  assert.is(slow.requests.length, 1, 'nothing more to the old URL');
  assert.is(moved.requests.length, 3);
  assert.is(new Set([...slow.requests, ...moved.requests].map((r) => r.id)).size, 4, 'each event once');
  for (const r of moved.requests) assert.equal(r.failures, []);
});

changes.run();
