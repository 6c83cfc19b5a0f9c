import { randomBytes } from 'node:crypto';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { generateProviderKey, startApnsPeer, type ApnsPeer, type ProviderKey } from './apns-peer.js';

export const BUNDLE_ID = 'com.example.herald';

/** A local APNs peer and the service settings that point Herald at it (the production code path). */
export async function pushSetup(options: { record?: boolean } = {}): Promise<{ peer: ApnsPeer; key: ProviderKey; env: Record<string, string> }> {
  const key = generateProviderKey();
  const peer = await startApnsPeer({ keyId: key.keyId, teamId: key.teamId, publicKey: key.publicKey, topic: BUNDLE_ID, record: options.record ?? true });
  const caFile = join(mkdtempSync(join(tmpdir(), 'herald-apns-ca-')), 'ca.pem');
  writeFileSync(caFile, peer.ca);
  const env = {
    APNS_HOST: '127.0.0.1', APNS_SANDBOX_HOST: '127.0.0.1', APNS_PORT: String(peer.port), APNS_CA_FILE: caFile,
    HERALD_ENCRYPTION_KEY: randomBytes(32).toString('hex'), APNS_RETRY_BASE_MS: '20',
  };
  return { peer, key, env };
}

/** The credentials body of `PUT /v1/apps/apns` for the peer's provider key. */
export function apnsCredentials(key: ProviderKey) {
  return { keyId: key.keyId, teamId: key.teamId, bundleId: BUNDLE_ID, privateKey: key.privateKeyPem };
}
