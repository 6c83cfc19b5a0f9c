import type { Redis } from 'ioredis';
import { createApiKey, ensureWorkspace, type Tenant, type Workspace, type Writer } from '../../streams/identity.js';
import type { Keys } from '../../streams/keys.js';
import type { TenantScope } from '../../streams/subscriber-writes.js';
import { registerSubscription } from '../../streams/subscriptions.js';
import { addTopicMembers, type TopicRef } from '../../streams/topic-members.js';
import { createTopic } from '../../streams/topics.js';
import { generateProviderKey, type ProviderKey } from '../../test/helpers/apns-peer.js';
import { deviceToken } from './apns-h2-client.js';
import { startApnsPeerProcess, type PeerProcess } from './apns-peer-process.js';

/**
 * The push audience of the messages benches, written straight through the product's library
 * functions in the bench process (the HTTP API would take minutes for 100,000 devices): a
 * workspace and tenant with a tenant key, subscribers `sub-<n>` with one iOS device each (token
 * `deviceToken(n)`), a topic and its members. Writes the same records, inbox events and indexes
 * as the routes do.
 */
export const BUNDLE_ID = 'com.example.herald.bench';
export const BY_BENCH: Writer = { actor: { type: 'system', id: null }, request: null };
export const subscriberId = (n: number) => `sub-${n}`;

export type PushTenant = { workspace: Workspace; tenant: Tenant; scope: TenantScope; tenantKey: string };

export async function createPushTenant(redis: Redis, keys: Keys, slug: string, partitions: number): Promise<PushTenant> {
  const { workspace, tenant } = await ensureWorkspace(redis, keys, slug, BY_BENCH);
  const tenantKey = (await createApiKey(redis, keys, { workspace, tenant, kind: 'tenant', scopes: ['*'], expiresAt: null, name: 'bench' }, BY_BENCH)).key;
  return { workspace, tenant, tenantKey, scope: { workspaceId: workspace.id, tenantId: tenant.id, partitions } };
}

/**
 * A new provider key and the local APNs peer, in its own process, checking tokens signed with it
 * for `BUNDLE_ID`; the peer's stop is pushed on `stops`.
 */
export async function startPeerWithProvider(stops: Array<() => Promise<void>>): Promise<{ provider: ProviderKey; peer: PeerProcess }> {
  const provider = generateProviderKey();
  const peer = await startApnsPeerProcess({
    keyId: provider.keyId, teamId: provider.teamId, topic: BUNDLE_ID,
    publicKeyPem: provider.publicKey.export({ type: 'spki', format: 'pem' }).toString(),
  });
  stops.push(peer.stop);
  return { provider, peer };
}

/** Runs `work(i)` for i in [from, to), `concurrency` at a time; `onProgress` every `every` items. */
export async function pool(from: number, to: number, concurrency: number, work: (i: number) => Promise<unknown>, onProgress?: (done: number) => void, every = 10_000): Promise<void> {
  let next = from;
  let done = 0;
  const lane = async () => {
    while (next < to) {
      await work(next++);
      if (++done % every === 0) onProgress?.(done);
    }
  };
  await Promise.all(Array.from({ length: Math.max(1, Math.min(concurrency, to - from)) }, lane));
}

/** Registers one iOS push device for each of `sub-<from>` … `sub-<to - 1>` (creating the subscribers). */
export async function registerDevices(redis: Redis, keys: Keys, scope: TenantScope, from: number, to: number, concurrency = 128, onProgress?: (done: number) => void): Promise<number> {
  const t0 = performance.now();
  await pool(from, to, concurrency, (i) => registerSubscription(redis, keys, scope, subscriberId(i), { channel: 'push', token: deviceToken(i), platform: 'ios', environment: 'production' }), onProgress);
  return (performance.now() - t0) / 1000;
}

export async function makeTopic(redis: Redis, keys: Keys, t: PushTenant, slug: string): Promise<TopicRef> {
  const topic = await createTopic(redis, keys, { workspace: t.workspace, tenant: t.tenant }, { slug }, BY_BENCH);
  return { id: topic.id, slug: topic.slug };
}

/** Adds `sub-<from>` … `sub-<to - 1>` to `topic` with addTopicMembers, `chunk` per call, `parallel` calls at a time. */
export async function joinTopic(redis: Redis, keys: Keys, scope: TenantScope, topic: TopicRef, from: number, to: number, chunk = 1000, parallel = 4, onProgress?: (done: number) => void): Promise<number> {
  const t0 = performance.now();
  const chunks = Math.ceil((to - from) / chunk);
  await pool(0, chunks, parallel, async (c) => {
    const ids: string[] = [];
    for (let i = from + c * chunk; i < Math.min(to, from + (c + 1) * chunk); i++) ids.push(subscriberId(i));
    await addTopicMembers(redis, keys, scope, topic, ids);
  }, onProgress ? (n) => onProgress(n * chunk) : undefined, Math.max(1, Math.round(20_000 / chunk)));
  return (performance.now() - t0) / 1000;
}

/** `PUT /v1/apps/apns` with the provider key (the web role needs HERALD_ENCRYPTION_KEY). */
export async function putApnsCredentials(webUrl: string, tenantKey: string, key: ProviderKey, bundleId = BUNDLE_ID): Promise<void> {
  const res = await fetch(`${webUrl}/v1/apps/apns`, {
    method: 'PUT',
    headers: { authorization: `Bearer ${tenantKey}`, 'content-type': 'application/json' },
    body: JSON.stringify({ keyId: key.keyId, teamId: key.teamId, bundleId, privateKey: key.privateKeyPem }),
  });
  const body = await res.text();
  if (res.status !== 200 && res.status !== 201) throw new Error(`PUT /v1/apps/apns answered ${res.status}: ${body.slice(0, 300)}`);
}

/** GET with the tenant key; the `data` of the envelope. */
export async function getData<T>(webUrl: string, tenantKey: string, path: string): Promise<T> {
  const res = await fetch(`${webUrl}${path}`, { headers: { authorization: `Bearer ${tenantKey}` } });
  const body = (await res.json()) as { data: T };
  if (res.status !== 200) throw new Error(`GET ${path} answered ${res.status}: ${JSON.stringify(body).slice(0, 300)}`);
  return body.data;
}

/** POST with the tenant key; status and the `data` of the envelope. */
export async function postData<T>(webUrl: string, tenantKey: string, path: string, body: unknown): Promise<{ status: number; data: T }> {
  const res = await fetch(`${webUrl}${path}`, { method: 'POST', headers: { authorization: `Bearer ${tenantKey}`, 'content-type': 'application/json' }, body: JSON.stringify(body) });
  const json = (await res.json()) as { data: T };
  return { status: res.status, data: json.data };
}
