import type { Redis } from 'ioredis';
import { isoNow, now } from '../lib/clock.js';
import { isId, newId } from '../lib/ids.js';
import { MAX_ENDPOINTS_PER_WORKSPACE } from '../lib/webhook-policy.js';
import { MAX_RETIRED_SECRETS, newWebhookSecret, OLD_SECRET_VALIDITY_MS, retiredSecretsOf, type RetiredSecret } from '../lib/webhook-signing.js';
import type { Writer, Workspace } from './identity.js';
import type { Keys } from './keys.js';
import { appendAudit, diff, type Ref } from './ledger.js';
import { callScript } from './lua-scripts.js';
import { recordOf } from '../lib/field-list.js';

/** A webhook endpoint as stored (spec 2.5 plus what delivery needs). */
export type WebhookEndpoint = {
  id: string;
  url: string;
  description: string | null;
  /** the patterns of spec 2.5 (`*` when created without) */
  events: string[];
  /** the tenant it is narrowed to, or null for every tenant */
  tenantId: string | null;
  tenantSlug: string | null;
  enabled: boolean;
  secret: string;
  /** secrets retired by rotations, newest first, each signing alongside the current one until its expiry */
  retiredSecrets: RetiredSecret[];
  /** the last rotation */
  rotatedAtMs: number | null;
  createdAt: string;
  updatedAt: string;
  disabledAt: string | null;
  /** start of the current failure streak (the first failure since the last success), or null */
  failingSinceMs: number | null;
  /** events from before this time are never delivered to it (set on create, edit of url/events/tenant, re-enable) */
  activeSinceMs: number;
  /** when it was disabled (by PATCH or the failure streak); null while enabled. Events from before it still get deliveries, which wait */
  activeUntilMs: number | null;
  /** windows an edit or re-enable ended, with the patterns and tenant the endpoint had then (lua/updateWebhookEndpoint) */
  pastWindows: PastWindow[];
};

/** A time the endpoint was active, `[sinceMs, untilMs)`, as it was then. */
export type PastWindow = { sinceMs: number; untilMs: number; events: string[]; tenantId: string | null };

/** What the API shows of an endpoint: never a secret (create and rotate add it, once). */
export type PublicWebhookEndpoint = {
  id: string;
  url: string;
  description: string | null;
  events: string[];
  tenant: string | null;
  enabled: boolean;
  createdAt: string;
  updatedAt: string;
  disabledAt: string | null;
  failingSince: string | null;
  secretRotatedAt: string | null;
};

export type EndpointInput = { url: string; description: string | null; events: string[]; tenant: Ref | null };

const numberOrNull = (s: string | undefined) => (s ? Number(s) : null);

/** A record from its hash (HGETALL), or null when empty. */
export function toEndpoint(h: Record<string, string>): WebhookEndpoint | null {
  if (!h.id) return null;
  return {
    id: h.id,
    url: h.url!,
    description: h.description || null,
    events: JSON.parse(h.events || '["*"]') as string[],
    tenantId: h.tenantId || null,
    tenantSlug: h.tenantSlug || null,
    enabled: h.enabled === '1',
    secret: h.secret!,
    retiredSecrets: retiredSecretsOf(h),
    rotatedAtMs: numberOrNull(h.rotatedAt),
    createdAt: h.createdAt!,
    updatedAt: h.updatedAt!,
    disabledAt: h.disabledAt || null,
    failingSinceMs: numberOrNull(h.failingSince),
    activeSinceMs: Number(h.activeSince ?? 0),
    activeUntilMs: numberOrNull(h.activeUntil),
    pastWindows: h.past ? (JSON.parse(h.past) as { since: number; until: number; events: string[]; tenantId: string }[])
      .map((w) => ({ sinceMs: w.since, untilMs: w.until, events: w.events, tenantId: w.tenantId || null })) : [],
  };
}

