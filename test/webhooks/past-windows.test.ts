import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { client } from '../helpers/api.js';
import { bootstrapWorkspace, startTestService } from '../helpers/service.js';
import { startReceiver } from '../helpers/webhook-receiver.js';
import { waitFor } from '../helpers/wait.js';

const ENV = { WEBHOOK_ALLOW_PRIVATE_NETWORKS: '127.0.0.0/8,::1/128', WEBHOOK_RETRY_SCHEDULE: '1s' };

test('an endpoint changed a dozen times while no dispatcher runs still gets every event it wanted when it happened (probe DF: only 10 past windows were kept, the events of the oldest were lost)', async () => {
  // web and worker only: the ledger waits, as it does while dispatchers are down or behind
  const service = await startTestService('wh-past-windows', ENV, ['web', 'worker']);
  const receiver = await startReceiver();
  let dispatcher: Awaited<ReturnType<typeof startTestService>> | undefined;
  try {
    const api = client(service.url);
    const ws = await bootstrapWorkspace(service, 'wh-past-windows');
    const path = '/v1/workspaces/wh-past-windows/webhooks';
    const created = await api.post(path, ws.keys.workspace, { url: `${receiver.url}/hook`, events: ['pw.*'] });
    assert.is(created.status, 201, created.text);
    const track = async (name: string) => assert.is((await api.post('/v1/events', ws.keys.tenant, { externalId: 'u1', name })).status, 202);
    await track('pw.first');
    const wanted = ['pw.first'];
    for (let i = 1; i <= 12; i++) {
      const events = i % 2 ? ['pw.*', 'zz.x'] : ['pw.*'];
      assert.is((await api.patch(`${path}/${created.body.data.id}`, ws.keys.workspace, { events })).status, 200);
      await track(`pw.e${i}`);
      wanted.push(`pw.e${i}`);
    }
    dispatcher = await startTestService('wh-past-windows-dispatcher', { ...ENV, REDIS_KEY_PREFIX: service.env.REDIS_KEY_PREFIX! }, ['dispatcher']);
    const names = () => new Set(receiver.requests.map((r) => r.body?.type as string));
    await waitFor('every wanted event delivered', async () => wanted.every((n) => names().has(n)), 15_000, 50);
    assert.equal([...names()].sort(), [...wanted].sort());
  } finally {
    await dispatcher?.stop();
    await receiver.close();
    await service.stop();
  }
});

test('the past windows an endpoint keeps fit 64 KB, the oldest going first (review of session 56: 100 windows of 100 long patterns were 1 MB, decoded by every enqueue)', async () => {
  const service = await startTestService('wh-past-bytes', ENV, ['web']);
  try {
    const api = client(service.url);
    const ws = await bootstrapWorkspace(service, 'wh-past-bytes');
    const path = '/v1/workspaces/wh-past-bytes/webhooks';
    const patterns = (round: number) => Array.from({ length: 100 }, (_, i) => `r${round}.${'p'.repeat(80)}${i}.*`);
    const created = await api.post(path, ws.keys.workspace, { url: 'https://example.com/hook', events: patterns(0) });
    assert.is(created.status, 201, created.text);
    for (let round = 1; round <= 12; round++) assert.is((await api.patch(`${path}/${created.body.data.id}`, ws.keys.workspace, { events: patterns(round) })).status, 200);
    const past = await service.redis.hget(service.keys.webhookEndpoint(ws.workspace.id, created.body.data.id), 'past');
    assert.ok(past!.length <= 65_536, `${past!.length} bytes`);
    const windows = JSON.parse(past!) as { events: string[] }[];
    assert.ok(windows.length > 0 && windows.length < 12, `${windows.length} windows kept`);
    assert.is(windows.at(-1)!.events[0], patterns(11)[0], 'the newest are kept');
  } finally {
    await service.stop();
  }
});

test.run();
