import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { Ajv } from 'ajv';
import { codePoints } from '../../lib/code-points.js';

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

test.run();
