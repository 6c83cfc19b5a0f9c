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

test.run();
