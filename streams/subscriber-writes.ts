import type { Redis } from 'ioredis';
import { isoNow, now } from '../lib/clock.js';
import { ApiError } from '../lib/errors.js';
import { newId } from '../lib/ids.js';
import { partitionOf } from '../lib/partition.js';
import type { Keys } from './keys.js';
import { callScript } from './lua-scripts.js';

/** Where a tenant's subscriber writes go. */
export type TenantScope = { workspaceId: string; tenantId: string; partitions: number };

export type RecordOp =
  | ['hset', string, string, string]
  | ['hdel', string, string]
  | ['del', string]
  | ['sadd', string, string]
  | ['srem', string, string]
  | ['zadd', string, number, string]
  | ['zrem', string, string];

export type EngineEvent = { name: string; data: Record<string, unknown> };

export type SubscriberSnapshot = { partition: number; exists: boolean; version: number; record: Record<string, string> };

/** Reads a subscriber's record and version (`exists` false for an unknown externalId). */
export async function readSubscriber(redis: Redis, keys: Keys, scope: TenantScope, externalId: string): Promise<SubscriberSnapshot> {
  const partition = partitionOf(scope.tenantId, externalId, scope.partitions);
  const [exists, record] = await Promise.all([
    redis.hexists(keys.subscribers(partition), `${scope.tenantId}|${externalId}`),
    redis.hgetall(keys.subscriber(partition, scope.tenantId, externalId)),
  ]);
  return { partition, exists: exists === 1, version: Number(record.v ?? 0), record };
}

export class VersionConflict extends Error {}

/**
 * Applies a change computed from `expectedVersion` of a subscriber: its engine events (appended to
 * the partition inbox with the next sequences) and record operations, atomically
 * (lua/writeSubscriber). Throws `VersionConflict` when another writer got there first.
 */
export async function writeSubscriber(
  redis: Redis, keys: Keys, scope: TenantScope, externalId: string,
  change: { create: boolean; expectedVersion: number | null; events: EngineEvent[]; ops: RecordOp[] },
): Promise<{ subscriberId: string; created: boolean; version: number }> {
  const p = partitionOf(scope.tenantId, externalId, scope.partitions);
  const at = now();
  const args: (string | number)[] = [
    scope.tenantId, scope.workspaceId, at, keys.partitionBase(p), isoNow(at), externalId, newId('subscriber', at), newId('event', at),
    change.create ? 1 : 0, change.expectedVersion === null ? '' : change.expectedVersion, change.events.length,
  ];
  for (const e of change.events) args.push(newId('event', at), e.name, JSON.stringify(e.data));
  args.push(change.ops.length);
  for (const op of change.ops) args.push(op[0], op[1], op[2] ?? '-', op[3] ?? '-');
  const reply = await callScript<[number, string?, number?, number?]>(redis, 'writeSubscriber', [keys.inbox(p), keys.sequences(p), keys.subscribers(p)], args);
  if (reply[0] === -2) throw new ApiError(404, 'not_found', 'Subscriber not found');
  if (reply[0] === 0) throw new VersionConflict();
  return { subscriberId: reply[1]!, created: Number(reply[2]) > 0, version: Number(reply[3]) };
}

export type Change<T> = { create: boolean; events: EngineEvent[]; ops: RecordOp[]; result: T } | { skip: T };

/**
 * Runs read → compute → compare-and-set until it applies (bounded): the way every subscriber
 * change is made, so a change is decided once even under concurrent writers. `read` loads more of
 * the subscriber's partition state (its subscriptions, topics), sent right after the version reads
 * on the same connection (one round trip with auto-pipelining; Redis runs them in order): every
 * write bumps the version, so state read after it is still current when the version still matches.
 */
export async function changeSubscriber<T, X = undefined>(
  redis: Redis, keys: Keys, scope: TenantScope, externalId: string,
  compute: (snapshot: SubscriberSnapshot, extra: X) => Change<T>,
  read?: (partition: number) => Promise<X>,
): Promise<T> {
  const partition = partitionOf(scope.tenantId, externalId, scope.partitions);
  for (let attempt = 0; attempt < 50; attempt++) {
    // both reads leave in one round trip, the version first: commands of one connection run in order
    const reading = readSubscriber(redis, keys, scope, externalId);
    const extraReading = read ? read(partition) : Promise.resolve(undefined);
    const [snapshot, extra] = (await Promise.all([reading, extraReading])) as [SubscriberSnapshot, X];
    const change = compute(snapshot, extra);
    if ('skip' in change) return change.skip;
    try {
      await writeSubscriber(redis, keys, scope, externalId, { ...change, expectedVersion: snapshot.version });
      return change.result;
    } catch (err) {
      if (!(err instanceof VersionConflict)) throw err;
    }
  }
  throw new ApiError(409, 'conflict', 'The subscriber is changing too fast; retry');
}
