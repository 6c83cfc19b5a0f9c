import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { fanOut, type FanoutContext } from '../../actors/fanout.js';
import { PushSender } from '../../actors/push-sender.js';
import { createLogger } from '../../lib/log.js';
import { writeScope } from '../../streams/audit-outbox.js';
import { IdentityRefs, SYSTEM_WRITER } from '../../streams/identity.js';
import { createMessage } from '../../streams/messages.js';
import { connectRedis } from '../../streams/redis.js';
import { startPushService } from '../helpers/push-setup.js';

type Setup = Awaited<ReturnType<typeof startPushService>>;

/**
 * Registers `token` for `externalId`, sends it a message and fans it out in this process (the test
 * is the dispatcher), running `meanwhile` once the fan-out has read the audience (its last read: the
 * subscriptions' owners) and before it writes `$send`; then `check`.
 */
async function fanOutWhile(name: string, externalId: string, token: string, meanwhile: (s: Setup) => Promise<void>, check: (s: Setup, messageId: string) => Promise<void>): Promise<void> {
  const setup = await startPushService(name, {}, ['web']);
  const { peer, service, api, key, pk, tenantId, workspaceId } = setup;
  const log = createLogger('error');
  const sender = new PushSender({ redis: service.redis, keys: service.keys, config: service.config, log });
  const redis = connectRedis({ url: service.env.REDIS_URL! });
  try {
    assert.is((await api.post('/v1/client/subscriptions', pk, { externalId, token, platform: 'ios' })).status, 201);
    const message = (await api.post('/v1/messages', key, { to: externalId, title: 't', body: 'b' })).body.data;
    const client = redis as unknown as Record<string, (...args: unknown[]) => Promise<unknown>>;
    const owners = service.keys.subscriptionOwners(tenantId);
    const hmget = client.hmget!.bind(redis);
    client.hmget = async (...args: unknown[]) => {
      const rows = await hmget(...args);
      if (args[0] === owners) await meanwhile(setup);
      return rows;
    };
    const context: FanoutContext = {
      redis, keys: service.keys, partitions: service.config.partitions, maxBacklog: service.config.inboxMaxBacklog, pusher: sender, log,
      chunkSize: service.config.fanoutChunkSize, refs: new IdentityRefs(redis, service.keys),
    };
    await fanOut(context, { workspaceId, tenantId, partitions: service.config.partitions }, [message.id]);
    const [delivery] = (await api.get(`/v1/messages/${message.id}/deliveries`, key)).body.data.items;
    assert.equal([delivery.status, delivery.reason], ['skipped', 'subscriber_not_found']);
    const done = (await api.get(`/v1/messages/${message.id}`, key)).body.data;
    assert.equal([done.status, done.counts.skipped], ['completed', 1]);
    assert.is(peer.requests.filter((r) => r.token === token).length, 0, 'nothing pushed to the deleted user\'s device');
    await check(setup, message.id);
  } finally {
    redis.disconnect();
    await sender.close();
    await service.stop();
    await peer.close();
  }
}

test('a subscriber deleted after the fan-out read its audience is not made again by its $send, and its device gets no push (probe EG: it came back, listed, with a $subscriber.created)', async () => {
  await fanOutWhile('deleted-mid-fanout', 'late-del', 'cd'.repeat(32), async ({ api, key }) => {
    assert.is((await api.del('/v1/subscribers/late-del', key)).status, 200);
  }, async ({ api, key }) => {
    assert.is((await api.get('/v1/subscribers/late-del', key)).status, 404, 'still deleted');
    assert.is((await api.get('/v1/subscribers', key)).body.data.total, 0, 'and not listed');
  });
});

test('a subscriber deleted and created again under its externalId after the fan-out read its audience gets no $send, and the deleted one\'s device, another user\'s by then, no push (probe EN)', async () => {
  const token = 'ab'.repeat(32);
  await fanOutWhile('recreated-mid-fanout', 'alice', token, async ({ api, key, pk }) => {
    assert.is((await api.del('/v1/subscribers/alice', key)).status, 200);
    assert.is((await api.post('/v1/subscribers', key, { externalId: 'alice' })).status, 201);
    assert.is((await api.post('/v1/client/subscriptions', pk, { externalId: 'bob', token, platform: 'ios' })).status, 201);
  }, async ({ api, key }, messageId) => {
    const timeline = (await api.get('/v1/subscribers/alice/timeline', key)).body.data.items as { name: string; messageId: string | null }[];
    assert.is(timeline.filter((e) => e.messageId === messageId).length, 0, 'the new alice got no $send of the deleted one\'s message');
  });
});

