import type { Redis } from 'ioredis';
import type { Logger } from '../lib/log.js';
import { partitionOf } from '../lib/partition.js';
import type { Keys } from './keys.js';
import type { RecordOp } from './subscriber-writes.js';
import { sweepAgedEntries } from './hash-sweep.js';
import { releaseToken } from './subscriptions.js';
import { mirrorMemberships } from './topic-members.js';
import { deleteWidgetsOf } from './widgets.js';

/**
 * The tenant-wide half of a subscriber delete, made crash-safe.
 *
 * A subscriber's own state lives in its partition (`{pN}`), removed by the delete's one
 * compare-and-set write (lua/writeSubscriber). What refers to it from the tenant's slot (`{t:…}`)
 * cannot go in that write: its token index entries (`tokens`, `subscriptionOwners`,
 * `subscriptionClaims`), its widgets and its entries in topic member sets. So the write also records
 * what it owes there, as one field of its partition's cleanup hash (`keys.subscriberCleanups`,
 * beside the record it removes: the two go together or not at all); the writer then removes those
 * references (`finishCleanup`) and the field. A writer killed in between leaves the field, and the
 * worker's sweeper (`actors/audit-outbox-sweeper.ts`, every `AUDIT_OUTBOX_SWEEP_MS`) finishes the
 * cleanups older than that interval (`sweepSubscriberCleanups`). Every step is idempotent (the
 * writer and a sweep may both run it) and leaves alone what a subscriber created again under the
 * same externalId since then holds: a token entry goes only while it still names the removed
 * subscription, its externalId, and no later claim (lua/releaseToken: re-registering the same token
 * claims it anew), a widget only when tagged with the deleted sub_ id (lua/deleteWidgets), a topic
 * member entry only when the externalId's partition says it is not a member
 * (`mirrorMemberships`).
 */
export type SubscriberCleanup = {
  /** when the delete's write was computed (ms): the sweep leaves younger ones to their writer */
  at: number;
  workspaceId: string;
  tenantId: string;
  externalId: string;
  /** the deleted subscriber's sub_ id */
  subscriberId: string;
  /** the subscriptions its set named, with the claim number stamped on each record removed */
  subscriptions: { id: string; channel: string; token: string | null; address: string | null; claim: number }[];
  /** the topics it belonged to */
  topicIds: string[];
};

const fieldOf = (c: Pick<SubscriberCleanup, 'tenantId' | 'subscriberId'>) => `${c.tenantId}|${c.subscriberId}`;

/** The record operation storing `cleanup` in the delete's own write. */
export function cleanupOp(keys: Keys, partition: number, cleanup: SubscriberCleanup): RecordOp {
  return ['hset', keys.subscriberCleanups(partition), fieldOf(cleanup), JSON.stringify(cleanup)];
}

/**
 * Removes the tenant-wide references of a deleted subscriber (see above), then its cleanup field.
 * A step that fails leaves the field for the sweeper.
 */
export async function finishCleanup(redis: Redis, keys: Keys, partitions: number, cleanup: SubscriberCleanup): Promise<void> {
  const { tenantId, externalId } = cleanup;
  await Promise.all(cleanup.subscriptions.map((s) => releaseToken(redis, keys, tenantId, externalId, s)));
  await deleteWidgetsOf(redis, keys, tenantId, externalId, cleanup.subscriberId);
  await mirrorMemberships(redis, keys, { workspaceId: cleanup.workspaceId, tenantId, partitions }, externalId, cleanup.topicIds);
  await redis.hdel(keys.subscriberCleanups(partitionOf(tenantId, externalId, partitions)), fieldOf(cleanup));
}

/** Most cleanups finished per partition and sweep; the rest wait for the next sweep. */
const PER_PARTITION = 1_000;

/**
 * Finishes the cleanups whose writer died (killed between the delete's write and the end of its
 * cleanup): those older than `minAgeMs`, which a live writer has long finished. One that fails is
 * kept for the next sweep and reported.
 */
export async function sweepSubscriberCleanups(redis: Redis, keys: Keys, partitions: number, minAgeMs: number, log: Logger): Promise<{ finished: number; kept: number }> {
  const hashes = Array.from({ length: partitions }, (_, p) => keys.subscriberCleanups(p));
  return sweepAgedEntries<SubscriberCleanup>(redis, hashes, PER_PARTITION, minAgeMs, log, 'subscriber cleanup', (cleanup) => finishCleanup(redis, keys, partitions, cleanup));
}
