import type { Redis } from 'ioredis';
import { isoNow, now } from '../lib/clock.js';
import { recordOf } from '../lib/field-list.js';
import { ApiError, lockTimeout, processingBehind } from '../lib/errors.js';
import { newId } from '../lib/ids.js';
import { partitionOf } from '../lib/partition.js';
import type { Keys } from './keys.js';
import { callScript } from './lua-scripts.js';
import type { WriteAudit, WriteReply } from './subscriber-audit.js';

/** Where a tenant's subscriber writes go. */
/**
 * Where a subscriber write applies. `only` (a merge's writes): a change of that externalId applies
 * to the subscriber with that sub_ id only; once it is deleted or made anew, `changeSubscriber`
 * throws `SubscriberChanged` instead of writing (or creating it again).
 */
export type TenantScope = {
  workspaceId: string; tenantId: string; partitions: number; only?: { externalId: string; id: string };
  /**
   * A write is refused (503 `unavailable`, that write not made) when the partition inbox holds more
   * entries than this: the API's writes pass `INBOX_MAX_BACKLOG`, as ingest is refused there, so
   * a flood of them (a client key toggling a mute) cannot grow the inbox without bound while the
   * worker is stopped or behind (probe EB); the engine's own writes pass none and always go.
   */
  maxInboxBacklog?: number;
};

/**
 * 404: the subscriber a write was limited to (`TenantScope.only`) is gone or was made anew. A merge
 * racing a delete of the identified subscriber recreated it and moved the anonymous one's devices,
 * topics and widgets into the new one or lost them (probe X).
 */
export class SubscriberChanged extends ApiError {
  constructor() {
    super(404, 'not_found', 'Subscriber not found');
  }
}

export type RecordOp =
  | ['hset', string, string, string]
  | ['hdel', string, string]
  | ['del', string]
  | ['sadd', string, string]
  | ['srem', string, string]
  | ['zadd', string, number, string]
  | ['zrem', string, string];

export type EngineEvent = { name: string; data: Record<string, unknown> };

export type SubscriberSnapshot = { partition: number; exists: boolean; version: number; id: string | null; record: Record<string, string> };

/**
 * Reads a subscriber's record and version (`exists` false for an unknown externalId); with
 * `record: false` only the version field is read and `record` is empty.
 */
export async function readSubscriber(redis: Redis, keys: Keys, scope: TenantScope, externalId: string, options: { record?: boolean } = {}): Promise<SubscriberSnapshot> {
  const partition = partitionOf(scope.tenantId, externalId, scope.partitions);
  const recordKey = keys.subscriber(partition, scope.tenantId, externalId);
  const exists = redis.hexists(keys.subscribers(partition), `${scope.tenantId}|${externalId}`);
  if (options.record === false) {
    const [found, [version, id]] = await Promise.all([exists, redis.hmget(recordKey, 'v', 'id')]);
    return { partition, exists: found === 1, version: Number(version ?? 0), id: id ?? null, record: {} };
  }
  const [found, record] = await Promise.all([exists, redis.hgetall(recordKey)]);
  return { partition, exists: found === 1, version: Number(record.v ?? 0), id: record.id ?? null, record };
}

export class VersionConflict extends Error {}

/**
 * A condition lua/writeSubscriber checks before it writes anything: `absent` (the key does not
 * exist), `scardBelow` (the set holds fewer than n members), `fieldIs` (the hash field holds the
 * value, '' meaning absent or empty: state of another subscriber of the partition that the change
 * depends on, which the version check does not cover). Keys are of the subscriber's partition.
 */
export type WriteGuard = ['absent', string] | ['scardBelow', string, number] | ['fieldIs', string, string, string];

/** Thrown by `writeSubscriber` when guard `index` of the change did not hold (nothing was written). */
export class GuardFailed extends Error {
  constructor(readonly index: number) {
    super(`write guard ${index} did not hold`);
  }
}

/**
 * Applies a change computed from `expected` (the version and id) of a subscriber: its engine events
 * (appended to the partition inbox with the next sequences) and record operations, atomically
 * (lua/writeSubscriber). Throws `VersionConflict` when another writer got there first, a subscriber
 * deleted and created anew since included (its version starts again, its id does not). `expected`
 * null skips the check: only for a change that does not depend on the subscriber's state beyond its
 * `guards` (checked in the same script; `GuardFailed` when one does not hold). `at` is the time of
 * the change (default now). With `audit`, the write records its audit intent in the partition's
 * outbox and, once applied, settles it through its trail (streams/subscriber-audit.ts). With
 * `needsRecord`, `record` is the subscriber's record as the write left it.
 */
