import type { Redis } from 'ioredis';
import { isoNow, now } from '../lib/clock.js';
import { ApiError, notFound } from '../lib/errors.js';
import { recordOf } from '../lib/field-list.js';
import { isId, newId } from '../lib/ids.js';
import type { Mapping } from '../lib/source-formats.js';
import { MAX_SOURCES_PER_TENANT, type IGNORED_REASONS, type SourceFormat } from '../lib/source-limits.js';
import { MAX_RETIRED_SECRETS, OLD_SECRET_VALIDITY_MS, retiredSecretsOf, signingSecrets } from '../lib/webhook-signing.js';
import { auditIntent, settleAudit, writeScope, type AuditDraft } from './audit-outbox.js';
import type { Writer } from './identity.js';
import type { Keys } from './keys.js';
import { diff, type Ref } from './ledger.js';
import { callScript } from './lua-scripts.js';

/** Outcomes an inbound delivery is counted under. */
export const DELIVERY_OUTCOMES = ['accepted', 'duplicate', 'ignored', 'rejected'] as const;
export type DeliveryOutcome = (typeof DELIVERY_OUTCOMES)[number];

/** A source as the API shows it, but its `inboundUrl` (which depends on how the caller reached the service). */
export type Source = {
  id: string;
  name: string;
  provider: string;
  format: SourceFormat;
  mapping: Mapping;
  namePrefix: string;
  enabled: boolean;
  counts: Record<DeliveryOutcome, number>;
  lastReceivedAt: string | null;
  lastError: { code: string; message: string; at: string } | null;
  lastIgnored: { reason: IgnoredReason; at: string } | null;
  secretUpdatedAt: string | null;
  createdAt: string;
  updatedAt: string;
};

/** A stored source with what only the inbound route sees: where it belongs and the secrets that verify now. */
export type InboundSource = Source & { workspaceId: string; tenantId: string; secrets: string[] };

/** Why a verified delivery was answered 200 `ignored` and nothing stored. */
export type IgnoredReason = (typeof IGNORED_REASONS)[number];

export type SourceScope = { workspace: Ref; tenant: Ref };
export type SourceInput = { name: string; provider: string; format: SourceFormat; secret: string; mapping: Partial<Mapping> & { externalId: string }; namePrefix?: string; enabled?: boolean };
export type SourcePatch = { name?: string; secret?: string; mapping?: Partial<Mapping> & { externalId: string }; namePrefix?: string; enabled?: boolean; revokeOldSecrets?: boolean };

const fullMapping = (m: Partial<Mapping> & { externalId: string }): Mapping => ({ externalId: m.externalId, name: m.name ?? null, id: m.id ?? null, timestamp: m.timestamp ?? null, data: m.data ?? null });

function toSource(h: Record<string, string>): Source {
  return {
    id: h.id!,
    name: h.name!,
    provider: h.provider!,
    format: h.format as SourceFormat,
    mapping: JSON.parse(h.mapping!) as Mapping,
    // stored as JSON text so that "" (no prefix) is a value, not a missing field
    namePrefix: JSON.parse(h.namePrefix!) as string,
    enabled: h.enabled === '1',
    counts: { accepted: Number(h['n:accepted'] ?? 0), duplicate: Number(h['n:duplicate'] ?? 0), ignored: Number(h['n:ignored'] ?? 0), rejected: Number(h['n:rejected'] ?? 0) },
    lastReceivedAt: h.lastReceivedAt ?? null,
    lastError: h.lastError ? (JSON.parse(h.lastError) as Source['lastError']) : null,
    lastIgnored: h.lastIgnored ? (JSON.parse(h.lastIgnored) as Source['lastIgnored']) : null,
    secretUpdatedAt: h.secretUpdatedAt ?? null,
    createdAt: h.createdAt!,
    updatedAt: h.updatedAt!,
  };
}

/** What a change of a source is audited on: its settings, never a secret (a new one shows as `secretUpdatedAt`). */
const editable = (s: Source) => ({ name: s.name, mapping: s.mapping, namePrefix: s.namePrefix, enabled: s.enabled, secretUpdatedAt: s.secretUpdatedAt });

/** Loads sources by id in one round trip; null for an id whose source no longer exists. */
export async function loadSources(redis: Redis, keys: Keys, tenantId: string, ids: string[]): Promise<(Source | null)[]> {
  if (ids.length === 0) return [];
  const pipeline = redis.pipeline();
  for (const id of ids) pipeline.hgetall(keys.source(tenantId, id));
  return ((await pipeline.exec()) ?? []).map(([err, h]) => {
    if (err) throw err;
    const hash = h as Record<string, string>;
    return hash.id ? toSource(hash) : null;
  });
}

