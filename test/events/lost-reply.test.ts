import { connect, createServer, type Server, type Socket } from 'node:net';
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { client } from '../helpers/api.js';
import { startWebProcess } from '../helpers/audit.js';
import { inboxEvents } from '../helpers/inbox.js';
import { stopRoleProcess, type RoleProcess } from '../helpers/processes.js';
import { bootstrapWorkspace, startTestService, type TestService } from '../helpers/service.js';

// Probe X2: a web process whose Redis connection drops after a write reached Redis but before its
// reply came back. ioredis resends such a command after the reconnect by default, so an event
// without the caller's id was stored twice under one 202. The web's connection does not resend:
// the request answers 503 (clients retry, with ids: spec 4.3.5) and the event is stored once.

/**
 * A TCP proxy to Redis that, once armed with a marker, forwards the first client write holding it,
 * then cuts that connection instead of passing Redis's reply back (the reply is lost, the write was
 * applied). Every other connection and write passes through untouched.
 */
type ReplyCutter = { port: number; arm: (marker: string) => void; cuts: () => number; close: () => Promise<void> };

async function startReplyCutter(redisUrl: string): Promise<ReplyCutter> {
  const target = new URL(redisUrl);
  let marker: string | null = null;
  let cuts = 0;
  const sockets = new Set<Socket>();
  const server: Server = createServer((downstream) => {
    const upstream = connect(Number(target.port), target.hostname);
    sockets.add(downstream).add(upstream);
    let cutNextReply = false;
    const cut = () => {
      downstream.destroy();
      upstream.destroy();
    };
    downstream.on('data', (chunk: Buffer) => {
      if (marker !== null && chunk.includes(marker)) {
        marker = null;
        cutNextReply = true;
      }
      upstream.write(chunk);
    });
    upstream.on('data', (chunk: Buffer) => {
      if (!cutNextReply) return void downstream.write(chunk);
      cuts++;
      cut();
    });
    for (const s of [downstream, upstream]) {
      s.on('error', cut);
      s.on('close', () => {
        sockets.delete(s);
        cut();
      });
    }
  });
  await new Promise<void>((done) => server.listen(0, '127.0.0.1', () => done()));
  return {
    port: (server.address() as { port: number }).port,
    arm: (m) => (marker = m),
    cuts: () => cuts,
    close: async () => {
      for (const s of sockets) s.destroy();
      await new Promise<void>((done) => server.close(() => done()));
    },
  };
}

type Ctx = { service: TestService; cutter: ReplyCutter; web: RoleProcess; api: ReturnType<typeof client>; key: string; tenantId: string };
const lost = suite<Ctx>('a write whose reply a dropped Redis connection lost');

lost.before(async (ctx) => {
  ctx.service = await startTestService('lost-reply');
  const { keys, tenant } = await bootstrapWorkspace(ctx.service, 'lost-reply');
  ctx.key = keys.tenant;
  ctx.tenantId = tenant.id;
  ctx.cutter = await startReplyCutter(ctx.service.env.REDIS_URL!);
  const started = await startWebProcess(ctx.service, { REDIS_URL: `redis://127.0.0.1:${ctx.cutter.port}` });
  ctx.web = started.web;
  ctx.api = started.api;
});

lost.after(async (ctx) => {
  if (ctx.web) await stopRoleProcess(ctx.web);
  await ctx.cutter?.close();
  await ctx.service?.stop();
});

lost('is not sent again after the reconnect: the request answers 503 and the event is stored once', async ({ api, key, cutter, service, tenantId }) => {
  const externalId = `lost-reply-${Date.now()}`;
  cutter.arm(externalId);
  const res = await api.post('/v1/events', key, { externalId, name: 'order.completed' });
  assert.is(cutter.cuts(), 1, 'the reply was cut');
  assert.is(res.status, 503, res.text);
  assert.is(res.body.error.code, 'unavailable');
  const stored = (await inboxEvents(service, tenantId, externalId)).filter((e) => e.name === 'order.completed');
  assert.is(stored.length, 1, 'applied once by Redis, not twice');

  // the connection serves again: the client's retry (with an id this time) is accepted once
  const retry = await api.post('/v1/events', key, { externalId, name: 'order.completed', id: 'retry-1' });
  assert.is(retry.status, 202, retry.text);
  assert.is(retry.body.data.items[0].status, 'accepted');
  assert.is((await inboxEvents(service, tenantId, externalId)).filter((e) => e.name === 'order.completed').length, 2);
});

lost.run();