export async function writeSubscriber(
  redis: Redis, keys: Keys, scope: TenantScope, externalId: string,
  change: { create: boolean; expected: { version: number; id: string | null } | null; events: EngineEvent[]; ops: RecordOp[]; guards?: WriteGuard[]; at?: number; audit?: WriteAudit | null; needsRecord?: boolean },
): Promise<{ subscriberId: string; created: boolean; version: number; record: Record<string, string> | null }> {
  const p = partitionOf(scope.tenantId, externalId, scope.partitions);
  const at = change.at ?? now();
  const outbox = keys.partitionOutbox(p);
  const audit = change.audit ?? null;
  const made = audit ? audit.trail.intent(outbox, audit) : null;
  const args: (string | number)[] = [
    scope.tenantId, scope.workspaceId, at, keys.partitionBase(p), isoNow(at), externalId, newId('subscriber', at), newId('event', at),
    change.create ? 1 : 0, change.expected === null ? '' : `${change.expected.version}|${change.expected.id ?? ''}`,
    made?.intent.token ?? '', made?.intent.json ?? '', made?.absorbs?.intent.token ?? '', audit?.needsRecord || change.needsRecord ? 1 : 0, change.events.length,
  ];
  for (const e of change.events) args.push(newId('event', at), e.name, JSON.stringify(e.data));
  pushOps(args, change.ops);
  const guards = change.guards ?? [];
  args.push(guards.length);
  for (const g of guards) args.push(g[0], g[1], g[2] ?? '-', g[3] ?? '-');
  args.push(scope.maxInboxBacklog ?? '');
  const reply = await callScript<WriteReply>(redis, 'writeSubscriber', [keys.inbox(p), keys.sequences(p), keys.subscribers(p), outbox], args);
  if (reply[0] === -2) throw new ApiError(404, 'not_found', 'Subscriber not found');
  if (reply[0] === -4) throw processingBehind();
  if (reply[0] === -3) throw new GuardFailed(Number(reply[1]) - 1);
  if (reply[0] === 0) throw new VersionConflict();
  if (made) audit!.trail.written(made, audit!, reply);
  return { subscriberId: reply[1]!, created: Number(reply[2]) > 0, version: Number(reply[3]), record: change.needsRecord ? recordOf(reply[4] ?? []) : null };
}

/**
 * The operations in lua/writeSubscriber's argument form: their number, then 4 arguments each; a run
 * of `hset` on one key goes as one `hmset` (key, number of pairs n, '-', then the n field/value
 * pairs), which the script applies with one HSET.
 */
function pushOps(args: (string | number)[], ops: RecordOp[]): void {
  const countAt = args.length;
  args.push(0);
  let count = 0;
  for (let i = 0; i < ops.length; count++) {
    const op = ops[i]!;
    if (op[0] === 'hset') {
      let end = i + 1;
      while (end < ops.length && ops[end]![0] === 'hset' && ops[end]![1] === op[1]) end++;
      if (end - i > 1) {
        args.push('hmset', op[1], end - i, '-');
        for (let j = i; j < end; j++) {
          const pair = ops[j] as ['hset', string, string, string];
          args.push(pair[2], pair[3]);
        }
        i = end;
        continue;
      }
    }
    args.push(op[0], op[1], op[2] ?? '-', op[3] ?? '-');
    i++;
  }
  args[countAt] = count;
}

/**
 * A computed change (`guards`: conditions on state the version does not cover; when one fails the
 * change is recomputed; `audit`: the audit entries the write records, see `writeSubscriber`).
 */
/** A change to write, or `skip` (nothing to write); `written` is given the record as the write left it. */
export type Change<T> = { create: boolean; events: EngineEvent[]; ops: RecordOp[]; guards?: WriteGuard[]; audit?: WriteAudit | null; result: T; written?: (record: Record<string, string>) => void } | { skip: T };

/**
 * Runs read → compute → compare-and-set until it applies (bounded): the way every subscriber
 * change is made, so a change is decided once even under concurrent writers. `read` loads more of
 * the subscriber's partition state (its subscriptions, topics), sent right after the version reads
 * on the same connection without waiting for their replies (Redis runs them in order): every
 * write bumps the version, so state read after it is still current when the version still matches.
 * `options.record` false reads only the subscriber's version (for a `compute` that does not look at
 * `snapshot.record`). A change that also depends on state the version does not cover (another
 * subscriber's, in the same partition) carries `guards`; a failed guard recomputes like a conflict.
 */
export async function changeSubscriber<T, X = undefined>(
  redis: Redis, keys: Keys, scope: TenantScope, externalId: string,
  compute: (snapshot: SubscriberSnapshot, extra: X, at: number) => Change<T>,
  read?: (partition: number) => Promise<X>,
  options: { record?: boolean } = {},
): Promise<T> {
  const partition = partitionOf(scope.tenantId, externalId, scope.partitions);
  for (let attempt = 0; attempt < 50; attempt++) {
    // both reads leave at once, the version first: commands of one connection run in order
    const reading = readSubscriber(redis, keys, scope, externalId, options);
    const extraReading = read ? read(partition) : Promise.resolve(undefined);
    const [snapshot, extra] = (await Promise.all([reading, extraReading])) as [SubscriberSnapshot, X];
    // a write limited to one subscriber (a merge's) finds another or none: the compare-and-set checks the id too
    if (scope.only?.externalId === externalId && snapshot.id !== scope.only.id) throw new SubscriberChanged();
    // one reading of the clock for the attempt: the record's times `compute` writes (updatedAt) and
    // the ones the script writes (a new subscriber's createdAt, its events) are the same instant
    // (updatedAt read before the write's own time came out 1 ms before createdAt: probe U)
    const at = now();
    const change = compute(snapshot, extra, at);
    if ('skip' in change) return change.skip;
    try {
      const done = await writeSubscriber(redis, keys, scope, externalId, {
        create: change.create, events: change.events, ops: change.ops, guards: change.guards, audit: change.audit,
        expected: { version: snapshot.version, id: snapshot.id }, at, needsRecord: change.written !== undefined,
      });
      change.written?.(done.record!);
      return change.result;
    } catch (err) {
      if (!(err instanceof VersionConflict) && !(err instanceof GuardFailed)) throw err;
    }
  }
  throw lockTimeout('The subscriber');
}
