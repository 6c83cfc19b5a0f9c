import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { Ajv } from 'ajv';
import { codePoints, utf8Prefix } from '../../lib/code-points.js';

test('codePoints counts a string as ajv counts maxLength: a surrogate pair is one character, a lone surrogate one too', () => {
  const ajv = new Ajv({ strict: false });
  const cases = ['', 'abc', '😀', 'a😀b', '😀😀😀', '\ud83d', '\ude00', '\ude00\ud83d', 'x\ud83d', 'é', '👩‍👩‍👧'];
  for (const value of cases) {
    const n = codePoints(value);
    assert.is(n, [...value].length, JSON.stringify(value));
    assert.ok(ajv.validate({ type: 'string', maxLength: n }, value), `${JSON.stringify(value)} fits ${n}`);
    if (n > 0) assert.not.ok(ajv.validate({ type: 'string', maxLength: n - 1 }, value), `${JSON.stringify(value)} does not fit ${n - 1}`);
  }
});

test('utf8Prefix keeps at most n bytes, cut back to the last whole character: never a U+FFFD the text did not have', () => {
  const text = 'ab€😀é' + 'x'.repeat(5);
  const bytes = Buffer.from(text, 'utf8');
  for (let n = 0; n <= bytes.length + 2; n++) {
    const kept = utf8Prefix(bytes, n);
    assert.ok(Buffer.byteLength(kept) <= n, `${n}: ${Buffer.byteLength(kept)} bytes`);
    assert.ok(text.startsWith(kept), `${n}: ${JSON.stringify(kept)} is a prefix`);
    assert.ok(Buffer.byteLength(kept) > n - 4, `${n}: cut back by less than one character`);
  }
  assert.is(utf8Prefix(Buffer.from('ab' + '€'.repeat(3000)), 4096), 'ab' + '€'.repeat(1364), 'the probe\'s case: 4,094 bytes');
  assert.is(utf8Prefix(Buffer.from([0x61, 0xff, 0x62]), 10), 'a\ufffdb', 'bytes that are not UTF-8 decode as usual');
  assert.is(utf8Prefix(Buffer.from([0x61, 0x80, 0x80, 0x80, 0x80, 0x80]), 5), 'a\ufffd\ufffd\ufffd\ufffd', 'a run of stray continuation bytes is not searched back past a character');
});

test.run();