test('a workflow send goes to its run\'s subscriber only: one created again under the externalId before the fan-out gets nothing (probe EV: a send a killed worker left reached the new subscriber\'s device)', async () => {
  const { peer, service, api, key, pk, tenantId, workspaceId } = await startPushService('pinned-fanout', {}, ['web']);
  const log = createLogger('error');
  const sender = new PushSender({ redis: service.redis, keys: service.keys, config: service.config, log });
  const refs = new IdentityRefs(service.redis, service.keys);
  try {
    assert.is((await api.post('/v1/client/subscriptions', pk, { externalId: 'phoenix', token: 'e1'.repeat(32), platform: 'ios' })).status, 201);
    const oldId = (await api.get('/v1/subscribers/phoenix', key)).body.data.id as string;
    const { message } = await createMessage(service.redis, service.keys, { workspaceId, tenantId }, {
      to: { externalId: 'phoenix' }, content: { title: 't', body: 'b' }, sendAt: null, subscriberId: oldId,
    }, { key: null, request: {} }, writeScope((await refs.scope(workspaceId, tenantId))!, SYSTEM_WRITER), log);
    assert.is((await api.del('/v1/subscribers/phoenix', key)).status, 200);
    const fresh = 'e2'.repeat(32);
    assert.is((await api.post('/v1/client/subscriptions', pk, { externalId: 'phoenix', token: fresh, platform: 'ios' })).status, 201);
    const context: FanoutContext = {
      redis: service.redis, keys: service.keys, partitions: service.config.partitions, maxBacklog: service.config.inboxMaxBacklog, pusher: sender, log,
      chunkSize: service.config.fanoutChunkSize, refs,
    };
    await fanOut(context, { workspaceId, tenantId, partitions: service.config.partitions }, [message.id]);
    const [delivery] = (await api.get(`/v1/messages/${message.id}/deliveries`, key)).body.data.items;
    assert.equal([delivery.status, delivery.reason], ['skipped', 'subscriber_not_found']);
    assert.is(peer.requests.length, 0, 'nothing pushed to the new subscriber\'s device');

    // the same when the fan-out resumes one a dispatcher left with its delivery made and pending
    assert.is((await api.post('/v1/client/subscriptions', pk, { externalId: 'ash', token: 'e3'.repeat(32), platform: 'ios' })).status, 201);
    const ashId = (await api.get('/v1/subscribers/ash', key)).body.data.id as string;
    const { message: left } = await createMessage(service.redis, service.keys, { workspaceId, tenantId }, {
      to: { externalId: 'ash' }, content: { title: 't', body: 'b' }, sendAt: null, subscriberId: ashId,
    }, { key: null, request: {} }, writeScope((await refs.scope(workspaceId, tenantId))!, SYSTEM_WRITER), log);
    const taken = new AbortController();
    taken.abort(); // taken over once its deliveries are made: the pushes are the next dispatcher's
    await fanOut({ ...context, signal: taken.signal }, { workspaceId, tenantId, partitions: service.config.partitions }, [left.id]);
    assert.is((await api.get(`/v1/messages/${left.id}/deliveries?status=pending`, key)).body.data.total, 1, 'left pending');
    assert.is((await api.del('/v1/subscribers/ash', key)).status, 200);
    assert.is((await api.post('/v1/subscribers', key, { externalId: 'ash' })).status, 201);
    await fanOut(context, { workspaceId, tenantId, partitions: service.config.partitions }, [left.id]);
    const resumed = (await api.get(`/v1/messages/${left.id}/deliveries`, key)).body.data.items as { status: string; reason: string }[];
    assert.ok(resumed.length > 0);
    assert.equal(resumed.map((d) => [d.status, d.reason]), resumed.map(() => ['skipped', 'subscriber_not_found']), 'the left one too');
    const timeline = (await api.get('/v1/subscribers/ash/timeline', key)).body.data.items as { name: string }[];
    assert.equal(timeline.filter((e) => e.name === '$send'), [], 'no $send on the new subscriber\'s stream');
  } finally {
    await sender.close();
    await service.stop();
    await peer.close();
  }
});

test.run();
