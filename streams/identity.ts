import type { Redis } from 'ioredis';
import { isoNow, now } from '../lib/clock.js';
import { isId, newId } from '../lib/ids.js';
import { KEY_PREFIX, KEY_SECRET_HEX, type KeyKind } from '../lib/key-kinds.js';
import { isSessionOnly } from '../lib/scopes.js';
import { randomBytes } from 'node:crypto';
import { sha256Hex } from '../lib/secrets.js';
import { auditIntent, recordIntent, settleAudit, writeScope, type AuditDraft, type AuditIntent, type AuditScope } from './audit-outbox.js';
import type { Keys } from './keys.js';
import { appendAudit, type AuditActor, type AuditRequest, type Ref } from './ledger.js';
import { callScript } from './lua-scripts.js';

export type Workspace = { id: string; slug: string; createdAt: string };
export type Tenant = { id: string; slug: string; workspaceId: string; createdAt: string };
export type ApiKeyRecord = {
  id: string;
  kind: KeyKind;
  workspaceId: string;
  tenantId: string | null;
  scopes: string[];
  name: string | null;
  /** the first characters of the key and its last four, enough to recognise it */
  hint: string;
  hash: string;
  createdAt: string;
  expiresAt: string | null;
  revokedAt: string | null;
};

export type Writer = { actor: AuditActor; request: AuditRequest };
/** Herald's own writes (a workflow's send, a token APNs declared dead): no actor, no request. */
export const SYSTEM_WRITER: Writer = Object.freeze({ actor: Object.freeze({ type: 'system', id: null }), request: null });

const ref = (r: { id: string; slug: string }): Ref => ({ id: r.id, slug: r.slug });

/** Reads a workspace by slug, or null. */
export async function findWorkspaceBySlug(redis: Redis, keys: Keys, slug: string): Promise<Workspace | null> {
  const id = await redis.hget(keys.workspaceSlugs, slug);
  return id ? findWorkspace(redis, keys, id) : null;
}

/** Reads a workspace by id, or null. */
export async function findWorkspace(redis: Redis, keys: Keys, id: string): Promise<Workspace | null> {
  const h = await redis.hgetall(keys.workspace(id));
  return h.id ? { id: h.id, slug: h.slug!, createdAt: h.createdAt! } : null;
}

/**
 * Creates the workspace `slug` with its `default` tenant unless it exists. Safe to repeat and to
 * interrupt: the slug is claimed first, and a claimed slug without its record is completed.
 */
export async function ensureWorkspace(redis: Redis, keys: Keys, slug: string, by: Writer): Promise<{ workspace: Workspace; tenant: Tenant; created: boolean }> {
  await redis.hsetnx(keys.workspaceSlugs, slug, newId('workspace'));
  const id = (await redis.hget(keys.workspaceSlugs, slug))!;
  const record = keys.workspace(id);
  const [hasSlug, audited] = await redis.hmget(record, 'slug', 'audited');
  const created = !hasSlug;
  if (created) await redis.hset(record, 'id', id, 'slug', slug, 'createdAt', isoNow());
  const workspace = (await findWorkspace(redis, keys, id))!;
  if (!audited) {
    // A fixed event id: a run interrupted after this append and repeated appends a duplicate the dispatcher drops.
    await appendAudit(redis, keys, { id: 'whe_' + id.slice('ws_'.length), type: 'workspace.created', workspace: ref(workspace), tenant: null, actor: by.actor, target: { type: 'workspace', id }, request: by.request, object: { ...workspace } });
    await redis.hset(record, 'audited', '1');
  }
  const { tenant } = await createTenant(redis, keys, workspace, 'default', by);
  return { workspace, tenant, created };
}

