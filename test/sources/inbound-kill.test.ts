import * as assert from 'uvu/assert';
import { partitionOf } from '../../lib/partition.js';
import { webhookHeaders } from '../../lib/webhook-signing.js';
import { client } from '../helpers/api.js';
import { killSuite, killUnderLoad, startWebProcess } from '../helpers/audit.js';
import { bootstrapWorkspace } from '../helpers/service.js';

// A web process SIGKILLed while it takes a source's deliveries, the provider then retrying every
// delivery it sent (re-signed, same webhook-id, as Standard Webhooks senders retry) on a new
// process: each delivery is stored exactly once. The subscriber's sequence counts what was stored:
// 1 for $subscriber.created plus one per distinct delivery, none lost, none twice.

const CLIENTS = 8;
const kill = killSuite('source deliveries through a killed web process', 'sources-kill');

kill('every delivery sent before, during and after the kill is stored once', async (ctx) => {
  const { service } = ctx;
  const boot = await bootstrapWorkspace(service, 'sources-kill');
  const api = client(service.url);
  const created = await api.post('/v1/sources', boot.keys.tenant, { name: 'Kill', provider: 'acme', format: 'standard-webhooks', mapping: { externalId: 'user' } });
  assert.is(created.status, 201, created.text);
  const { id, secret } = created.body.data as { id: string; secret: string };

  const deliver = (webApi: ReturnType<typeof client>, c: number, n: number) => {
    const body = JSON.stringify({ type: 'order.paid', user: `buyer-${c}`, n });
    return webApi.call('POST', `/v1/sources/${id}/inbound`, { raw: body, headers: webhookHeaders([secret], `msg-${c}-${n}`, body, Math.floor(Date.now() / 1000)) as unknown as Record<string, string> });
  };
  const sent = new Array<number>(CLIENTS).fill(0);
  let answered = 0;
  const { web, api: webApi } = await startWebProcess(service);
  ctx.web = web;
  await killUnderLoad(web, CLIENTS, async (c, n) => {
    sent[c] = n + 1;
    const res = await deliver(webApi, c, n);
    assert.is(res.status, 202, res.text);
    assert.is(res.body.data.status, 'accepted');
    answered++;
  }, async () => answered >= 120);
  ctx.web = undefined;

  // the provider retries every delivery: those answered, the one in flight at the kill, and one more each
  const retry = await startWebProcess(service);
  ctx.web = retry.web;
  let duplicates = 0;
  for (let c = 0; c < CLIENTS; c++) {
    for (let n = 0; n <= sent[c]!; n++) {
      const res = await deliver(retry.api, c, n);
      assert.is(res.status, 202, res.text);
      if (res.body.data.status === 'duplicate') duplicates++;
      assert.is(res.body.data.event.data.n, n, 'the answer is this delivery\'s event (the original one for a duplicate)');
    }
  }
  assert.ok(duplicates >= answered, `${duplicates} duplicates of ${answered} answered before the kill`);

  const { tenant } = boot;
  for (let c = 0; c < CLIENTS; c++) {
    const externalId = `buyer-${c}`;
    const seq = Number(await service.redis.hget(service.keys.sequences(partitionOf(tenant.id, externalId, service.config.partitions)), `${tenant.id}|${externalId}`));
    assert.is(seq, 1 + sent[c]! + 1, `${externalId}: $subscriber.created and ${sent[c]! + 1} deliveries, each stored once`);
  }
});

kill.run();
