import { createHash } from 'node:crypto';
import { canonicalJson } from '../lib/canonical-json.js';
import type { Redis } from 'ioredis';
import { isoNow, now } from '../lib/clock.js';
import { ApiError, notFound } from '../lib/errors.js';
import { recordOf } from '../lib/field-list.js';
import type { PushContent } from '../lib/apns-payload.js';
import { isId, newId } from '../lib/ids.js';
import { partitionOf } from '../lib/partition.js';
import type { Logger } from '../lib/log.js';
import { auditIntent, settleAudit, settleAuditLater, type AuditDraft, type AuditIntent, type AuditScope } from './audit-outbox.js';
import type { Keys, MessageLane } from './keys.js';
import { callScript } from './lua-scripts.js';

export const MESSAGE_STATUSES = ['scheduled', 'queued', 'sending', 'completed', 'canceled', 'failed'] as const;
export type MessageStatus = (typeof MESSAGE_STATUSES)[number];
export const DELIVERY_STATUSES = ['pending', 'sent', 'failed', 'skipped', 'canceled'] as const;
export type DeliveryStatus = (typeof DELIVERY_STATUSES)[number];
export const MAX_SEND_AHEAD_MS = 30 * 86_400_000;
/** A message's priority when its sender names none (the `MessageRequest` schema's default too). */
const DEFAULT_PRIORITY = 'high';

export type Target = { externalId: string } | { topic: string } | { segment: string } | { where: Record<string, unknown> };
/** The workflow run step a message was sent from (its `$send` carries `runId` and `step`). */
export type RunRef = { runId: string; step: string; workflowId: string; workflow: string; versionId: string };
export type MessageContent = PushContent;
export type Message = {
  id: string; status: MessageStatus; to: Target; content: MessageContent; counts: Record<'total' | DeliveryStatus, number>; error: string | null;
  createdAt: string; sendAt: string | null; startedAt: string | null; completedAt: string | null; canceledAt: string | null; updatedAt: string;
  run: RunRef | null;
};
export type Delivery = {
  id: string; messageId: string; externalId: string; subscriptionId: string | null; channel: 'push' | 'email'; status: DeliveryStatus; reason: string | null;
  provider: { status: number | null; apnsId: string | null; reason: string | null; timestamp: string | null } | null;
  attempts: number; createdAt: string; updatedAt: string; sentAt: string | null;
};

export function toMessage(h: Record<string, string>): Message {
  const count = (s: string) => Number(h[`n:${s}`] ?? 0);
  return {
    id: h.id!, status: h.status as MessageStatus, to: JSON.parse(h.to!), content: JSON.parse(h.content!),
    counts: { total: count('total'), pending: count('pending'), sent: count('sent'), failed: count('failed'), skipped: count('skipped'), canceled: count('canceled') },
    error: h.error || null, createdAt: h.createdAt!, sendAt: h.sendAt || null, startedAt: h.startedAt || null, completedAt: h.completedAt || null,
    canceledAt: h.canceledAt || null, updatedAt: h.updatedAt ?? h.createdAt!, run: h.run ? JSON.parse(h.run) : null,
  };
}

export function toDelivery(h: Record<string, string>): Delivery {
  const answered = h.providerStatus !== undefined || h.apnsId !== undefined;
  return {
    id: h.id!, messageId: h.messageId!, externalId: h.externalId!, subscriptionId: h.subscriptionId || null, channel: (h.channel || 'push') as Delivery['channel'],
    status: h.status as DeliveryStatus, reason: h.reason || null,
    provider: answered ? { status: h.providerStatus ? Number(h.providerStatus) : null, apnsId: h.apnsId || null, reason: h.providerReason || null, timestamp: h.providerTimestamp || null } : null,
    attempts: Number(h.attempts ?? 0), createdAt: h.createdAt!, updatedAt: h.updatedAt ?? h.createdAt!, sentAt: h.sentAt || null,
  };
}