/**
 * Whether an event at `eventMs` is one the endpoint gets (spec 3.3): not from before its creation,
 * last edit or re-enable, nor from after its disable. lua/enqueueWebhookDeliveries decides the same
 * from the stored record.
 */
function isActiveAt(e: WebhookEndpoint, eventMs: number): boolean {
  return eventMs >= e.activeSinceMs && (e.enabled || eventMs < (e.activeUntilMs ?? 0));
}

/**
 * Whether the endpoint gets an event of `tenantId` at `eventMs` (spec 3.3): as it is now when the
 * event is from its current window, or as it was then when the event is from a window an edit or
 * re-enable ended, so that a change never delivers an event from before it and never takes away
 * one the endpoint wanted when it happened (`accepts` says whether patterns take the event).
 */
export function wantsEvent(e: WebhookEndpoint, eventMs: number, tenantId: string | null, accepts: (patterns: readonly string[]) => boolean): boolean {
  if (isActiveAt(e, eventMs) && (e.tenantId === null || e.tenantId === tenantId) && accepts(e.events)) return true;
  return e.pastWindows.some((w) => eventMs >= w.sinceMs && eventMs < w.untilMs && (w.tenantId === null || w.tenantId === tenantId) && accepts(w.events));
}

/** The earliest event time the endpoint may still get: its current window's start, or a past window's. */
export function activeFromMs(e: WebhookEndpoint): number {
  return Math.min(e.activeSinceMs, ...e.pastWindows.map((w) => w.sinceMs));
}

/** A record from an HGETALL reply of a script (a flat list). */
export function endpointFromList(list: string[]): WebhookEndpoint | null {
  return toEndpoint(recordOf(list));
}

export function publicEndpoint(e: WebhookEndpoint): PublicWebhookEndpoint {
  return {
    id: e.id,
    url: e.url,
    description: e.description,
    events: e.events,
    tenant: e.tenantSlug,
    enabled: e.enabled,
    createdAt: e.createdAt,
    updatedAt: e.updatedAt,
    disabledAt: e.disabledAt,
    failingSince: e.failingSinceMs === null ? null : isoNow(e.failingSinceMs),
    secretRotatedAt: e.rotatedAtMs === null ? null : isoNow(e.rotatedAtMs),
  };
}

/**
 * Appends the endpoint's audit entry after its write. Never rejects: the write is made and is answered
 * as made (a 503 invited a retry, which created a second endpoint or was answered 404; probe O, Redis
 * out of memory); an entry Redis refuses is lost, one of the private `webhook.*` names that no
 * endpoint is ever sent (docs/webhooks.md).
 */
async function audit(redis: Redis, keys: Keys, workspace: Workspace, type: string, e: WebhookEndpoint, by: Writer, change?: ReturnType<typeof diff>): Promise<void> {
  await appendAudit(redis, keys, {
    type,
    workspace: { id: workspace.id, slug: workspace.slug },
    tenant: e.tenantId ? { id: e.tenantId, slug: e.tenantSlug! } : null,
    actor: by.actor,
    target: { type: 'webhook_endpoint', id: e.id },
    request: by.request,
    object: { ...publicEndpoint(e) },
    ...(change ?? {}),
  }).catch(() => undefined);
}

/**
 * Puts a workspace in the registry of workspaces with endpoints (the ledgers the dispatchers read).
 * Called after the endpoint exists, so a concurrent `leaveRegistryIfEmpty` sees it or is undone.
 */
export async function joinRegistry(redis: Redis, keys: Keys, workspaceId: string): Promise<void> {
  await redis.zadd(keys.webhookWorkspaces, 0, workspaceId);
}

/**
 * Takes a workspace without endpoints out of the registry: remove, then look again, and put it back
 * if an endpoint appeared meanwhile (its creator adds it after creating, so one of the two wins).
 */
