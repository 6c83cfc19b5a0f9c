import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { ConfigError, loadConfig } from '../../lib/config.js';

const config = suite('config');

config('numeric settings are decimal digits within their range; other spellings of a number are refused, naming the setting', () => {
  assert.is(loadConfig({ EVENT_RETENTION_DAYS: '10' }, {}).retentionMs, 10 * 86_400_000);
  assert.is(loadConfig({ EVENT_RETENTION_DAYS: '' }, {}).retentionMs, 30 * 86_400_000, 'empty is the default');
  for (const bad of ['1e1', '0x1e', '30.0', '30.5', ' 30', '+30', '-1', '0', 'abc', '99999999999']) {
    assert.throws(() => loadConfig({ EVENT_RETENTION_DAYS: bad }, {}), (err: Error) => err instanceof ConfigError && err.message === `EVENT_RETENTION_DAYS must be an integer from 1 to 3650, got "${bad}"`, bad);
  }
  assert.throws(() => loadConfig({ PORT: '3e3' }, {}), (err: Error) => err instanceof ConfigError && /^PORT /.test(err.message));
});

config.run();
