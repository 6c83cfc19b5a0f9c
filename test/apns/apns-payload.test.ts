import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import {
  APNS_MAX_PAYLOAD_BYTES, apnsContentProblems, apnsIdFor, apnsPayloadSize, buildApnsRequest, CONTENT_FIELDS, payloadSize, type PushContent,
} from '../../lib/apns-payload.js';
import { MessageCreate } from '../../lib/schemas/messages.js';
import { SendContent } from '../../lib/schemas/workflows.js';

const IDS = { messageId: 'msg_01hzzzzzzzzzzzzzzzzzzzzzzz', deliveryId: 'dlv_01hzzzzzzzzzzzzzzzzzzzzzzz' };
const AT = Date.UTC(2030, 0, 1, 12, 0, 0, 500);
const UUID_V5 = /^[0-9a-f]{8}-[0-9a-f]{4}-5[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/;

const payload = suite('apns payload');

payload('the smallest content gives an alert with title and body, the herald ids, priority 10 and no expiration', () => {
  const { payload: p, headers } = buildApnsRequest({ title: 'Hi', body: 'There' }, IDS, AT);
  assert.equal(p, { aps: { alert: { title: 'Hi', body: 'There' } }, herald: { messageId: IDS.messageId, deliveryId: IDS.deliveryId } });
  assert.equal(headers, { pushType: 'alert', priority: 10, expiration: undefined, collapseId: undefined, apnsId: apnsIdFor(IDS.deliveryId) });
});

payload('every field lands where APNs and the SDK expect it', () => {
  const content: PushContent = {
    title: 'Order shipped', body: 'Arrives Tuesday', data: { orderId: 'o_1', nested: { a: [1, 2] } }, badge: 3, sound: 'default',
    threadId: 'orders', collapseId: 'order-o_1', image: 'https://cdn.example.com/box.png', url: 'app://orders/o_1', priority: 'normal', ttl: 3600,
  };
  const { payload: p, headers } = buildApnsRequest(content, IDS, AT);
  assert.equal(p, {
    aps: { alert: { title: 'Order shipped', body: 'Arrives Tuesday' }, badge: 3, sound: 'default', 'thread-id': 'orders', 'mutable-content': 1 },
    orderId: 'o_1',
    nested: { a: [1, 2] },
    herald: { messageId: IDS.messageId, deliveryId: IDS.deliveryId, url: 'app://orders/o_1', image: 'https://cdn.example.com/box.png' },
  });
  assert.is(Object.keys(p)[0], 'aps', 'aps comes first');
  assert.equal(headers, { pushType: 'alert', priority: 5, expiration: Math.floor(AT / 1000) + 3600, collapseId: 'order-o_1', apnsId: apnsIdFor(IDS.deliveryId) });
});

payload('subtitle, action category, interruption level and content-available go into aps; the preference category into herald (probe H1)', () => {
  const content: PushContent = {
    title: 'Standup', subtitle: 'in 5 minutes', body: 'Room 4', category: 'reminders', actionCategory: 'MEETING_INVITATION',
    interruptionLevel: 'time-sensitive', contentAvailable: true,
  };
  const { payload: p } = buildApnsRequest(content, IDS, AT);
  assert.equal(p.aps, {
    alert: { title: 'Standup', subtitle: 'in 5 minutes', body: 'Room 4' }, category: 'MEETING_INVITATION', 'interruption-level': 'time-sensitive', 'content-available': 1,
  });
  assert.equal(p.herald, { messageId: IDS.messageId, deliveryId: IDS.deliveryId, category: 'reminders' });
  assert.not.ok('content-available' in buildApnsRequest({ title: 't', body: 'b', contentAvailable: false }, IDS, AT).payload.aps, 'false sends nothing');
});

payload('every content field of POST /v1/messages is one the payload knows, and a workflow send step takes the same', () => {
  const create = Object.keys(MessageCreate.properties as object).filter((k) => k !== 'to' && k !== 'sendAt');
  assert.equal(create.sort(), [...CONTENT_FIELDS].sort());
  assert.equal(Object.keys(SendContent.properties as object), [...CONTENT_FIELDS]);
});

payload('badge 0 clears the badge and is kept; no image means no mutable-content', () => {
  const { payload: p } = buildApnsRequest({ title: 't', body: 'b', badge: 0 }, IDS, AT);
  assert.is(p.aps.badge, 0);
  assert.not.ok('mutable-content' in p.aps);
});

payload('ttl 0 is expiration 0 (deliver now or never); priority high is 10', () => {
  const { headers } = buildApnsRequest({ title: 't', body: 'b', ttl: 0, priority: 'high' }, IDS, AT);
  assert.is(headers.expiration, 0);
  assert.is(headers.priority, 10);
});

payload('reserved keys in data never override the payload\'s own', () => {
  const { payload: p } = buildApnsRequest({ title: 't', body: 'b', data: { aps: { alert: 'x' }, herald: 'x', keep: true } }, IDS, AT);
  assert.equal(p.aps, { alert: { title: 't', body: 'b' } });
  assert.equal(p.herald, { messageId: IDS.messageId, deliveryId: IDS.deliveryId });
  assert.is(p.keep, true);
});

payload('the apns-id is a version-5 UUID of the delivery id: the same for a resend, different per delivery', () => {
  const id = apnsIdFor('dlv_a');
  assert.match(id, UUID_V5);
  assert.is(apnsIdFor('dlv_a'), id);
  assert.is.not(apnsIdFor('dlv_b'), id);
  assert.is(buildApnsRequest({ title: 't', body: 'b' }, { messageId: 'msg_x', deliveryId: 'dlv_a' }).headers.apnsId, id);
  const many = new Set(Array.from({ length: 1000 }, (_, i) => apnsIdFor(`dlv_${i}`)));
  assert.is(many.size, 1000);
});

payload('payloadSize counts UTF-8 bytes of the compact JSON', () => {
  const { payload: p } = buildApnsRequest({ title: 'é', body: '🔔' }, IDS, AT);
  assert.is(payloadSize(p), Buffer.byteLength(JSON.stringify(p)));
  assert.ok(payloadSize(p) > JSON.stringify(p).length, 'multi-byte characters count as bytes');
});

const checks = suite('apns content checks');

const filler = (bytes: number) => 'x'.repeat(bytes);
const sizeWithData = (n: number) => apnsPayloadSize({ title: 't', body: 'b', data: { blob: filler(n) } });

checks('content right at the 4096-byte limit passes; one byte more is a problem naming data (POST /v1/messages answers it as 400 validation)', () => {
  const base = sizeWithData(0);
  const fits: PushContent = { title: 't', body: 'b', data: { blob: filler(APNS_MAX_PAYLOAD_BYTES - base) } };
  assert.is(apnsPayloadSize(fits), APNS_MAX_PAYLOAD_BYTES);
  assert.equal(apnsContentProblems(fits), []);
  const over: PushContent = { title: 't', body: 'b', data: { blob: filler(APNS_MAX_PAYLOAD_BYTES - base + 1) } };
  const details = apnsContentProblems(over);
  assert.equal(details, [{ param: 'data', message: 'makes the APNs payload 4097 bytes; the limit is 4096' }]);
});

checks('the size is the same for every delivery of a message (ids have a fixed length)', () => {
  const content: PushContent = { title: 'Hello', body: 'World', data: { k: 'v' }, url: 'app://x' };
  const real = payloadSize(buildApnsRequest(content, { messageId: 'msg_0123456789abcdefghjkmnpqrs', deliveryId: 'dlv_0123456789abcdefghjkmnpqrs' }).payload);
  assert.is(apnsPayloadSize(content), real);
});

checks('a body too large without data names body', () => {
  assert.equal(apnsContentProblems({ title: 't', body: filler(5000) }).map((d) => d.param), ['body']);
});

// collapseId (64 printable ASCII characters) is the schema's: test/messages/messages.test.ts
checks('data may not hold aps or herald', () => {
  assert.equal(apnsContentProblems({ title: 't', body: 'b', data: { aps: {}, herald: 1 } }).map((d) => d.param), ['data.aps', 'data.herald']);
  assert.equal(apnsContentProblems({ title: 't', body: 'b', collapseId: filler(64) }), []);
});

payload.run();
checks.run();