export async function leaveRegistryIfEmpty(redis: Redis, keys: Keys, workspaceId: string): Promise<boolean> {
  if ((await redis.zcard(keys.webhookEndpoints(workspaceId))) > 0) return false;
  await redis.zrem(keys.webhookWorkspaces, workspaceId);
  if ((await redis.zcard(keys.webhookEndpoints(workspaceId))) > 0) {
    await joinRegistry(redis, keys, workspaceId);
    return false;
  }
  return true;
}

/**
 * Creates an endpoint with a new signing secret; null when the workspace already has
 * `MAX_ENDPOINTS_PER_WORKSPACE`. Appends the private audit event `webhook.created`.
 */
export async function createEndpoint(redis: Redis, keys: Keys, workspace: Workspace, input: EndpointInput, by: Writer): Promise<WebhookEndpoint | null> {
  // before the endpoint exists (and before its activeSince): every stream event it can want is
  // forwarded to the ledger (streams/stream-ledger.ts)
  await redis.sadd(keys.webhookForwarding, workspace.id);
  const at = now();
  const id = newId('webhookEndpoint', at); // the endpoint list is by id: its time is createdAt's
  const iso = isoNow(at);
  const fields: Record<string, string> = {
    id, url: input.url, description: input.description ?? '', events: JSON.stringify(input.events),
    tenantId: input.tenant?.id ?? '', tenantSlug: input.tenant?.slug ?? '', enabled: '1', secret: newWebhookSecret(),
    retiredSecrets: '', previousSecret: '', rotatedAt: '', createdAt: iso, updatedAt: iso, disabledAt: '', failingSince: '', activeSince: String(at),
  };
  const created = await callScript<number>(redis, 'createWebhookEndpoint',
    [keys.webhookEndpoints(workspace.id), keys.webhookEndpoint(workspace.id, id), keys.webhookVersion(workspace.id)],
    [id, MAX_ENDPOINTS_PER_WORKSPACE, ...Object.entries(fields).flat()]);
  if (created !== 1) return null;
  // The endpoint exists: it is answered as made, with its secret, whatever follows. A registry write
  // Redis refuses (out of memory) answered 503, and the secret, shown only here, was lost with an
  // enabled endpoint delivering under it; a retry made a second one (probe CB). The dispatchers'
  // sweep joins a workspace left out (`joinLeftOut`: it is in webhookForwarding, joined above).
  await joinRegistry(redis, keys, workspace.id).catch(() => undefined);
  const record = toEndpoint(fields)!;
  await audit(redis, keys, workspace, 'webhook.created', record, by);
  return record;
}

/** An endpoint of the workspace by id, or null (malformed and foreign ids included). */
export async function findEndpoint(redis: Redis, keys: Keys, workspaceId: string, id: string): Promise<WebhookEndpoint | null> {
  if (!isId('webhookEndpoint', id)) return null;
  return toEndpoint(await redis.hgetall(keys.webhookEndpoint(workspaceId, id)));
}

/** Endpoints by id (null for those gone), in one round trip. */
export async function loadEndpoints(redis: Redis, keys: Keys, workspaceId: string, ids: string[]): Promise<(WebhookEndpoint | null)[]> {
  if (ids.length === 0) return [];
  const pipeline = redis.pipeline();
  for (const id of ids) pipeline.hgetall(keys.webhookEndpoint(workspaceId, id));
  const replies = (await pipeline.exec()) ?? [];
  return replies.map(([err, h]) => {
    if (err) throw err;
    return toEndpoint(h as Record<string, string>);
  });
}

/** Every endpoint of the workspace (at most 50), oldest first. */
export async function allEndpoints(redis: Redis, keys: Keys, workspaceId: string): Promise<WebhookEndpoint[]> {
  const ids = await redis.zrange(keys.webhookEndpoints(workspaceId), 0, -1);
  return (await loadEndpoints(redis, keys, workspaceId, ids)).filter((e): e is WebhookEndpoint => e !== null);
}

