import type { Redis } from 'ioredis';
import { now } from '../lib/clock.js';
import type { Logger } from '../lib/log.js';
import {
  findApiKeyByHash, findTenantWithIdentity, findWorkspace, IDENTITY_CHANGE_PREFIX, tenantIdentity,
  type ApiKeyRecord, type IdentitySettings, type Tenant, type Workspace,
} from './identity.js';
import type { Keys } from './keys.js';

/** What a presented key resolves to: its record, its workspace and (tenant and client keys) its tenant. */
export type Principal = { key: ApiKeyRecord; workspace: Workspace; tenant: Tenant | null };

const MAX_ENTRIES = 10_000;

/**
 * A per-process cache of principals by key hash, and of tenants' identity settings (secret and
 * whether verification is required) by tenant id. Revocations and identity changes are published
 * on one Redis channel and drop the entry at once in every process; entries also expire after
 * `ttlMs`. The cache is only trusted while the subscription's connection is up: when it closes the
 * cache is cleared and every lookup reads Redis until it is back (and cleared once more), so a
 * revocation published while this process could not hear it never leaves a revoked key working.
 */
export class KeyCache {
  private readonly entries = new Map<string, { principal: Principal; until: number }>();
  private readonly identities = new Map<string, { settings: IdentitySettings; until: number }>();
  private subscriber: Redis | null = null;
  /** true once the subscriber connection's SUBSCRIBE was answered, false again when it closes */
  private subscribed = false;
  /** bumped on every message of the channel, so a lookup that raced one is not cached */
  private generation = 0;

  constructor(private readonly redis: Redis, private readonly keys: Keys, private readonly ttlMs: number, private readonly log: Logger) {}

  /** Subscribes to revocations and identity changes on a dedicated connection. */
  async start(): Promise<void> {
    // Its own re-subscription, not ioredis's: ioredis reports the connection `ready` before the
    // SUBSCRIBE it sends again is through, and a revocation published in between would not be
    // heard. So the cache is trusted only once this connection's own SUBSCRIBE has been answered.
    const sub = this.redis.duplicate({ autoResubscribe: false });
    this.subscriber = sub;
    sub.on('message', (_channel: string, message: string) => {
      this.generation++;
      if (message.startsWith(IDENTITY_CHANGE_PREFIX)) this.identities.delete(message.slice(IDENTITY_CHANGE_PREFIX.length));
      else this.entries.delete(message);
    });
    const forget = () => {
      this.subscribed = false;
      this.generation++;
      this.entries.clear();
      this.identities.clear();
    };
    const subscribe = async () => {
      await sub.subscribe(this.keys.keyRevocations);
      // still the same connection (no close in between): from now on every revocation reaches it
      if (this.subscriber === sub && sub.status === 'ready') {
        forget();
        this.subscribed = true;
      }
    };
    sub.on('ready', () => {
      forget();
      subscribe().catch((err: Error) => this.log.warn('key revocation subscription failed', { err: err.message }));
    });
    sub.on('close', forget);
    sub.on('error', (err: Error) => this.log.warn('key revocation subscription error', { err: err.message }));
    await subscribe();
  }

  async stop(): Promise<void> {
    this.subscriber?.disconnect();
    this.subscriber = null;
    this.subscribed = false;
    this.entries.clear();
    this.identities.clear();
  }

  /** True while revocations can reach this process: only then is anything cached or served from the cache. */
  get listening(): boolean {
    return this.ttlMs > 0 && this.subscribed && this.subscriber?.status === 'ready';
  }

  /** The principal of the key whose hash is `hash`, or null when no such key exists. */
  async lookup(hash: string): Promise<Principal | null> {
    const hit = this.listening ? this.entries.get(hash) : undefined;
    if (hit && hit.until > now()) return hit.principal;
    const generation = this.generation;
    const key = await findApiKeyByHash(this.redis, this.keys, hash);
    if (!key) return null;
    const workspace = await findWorkspace(this.redis, this.keys, key.workspaceId);
    if (!workspace) return null;
    const found = key.tenantId ? await findTenantWithIdentity(this.redis, this.keys, key.workspaceId, key.tenantId) : null;
    if (key.tenantId && !found) return null;
    const tenant = found?.tenant ?? null;
    const principal: Principal = { key, workspace, tenant };
    // A revocation announced while this lookup read Redis may concern this very key: do not cache then.
    if (this.listening && generation === this.generation) {
      const until = now() + this.ttlMs;
      if (!key.revokedAt) {
        if (this.entries.size >= MAX_ENTRIES) this.entries.delete(this.entries.keys().next().value as string);
        this.entries.set(hash, { principal, until });
      }
      // the tenant record read above holds its identity settings too (once its secret exists)
      if (tenant && found!.identity) this.remember(tenant.id, found!.identity, until);
    }
    return principal;
  }

  /**
   * The identity settings of `tenant` (its secret made on first use), from this cache unless
   * `fresh`; a change (`rotateIdentitySecret`, `setIdentityRequired`) drops the entry in every
   * process at once, and a read that raced such a change is not cached.
   */
  async identity(tenant: Tenant, options: { fresh?: boolean } = {}): Promise<IdentitySettings> {
    if (!options.fresh && this.listening) {
      const hit = this.identities.get(tenant.id);
      if (hit && hit.until > now()) return hit.settings;
    }
    const generation = this.generation;
    const settings = await tenantIdentity(this.redis, this.keys, tenant);
    if (this.listening && generation === this.generation) this.remember(tenant.id, settings, now() + this.ttlMs);
    return settings;
  }

  private remember(tenantId: string, settings: IdentitySettings, until: number): void {
    if (!this.identities.has(tenantId) && this.identities.size >= MAX_ENTRIES) this.identities.delete(this.identities.keys().next().value as string);
    this.identities.set(tenantId, { settings, until });
  }
}
