import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { fanOut, type FanoutContext } from '../../actors/fanout.js';
import { PushSender } from '../../actors/push-sender.js';
import { createLogger } from '../../lib/log.js';
import { IdentityRefs } from '../../streams/identity.js';
import { connectRedis } from '../../streams/redis.js';
import { startPushService } from '../helpers/push-setup.js';

test('a subscriber deleted after the fan-out read its audience is not made again by its $send, and its device gets no push (probe EG: it came back, listed, with a $subscriber.created)', async () => {
  // web only: this test is the dispatcher
  const { peer, service, api, key, pk, tenantId, workspaceId } = await startPushService('deleted-mid-fanout', {}, ['web']);
  const log = createLogger('error');
  const sender = new PushSender({ redis: service.redis, keys: service.keys, config: service.config, log });
  const redis = connectRedis({ url: service.env.REDIS_URL! });
  try {
    const token = 'cd'.repeat(32);
    assert.is((await api.post('/v1/client/subscriptions', pk, { externalId: 'late-del', token, platform: 'ios' })).status, 201);
    const message = (await api.post('/v1/messages', key, { to: 'late-del', title: 't', body: 'b' })).body.data;
    // the delete lands once the fan-out has read the audience (its last read: the subscriptions'
    // owners), before it writes `$send`
    const client = redis as unknown as Record<string, (...args: unknown[]) => Promise<unknown>>;
    const owners = service.keys.subscriptionOwners(tenantId);
    const hmget = client.hmget!.bind(redis);
    client.hmget = async (...args: unknown[]) => {
      const rows = await hmget(...args);
      if (args[0] === owners) assert.is((await api.del('/v1/subscribers/late-del', key)).status, 200);
      return rows;
    };
    const context: FanoutContext = {
      redis, keys: service.keys, partitions: service.config.partitions, maxBacklog: service.config.inboxMaxBacklog, pusher: sender, log,
      chunkSize: service.config.fanoutChunkSize, refs: new IdentityRefs(redis, service.keys),
    };
    await fanOut(context, { workspaceId, tenantId, partitions: service.config.partitions }, [message.id]);
    assert.is((await api.get('/v1/subscribers/late-del', key)).status, 404, 'still deleted');
    assert.is((await api.get('/v1/subscribers', key)).body.data.total, 0, 'and not listed');
    const [delivery] = (await api.get(`/v1/messages/${message.id}/deliveries`, key)).body.data.items;
    assert.equal([delivery.status, delivery.reason], ['skipped', 'subscriber_not_found']);
    const done = (await api.get(`/v1/messages/${message.id}`, key)).body.data;
    assert.equal([done.status, done.counts.skipped], ['completed', 1]);
    assert.is(peer.requests.filter((r) => r.token === token).length, 0, 'nothing pushed to the deleted user\'s device');
  } finally {
    redis.disconnect();
    await sender.close();
    await service.stop();
    await peer.close();
  }
});

test.run();