export type TenantRef = { workspaceId: string; tenantId: string };

/**
 * The fan-out queue a message goes to: one-subscriber messages have their own queue, so a
 * broadcast being walked never holds up the one-user messages sent after it (docs/messages.md).
 */
export function laneOf(to: Target): MessageLane {
  return 'externalId' in to ? 'one' : 'audience';
}

/**
 * The idempotency key of a workflow run step's message (docs/automation.md, "Exactly once"): a step
 * retried after a crash finds its message again. It begins with a NUL character, which no HTTP
 * header value can carry (Node answers such a request 400 before any route runs), so a caller's
 * `Idempotency-Key`, stored as it is in the same hash, can never name an engine key: caller keys
 * and engine keys share the tenant's idempotency hash without meeting.
 */
export function runStepIdempotencyKey(runId: string, step: string): string {
  return `\u0000run:${runId}:${step}`;
}

/** The fingerprint of a request stored beside its Idempotency-Key. */
function requestHash(request: unknown): string {
  return createHash('sha256').update(canonicalJson(request)).digest('hex');
}

/** The request of a body the JSON layer refused: no message was ever made from one, so it is the same as none. */
export const REFUSED = Symbol('refused body');

/**
 * The message an Idempotency-Key already names, when the same request is replayed (409
 * `idempotency_key_reused` for another request); null for a key not used yet. Read before the
 * request's target is checked, so a replay answers the original even once its topic or segment
 * is gone; `createMessage` decides again atomically.
 */
export async function findReplayedMessage(redis: Redis, keys: Keys, tenantId: string, key: string, request: unknown): Promise<Message | null> {
  const seen = await redis.hget(keys.idempotency(tenantId), key);
  if (seen === null) return null;
  const bar = seen.indexOf('|');
  if (request === REFUSED || seen.slice(bar + 1) !== requestHash(request)) throw new ApiError(409, 'idempotency_key_reused', 'This Idempotency-Key was used with a different request', { param: 'Idempotency-Key' });
  return getMessage(redis, keys, tenantId, seen.slice(0, bar));
}

/**
 * Creates a message (queued, or scheduled with `sendAt`), deciding `Idempotency-Key` in one script:
 * same key and same request → the original (`replayed`), nothing new; same key, other request → 409
 * `idempotency_key_reused`. Keys are per tenant and never expire. A created message is audited
 * `message.created` through the tenant's outbox (streams/audit-outbox.ts), whoever sent it: a
 * caller's request (its key and request in `audit`) or a workflow run's send (the system actor; the
 * message's `run` names the run). The intent is written by the same script as the message and only
 * when the message is created, so a replay (a caller's retry, or a run step retried after a crash
 * under its `runStepIdempotencyKey`) is not audited again.
 *
 * It resolves once the script has written the message: the intent is settled after it, off the
 * sender's path (`settleAuditLater`; a failure is reported to `log`). The entry's id and time are
 * fixed in the intent either way.
 */
