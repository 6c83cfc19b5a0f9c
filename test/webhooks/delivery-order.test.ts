import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { now } from '../../lib/clock.js';
import { derivedId, newId } from '../../lib/ids.js';
import { enqueueDeliveries, type EnqueueEvent } from '../../streams/webhook-deliveries.js';
import { client } from '../helpers/api.js';
import { bootstrapWorkspace, startTestService, type TestService } from '../helpers/service.js';

type Ctx = { service: TestService; api: ReturnType<typeof client> };

// The web role only: the deliveries are made here by calling the enqueue step as a dispatcher
// does, with the clock each call is given, and nothing sends them.
const order = suite<Ctx>('webhook delivery order');

order.before(async (ctx) => {
  ctx.service = await startTestService('wh-order');
  ctx.api = client(ctx.service.url);
});
order.after(async (ctx) => ctx.service.stop());

order('the list is newest first by createdAt; deliveries of one millisecond in the order they were made, across calls; pages neither repeat nor skip', async (ctx) => {
  const { redis, keys, config } = ctx.service;
  const ws = await bootstrapWorkspace(ctx.service, 'wo-ties');
  const created = await ctx.api.post('/v1/workspaces/wo-ties/webhooks', ws.keys.workspace, { url: 'https://8.8.8.8/hooks' });
  const e: string = created.body.data.id;
  const eventMs = now() + 10; // at or after the endpoint's activeSince
  const events: EnqueueEvent[] = Array.from({ length: 7 }, () => {
    const eventId = newId('webhookEvent', eventMs);
    return { eventId, eventMs, eventType: 'order.completed', body: '{}', targets: [{ endpointId: e, deliveryId: derivedId('webhookDelivery', eventMs, `${eventId}|${e}`) }] };
  });
  const at = eventMs + 1_000;
  const enqueue = (chunk: EnqueueEvent[], atMs: number) =>
    enqueueDeliveries(redis, keys, ws.workspace.id, chunk, new Map([[e, 0]]), { atMs, leaseMs: 60_000, token: `t${atMs}`, retentionMs: config.retentionMs });
  await enqueue(events.slice(0, 3), at);
  await enqueue(events.slice(3, 5), at); // the same millisecond, a later call: after the first three
  await enqueue(events.slice(5, 6), at - 5); // a dispatcher whose clock is behind: below, by its createdAt
  await enqueue(events.slice(6, 7), at + 1);
  await enqueue(events.slice(0, 3), at + 2); // a re-forward makes nothing new and moves nothing
  const deliveryOf = (i: number) => events[i]!.targets[0]!.deliveryId;
  const expected = [6, 4, 3, 2, 1, 0, 5].map(deliveryOf);

  const base = `/v1/workspaces/wo-ties/webhooks/${e}/deliveries`;
  const all = (await ctx.api.get(base, ws.keys.workspace)).body.data;
  assert.equal([all.total, all.items.map((d: any) => d.id)], [7, expected]);
  const seen: any[] = [];
  let cursor: string | null = null;
  do {
    const page: any = (await ctx.api.get(`${base}?limit=2${cursor ? `&cursor=${cursor}` : ''}`, ws.keys.workspace)).body.data;
    assert.ok(page.items.length <= 2);
    seen.push(...page.items);
    cursor = page.nextCursor;
  } while (cursor);
  assert.equal(seen.map((d) => d.id), expected, 'pages of 2 give the same order, each delivery once');
  const times = seen.map((d) => Date.parse(d.createdAt));
  assert.ok(times.every((t, i) => i === 0 || t <= times[i - 1]!), `createdAt never increases down the list: ${seen.map((d) => d.createdAt)}`);
  assert.equal((await ctx.api.get(`${base}?status=pending&limit=100`, ws.keys.workspace)).body.data.items.map((d: any) => d.id), expected, 'the status index has the same order');
});

order.run();
