import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { sweepWebhooks } from '../../actors/webhook-dispatcher.js';
import { now } from '../../lib/clock.js';
import { derivedId } from '../../lib/ids.js';
import { createLogger } from '../../lib/log.js';
import { UNREAD_LEDGER_WINDOW_MS } from '../../lib/webhook-policy.js';
import type { RoleContext } from '../../streams/role-context.js';
import { client } from '../helpers/api.js';
import { bootstrapWorkspace, startTestService, type TestService } from '../helpers/service.js';

type Ctx = { service: TestService; role: RoleContext; api: ReturnType<typeof client> };

const sweep = suite<Ctx>('webhook housekeeping');

sweep.before(async (ctx) => {
  ctx.service = await startTestService('wh-sweep');
  const { config, redis, keys } = ctx.service;
  ctx.role = { config, redis, keys, log: createLogger('error'), target: { url: ctx.service.env.REDIS_URL! } };
  ctx.api = client(ctx.service.url);
});
sweep.after(async (ctx) => ctx.service.stop());

async function endpoint(ctx: Ctx, slug: string, key: string): Promise<string> {
  const res = await ctx.api.post(`/v1/workspaces/${slug}/webhooks`, key, { url: 'https://8.8.8.8/hooks' });
  assert.is(res.status, 201);
  return res.body.data.id;
}

sweep('a workspace without endpoints leaves the registry; one with endpoints stays', async (ctx) => {
  const { redis, keys } = ctx.service;
  const a = await bootstrapWorkspace(ctx.service, 'sw-a');
  const b = await bootstrapWorkspace(ctx.service, 'sw-b');
  const ea = await endpoint(ctx, 'sw-a', a.keys.workspace);
  await endpoint(ctx, 'sw-b', b.keys.workspace);
  assert.equal((await redis.zrange(keys.webhookWorkspaces, 0, -1)).sort(), [a.workspace.id, b.workspace.id].sort());
  await ctx.api.del(`/v1/workspaces/sw-a/webhooks/${ea}`, a.keys.workspace);
  assert.equal(await redis.zrange(keys.webhookWorkspaces, 0, -1), [b.workspace.id], 'deleting the last endpoint leaves the registry');
  await redis.zadd(keys.webhookWorkspaces, 0, a.workspace.id); // as if that step had been interrupted
  const result = await sweepWebhooks(ctx.role);
  assert.is(result.unregistered, 1);
  assert.equal(await redis.zrange(keys.webhookWorkspaces, 0, -1), [b.workspace.id]);
});

sweep('ledgers of workspaces without endpoints keep the last hour only; read ledgers are left to their group', async (ctx) => {
  const { redis, keys } = ctx.service;
  const c = await bootstrapWorkspace(ctx.service, 'sw-c');
  const b = await bootstrapWorkspace(ctx.service, 'sw-b');
  const at = now();
  for (const ws of [c.workspace.id, b.workspace.id]) {
    await redis.del(keys.ledger(ws));
    await redis.xadd(keys.ledger(ws), `${at - UNREAD_LEDGER_WINDOW_MS - 60_000}-0`, 'kind', 'audit', 'payload', '{}');
    await redis.xadd(keys.ledger(ws), `${at - 60_000}-0`, 'kind', 'audit', 'payload', '{}');
  }
  const result = await sweepWebhooks(ctx.role);
  assert.ok(result.trimmed >= 1);
  assert.is(await redis.xlen(keys.ledger(c.workspace.id)), 1, 'the hour-old entry is gone');
  assert.is(await redis.xlen(keys.ledger(b.workspace.id)), 2, 'a ledger the dispatchers read is trimmed by their group only');
});

sweep('delivery indexes lose ids past the retention', async (ctx) => {
  const { redis, keys, config } = ctx.service;
  const b = await bootstrapWorkspace(ctx.service, 'sw-b');
  const [e] = await redis.zrange(keys.webhookEndpoints(b.workspace.id), 0, 0);
  const old = derivedId('webhookDelivery', now() - config.retentionMs - 60_000, 'old');
  const fresh = derivedId('webhookDelivery', now() - 60_000, 'fresh');
  for (const index of [keys.webhookDeliveries(b.workspace.id, e!), keys.webhookDeliveries(b.workspace.id, e!, 'success')]) await redis.zadd(index, 0, old, 0, fresh);
  const result = await sweepWebhooks(ctx.role);
  assert.is(result.pruned, 2);
  assert.equal(await redis.zrange(keys.webhookDeliveries(b.workspace.id, e!), 0, -1), [fresh]);
  assert.equal(await redis.zrange(keys.webhookDeliveries(b.workspace.id, e!, 'success'), 0, -1), [fresh]);
});

sweep.run();