export async function createMessage(
  redis: Redis, keys: Keys, ref: TenantRef, input: { to: Target; content: MessageContent; sendAt: ScheduledSend | null; run?: RunRef; /** the topic or segment id the slug named at the request */ audienceId?: string | null; /** the message's id when the caller made it already (a workflow's send step: streams/run-sends.ts) */ id?: string;
    /** the only subscriber of `to.externalId` it goes to (a workflow's send: its run's); kept as `sid`, not shown */ subscriberId?: string },
  idempotency: { key: string | null; request: unknown }, audit: AuditScope, log: Pick<Logger, 'warn'>,
): Promise<{ message: Message; replayed: boolean }> {
  const ms = now();
  const id = input.id ?? newId('message', ms);
  const at = isoNow(ms);
  const sendAtMs = input.sendAt?.atMs ?? null;
  const status: MessageStatus = sendAtMs ? 'scheduled' : 'queued';
  const lane = laneOf(input.to);
  // the API's schema fills the default priority in; a workflow's send step gets the same here, so a
  // message reads alike whoever sent it (probe T)
  const content: MessageContent = { ...input.content, priority: input.content.priority ?? DEFAULT_PRIORITY };
  const fields: Record<string, string> = {
    id, status, lane, to: JSON.stringify(input.to), content: JSON.stringify(content), createdAt: at, updatedAt: at,
    sendAt: sendAtMs ? isoNow(sendAtMs) : '', ...(input.run ? { run: JSON.stringify(input.run) } : {}),
    // a message sent now goes to the topic or segment its slug named when it was accepted, not to one
    // made under the slug before the dispatcher got to it (probe DW: a queued message went to the
    // members of a new topic of the same slug); a scheduled one reads its slug when it is due
    ...(input.audienceId && !sendAtMs ? { audienceId: input.audienceId } : {}),
    ...(input.subscriberId ? { sid: input.subscriberId } : {}),
    // a caller's Idempotency-Key keeps the message past the retention (keys never expire; lua/expireMessages)
    idem: idempotency.key !== null && !input.run ? '1' : '0', 'n:total': '0', 'n:pending': '0', 'n:sent': '0', 'n:failed': '0', 'n:skipped': '0', 'n:canceled': '0',
  };
  // a new message is what is written here (no second read); a replay answers the stored original
  const message = toMessage(fields);
  // the request's fingerprint matters only under an Idempotency-Key
  const hash = idempotency.key ? requestHash(idempotency.request) : '';
  const intent = auditIntent(keys.tenantOutbox(ref.tenantId), 'message.create', audit, message);
  await registerSender(redis, keys, ref);
  // its release time before the message: a process dying in between leaves a member whose message
  // does not exist (or, under a replayed Idempotency-Key, is another), which the scheduler drops
  const release = input.sendAt
    ? () => redis.zadd(keys.messageTimers(messageTimerPartition(ref.tenantId, id, input.sendAt!.partitions)), input.sendAt!.atMs, `${ref.tenantId}|${id}`)
    : null;
  if (release) await release();
  const flat = Object.entries(fields).flat();
  const reply = await callScript<CreateReply>(
    redis, 'createMessage',
    [
      keys.idempotency(ref.tenantId), keys.message(ref.tenantId, id), keys.messageIndex(ref.tenantId), keys.messagesByStatus(ref.tenantId, status),
      keys.messageQueue(ref.tenantId, lane), keys.messageDue(ref.tenantId), keys.tenantOutbox(ref.tenantId),
    ],
    [idempotency.key ?? '', hash, id, sendAtMs ?? '', intent.token, intent.json, flat.length / 2, ...flat],
  );
  const [outcome, messageId] = reply;
  // nothing was written under this id: its release time goes (the scheduler would drop it when due, up
  // to 30 days later; racing requests on one key left one each, probe AR)
  if (outcome !== 1 && release) await redis.zrem(keys.messageTimers(messageTimerPartition(ref.tenantId, id, input.sendAt!.partitions)), `${ref.tenantId}|${id}`).catch(() => undefined);
  if (outcome === 0) throw new ApiError(409, 'idempotency_key_reused', 'This Idempotency-Key was used with a different request', { param: 'Idempotency-Key' });
  if (outcome === 2) return { message: await getMessage(redis, keys, ref.tenantId, messageId), replayed: true };
  // ... and again after it: a scheduler's tick between the two, with the time already due (a sendAt
  // milliseconds ahead), found no message and dropped the member, and the message stayed scheduled
  // until the repair pass, up to 10 minutes (probe AD: 2 to 14 of ~1,000). A tick that released it
  // meanwhile makes this member one the next tick drops (the message is no longer scheduled).
  // The message is written: a failure here must not answer 500 (a client retrying without an
  // Idempotency-Key would schedule it twice); the repair pass covers a member lost meanwhile.
  if (release) await release().catch((err: Error) => log.warn('scheduled message release time not written again; the repair pass will', { messageId: id, err: err.message }));
  settleAuditLater(redis, keys, intent, MESSAGE_AUDITS['message.create'](message, reply), (err) => {
    log.warn('message.created not appended yet; the audit outbox sweeper will', { messageId: id, err });
  });
  return { message, replayed: false };
}