export type EndpointPatch = { url?: string; description?: string | null; events?: string[]; tenant?: Ref | null; enabled?: boolean };

/**
 * Applies a PATCH (lua/updateWebhookEndpoint decides activeSince and the streak from the stored
 * values); appends `webhook.updated` with changes when anything changed. Null when not found.
 */
export async function updateEndpoint(
  redis: Redis, keys: Keys, workspace: Workspace, id: string, patch: EndpointPatch, by: Writer,
): Promise<{ endpoint: WebhookEndpoint; reenabled: boolean; atMs: number } | null> {
  if (!isId('webhookEndpoint', id)) return null;
  const fields: string[] = [];
  if (patch.url !== undefined) fields.push('url', patch.url);
  if (patch.description !== undefined) fields.push('description', patch.description ?? '');
  if (patch.events !== undefined) fields.push('events', JSON.stringify(patch.events));
  if (patch.tenant !== undefined) fields.push('tenantId', patch.tenant?.id ?? '', 'tenantSlug', patch.tenant?.slug ?? '');
  if (patch.enabled !== undefined) fields.push('enabled', patch.enabled ? '1' : '0');
  const at = now();
  const reply = await callScript<[string[], string[], number] | []>(redis, 'updateWebhookEndpoint',
    [keys.webhookEndpoint(workspace.id, id), keys.webhookVersion(workspace.id), keys.webhookRequeues(workspace.id)], [at, isoNow(at), id, fields.length / 2, ...fields]);
  if (reply.length === 0) return null;
  const before = endpointFromList(reply[0])!;
  const after = endpointFromList(reply[1])!;
  const change = diff(publicEndpoint(before), publicEndpoint(after));
  if (change) await audit(redis, keys, workspace, 'webhook.updated', after, by, change);
  return { endpoint: after, reenabled: reply[2] === 1, atMs: at };
}

/** Deletes an endpoint (`webhook.deleted`); null when not found. */
export async function deleteEndpoint(redis: Redis, keys: Keys, workspace: Workspace, id: string, by: Writer): Promise<WebhookEndpoint | null> {
  if (!isId('webhookEndpoint', id)) return null;
  const reply = await callScript<[string[], number] | []>(redis, 'deleteWebhookEndpoint',
    [keys.webhookEndpoint(workspace.id, id), keys.webhookEndpoints(workspace.id), keys.webhookVersion(workspace.id)], [keys.webhookBase(workspace.id), id]);
  if (reply.length === 0) return null;
  const before = endpointFromList(reply[0])!;
  if (reply[1] === 0) await leaveRegistryIfEmpty(redis, keys, workspace.id);
  await audit(redis, keys, workspace, 'webhook.deleted', before, by);
  return before;
}

/**
 * Gives an endpoint a new secret; the one it replaces keeps signing for 24 hours, as do those
 * retired by earlier rotations within their own 24 hours (at most `MAX_RETIRED_SECRETS`), see
 * lua/rotateWebhookSecret. Appends `webhook.rotated`, whose object never carries a secret. Null
 * when not found.
 */
export async function rotateSecret(redis: Redis, keys: Keys, workspace: Workspace, id: string, by: Writer): Promise<WebhookEndpoint | null> {
  if (!isId('webhookEndpoint', id)) return null;
  const at = now();
  const reply = await callScript<[string[], string[]] | []>(redis, 'rotateWebhookSecret',
    [keys.webhookEndpoint(workspace.id, id), keys.webhookVersion(workspace.id)], [newWebhookSecret(), at, isoNow(at), OLD_SECRET_VALIDITY_MS, MAX_RETIRED_SECRETS]);
  if (reply.length === 0) return null;
  const before = endpointFromList(reply[0])!;
  const after = endpointFromList(reply[1])!;
  await audit(redis, keys, workspace, 'webhook.rotated', after, by, diff(publicEndpoint(before), publicEndpoint(after)) ?? undefined);
  return after;
}