/** Creates tenant `slug` in `workspace`; `created` is false (and the existing one returned) when the slug is taken. */
export async function createTenant(redis: Redis, keys: Keys, workspace: Workspace, slug: string, by: Writer): Promise<{ tenant: Tenant; created: boolean }> {
  // the id and createdAt read one clock: a list newest first by id is newest first by createdAt
  const at = now();
  const id = newId('tenant', at);
  const tenant: Tenant = { id, slug, workspaceId: workspace.id, createdAt: isoNow(at) };
  const intent = auditIntent(keys.workspaceOutbox(workspace.id), 'tenant.create', tenantScope(workspace, tenant, by), tenant);
  const reply = await callScript<[number, string]>(
    redis, 'createTenant',
    [keys.tenantSlugs(workspace.id), keys.tenantIndex(workspace.id), keys.tenant(workspace.id, id), intent.key],
    [id, slug, workspace.id, tenant.createdAt, at, intent.token, intent.json],
  );
  if (reply[0] !== 1) return { tenant: (await findTenant(redis, keys, workspace.id, reply[1]))!, created: false };
  await settleAudit(redis, keys, intent, TENANT_AUDITS['tenant.create'](tenant, reply));
  return { tenant, created: true };
}

/** Reads a tenant of a workspace by id, or null. */
export async function findTenant(redis: Redis, keys: Keys, workspaceId: string, tenantId: string): Promise<Tenant | null> {
  return (await findTenantWithIdentity(redis, keys, workspaceId, tenantId))?.tenant ?? null;
}

/**
 * Reads a tenant and, from the same record, its identity settings (null while the tenant has no
 * identity secret yet: `tenantIdentity` makes it). The settings never go into the `Tenant` object,
 * which is copied into audit entries.
 */
export async function findTenantWithIdentity(redis: Redis, keys: Keys, workspaceId: string, tenantId: string): Promise<{ tenant: Tenant; identity: IdentitySettings | null } | null> {
  if (!isId('tenant', tenantId)) return null;
  const h = await redis.hgetall(keys.tenant(workspaceId, tenantId));
  if (!h.id) return null;
  return {
    tenant: { id: h.id, slug: h.slug!, workspaceId: h.workspaceId!, createdAt: h.createdAt! },
    identity: h.identitySecret ? { secret: h.identitySecret, required: h.identityRequired === '1' } : null,
  };
}

/** Reads a tenant of a workspace by slug, or null. */
export async function findTenantBySlug(redis: Redis, keys: Keys, workspaceId: string, slug: string): Promise<Tenant | null> {
  const id = await redis.hget(keys.tenantSlugs(workspaceId), slug);
  return id ? findTenant(redis, keys, workspaceId, id) : null;
}

/**
 * The `{ id, slug }` refs of workspaces and tenants by id, cached per process for writers that know
 * only ids (a workflow run's send): a slug is fixed when its workspace or tenant is created
 * (`ensureWorkspace`, `lua/createTenant`), nothing renames one and neither is ever deleted, so an
 * entry never goes stale and a warm lookup costs no round trip. Concurrent lookups of one id share
 * one read; a miss (no such record) is not kept. Bounded: past `max` entries the cache starts over.
 */
export class IdentityRefs {
  private readonly refs = new Map<string, Promise<Ref | null>>();

  constructor(private readonly redis: Redis, private readonly keys: Keys, private readonly max = 10_000) {}

  workspace(workspaceId: string): Promise<Ref | null> {
    return this.cached(workspaceId, async () => {
      const workspace = await findWorkspace(this.redis, this.keys, workspaceId);
      return workspace ? ref(workspace) : null;
    });
  }

  tenant(workspaceId: string, tenantId: string): Promise<Ref | null> {
    return this.cached(tenantId, async () => {
      const tenant = await findTenant(this.redis, this.keys, workspaceId, tenantId);
      return tenant ? ref(tenant) : null;
    });
  }

  /** Workspace and tenant refs together, or null when either is unknown. */
  async scope(workspaceId: string, tenantId: string): Promise<{ workspace: Ref; tenant: Ref } | null> {
    const [workspace, tenant] = await Promise.all([this.workspace(workspaceId), this.tenant(workspaceId, tenantId)]);
    return workspace && tenant ? { workspace, tenant } : null;
  }

