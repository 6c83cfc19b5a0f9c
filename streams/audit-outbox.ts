import type { ChainableCommander, Redis } from 'ioredis';
import { isoNow, now } from '../lib/clock.js';
import { newId } from '../lib/ids.js';
import { waitAtMost } from '../lib/wait-at-most.js';
import type { Keys } from './keys.js';
import { LEDGER_FIELDS, LEDGER_MAX_LENGTH, auditPayload, type AuditActor, type AuditRequest, type Ref } from './ledger.js';

/**
 * Audit entries that survive a crash (the transactional outbox).
 *
 * A control-plane write records its pending audit entries in the outbox of its own hash slot
 * (`{w:…}`, `{t:…}` or `{pN}`: `keys.outbox`) in the same atomic step as the write itself: the Lua
 * script calls `lua/includes/recordAudit` with the intent made here, or a MULTI carries the HSET.
 * Once the write returns, the writer turns the intent and the write's reply into entries (the
 * operation's pure `AuditOp`), appends them to the workspace ledger under ids fixed in the intent,
 * and deletes the intent (`settleAudit`). A process killed between the write and that step leaves
 * the intent behind; the outbox sweeper (`actors/audit-outbox-sweeper.ts`) settles it with the same
 * `AuditOp`, so every write that took effect gets its entries, and a write that did not gets none.
 * Appending twice (a crash after the append, before the delete) repeats the same event ids, which
 * the webhook dispatcher turns into deliveries once.
 */

/** Who made the write and where it belongs: what an entry carries besides what the write decided. */
export type AuditScope = { workspace: Ref; tenant: Ref | null; actor: AuditActor; request: AuditRequest };

/** The audit scope of a write made in `scope` (workspace and tenant refs) by `by` (actor and request). */
export function writeScope(scope: { workspace: Ref; tenant: Ref | null }, by: { actor: AuditActor; request: AuditRequest }): AuditScope {
  return { workspace: scope.workspace, tenant: scope.tenant, actor: by.actor, request: by.request };
}

/** One entry as an operation describes it; the scope, id and time come from the intent. */
export type AuditDraft = {
  type: string;
  target: { type: string; id: string };
  object: Record<string, unknown>;
  changes?: Record<string, unknown>;
  previousAttributes?: Record<string, unknown>;
};

/**
 * What entries a write produced, from what the writer knew before (`input`, JSON) and what the
 * write answered (`reply`: the script's reply as `cjson` encoded it, or null for a MULTI). Pure: the
 * sweeper runs it in another process, long after the write. An empty answer means the write
 * changed nothing worth auditing.
 */
export type AuditOp<I = never, R = unknown> = (input: I, reply: R) => AuditDraft[];

/** The stored intent: everything `settle` needs but the reply. */
type IntentRecord = { op: string; scope: AuditScope; input: unknown; at: number; ids: string[] };

/** A pending audit of one write: the outbox field to write with it (`token` → `json`). */
export type AuditIntent = { key: string; token: string; json: string; record: IntentRecord };

/**
 * Makes the intent of a write whose entries `op` will describe: `ids` (one per entry the operation
 * can produce at most) are fixed now, so a second settle appends the same events.
 */
export function auditIntent(outbox: string, op: string, scope: AuditScope, input: unknown, entries = 1): AuditIntent {
  const ids = Array.from({ length: entries }, () => newId('webhookEvent'));
  const record: IntentRecord = { op, scope, input, at: now(), ids };
  return { key: outbox, token: ids[0]!, json: JSON.stringify(record), record };
}

/** Queues the intent's HSET on a MULTI (or pipeline) that makes the write, for writes that are not a script. */
export function recordIntent(multi: ChainableCommander, intent: AuditIntent): ChainableCommander {
  return multi.hset(intent.key, intent.token, intent.json);
}

/**
 * Appends the write's entries to the workspace ledger, then, once every append succeeded, removes
 * its intent from the outbox (a crash in between repeats the append, under the same ids). Never
 * rejects: the write it settles is made, its intent with it, so a failed append or delete (Redis out
 * of memory, the connection lost) leaves the intent to the outbox sweeper, which logs what it settles,
 * and the write is answered as made. Until session 48 the failure was thrown, and a delete made under
 * a full memory was answered 503 "retry later" (probe O: topics, segments, workflows, sources,
 * webhook endpoints, message cancels), its retry then 404.
 */
export async function settleAudit(redis: Redis, keys: Keys, intent: AuditIntent, drafts: AuditDraft[]): Promise<void> {
  await settleBatch(redis, [{ keys, intent, drafts, onFailure: () => undefined, done: () => undefined }]);
}

/** The settles `settleAuditLater` left under way in this process (none of them rejects). */
const unsettled = new Set<Promise<void>>();

type Later = { keys: Keys; intent: AuditIntent; drafts: AuditDraft[]; onFailure: (err: unknown) => void; done: () => void };
/** The settles queued per connection, sent together at the end of the event-loop turn (`flushLater`). */
const queued = new Map<Redis, Later[]>();
/** Most settles one flush sends in one pipeline; more wait for the next. */
const FLUSH_MOST = 512;

