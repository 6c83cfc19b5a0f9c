import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { Webhook } from 'standardwebhooks';
import {
  OLD_SECRET_VALIDITY_MS,
  TOLERANCE_SECONDS,
  newWebhookSecret,
  signPayload,
  signingSecrets,
  verifySignature,
  webhookHeaders,
} from '../../lib/webhook-signing.js';

const VECTOR = {
  secret: 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw',
  id: 'msg_p5jXN8AQM9LWM0D4loKWxJek',
  timestamp: 1614265330,
  body: '{"test": 2432232314}',
  signature: 'v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=',
};

function headersOf(signature: string, timestamp = VECTOR.timestamp) {
  return { id: VECTOR.id, timestamp: String(timestamp), signature };
}

const signing = suite('webhook signing');

signing('the Standard Webhooks test vector signs to its published signature', () => {
  assert.is(signPayload([VECTOR.secret], VECTOR.id, VECTOR.timestamp, VECTOR.body), VECTOR.signature);
});

signing('a secret without the whsec_ prefix is decoded as base64 too', () => {
  const bare = VECTOR.secret.slice('whsec_'.length);
  assert.is(signPayload([bare], VECTOR.id, VECTOR.timestamp, VECTOR.body), VECTOR.signature);
});

signing('a body given as bytes signs like the same text', () => {
  assert.is(signPayload([VECTOR.secret], VECTOR.id, VECTOR.timestamp, Buffer.from(VECTOR.body)), VECTOR.signature);
});

signing('two secrets give two space-separated v1 signatures, current first', () => {
  const other = newWebhookSecret();
  const header = signPayload([VECTOR.secret, other], VECTOR.id, VECTOR.timestamp, VECTOR.body);
  const parts = header.split(' ');
  assert.is(parts.length, 2);
  assert.is(parts[0], VECTOR.signature);
  assert.is(parts[1], signPayload([other], VECTOR.id, VECTOR.timestamp, VECTOR.body));
});

signing('a new secret is whsec_ and the base64 of 24 random bytes', () => {
  const secret = newWebhookSecret();
  assert.match(secret, /^whsec_[A-Za-z0-9+/]{32}$/);
  assert.is(Buffer.from(secret.slice(6), 'base64').length, 24);
  assert.is.not(newWebhookSecret(), secret);
});

signing('signing refuses a malformed secret, no secret, or a fractional timestamp', () => {
  assert.throws(() => signPayload(['whsec_'], VECTOR.id, VECTOR.timestamp, VECTOR.body), /base64/);
  assert.throws(() => signPayload(['whsec_not*base64!'], VECTOR.id, VECTOR.timestamp, VECTOR.body), /base64/);
  assert.throws(() => signPayload([], VECTOR.id, VECTOR.timestamp, VECTOR.body), /at least one secret/);
  assert.throws(() => signPayload([VECTOR.secret], VECTOR.id, 1.5, VECTOR.body), /whole unix seconds/);
});

signing('the tolerance is five minutes and an old secret lives 24 hours', () => {
  assert.is(TOLERANCE_SECONDS, 300);
  assert.is(OLD_SECRET_VALIDITY_MS, 86_400_000);
});

signing.run();

const verifying = suite('webhook signature verification');

verifying('the test vector verifies at its own timestamp', () => {
  assert.ok(verifySignature(VECTOR.secret, headersOf(VECTOR.signature), VECTOR.body, VECTOR.timestamp));
});

verifying('any one of several space-separated signatures may match', () => {
  const header = `v1,${Buffer.alloc(32).toString('base64')} v2,whatever ${VECTOR.signature}`;
  assert.ok(verifySignature(VECTOR.secret, headersOf(header), VECTOR.body, VECTOR.timestamp));
});

verifying('a changed body, id or secret fails', () => {
  const now = VECTOR.timestamp;
  assert.not.ok(verifySignature(VECTOR.secret, headersOf(VECTOR.signature), '{"test": 2432232315}', now));
  assert.not.ok(verifySignature(VECTOR.secret, { ...headersOf(VECTOR.signature), id: 'msg_other' }, VECTOR.body, now));
  assert.not.ok(verifySignature(newWebhookSecret(), headersOf(VECTOR.signature), VECTOR.body, now));
});

verifying('a signature under another version tag or without a tag is ignored', () => {
  const bare = VECTOR.signature.slice(3);
  assert.not.ok(verifySignature(VECTOR.secret, headersOf(`v1a,${bare}`), VECTOR.body, VECTOR.timestamp));
  assert.not.ok(verifySignature(VECTOR.secret, headersOf(bare), VECTOR.body, VECTOR.timestamp));
  assert.not.ok(verifySignature(VECTOR.secret, headersOf(`v1,${bare.slice(0, -2)}`), VECTOR.body, VECTOR.timestamp));
});

