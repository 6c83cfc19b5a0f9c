import { randomBytes } from 'node:crypto';
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { ConfigError, loadConfig } from '../../lib/config.js';
import { createSecretBox, parseEncryptionKey, SecretBoxError } from '../../lib/secret-box.js';

/** uvu's `throws` takes a predicate, not a class. */
const isA = (type: new (...args: any[]) => Error) => (err: Error) => err instanceof type;

const box = suite('secret box');

const SEALED = /^v1:[A-Za-z0-9+/]{16}:[A-Za-z0-9+/]{22}==:[A-Za-z0-9+/=]*$/;

box('a sealed value opens to the same text, and the format is v1:<iv>:<tag>:<data> in base64', () => {
  const b = createSecretBox(randomBytes(32));
  const text = '-----BEGIN PRIVATE KEY-----\nMIGTAgEAMBMG…\n-----END PRIVATE KEY-----\n';
  const sealed = b.seal(text);
  assert.match(sealed, SEALED);
  assert.not.ok(sealed.includes('PRIVATE KEY'), 'the plaintext does not show');
  assert.is(b.open(sealed), text);
  assert.is(b.open(b.seal('')), '', 'an empty string round-trips');
  assert.is(b.open(b.seal('héllo ✓ 🔑')), 'héllo ✓ 🔑', 'UTF-8 round-trips');
});

box('sealing the same text twice gives different values (a fresh IV each time)', () => {
  const b = createSecretBox(randomBytes(32));
  const values = new Set(Array.from({ length: 50 }, () => b.seal('same')));
  assert.is(values.size, 50);
  const ivs = new Set([...values].map((v) => v.split(':')[1]));
  assert.is(ivs.size, 50);
});

box('another key cannot open a value', () => {
  const sealed = createSecretBox(randomBytes(32)).seal('secret');
  assert.throws(() => createSecretBox(randomBytes(32)).open(sealed), (err: Error) => err instanceof SecretBoxError && /does not open with this key/.test(err.message));
});

box('a value sealed under one context does not open under another, nor without one', () => {
  const b = createSecretBox(randomBytes(32));
  const sealed = b.seal('secret', 'herald:apns:tnt_a:privateKey');
  assert.is(b.open(sealed, 'herald:apns:tnt_a:privateKey'), 'secret');
  assert.throws(() => b.open(sealed, 'herald:apns:tnt_b:privateKey'), isA(SecretBoxError));
  assert.throws(() => b.open(sealed), isA(SecretBoxError));
  assert.throws(() => b.open(b.seal('secret'), 'some context'), isA(SecretBoxError));
});

box('an altered iv, tag or ciphertext is refused', () => {
  const b = createSecretBox(randomBytes(32));
  const sealed = b.seal('a secret worth protecting');
  const parts = sealed.split(':');
  for (const index of [1, 2, 3]) {
    const bytes = Buffer.from(parts[index]!, 'base64');
    bytes[0] = bytes[0]! ^ 0x01;
    const altered = parts.map((p, i) => (i === index ? bytes.toString('base64') : p)).join(':');
    assert.throws(() => b.open(altered), isA(SecretBoxError), `part ${index}`);
  }
});

box('malformed values and unknown versions are refused with a SecretBoxError', () => {
  const b = createSecretBox(randomBytes(32));
  const [, iv, tag, data] = b.seal('x').split(':');
  for (const value of ['', 'plain text', 'v1:abc', `v1:${iv}:${tag}`, `v1:${iv}:${tag}:${data}:extra`, `v1:AAAA:${tag}:${data}`, `v1:${iv}:AAAA:${data}`]) {
    assert.throws(() => b.open(value), isA(SecretBoxError), JSON.stringify(value));
  }
  assert.throws(() => b.open(`v2:${iv}:${tag}:${data}`), (err: Error) => err instanceof SecretBoxError && /unknown sealed-value format "v2"/.test(err.message));
});

box('a key must be exactly 32 bytes', () => {
  assert.throws(() => createSecretBox(randomBytes(16)), isA(RangeError));
  assert.throws(() => createSecretBox(randomBytes(33)), isA(RangeError));
});

box('the box keeps its own copy of the key', () => {
  const key = randomBytes(32);
  const b = createSecretBox(key);
  const sealed = b.seal('secret');
  key.fill(0);
  assert.is(b.open(sealed), 'secret');
});

const keys = suite('encryption key setting');

