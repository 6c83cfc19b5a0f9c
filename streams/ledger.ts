import type { Redis } from 'ioredis';
import { isoNow } from '../lib/clock.js';
import { newId } from '../lib/ids.js';
import type { Keys } from './keys.js';

/** Upper bound on a workspace ledger; the webhook dispatcher consumes far behind it. */
export const LEDGER_MAX_LENGTH = 1_000_000;

export type AuditActor = { type: 'api_key' | 'cli' | 'system'; id: string | null };
export type AuditRequest = { id: string; ip: string | null; userAgent: string | null } | null;
export type Ref = { id: string; slug: string };

/** One control-plane change, as every write reports it. */
export type AuditEntry = {
  /** event name, `resource.action` (`key.created`, `subscriber.updated`) */
  type: string;
  workspace: Ref;
  tenant: Ref | null;
  actor: AuditActor;
  target: { type: string; id: string };
  request: AuditRequest;
  /** the object after the change */
  object: Record<string, unknown>;
  /** a fixed webhook event id, for writes that may be retried after a crash (the dispatcher dedupes on it) */
  id?: string;
  /** on updates: the changed fields' new and previous values */
  changes?: Record<string, unknown>;
  previousAttributes?: Record<string, unknown>;
};

/** Names of the fields of a ledger stream entry. */
export const LEDGER_FIELDS = { kind: 'kind', payload: 'payload' } as const;

/** The stored form of a ledger entry: the webhook payload of spec 2.6 minus nothing; built once here. */
export function auditPayload(entry: AuditEntry, id: string = newId('webhookEvent')): Record<string, unknown> {
  const payload: Record<string, unknown> = {
    id,
    type: entry.type,
    apiVersion: 'v1',
    createdAt: isoNow(),
    workspace: entry.workspace,
    tenant: entry.tenant,
    actor: entry.actor,
    target: entry.target,
    request: entry.request,
    data: { object: entry.object },
  };
  if (entry.changes) {
    payload.changes = entry.changes;
    payload.previousAttributes = entry.previousAttributes ?? {};
  }
  return payload;
}

/**
 * Appends one audit event to the workspace ledger. Every control-plane write calls this
 * (once its own write is done); the webhook dispatcher consumes the ledger.
 */
export async function appendAudit(redis: Redis, keys: Keys, entry: AuditEntry): Promise<string> {
  const payload = entry.id ? auditPayload(entry, entry.id) : auditPayload(entry);
  await redis.xadd(keys.ledger(entry.workspace.id), 'MAXLEN', '~', LEDGER_MAX_LENGTH, '*', LEDGER_FIELDS.kind, 'audit', LEDGER_FIELDS.payload, JSON.stringify(payload));
  return payload.id as string;
}

/** Structural equality of JSON values (object key order does not matter). */
export function sameJson(a: unknown, b: unknown): boolean {
  if (a === b) return true;
  if (typeof a !== 'object' || typeof b !== 'object' || a === null || b === null) return false;
  if (Array.isArray(a) !== Array.isArray(b)) return false;
  if (Array.isArray(a)) return a.length === (b as unknown[]).length && a.every((v, i) => sameJson(v, (b as unknown[])[i]));
  const ka = Object.keys(a);
  const kb = Object.keys(b);
  return ka.length === kb.length && ka.every((k) => Object.hasOwn(b, k) && sameJson((a as Record<string, unknown>)[k], (b as Record<string, unknown>)[k]));
}

/** Field-by-field difference of two records: what changed, and what it was before. */
export function diff(before: Record<string, unknown>, after: Record<string, unknown>): { changes: Record<string, unknown>; previousAttributes: Record<string, unknown> } | null {
  const changes: Record<string, unknown> = {};
  const previousAttributes: Record<string, unknown> = {};
  for (const field of new Set([...Object.keys(before), ...Object.keys(after)])) {
    const was = Object.hasOwn(before, field) ? before[field] ?? null : null;
    const is = Object.hasOwn(after, field) ? after[field] ?? null : null;
    if (sameJson(was, is)) continue;
    changes[field] = is;
    previousAttributes[field] = was;
  }
  return Object.keys(changes).length ? { changes, previousAttributes } : null;
}