/** Reads a source of the tenant by id, or null (a malformed id too). */
export async function findSource(redis: Redis, keys: Keys, tenantId: string, id: string): Promise<Source | null> {
  if (!isId('source', id)) return null;
  return (await loadSources(redis, keys, tenantId, [id]))[0] ?? null;
}

/**
 * The source an inbound request names, found without a credential through the route hash; null
 * when unknown, malformed or deleted. `secrets` holds the current secret and each one a change
 * replaced in the last 24 hours (at most 10).
 */
/** Whether an inbound URL's id is routed to a source (one read: the early answer before a body is read). */
export async function isRoutedSource(redis: Redis, keys: Keys, id: string): Promise<boolean> {
  return isId('source', id) && (await redis.hexists(keys.sourceRoutes, id)) === 1;
}

export async function findInboundSource(redis: Redis, keys: Keys, id: string): Promise<InboundSource | null> {
  if (!isId('source', id)) return null;
  const route = await redis.hget(keys.sourceRoutes, id);
  if (!route) return null;
  const [workspaceId, tenantId] = route.split('|') as [string, string];
  const h = await redis.hgetall(keys.source(tenantId, id));
  if (!h.id) {
    // a delete whose process died before removing the route (an id is known only once created,
    // so no create can be under way for it): the route goes now
    await redis.hdel(keys.sourceRoutes, id);
    return null;
  }
  // the current secret and those a change retired less than 24 hours ago, as a webhook endpoint signs with
  return { ...toSource(h), workspaceId, tenantId, secrets: signingSecrets(h.secret!, retiredSecretsOf(h), now()) };
}

/**
 * Creates a source; 400 `bad_request` when the tenant has MAX_SOURCES_PER_TENANT already (a count
 * cap, as for segments: docs/architecture.md). Its route
 * is written first (a crash before the record leaves a route to nothing, which answers 404).
 */
export async function createSource(redis: Redis, keys: Keys, scope: SourceScope, input: SourceInput, by: Writer): Promise<Source> {
  const tenantId = scope.tenant.id;
  const ms = now();
  const id = newId('source', ms);
  const at = isoNow(ms);
  const source: Source = {
    id, name: input.name, provider: input.provider, format: input.format, mapping: fullMapping(input.mapping),
    namePrefix: input.namePrefix ?? `${input.provider}.`, enabled: input.enabled ?? true,
    counts: { accepted: 0, duplicate: 0, ignored: 0, rejected: 0 }, lastReceivedAt: null, lastError: null, lastIgnored: null, secretUpdatedAt: null, createdAt: at, updatedAt: at,
  };
  await redis.hset(keys.sourceRoutes, id, `${scope.workspace.id}|${tenantId}`);
  const intent = auditIntent(keys.tenantOutbox(tenantId), 'source.create', writeScope(scope, by), source);
  const fields: Record<string, string> = {
    id, name: source.name, provider: source.provider, format: source.format, secret: input.secret, mapping: JSON.stringify(source.mapping),
    namePrefix: JSON.stringify(source.namePrefix), enabled: source.enabled ? '1' : '0', createdAt: at, updatedAt: at,
  };
  const reply = await callScript<[number, string?]>(redis, 'createSource', [keys.sourceIndex(tenantId), keys.source(tenantId, id), intent.key],
    [id, intent.token, intent.json, MAX_SOURCES_PER_TENANT, Object.keys(fields).length, ...Object.entries(fields).flat()]);
  if (reply[0] !== 1) {
    await redis.hdel(keys.sourceRoutes, id);
    throw new ApiError(400, 'bad_request', `A tenant has at most ${MAX_SOURCES_PER_TENANT} sources; delete one first`);
  }
  await settleAudit(redis, keys, intent, SOURCE_AUDITS['source.create'](source, reply));
  return source;
}

/**
 * Changes a source's settings; a new `secret` leaves the replaced one verifying for 24 hours (at
 * most 10 replaced secrets at once, as a webhook endpoint's rotations), unless `revokeOldSecrets`
 * ends every replaced one now (then `secretUpdatedAt` moves).
 * Audited as `source.updated` only when a value changed. 404 for an unknown id.
 */
