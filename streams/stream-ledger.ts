import type { Redis } from 'ioredis';
import { isoNow } from '../lib/clock.js';
import type { Keys } from './keys.js';
import { LEDGER_FIELDS, LEDGER_MAX_LENGTH } from './ledger.js';
import { preferencesDiff, preferencesFrom } from './preferences.js';
import type { StreamEntry } from './stream-consumer.js';

/** The webhook event id of a stream event: stable, derived from the `evt_` id, so a re-forward is recognisable. */
export function webhookEventIdOf(eventId: string): string {
  return 'whe_' + eventId.slice('evt_'.length);
}

/**
 * The ledger form of a stream event: the payload of spec 2.6 for `data.object`, with workspace
 * and tenant by id (the dispatcher adds the slugs when it builds the delivered payload).
 */
export function streamLedgerPayload(f: Record<string, string>): Record<string, unknown> {
  return {
    id: webhookEventIdOf(f.id!),
    type: f.n,
    apiVersion: 'v1',
    createdAt: isoNow(Number(f.r)),
    workspace: { id: f.w },
    tenant: { id: f.t },
    data: {
      object: {
        id: f.id,
        sequence: Number(f.q),
        name: f.n,
        source: f.o,
        provider: f.pv || null,
        timestamp: isoNow(Number(f.ts)),
        data: JSON.parse(f.d || '{}'),
        subscriber: { id: f.u, externalId: f.x },
        runId: f.ru || null,
        messageId: f.m || null,
        step: f.st || null,
        ...runOf(f),
      },
    },
    ...updatedOf(f),
  };
}

/**
 * Spec 2.6: `*.updated` events carry `changes` and `previousAttributes`. The engine's own
 * `$subscriber.updated` and `$preferences.updated` carry them at the top of the payload too, as the
 * audit `subscriber.updated` does (their `data.object.data` keeps what the stream event holds). An
 * SDK's `$app.updated` or a caller's `*.updated` name has free-form data: nothing is added.
 */
function updatedOf(f: Record<string, string>): { changes?: Record<string, unknown>; previousAttributes?: Record<string, unknown> } {
  if (f.n !== '$subscriber.updated' && f.n !== '$preferences.updated') return {};
  const data = JSON.parse(f.d || '{}') as Record<string, unknown>;
  if (f.n === '$subscriber.updated') {
    return { changes: (data.changes ?? {}) as Record<string, unknown>, previousAttributes: (data.previousAttributes ?? {}) as Record<string, unknown> };
  }
  const diff = preferencesDiff(preferencesFrom(data.previous), preferencesFrom(data.preferences));
  return { changes: { preferences: diff.changes }, previousAttributes: { preferences: diff.previousAttributes } };
}

/** Spec 6.1 rule 5: events of a workflow run carry `workflow` and `versionId` in webhook payloads. */
function runOf(f: Record<string, string>): { workflow?: string | null; versionId?: string | null } {
  if (!f.ru) return {};
  const data = JSON.parse(f.d || '{}') as Record<string, unknown>;
  return { workflow: typeof data.workflow === 'string' ? data.workflow : null, versionId: typeof data.versionId === 'string' ? data.versionId : null };
}

// Stands in for the event's data while the payload is serialized; the data's JSON text from the inbox
// is then spliced in as it is (it was validated and serialized once, at ingest).
const DATA_SLOT = '\u0000herald-data\u0000';
const DATA_SLOT_JSON = JSON.stringify(DATA_SLOT);

/** The ledger payload as JSON text, without parsing and re-serializing the event's data. */
export function streamLedgerJson(fields: Record<string, string>): string {
  const payload = streamLedgerPayload({ ...fields, d: '{}' });
  const object = (payload.data as { object: Record<string, unknown> }).object;
  Object.assign(object, runOf(fields));
  Object.assign(payload, updatedOf(fields));
  object.data = DATA_SLOT;
  return JSON.stringify(payload).replace(DATA_SLOT_JSON, () => fields.d || '{}');
}

/**
 * The workspaces whose stream events go to their ledger: those that ever had a webhook endpoint
 * (`webhookForwarding`, joined before the endpoint is created) and those in the dispatchers'
 * registry (endpoints made before that set existed). Read after the entries were read from the
 * inbox: an endpoint wants an event only from its `activeSince` on, so a workspace absent here has
 * no endpoint that can want any of those entries, and its ledger would only be trimmed unread.
 */
export async function forwardingWorkspaces(redis: Redis, keys: Keys): Promise<Set<string>> {
  const [forwarding, registered] = await Promise.all([redis.smembers(keys.webhookForwarding), redis.zrange(keys.webhookWorkspaces, 0, -1)]);
  return new Set([...forwarding, ...registered]);
}

/**
 * Appends each inbox entry of the `workspaces` to its workspace ledger (pipelined). At-least-once:
 * a batch replayed after a crash forwards again with the same webhook event ids, which the
 * dispatcher dedupes.
 */
export async function forwardToLedger(redis: Redis, keys: Keys, entries: StreamEntry[], workspaces: Set<string>): Promise<void> {
  const forwarded = entries.filter(({ fields }) => workspaces.has(fields.w!));
  if (forwarded.length === 0) return;
  const pipeline = redis.pipeline();
  for (const { fields } of forwarded) {
    pipeline.xadd(keys.ledger(fields.w!), 'MAXLEN', '~', LEDGER_MAX_LENGTH, '*', LEDGER_FIELDS.kind, 'stream', LEDGER_FIELDS.payload, streamLedgerJson(fields));
  }
  const replies = (await pipeline.exec()) ?? [];
  for (const [err] of replies) if (err) throw err;
}