  // workspace (ws_) and tenant (tnt_) ids never collide, so one map holds both
  private cached(id: string, load: () => Promise<Ref | null>): Promise<Ref | null> {
    let found = this.refs.get(id);
    if (!found) {
      if (this.refs.size >= this.max) this.refs.clear();
      const loading = (found = load());
      this.refs.set(id, loading);
      // a miss or a failed read is asked again next time
      const forget = () => this.refs.get(id) === loading && this.refs.delete(id);
      loading.then((r) => r ?? forget(), forget);
    }
    return found;
  }
}

function toKeyRecord(h: Record<string, string>): ApiKeyRecord {
  return {
    id: h.id!,
    kind: h.kind as KeyKind,
    workspaceId: h.workspaceId!,
    tenantId: h.tenantId || null,
    scopes: h.scopes ? h.scopes.split(',') : [],
    name: h.name || null,
    hint: h.hint!,
    hash: h.hash!,
    createdAt: h.createdAt!,
    expiresAt: h.expiresAt || null,
    revokedAt: h.revokedAt || null,
  };
}

/** The public view of a key record (no hash). */
export function publicKey(record: ApiKeyRecord): Omit<ApiKeyRecord, 'hash'> {
  const { hash: _hash, ...rest } = record;
  return rest;
}

/**
 * Creates an API key and returns the key itself once; only its SHA-256 is stored. The record
 * is written before the hash pointer, so a lookup never finds a pointer without its record.
 * Scopes must already be checked with `scopeProblem` and `scopeProblemForKind` (tests make
 * deliberately useless keys, so this does not check them all itself); a session-only scope is
 * refused here too, whatever the caller checked (spec 5.7: never granted to a key, by any path;
 * probe BZ).
 */
export async function createApiKey(
  redis: Redis, keys: Keys,
  input: { workspace: Workspace; tenant: Tenant | null; kind: KeyKind; scopes: string[]; expiresAt: string | null; name: string | null },
  by: Writer,
): Promise<{ key: string; record: ApiKeyRecord }> {
  const sessionOnly = input.scopes.find(isSessionOnly);
  if (sessionOnly !== undefined) throw new Error(`createApiKey: "${sessionOnly}" is session-only and can never be granted to a key`);
  const key = KEY_PREFIX[input.kind] + randomBytes(KEY_SECRET_HEX / 2).toString('hex');
  const at = now();
  const id = newId('key', at);
  const record: ApiKeyRecord = {
    id,
    kind: input.kind,
    workspaceId: input.workspace.id,
    tenantId: input.kind === 'workspace' ? null : input.tenant!.id,
    scopes: input.scopes,
    name: input.name,
    hint: `${KEY_PREFIX[input.kind]}…${key.slice(-4)}`,
    hash: sha256Hex(key),
    createdAt: isoNow(at),
    expiresAt: input.expiresAt,
    revokedAt: null,
  };
  await redis.hset(keys.apiKey(id), {
    id, kind: record.kind, workspaceId: record.workspaceId, tenantId: record.tenantId ?? '', scopes: record.scopes.join(','),
    name: record.name ?? '', hint: record.hint, hash: record.hash, createdAt: record.createdAt, expiresAt: record.expiresAt ?? '', revokedAt: '',
  });
  // listed before it works: a write Redis refuses in between (out of memory) leaves no working key
  // that the key list does not show, and so cannot be revoked (probe CB)
  await redis.zadd(keys.apiKeyIndex(input.workspace.id), 0, id);
  await redis.set(keys.apiKeyByHash(record.hash), id);
  await appendAudit(redis, keys, {
    type: 'key.created', workspace: ref(input.workspace), tenant: input.tenant ? ref(input.tenant) : null,
    actor: by.actor, target: { type: 'api_key', id }, request: by.request, object: publicKey(record),
  });
  return { key, record };
}

