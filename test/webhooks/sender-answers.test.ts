import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { MAX_ANSWER_HEADER_BYTES, postWebhook } from '../../actors/webhook-sender.js';
import { createAllowList } from '../../lib/ssrf-guard.js';
import { startReceiver } from '../helpers/webhook-receiver.js';

const SECRET = `whsec_${Buffer.alloc(24, 7).toString('base64')}`;
const options = { timeoutMs: 5_000, production: false, allow: createAllowList(['127.0.0.0/8']) };

test('a 2xx with large headers (a long Content-Security-Policy, many cookies) is a success; headers beyond the limit are a failed attempt, named so (probe D: 16 KB failed it)', async () => {
  const r = await startReceiver({ secrets: [SECRET] });
  try {
    r.behave(() => ({ status: 200, body: 'ok', headers: { 'content-security-policy': 'h'.repeat(60_000), 'x-more': 'm'.repeat(60_000) } }));
    const big = await postWebhook(r.url, 'whe_big', Buffer.from('{"a":1}'), [SECRET], undefined, options);
    assert.equal([big.success, big.statusCode, big.error, big.response], [true, 200, null, 'ok']);
    assert.equal(r.requests.at(-1)!.verifiedBy, [SECRET]);
    r.behave(() => ({ status: 200, body: 'ok', headers: { 'x-huge': 'h'.repeat(MAX_ANSWER_HEADER_BYTES + 1) } }));
    const huge = await postWebhook(r.url, 'whe_huge', Buffer.from('{"a":1}'), [SECRET], undefined, options);
    assert.equal([huge.success, huge.statusCode], [false, null]);
    assert.match(huge.error ?? '', /overflow/i);
  } finally {
    await r.close();
  }
});

test.run();