/** A scheduled send: when, and the deployment's partition count (its release time is kept in a partition's set). */
export type ScheduledSend = { atMs: number; partitions: number };

/**
 * The partition whose `messageTimers` set holds a scheduled message's release time: spread by
 * message id, so the scheduler role's partition leases share the work, and no tenant count bounds it.
 */
export function messageTimerPartition(tenantId: string, messageId: string, partitions: number): number {
  return partitionOf(tenantId, messageId, partitions);
}

/**
 * Releases a partition's scheduled messages due at `atMs` (at most `limit`): each is moved from
 * `scheduled` to `queued` (lua/moveMessage, a compare-and-set that also queues it for fan-out),
 * then its member leaves the set. A process dying in between moves nothing twice: the next round
 * finds the message queued already. A member whose message was canceled, or never written, is
 * dropped. Resolves with the number of members taken.
 */
export async function releaseDueMessages(redis: Redis, keys: Keys, partition: number, atMs: number, limit: number): Promise<number> {
  const set = keys.messageTimers(partition);
  const due = await redis.zrangebyscore(set, '-inf', atMs, 'LIMIT', 0, limit);
  if (due.length === 0) return 0;
  await Promise.all(due.map((member) => {
    const bar = member.indexOf('|');
    return moveMessage(redis, keys, member.slice(0, bar), member.slice(bar + 1), ['scheduled'], 'queued');
  }));
  await redis.zrem(set, ...due);
  return due.length;
}

/** When this process last registered each tenant as a sender (`messageTenants`); re-registered every minute. */
const registered = new Map<string, number>();
const REGISTER_EVERY_MS = 60_000;

/**
 * Registers the tenant in `messageTenants` before its first message, so dispatchers read its queue
 * even if this process dies right after. Members are never removed; this process skips the write
 * while its last one is recent (a Redis that lost its data is registered again within a minute).
 */
async function registerSender(redis: Redis, keys: Keys, ref: TenantRef): Promise<void> {
  const member = `${ref.tenantId}|${ref.workspaceId}`;
  const cacheKey = `${keys.messageTenants}|${member}`;
  const at = now();
  if (at - (registered.get(cacheKey) ?? -Infinity) < REGISTER_EVERY_MS) return;
  await redis.zadd(keys.messageTenants, 'NX', at, member);
  if (registered.size > 100_000) registered.clear();
  registered.set(cacheKey, at);
}

export async function getMessage(redis: Redis, keys: Keys, tenantId: string, id: string): Promise<Message> {
  if (!isId('message', id)) throw notFound('Message');
  const h = await redis.hgetall(keys.message(tenantId, id));
  if (!h.id) throw notFound('Message');
  return toMessage(h);
}

type CreateReply = [number, string];
type MoveReply = [number, string, string[]?];

/** Runs lua/moveMessage; with an intent, the move is audited and the reply carries the record after it. */
function runMoveMessage(
  redis: Redis, keys: Keys, tenantId: string, id: string, from: MessageStatus[], to: MessageStatus, fields: Record<string, string>, intent: AuditIntent | null,
): Promise<MoveReply> {
  const flat = Object.entries({ ...fields, updatedAt: isoNow() }).flat();
  return callScript<MoveReply>(
    redis, 'moveMessage', [keys.message(tenantId, id), keys.tenantOutbox(tenantId)],
    [keys.tenantBase(tenantId), id, from.join(','), to, intent?.token ?? '', intent?.json ?? '', flat.length / 2, ...flat],
  );
}