keys('64 hex characters, base64 and base64url all give the same 32 bytes', () => {
  const bytes = randomBytes(32);
  for (const text of [bytes.toString('hex'), bytes.toString('hex').toUpperCase(), bytes.toString('base64'), bytes.toString('base64').replace(/=$/, ''), bytes.toString('base64url'), `  ${bytes.toString('hex')}\n`]) {
    assert.equal(parseEncryptionKey(text), bytes, text);
  }
});

keys('other lengths and alphabets are refused', () => {
  for (const text of ['', 'short', randomBytes(16).toString('hex'), randomBytes(33).toString('hex'), randomBytes(31).toString('base64'), randomBytes(48).toString('base64'), 'z'.repeat(64), randomBytes(32).toString('hex') + '0']) {
    assert.is(parseEncryptionKey(text), null, text);
  }
});

keys('loadConfig reads HERALD_ENCRYPTION_KEY: unset or empty is null, a good key is its bytes, a bad one is a ConfigError saying how to make one', () => {
  assert.is(loadConfig({}, {}).encryptionKey, null);
  assert.is(loadConfig({ HERALD_ENCRYPTION_KEY: '' }, {}).encryptionKey, null);
  const bytes = randomBytes(32);
  assert.equal(loadConfig({ HERALD_ENCRYPTION_KEY: bytes.toString('hex') }, {}).encryptionKey, bytes);
  assert.equal(loadConfig({ HERALD_ENCRYPTION_KEY: bytes.toString('base64') }, {}).encryptionKey, bytes);
  assert.throws(
    () => loadConfig({ HERALD_ENCRYPTION_KEY: 'hunter2' }, {}),
    (err: Error) => err instanceof ConfigError && err.message === 'HERALD_ENCRYPTION_KEY must be 32 bytes written as 64 hex characters or as base64 (make one with: openssl rand -hex 32)',
  );
  let message = '';
  try {
    loadConfig({ HERALD_ENCRYPTION_KEY: 'hunter2' }, {});
  } catch (err) {
    message = (err as Error).message;
  }
  assert.not.ok(message.includes('hunter2'), 'the message does not echo the value');
});

keys('the APNs settings have their documented defaults and are validated', () => {
  const c = loadConfig({}, {});
  assert.is(c.apnsHost, 'api.push.apple.com');
  assert.is(c.apnsSandboxHost, 'api.sandbox.push.apple.com');
  assert.is(c.apnsPort, 443);
  assert.is(c.apnsSandboxPort, 443);
  assert.is(c.apnsCaFile, null);
  assert.is(c.apnsMaxConcurrentPerTenant, 1000);
  assert.is(c.apnsRatePerTenantPerSecond, 20_000);
  assert.is(c.apnsMaxAttempts, 5);
  assert.is(c.apnsRetryBaseMs, 250);
  assert.is(c.apnsRequestTimeoutMs, 5000);
  assert.is(c.apnsCredentialsCheckMs, 10_000);
  const set = loadConfig({ APNS_HOST: '127.0.0.1', APNS_SANDBOX_HOST: 'localhost', APNS_PORT: '2197', APNS_CA_FILE: '/tmp/ca.pem', APNS_CREDENTIALS_CHECK_SECONDS: '0' }, {});
  assert.is(set.apnsHost, '127.0.0.1');
  assert.is(set.apnsSandboxHost, 'localhost');
  assert.is(set.apnsPort, 2197);
  assert.is(set.apnsSandboxPort, 2197, 'the sandbox port follows APNS_PORT unless set');
  assert.is(loadConfig({ APNS_PORT: '2197', APNS_SANDBOX_PORT: '443' }, {}).apnsSandboxPort, 443);
  assert.is(set.apnsCaFile, '/tmp/ca.pem');
  assert.is(set.apnsCredentialsCheckMs, 0);
  assert.throws(() => loadConfig({ APNS_HOST: 'https://api.push.apple.com' }, {}), (err: Error) => err instanceof ConfigError && /^APNS_HOST must be a host name/.test(err.message));
  assert.throws(() => loadConfig({ APNS_SANDBOX_HOST: 'host:443' }, {}), isA(ConfigError));
  assert.throws(() => loadConfig({ APNS_PORT: '0' }, {}), isA(ConfigError));
  assert.throws(() => loadConfig({ APNS_MAX_ATTEMPTS: '0' }, {}), isA(ConfigError));
});

box.run();
keys.run();
