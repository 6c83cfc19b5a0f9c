import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import type { Redis } from 'ioredis';
import { SYSTEM_WRITER } from '../../streams/identity.js';
import { writeScope } from '../../streams/audit-outbox.js';
import { createMessage, getMessage, messageTimerPartition, releaseDueMessages } from '../../streams/messages.js';
import { bootstrapWorkspace, startTestService, type TestService } from '../helpers/service.js';

// A scheduled message's release time is written before the message and again after it (probe AD):
// a scheduler tick falling between the two, with the time already due, drops the first member.

type Ctx = { service: TestService; tenantId: string; workspaceId: string };
const scheduled = suite<Ctx>('scheduled message release');

scheduled.before(async (ctx) => {
  // no scheduler role: the test runs the ticks itself
  ctx.service = await startTestService('scheduled-release', {}, ['web']);
  const boot = await bootstrapWorkspace(ctx.service, 'scheduled-release');
  ctx.tenantId = boot.tenant.id;
  ctx.workspaceId = boot.workspace.id;
});
scheduled.after(async (ctx) => {
  await ctx.service.stop();
});

scheduled('a scheduler tick between the release time\'s write and the message\'s finds no message and drops the member: it is written again, and the next tick releases the message', async (ctx) => {
  const { redis, keys, config } = ctx.service;
  const partitions = config.partitions;
  let tickedIn = false;
  // the web process's client, with a scheduler tick run right after it writes the release time
  const racing = new Proxy(redis, {
    get(target, prop) {
      if (prop === 'zadd') {
        return async (...args: unknown[]) => {
          const added = await (target.zadd as (...a: unknown[]) => Promise<unknown>)(...args);
          if (!tickedIn && String(args[0]).includes('msg-timers')) {
            tickedIn = true;
            const member = String(args[2]);
            const p = messageTimerPartition(ctx.tenantId, member.slice(member.indexOf('|') + 1), partitions);
            assert.is(await releaseDueMessages(target, keys, p, Date.now() + 60_000, 100), 1, 'the tick took the member of a message not written yet');
          }
          return added;
        };
      }
      const value = Reflect.get(target, prop, target);
      return typeof value === 'function' ? value.bind(target) : value;
    },
  }) as Redis;
  const { message } = await createMessage(racing, keys, { workspaceId: ctx.workspaceId, tenantId: ctx.tenantId },
    { to: { externalId: 'soon' }, content: { title: 't', body: 'b' }, sendAt: { atMs: Date.now() + 5, partitions }, run: undefined }, { key: null, request: {} },
    writeScope({ workspace: { id: ctx.workspaceId, slug: 'scheduled-release' }, tenant: { id: ctx.tenantId, slug: 'default' } }, SYSTEM_WRITER), console);
  assert.ok(tickedIn);
  assert.is(message.status, 'scheduled');
  const p = messageTimerPartition(ctx.tenantId, message.id, partitions);
  await new Promise((r) => setTimeout(r, 10));
  assert.is(await releaseDueMessages(redis, keys, p, Date.now(), 100), 1, 'the next tick finds the release time');
  assert.is((await getMessage(redis, keys, ctx.tenantId, message.id)).status, 'queued');
});

scheduled('a tick that released the message before the second write leaves a member the next tick drops: released once', async (ctx) => {
  const { redis, keys, config } = ctx.service;
  const partitions = config.partitions;
  const { message } = await createMessage(redis, keys, { workspaceId: ctx.workspaceId, tenantId: ctx.tenantId },
    { to: { externalId: 'soon' }, content: { title: 't', body: 'b' }, sendAt: { atMs: Date.now() + 5, partitions }, run: undefined }, { key: null, request: {} },
    writeScope({ workspace: { id: ctx.workspaceId, slug: 'scheduled-release' }, tenant: { id: ctx.tenantId, slug: 'default' } }, SYSTEM_WRITER), console);
  const p = messageTimerPartition(ctx.tenantId, message.id, partitions);
  await new Promise((r) => setTimeout(r, 10));
  assert.is(await releaseDueMessages(redis, keys, p, Date.now(), 100), 1);
  // the member written again by a create racing that tick
  await redis.zadd(keys.messageTimers(p), Date.now() - 1, `${ctx.tenantId}|${message.id}`);
  assert.is(await releaseDueMessages(redis, keys, p, Date.now(), 100), 1, 'taken and dropped');
  const queued = (await redis.xrange(keys.messageQueue(ctx.tenantId, 'one'), '-', '+')).filter(([, fields]) => fields.includes(message.id));
  assert.is(queued.length, 1, 'queued for fan-out once');
  assert.is(await redis.zcard(keys.messageTimers(p)), 0);
});

scheduled.run();
