import { randomBytes } from 'node:crypto';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { Role } from '../../lib/config.js';
import { client } from './api.js';
import { generateProviderKey, startApnsPeer, type ApnsPeer, type ProviderKey } from './apns-peer.js';
import { bootstrapWorkspace, startTestService } from './service.js';

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

/**
 * What push tests start from: a local APNs peer, the service (`roles`) pointed at it, and a workspace
 * whose default tenant holds the peer's credentials, with keys of every kind (scopes `*`).
 */
export async function startPushService(name: string, overrides: Record<string, string>, roles: Role[]) {
  const { peer, key, env } = await pushSetup();
  const service = await startTestService(name, { ...env, ...overrides }, roles);
  const api = client(service.url);
  const boot = await bootstrapWorkspace(service, name);
  const res = await api.call('PUT', '/v1/apps/apns', { key: boot.keys.tenant, body: apnsCredentials(key) });
  if (res.status !== 200 && res.status !== 201) throw new Error(`PUT /v1/apps/apns: ${res.status} ${JSON.stringify(res.body)}`);
  return { peer, service, api, key: boot.keys.tenant, pk: boot.keys.client, tenantId: boot.tenant.id, workspaceId: boot.workspace.id, providerKey: key };
}