export async function updateSource(redis: Redis, keys: Keys, scope: SourceScope, id: string, patch: SourcePatch, by: Writer): Promise<Source> {
  const tenantId = scope.tenant.id;
  if (!isId('source', id)) throw notFound('Source');
  const fields: Record<string, string> = {};
  if (patch.name !== undefined) fields.name = patch.name;
  if (patch.mapping !== undefined) fields.mapping = JSON.stringify(fullMapping(patch.mapping));
  if (patch.namePrefix !== undefined) fields.namePrefix = JSON.stringify(patch.namePrefix);
  if (patch.enabled !== undefined) fields.enabled = patch.enabled ? '1' : '0';
  if (patch.secret !== undefined) fields.secret = patch.secret;
  const intent = auditIntent(keys.tenantOutbox(tenantId), 'source.update', writeScope(scope, by), null);
  const reply = await callScript<UpdateReply>(redis, 'updateSource', [keys.source(tenantId, id), intent.key],
    [isoNow(), intent.token, intent.json, now(), OLD_SECRET_VALIDITY_MS, MAX_RETIRED_SECRETS, Object.keys(fields).length, ...Object.entries(fields).flat(), patch.revokeOldSecrets ? '1' : '0']);
  if (reply[0] !== 1) throw notFound('Source');
  const drafts = SOURCE_AUDITS['source.update'](null, reply);
  if (drafts.length) await settleAudit(redis, keys, intent, drafts);
  return toSource(recordOf(reply[2]!));
}

/** Deletes a source and then its route (its URL answers 404); the source as it was, 404 for an unknown id. */
export async function deleteSource(redis: Redis, keys: Keys, scope: SourceScope, id: string, by: Writer): Promise<Source> {
  const tenantId = scope.tenant.id;
  if (!isId('source', id)) throw notFound('Source');
  const intent = auditIntent(keys.tenantOutbox(tenantId), 'source.delete', writeScope(scope, by), null);
  const reply = await callScript<DeleteReply>(redis, 'deleteSource', [keys.sourceIndex(tenantId), keys.source(tenantId, id), intent.key], [id, intent.token, intent.json]);
  if (reply[0] !== 1) throw notFound('Source');
  await redis.hdel(keys.sourceRoutes, id);
  await settleAudit(redis, keys, intent, SOURCE_AUDITS['source.delete'](null, reply));
  return toSource(recordOf(reply[1]!));
}

/** How long the error of a verified delivery stays `lastError` whatever unverified requests come (lua/countSourceInbound). */
const VERIFIED_ERROR_KEPT_MS = 86_400_000;

/**
 * Counts one delivery under its outcome (with the error of a rejected one, the reason of an ignored
 * one), unless the source was deleted meanwhile. `verified` is false for a delivery whose signature
 * failed: it does not move `lastReceivedAt`.
 */
export async function countDelivery(redis: Redis, keys: Keys, source: InboundSource, outcome: DeliveryOutcome, verified: boolean, why?: ApiError | IgnoredReason): Promise<void> {
  const ms = now();
  const at = isoNow(ms);
  const lastError = why instanceof ApiError ? JSON.stringify({ code: why.code, message: why.message, at }) : '';
  const lastIgnored = typeof why === 'string' ? JSON.stringify({ reason: why, at }) : '';
  await callScript(redis, 'countSourceInbound', [keys.source(source.tenantId, source.id)], [verified ? at : '', lastError, 1, outcome, 1, ms, VERIFIED_ERROR_KEPT_MS, lastIgnored]);
}

type UpdateReply = [number, string[]?, string[]?];
type DeleteReply = [number, string[]?];

/** The audit entries of source writes, from their scripts' replies (streams/audit-outbox.ts). */
export const SOURCE_AUDITS = {
  'source.create': (source: Source, reply: [number, string?]): AuditDraft[] =>
    reply[0] === 1 ? [{ type: 'source.created', target: { type: 'source', id: source.id }, object: { ...source } }] : [],
  'source.update': (_: null, reply: UpdateReply): AuditDraft[] => {
    if (reply[0] !== 1) return [];
    const before = toSource(recordOf(reply[1]!));
    const after = toSource(recordOf(reply[2]!));
    const changed = diff(editable(before), editable(after));
    return changed ? [{ type: 'source.updated', target: { type: 'source', id: after.id }, object: { ...after }, ...changed }] : [];
  },
  'source.delete': (_: null, reply: DeleteReply): AuditDraft[] => {
    if (reply[0] !== 1) return [];
    const source = toSource(recordOf(reply[1]!));
    return [{ type: 'source.deleted', target: { type: 'source', id: source.id }, object: { ...source } }];
  },
};
