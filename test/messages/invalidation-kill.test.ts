import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { fanOut, type FanoutContext } from '../../actors/fanout.js';
import { PushSender } from '../../actors/push-sender.js';
import { createLogger } from '../../lib/log.js';
import { IdentityRefs } from '../../streams/identity.js';
import { commandName } from '../../streams/lua-scripts.js';
import { connectRedis } from '../../streams/redis.js';
import type { Redis } from 'ioredis';
import { startPushService } from '../helpers/push-setup.js';

test('a dispatcher killed after a 410 invalidated the token and before its answer was recorded: on resume the delivery is failed with that answer, not skipped as never sent (probe DG), and nothing is pushed again', async () => {
  // web only: this test is the dispatcher
  const { peer, service, api, key, pk, tenantId, workspaceId } = await startPushService('invalidation-kill', {}, ['web']);
  const log = createLogger('error');
  const sender = new PushSender({ redis: service.redis, keys: service.keys, config: service.config, log });
  const dying = connectRedis({ url: service.env.REDIS_URL! });
  try {
    const token = 'ab'.repeat(32);
    assert.is((await api.post('/v1/client/subscriptions', pk, { externalId: 'gone-k', token, platform: 'ios' })).status, 201);
    peer.respondWith({ token, status: 410, reason: 'Unregistered' });
    const message = (await api.post('/v1/messages', key, { to: 'gone-k', title: 't', body: 'b' })).body.data;
    const context = (redis: Redis): FanoutContext => ({
      redis, keys: service.keys, partitions: service.config.partitions, maxBacklog: service.config.inboxMaxBacklog, pusher: sender, log,
      chunkSize: service.config.fanoutChunkSize, refs: new IdentityRefs(redis, service.keys),
    });
    const scope = { workspaceId, tenantId, partitions: service.config.partitions };
    // killed once the answer is in and the subscription invalidated, before the delivery records it
    (dying as unknown as Record<string, unknown>)[commandName('settleDeliveries')] = () => Promise.reject(new Error('killed'));
    await fanOut(context(dying), scope, [message.id]).then(() => assert.unreachable('the record cannot be written'), (err: Error) => assert.is(err.message, 'killed'));
    const subscription = (await api.get('/v1/subscribers/gone-k/subscriptions', key)).body.data.items[0];
    assert.equal([subscription.enabled, Boolean(subscription.invalidatedAt)], [false, true]);
    assert.is((await api.get(`/v1/messages/${message.id}/deliveries`, key)).body.data.items[0].status, 'pending');

    await fanOut(context(service.redis), scope, [message.id]);
    const [delivery] = (await api.get(`/v1/messages/${message.id}/deliveries`, key)).body.data.items;
    assert.equal([delivery.status, delivery.reason, delivery.provider?.status, delivery.provider?.reason, delivery.attempts], ['failed', 'Unregistered', 410, 'Unregistered', 1], JSON.stringify(delivery));
    const done = (await api.get(`/v1/messages/${message.id}`, key)).body.data;
    assert.equal([done.status, done.counts.failed, done.counts.skipped], ['completed', 1, 0]);
    assert.is(peer.requests.filter((r) => r.token === token).length, 1, 'pushed once');
  } finally {
    dying.disconnect();
    await sender.close();
    await service.stop();
    await peer.close();
  }
});

test.run();