verifying('a timestamp up to five minutes away either way is accepted, further is rejected', () => {
  const header = headersOf(VECTOR.signature);
  assert.ok(verifySignature(VECTOR.secret, header, VECTOR.body, VECTOR.timestamp + TOLERANCE_SECONDS));
  assert.ok(verifySignature(VECTOR.secret, header, VECTOR.body, VECTOR.timestamp - TOLERANCE_SECONDS));
  assert.not.ok(verifySignature(VECTOR.secret, header, VECTOR.body, VECTOR.timestamp + TOLERANCE_SECONDS + 1));
  assert.not.ok(verifySignature(VECTOR.secret, header, VECTOR.body, VECTOR.timestamp - TOLERANCE_SECONDS - 1));
});

verifying('a timestamp that is not whole seconds is rejected', () => {
  for (const timestamp of ['', 'abc', '1614265330.5', '-1614265330', '1614265330abc']) {
    const headers = { id: VECTOR.id, timestamp, signature: VECTOR.signature };
    assert.not.ok(verifySignature(VECTOR.secret, headers, VECTOR.body, VECTOR.timestamp), timestamp);
  }
});

verifying.run();

const headers = suite('webhook delivery headers');

headers('headers carry the id, the timestamp and the signature over them', () => {
  const result = webhookHeaders([VECTOR.secret], VECTOR.id, VECTOR.body, VECTOR.timestamp);
  assert.equal(result, {
    'webhook-id': VECTOR.id,
    'webhook-timestamp': String(VECTOR.timestamp),
    'webhook-signature': VECTOR.signature,
  });
});

headers('the previous secret keeps signing for 24 hours after a rotation', () => {
  const rotatedAtMs = 1_700_000_000_000;
  const previous = { secret: 'whsec_old', rotatedAtMs };
  assert.equal(signingSecrets('whsec_new', previous, rotatedAtMs), ['whsec_new', 'whsec_old']);
  assert.equal(signingSecrets('whsec_new', previous, rotatedAtMs + OLD_SECRET_VALIDITY_MS - 1), ['whsec_new', 'whsec_old']);
  assert.equal(signingSecrets('whsec_new', previous, rotatedAtMs + OLD_SECRET_VALIDITY_MS), ['whsec_new']);
  assert.equal(signingSecrets('whsec_new', null, rotatedAtMs), ['whsec_new']);
});

headers.run();

const reference = suite('webhook signing against the standardwebhooks reference verifier');

const nowSeconds = () => Math.floor(Date.now() / 1000);
const BODY = '{"id":"whe_0123456789abcdefghjkmnpqrs","type":"event.created","data":{"object":{"n":"é ✓"}}}';

reference('headers signed with one secret pass the reference verifier', () => {
  const secret = newWebhookSecret();
  const sent = webhookHeaders([secret], 'whe_one', BODY, nowSeconds());
  assert.equal(new Webhook(secret).verify(BODY, sent), JSON.parse(BODY));
});

reference('during a rotation the reference verifier accepts either secret', () => {
  const current = newWebhookSecret();
  const previous = newWebhookSecret();
  const sent = webhookHeaders([current, previous], 'whe_two', BODY, nowSeconds());
  assert.equal(new Webhook(current).verify(BODY, sent), JSON.parse(BODY));
  assert.equal(new Webhook(previous).verify(BODY, sent), JSON.parse(BODY));
  assert.throws(() => new Webhook(newWebhookSecret()).verify(BODY, sent), /No matching signature/);
});

reference('the reference verifier rejects a tampered body', () => {
  const secret = newWebhookSecret();
  const sent = webhookHeaders([secret], 'whe_three', BODY, nowSeconds());
  assert.throws(() => new Webhook(secret).verify(BODY.replace('created', 'deleted'), sent), /No matching signature/);
});

reference('the reference verifier rejects a timestamp older than five minutes', () => {
  const secret = newWebhookSecret();
  const sent = webhookHeaders([secret], 'whe_four', BODY, nowSeconds() - TOLERANCE_SECONDS - 10);
  assert.throws(() => new Webhook(secret).verify(BODY, sent), /too old/);
});

reference('signatures from the reference signer verify here', () => {
  const secret = newWebhookSecret();
  const at = nowSeconds();
  const signature = new Webhook(secret).sign('whe_five', new Date(at * 1000), BODY);
  assert.ok(verifySignature(secret, { id: 'whe_five', timestamp: String(at), signature }, BODY, at));
});

reference.run();
