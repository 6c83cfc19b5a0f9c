import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { apnsTokenForm } from '../../lib/apns-token.js';

test('apnsTokenForm: hex in lowercase without NSData\'s spaces and <>; anything else as sent', () => {
  const hex = '0a1b2c3d'.repeat(8);
  const cases: [string, string][] = [
    [hex, hex],
    [hex.toUpperCase(), hex],
    [`<${hex.match(/.{8}/g)!.join(' ')}>`, hex],
    [` ${hex}\n`, hex],
    ['dGVzdA:APA91bH-Xy_Z', 'dGVzdA:APA91bH-Xy_Z'], // an FCM token: not hex
    ['ABCDEFGZ', 'ABCDEFGZ'],
    ['<ab cd>', '<ab cd>'], // under 8 once stripped
  ];
  for (const [sent, kept] of cases) assert.is(apnsTokenForm(sent), kept, JSON.stringify(sent));
});

test.run();
