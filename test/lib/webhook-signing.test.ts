import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { Webhook } from 'standardwebhooks';
import {
  MAX_RETIRED_SECRETS,
  OLD_SECRET_VALIDITY_MS,
  retiredSecretsOf,
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

headers('a retired secret keeps signing for 24 hours after the rotation that retired it', () => {
  const rotatedAtMs = 1_700_000_000_000;
  const retired = [{ secret: 'whsec_old', expiresAtMs: rotatedAtMs + OLD_SECRET_VALIDITY_MS }];
  assert.equal(signingSecrets('whsec_new', retired, rotatedAtMs), ['whsec_new', 'whsec_old']);
  assert.equal(signingSecrets('whsec_new', retired, rotatedAtMs + OLD_SECRET_VALIDITY_MS - 1), ['whsec_new', 'whsec_old']);
  assert.equal(signingSecrets('whsec_new', retired, rotatedAtMs + OLD_SECRET_VALIDITY_MS), ['whsec_new']);
  assert.equal(signingSecrets('whsec_new', [], rotatedAtMs), ['whsec_new']);
});

headers('two rotations within 24 hours: each retired secret signs until its own expiry, current first, newest next', () => {
  const t0 = 1_700_000_000_000;
  const hour = 3_600_000;
  // whsec_a retired at t0, whsec_b at t0 + 6 h; whsec_c is current
  const retired = [
    { secret: 'whsec_a', expiresAtMs: t0 + OLD_SECRET_VALIDITY_MS },
    { secret: 'whsec_b', expiresAtMs: t0 + 6 * hour + OLD_SECRET_VALIDITY_MS },
  ];
  assert.equal(signingSecrets('whsec_c', retired, t0 + 6 * hour), ['whsec_c', 'whsec_b', 'whsec_a'], 'the first secret still signs after the second rotation');
  assert.equal(signingSecrets('whsec_c', retired, t0 + OLD_SECRET_VALIDITY_MS - 1), ['whsec_c', 'whsec_b', 'whsec_a']);
  assert.equal(signingSecrets('whsec_c', retired, t0 + OLD_SECRET_VALIDITY_MS), ['whsec_c', 'whsec_b'], 'the first ends 24 h after the rotation that retired it');
  assert.equal(signingSecrets('whsec_c', retired, t0 + 6 * hour + OLD_SECRET_VALIDITY_MS), ['whsec_c']);
});

headers(`at most ${MAX_RETIRED_SECRETS} retired secrets sign; duplicates and the current secret are not repeated`, () => {
  const t0 = 1_700_000_000_000;
  const retired = Array.from({ length: MAX_RETIRED_SECRETS + 2 }, (_, i) => ({ secret: `whsec_${i}`, expiresAtMs: t0 + OLD_SECRET_VALIDITY_MS + i }));
  const got = signingSecrets('whsec_now', retired, t0);
  assert.is(got.length, 1 + MAX_RETIRED_SECRETS);
  assert.equal(got.slice(0, 3), ['whsec_now', `whsec_${MAX_RETIRED_SECRETS + 1}`, `whsec_${MAX_RETIRED_SECRETS}`], 'the newest are kept');
  assert.not.ok(got.includes('whsec_0') || got.includes('whsec_1'), 'the oldest end early');
  assert.equal(signingSecrets('whsec_x', [{ secret: 'whsec_x', expiresAtMs: t0 + 1 }, { secret: 'whsec_y', expiresAtMs: t0 + 2 }, { secret: 'whsec_y', expiresAtMs: t0 + 1 }], t0), ['whsec_x', 'whsec_y']);
});

headers('stored retired secrets: the JSON list, merged with the previousSecret of records rotated by an earlier version', () => {
  const t0 = 1_700_000_000_000;
  const list = JSON.stringify([{ secret: 'whsec_b', expiresAt: t0 + 10 }, { secret: 'whsec_a', expiresAt: t0 + 5 }]);
  assert.equal(retiredSecretsOf({}), []);
  assert.equal(retiredSecretsOf({ retiredSecrets: '', previousSecret: '', rotatedAt: '' }), []);
  assert.equal(retiredSecretsOf({ retiredSecrets: '{}' }), [], 'cjson writes an empty list as {}');
  // a record of the earlier version: one previous secret, retired at rotatedAt
  assert.equal(retiredSecretsOf({ previousSecret: 'whsec_p', rotatedAt: String(t0) }), [{ secret: 'whsec_p', expiresAtMs: t0 + OLD_SECRET_VALIDITY_MS }]);
  // this version keeps previousSecret as the newest retired one: not counted twice
  assert.equal(retiredSecretsOf({ retiredSecrets: list, previousSecret: 'whsec_b', rotatedAt: String(t0 + 10 - OLD_SECRET_VALIDITY_MS) }), [
    { secret: 'whsec_b', expiresAtMs: t0 + 10 }, { secret: 'whsec_a', expiresAtMs: t0 + 5 },
  ]);
  // rotated again by a process of the earlier version (rolling upgrade): its previousSecret joins the list
  assert.equal(retiredSecretsOf({ retiredSecrets: list, previousSecret: 'whsec_c', rotatedAt: String(t0 + 20) }), [
    { secret: 'whsec_c', expiresAtMs: t0 + 20 + OLD_SECRET_VALIDITY_MS }, { secret: 'whsec_b', expiresAtMs: t0 + 10 }, { secret: 'whsec_a', expiresAtMs: t0 + 5 },
  ]);
  // JSON escapes of the base64 alphabet (cjson writes / as \/)
  assert.equal(retiredSecretsOf({ retiredSecrets: '[{"secret":"whsec_a\\/b+c=","expiresAt":1700000000000}]' }), [{ secret: 'whsec_a/b+c=', expiresAtMs: t0 }]);
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