/** Reads a key record by id, or null. */
export async function findApiKey(redis: Redis, keys: Keys, id: string): Promise<ApiKeyRecord | null> {
  if (!isId('key', id)) return null;
  const h = await redis.hgetall(keys.apiKey(id));
  return h.id ? toKeyRecord(h) : null;
}

/** Reads the key record whose stored hash is `hash`, or null. */
export async function findApiKeyByHash(redis: Redis, keys: Keys, hash: string): Promise<ApiKeyRecord | null> {
  const id = await redis.get(keys.apiKeyByHash(hash));
  return id ? findApiKey(redis, keys, id) : null;
}

/** Lists a workspace's keys, newest first (bounded: at most `limit`). */
export async function listApiKeys(redis: Redis, keys: Keys, workspaceId: string, limit = 1000): Promise<ApiKeyRecord[]> {
  const ids = await redis.zrange(keys.apiKeyIndex(workspaceId), '+', '-', 'BYLEX', 'REV', 'LIMIT', 0, limit);
  const records = await Promise.all(ids.map((id) => findApiKey(redis, keys, id)));
  return records.filter((r): r is ApiKeyRecord => r !== null);
}

/**
 * Revokes a key of `workspace` at once in every process: the record is marked and the hash is
 * published so every key cache drops it. Returns null when the key is not the workspace's.
 */
export async function revokeApiKey(redis: Redis, keys: Keys, workspace: Workspace, id: string, by: Writer): Promise<ApiKeyRecord | null> {
  const record = await findApiKey(redis, keys, id);
  if (!record || record.workspaceId !== workspace.id) return null;
  if (record.revokedAt) return record;
  const revokedAt = isoNow();
  await redis.hset(keys.apiKey(id), 'revokedAt', revokedAt);
  await redis.publish(keys.keyRevocations, record.hash);
  const revoked = { ...record, revokedAt };
  const tenant = record.tenantId ? await findTenant(redis, keys, workspace.id, record.tenantId) : null;
  await appendAudit(redis, keys, {
    type: 'key.revoked', workspace: ref(workspace), tenant: tenant ? ref(tenant) : null, actor: by.actor, target: { type: 'api_key', id }, request: by.request,
    object: publicKey(revoked), changes: { revokedAt }, previousAttributes: { revokedAt: null },
  });
  return revoked;
}

export type IdentitySettings = { secret: string; required: boolean };

/**
 * Prefix of the messages on the key-revocation channel (`keys.keyRevocations`) that announce a
 * change of a tenant's identity settings (`tenant-identity:<tenantId>`); the channel's other
 * messages are revoked key hashes (64 hex characters), which this prefix can never be.
 */
export const IDENTITY_CHANGE_PREFIX = 'tenant-identity:';

/** Tells every process's key cache that the identity settings of `tenantId` changed. */
async function announceIdentityChange(redis: Redis, keys: Keys, tenantId: string): Promise<void> {
  await redis.publish(keys.keyRevocations, IDENTITY_CHANGE_PREFIX + tenantId);
}

/**
 * The tenant's identity-verification settings read from Redis; the secret is made on first use
 * (HSETNX, so concurrent first uses agree on one) and never leaves through the API. Request paths
 * read them through the key cache (`KeyCache.identity`), which every change below invalidates.
 */
export async function tenantIdentity(redis: Redis, keys: Keys, tenant: Tenant): Promise<IdentitySettings> {
  const key = keys.tenant(tenant.workspaceId, tenant.id);
  let [secret, required] = await redis.hmget(key, 'identitySecret', 'identityRequired');
  if (!secret) {
    await redis.hsetnx(key, 'identitySecret', randomBytes(32).toString('hex'));
    [secret, required] = await redis.hmget(key, 'identitySecret', 'identityRequired');
  }
  return { secret: secret!, required: required === '1' };
}

/**
 * Replaces the tenant's identity secret: hashes made with the old one stop verifying at once in
 * every process (the change is announced to every key cache before this returns).
 */