/**
 * Settles the intent off the writer's path: the write is answered once the script has made it
 * (with its intent), and the ledger append and the intent's delete go on after. For the writes of
 * the hot paths (a message created, a subscriber's write: registrations, upserts). The settles queued
 * on a connection during one event-loop turn leave together when it ends (`setImmediate`): one
 * pipeline of their appends, then one `HDEL` per outbox of the intents whose appends all succeeded,
 * two round trips for the turn instead of two per write. They leave before any request that arrives
 * after this one's answer is read, so a caller's next write is appended after. A failure goes to
 * `onFailure` and leaves the intent to the outbox sweeper, so nothing is lost; `auditsSettled` waits
 * for those under way.
 */
export function settleAuditLater(redis: Redis, keys: Keys, intent: AuditIntent, drafts: AuditDraft[], onFailure: (err: unknown) => void): void {
  let done!: () => void;
  const settling = new Promise<void>((r) => (done = r));
  unsettled.add(settling);
  void settling.then(() => unsettled.delete(settling));
  const queue = queued.get(redis);
  if (queue) {
    queue.push({ keys, intent, drafts, onFailure, done });
    return;
  }
  queued.set(redis, [{ keys, intent, drafts, onFailure, done }]);
  setImmediate(() => void flushLater(redis));
}

/** Sends the settles queued on `redis`, FLUSH_MOST at a time. */
async function flushLater(redis: Redis): Promise<void> {
  const all = queued.get(redis) ?? [];
  queued.delete(redis);
  for (let from = 0; from < all.length; from += FLUSH_MOST) {
    const batch = all.slice(from, from + FLUSH_MOST);
    await settleBatch(redis, batch);
    for (const later of batch) later.done();
  }
}

/**
 * The appends of every settle in `batch` in one pipeline, then the intents of those whose appends all
 * succeeded deleted, one `HDEL` per outbox. Never rejects: each failure goes to its settle's `onFailure`.
 */
async function settleBatch(redis: Redis, batch: Later[]): Promise<void> {
  const appended: Later[] = [];
  try {
    const pipeline = redis.pipeline();
    for (const later of batch) appendDrafts(pipeline, later.keys, later.intent.record, later.drafts);
    const replies = batch.some((later) => later.drafts.length) ? (await pipeline.exec()) ?? [] : [];
    let at = 0;
    for (const later of batch) {
      const failed = replies.slice(at, at + later.drafts.length).find(([err]) => err)?.[0];
      at += later.drafts.length;
      if (failed) later.onFailure(failed);
      else appended.push(later);
    }
  } catch (err) {
    for (const later of batch) later.onFailure(err);
    return;
  }
  const byOutbox = new Map<string, Later[]>();
  for (const later of appended) {
    const settles = byOutbox.get(later.intent.key);
    if (settles) settles.push(later);
    else byOutbox.set(later.intent.key, [later]);
  }
  if (byOutbox.size === 0) return;
  try {
    const deletes = redis.pipeline();
    for (const [outbox, settles] of byOutbox) deletes.hdel(outbox, ...settles.map((later) => later.intent.token));
    const replies = (await deletes.exec()) ?? [];
    [...byOutbox.values()].forEach((settles, i) => {
      const err = replies[i]?.[0];
      if (err) for (const later of settles) later.onFailure(err);
    });
  } catch (err) {
    for (const later of appended) later.onFailure(err);
  }
}

/**
 * Resolves once the settles `settleAuditLater` left under way are done, or after `withinMs`: a
 * stopping process waits for them before it closes its Redis connection, so a deploy leaves none
 * to the outbox sweeper (one that cannot finish is left to it all the same).
 */
export async function auditsSettled(withinMs: number): Promise<void> {
  if (unsettled.size === 0) return;
  await waitAtMost(Promise.all(unsettled), withinMs);
}

/** Queues the ledger appends of an intent's entries. */
export function appendDrafts(pipeline: ChainableCommander, keys: Keys, record: IntentRecord, drafts: AuditDraft[]): void {
  if (drafts.length > record.ids.length) throw new Error(`audit op ${record.op} made ${drafts.length} entries, its intent has ids for ${record.ids.length}`);
  drafts.forEach((draft, i) => {
    const payload = auditPayload({ ...draft, workspace: record.scope.workspace, tenant: record.scope.tenant, actor: record.scope.actor, request: record.scope.request }, record.ids[i]!);
    payload.createdAt = isoNow(record.at);
    pipeline.xadd(keys.ledger(record.scope.workspace.id), 'MAXLEN', '~', LEDGER_MAX_LENGTH, '*', LEDGER_FIELDS.kind, 'audit', LEDGER_FIELDS.payload, JSON.stringify(payload));
  });
}

/** An outbox field as stored: the intent's JSON, a newline, and the reply as `cjson` encoded it (absent for a MULTI). */
export function parseOutboxField(value: string): { record: IntentRecord; reply: unknown } {
  const cut = value.indexOf('\n');
  const record = JSON.parse(cut < 0 ? value : value.slice(0, cut)) as IntentRecord;
  return { record, reply: cut < 0 ? null : asScriptReply(JSON.parse(value.slice(cut + 1))) };
}

/**
 * A reply as `cjson` stored it, turned into what the same reply is when ioredis receives it from
 * the script, so an `AuditOp` sees one shape in both paths: a Lua table is an array (cjson writes
 * an empty one `{}`), `false` is null and `true` 1, a number is truncated to an integer.
 */
export function asScriptReply(value: unknown): unknown {
  if (Array.isArray(value)) return value.map(asScriptReply);
  if (value === false || value === null) return null;
  if (value === true) return 1;
  if (typeof value === 'number') return Math.trunc(value);
  if (typeof value === 'object') return [];
  return value;
}