/** Moves a message between statuses (see lua/moveMessage); returns whether it moved and its status before. */
export async function moveMessage(redis: Redis, keys: Keys, tenantId: string, id: string, from: MessageStatus[], to: MessageStatus, fields: Record<string, string> = {}): Promise<{ moved: boolean; status: string }> {
  const [moved, status] = await runMoveMessage(redis, keys, tenantId, id, from, to, fields, null);
  return { moved: moved === 1, status };
}

/**
 * Cancels a scheduled (or not yet started) message; 409 `conflict` once its sending has begun.
 * `canceled`: this call canceled it (not an earlier one), and audited `message.canceled` through
 * the tenant's outbox in the same script, so concurrent cancels audit it once.
 */
export async function cancelMessage(redis: Redis, keys: Keys, tenantId: string, id: string, audit: AuditScope, partitions: number): Promise<{ message: Message; canceled: boolean }> {
  await getMessage(redis, keys, tenantId, id);
  const intent = auditIntent(keys.tenantOutbox(tenantId), 'message.cancel', audit, null);
  const reply = await runMoveMessage(redis, keys, tenantId, id, ['scheduled', 'queued'], 'canceled', { canceledAt: isoNow() }, intent);
  if (reply[0] !== 1) {
    if (reply[1] !== 'canceled') throw new ApiError(409, 'conflict', `The message is ${reply[1]}; only scheduled or queued messages can be canceled`);
    return { message: await getMessage(redis, keys, tenantId, id), canceled: false };
  }
  // a scheduled message's release time goes with it (another slot than the script's): it stayed until
  // the original sendAt, up to 30 days, past the message's own retention (probe L). One a crash leaves
  // here is dropped by the scheduler when due, finding no scheduled message.
  await redis.zrem(keys.messageTimers(messageTimerPartition(tenantId, id, partitions)), `${tenantId}|${id}`).catch(() => undefined);
  await settleAudit(redis, keys, intent, MESSAGE_AUDITS['message.cancel'](null, reply));
  return { message: toMessage(recordOf(reply[2]!)), canceled: true };
}

const messageAudit = (type: string, message: Message): AuditDraft => ({ type, target: { type: 'message', id: message.id }, object: { ...message } });

/** The audit entries of message writes, from their scripts' replies (streams/audit-outbox.ts). */
export const MESSAGE_AUDITS = {
  'message.create': (message: Message, reply: CreateReply): AuditDraft[] => (reply[0] === 1 ? [messageAudit('message.created', message)] : []),
  'message.cancel': (_: null, reply: MoveReply): AuditDraft[] => (reply[0] === 1 ? [messageAudit('message.canceled', toMessage(recordOf(reply[2]!)))] : []),
};

export async function getDelivery(redis: Redis, keys: Keys, tenantId: string, id: string): Promise<Delivery> {
  if (!isId('delivery', id)) throw notFound('Delivery');
  const h = await redis.hgetall(keys.delivery(tenantId, id));
  if (!h.id) throw notFound('Delivery');
  return toDelivery(h);
}

/** Loads deliveries by id (null for vanished ones), pipelined. */
export async function loadDeliveries(redis: Redis, keys: Keys, tenantId: string, ids: string[]): Promise<(Delivery | null)[]> {
  const pipeline = redis.pipeline();
  for (const id of ids) pipeline.hgetall(keys.delivery(tenantId, id));
  return ((await pipeline.exec()) ?? []).map(([, h]) => ((h as Record<string, string>)?.id ? toDelivery(h as Record<string, string>) : null));
}

export async function loadMessages(redis: Redis, keys: Keys, tenantId: string, ids: string[]): Promise<(Message | null)[]> {
  const pipeline = redis.pipeline();
  for (const id of ids) pipeline.hgetall(keys.message(tenantId, id));
  return ((await pipeline.exec()) ?? []).map(([, h]) => ((h as Record<string, string>)?.id ? toMessage(h as Record<string, string>) : null));
}