export async function rotateIdentitySecret(redis: Redis, keys: Keys, workspace: Workspace, tenant: Tenant, by: Writer): Promise<string> {
  const secret = randomBytes(32).toString('hex');
  // the event's object is the tenant as tenant.created and tenant.updated describe it
  const described = { ...tenant, identityVerificationRequired: (await redis.hget(keys.tenant(tenant.workspaceId, tenant.id), 'identityRequired')) === '1' };
  const intent = auditIntent(keys.workspaceOutbox(tenant.workspaceId), 'tenant.rotateIdentitySecret', tenantScope(workspace, tenant, by), described);
  await writeTenantSetting(redis, keys, tenant, 'identitySecret', secret, intent);
  await settleAudit(redis, keys, intent, TENANT_AUDITS['tenant.rotateIdentitySecret'](described));
  return secret;
}

/**
 * Turns required identity verification on or off for a tenant's client calls, at once in every
 * process. The stored value is compared in lua/setIdentityRequired, atomically with the write: only
 * a call that changes it writes and audits `tenant.updated`, so the entry's previous value is the
 * one it replaced (concurrent toggles to one value make one entry).
 */
export async function setIdentityRequired(redis: Redis, keys: Keys, workspace: Workspace, tenant: Tenant, required: boolean, by: Writer): Promise<void> {
  const input = { tenant, required };
  const intent = auditIntent(keys.workspaceOutbox(tenant.workspaceId), 'tenant.setIdentityRequired', tenantScope(workspace, tenant, by), input);
  const [changed] = await callScript<[number]>(redis, 'setIdentityRequired', [keys.tenant(tenant.workspaceId, tenant.id), intent.key], [required ? '1' : '0', intent.token, intent.json]);
  if (changed !== 1) return;
  await announceIdentityChange(redis, keys, tenant.id);
  await settleAudit(redis, keys, intent, TENANT_AUDITS['tenant.setIdentityRequired'](input));
}

/**
 * Sets one identity setting on the tenant's record with its audit intent (one MULTI in the
 * workspace slot), then announces the change to every process's key cache.
 */
async function writeTenantSetting(redis: Redis, keys: Keys, tenant: Tenant, field: string, value: string, intent: AuditIntent): Promise<void> {
  const replies = (await recordIntent(redis.multi().hset(keys.tenant(tenant.workspaceId, tenant.id), field, value), intent).exec()) ?? [];
  for (const [err] of replies) if (err) throw err;
  await announceIdentityChange(redis, keys, tenant.id);
}

const tenantScope = (workspace: Workspace, tenant: Tenant, by: Writer): AuditScope => writeScope({ workspace: ref(workspace), tenant: ref(tenant) }, by);
const tenantAudit = (type: string, tenant: Tenant, rest: Partial<AuditDraft> = {}): AuditDraft => ({ type, target: { type: 'tenant', id: tenant.id }, object: { ...tenant }, ...rest });

/**
 * The audit entries of tenant writes (streams/audit-outbox.ts): from the script's reply for a
 * creation; for the settings, from what the writer knew: a rotation (a MULTI, no reply) always
 * changes the secret, and lua/setIdentityRequired records its intent only when it changed the value,
 * so the previous value is the other one.
 */
export const TENANT_AUDITS = {
  // a new tenant never requires identity verification; `tenant.updated` reports when that changes
  'tenant.create': (tenant: Tenant, reply: [number, string]): AuditDraft[] =>
    (reply[0] === 1 ? [tenantAudit('tenant.created', tenant, { object: { ...tenant, identityVerificationRequired: false } })] : []),
  'tenant.rotateIdentitySecret': (tenant: Tenant & { identityVerificationRequired: boolean }): AuditDraft[] => [tenantAudit('tenant.identity_secret_rotated', tenant)],
  'tenant.setIdentityRequired': ({ tenant, required }: { tenant: Tenant; required: boolean }): AuditDraft[] => [
    tenantAudit('tenant.updated', tenant, {
      object: { ...tenant, identityVerificationRequired: required },
      changes: { identityVerificationRequired: required }, previousAttributes: { identityVerificationRequired: !required },
    }),
  ],
};
