import type { Redis } from 'ioredis';
import { now } from '../lib/clock.js';
import type { Logger } from '../lib/log.js';
import { findApiKeyByHash, findTenant, findWorkspace, type ApiKeyRecord, type Tenant, type Workspace } from './identity.js';
import type { Keys } from './keys.js';

/** What a presented key resolves to: its record, its workspace and (tenant and client keys) its tenant. */
export type Principal = { key: ApiKeyRecord; workspace: Workspace; tenant: Tenant | null };

const MAX_ENTRIES = 10_000;

/**
 * A per-process cache of principals by key hash. Revocations are published on a Redis channel
 * and drop the entry at once in every process; entries also expire after `ttlMs`, and the whole
 * cache is cleared whenever the subscription reconnects, so a missed message cannot keep a
 * revoked key alive longer than the TTL.
 */
export class KeyCache {
  private readonly entries = new Map<string, { principal: Principal; until: number }>();
  private subscriber: Redis | null = null;
  /** bumped on every revocation message, so a lookup that raced one is not cached */
  private generation = 0;

  constructor(private readonly redis: Redis, private readonly keys: Keys, private readonly ttlMs: number, private readonly log: Logger) {}

  /** Subscribes to revocations on a dedicated connection. */
  async start(): Promise<void> {
    const sub = this.redis.duplicate();
    this.subscriber = sub;
    sub.on('message', (_channel: string, hash: string) => {
      this.generation++;
      this.entries.delete(hash);
    });
    sub.on('ready', () => this.entries.clear());
    sub.on('error', (err: Error) => this.log.warn('key revocation subscription error', { err: err.message }));
    await sub.subscribe(this.keys.keyRevocations);
  }

  async stop(): Promise<void> {
    this.subscriber?.disconnect();
    this.subscriber = null;
    this.entries.clear();
  }

  /** The principal of the key whose hash is `hash`, or null when no such key exists. */
  async lookup(hash: string): Promise<Principal | null> {
    const hit = this.entries.get(hash);
    if (hit && hit.until > now()) return hit.principal;
    const generation = this.generation;
    const key = await findApiKeyByHash(this.redis, this.keys, hash);
    if (!key) return null;
    const workspace = await findWorkspace(this.redis, this.keys, key.workspaceId);
    if (!workspace) return null;
    const tenant = key.tenantId ? await findTenant(this.redis, this.keys, key.workspaceId, key.tenantId) : null;
    if (key.tenantId && !tenant) return null;
    const principal: Principal = { key, workspace, tenant };
    // A revocation announced while this lookup read Redis may concern this very key: do not cache then.
    if (!key.revokedAt && this.ttlMs > 0 && generation === this.generation) {
      if (this.entries.size >= MAX_ENTRIES) this.entries.delete(this.entries.keys().next().value as string);
      this.entries.set(hash, { principal, until: now() + this.ttlMs });
    }
    return principal;
  }
}
