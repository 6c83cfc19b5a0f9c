import type { Schema } from './common.js';

// Every export of this module is a schema: lib/schemas/index.ts registers them all.

const appleId = (what: string): Schema => ({
  type: 'string', pattern: '^[A-Z0-9]{10}$',
  description: `The 10-character ${what} (A-Z, 0-9).`,
});

export const ApnsCredentialsUpdate: Schema = {
  type: 'object',
  additionalProperties: false,
  required: ['keyId', 'teamId', 'bundleId', 'privateKey'],
  properties: {
    keyId: appleId('Key ID Apple shows for the .p8 signing key'),
    teamId: appleId('Apple Developer Team ID'),
    bundleId: {
      type: 'string', minLength: 3, maxLength: 155, pattern: '^[A-Za-z0-9-]+(?:\\.[A-Za-z0-9-]+)+$',
      description: 'The app\'s bundle id, sent as `apns-topic`, e.g. com.example.app.',
    },
    privateKey: {
      type: 'string', minLength: 1, maxLength: 8192, writeOnly: true,
      description: 'The whole AuthKey_XXXXXXXXXX.p8 file (PKCS#8 PEM of an EC P-256 key). Stored encrypted; never returned.',
    },
  },
};

export const ApnsCredentials: Schema = {
  type: 'object',
  additionalProperties: false,
  required: ['keyId', 'teamId', 'bundleId', 'keyFingerprint', 'configuredAt'],
  description: 'The tenant\'s APNs app credentials without the private key.',
  properties: {
    keyId: { type: 'string' },
    teamId: { type: 'string' },
    bundleId: { type: 'string' },
    keyFingerprint: { type: 'string', pattern: '^sha256:[0-9a-f]{64}$', description: 'SHA-256 of the public half of the key (DER SubjectPublicKeyInfo), to recognise a key without revealing it.' },
    configuredAt: { type: 'string', format: 'date-time', description: 'When these credentials were stored.' },
  },
};
