import type { Redis } from 'ioredis';
import { codePoints } from '../lib/code-points.js';
import { isId } from '../lib/ids.js';
import type { Keys } from './keys.js';
import type { TenantScope } from './subscriber-writes.js';
import { loadSubscribers, type Subscriber } from './subscribers.js';

/**
 * A member of an index that lists subscribers newest first (the subscriber index, a segment's
 * members): `<sub_ id>|<externalId>`, lex-ordered by the time-ordered id. Without an id (a segment
 * member written before members carried one) the member is the externalId alone.
 */
export function indexMember(subscriberId: string | undefined, externalId: string): string {
  return subscriberId ? `${subscriberId}|${externalId}` : externalId;
}

/** The externalId an index member names (`indexMember`). */
export function indexedExternalId(member: string): string {
  const bar = member.indexOf('|');
  return bar > 0 && isId('subscriber', member.slice(0, bar)) ? member.slice(bar + 1) : member;
}

/** Whether a cursor's position is an index member with an id (`<sub_ id>|<externalId>`): anything else is another list's cursor, or forged. */
export function isSubscriberPosition(member: string): boolean {
  const bar = member.indexOf('|');
  const externalId = member.slice(bar + 1);
  return bar > 0 && isId('subscriber', member.slice(0, bar)) && externalId.length >= 1 && codePoints(externalId) <= 256;
}

/**
 * One page of a tenant's subscribers, newest first, merged across partitions. Each partition keeps
 * a lex-ordered index of `<sub_ id>|<externalId>` (ids are time-ordered), so the member itself is
 * the keyset cursor and `total` is the sum of the partitions' ZCARDs (a subscriber lives in one).
 */
export async function listSubscribers(
  redis: Redis, keys: Keys, scope: TenantScope, limit: number, after: string | null, filter: { email?: string },
): Promise<{ items: Subscriber[]; next: string | null; total: number }> {
  const indexOf = (p: number) => (filter.email ? keys.subscriberEmailIndex(p, scope.tenantId, filter.email.toLowerCase()) : keys.subscriberIndex(p, scope.tenantId));
  const max = after ? `(${after}` : '+';
  const pipeline = redis.pipeline();
  for (let p = 0; p < scope.partitions; p++) {
    pipeline.zrange(indexOf(p), max, '-', 'BYLEX', 'REV', 'LIMIT', 0, limit + 1);
    pipeline.zcard(indexOf(p));
  }
  const replies = (await pipeline.exec()) ?? [];
  const candidates: { member: string; p: number }[] = [];
  let total = 0;
  for (let p = 0; p < scope.partitions; p++) {
    for (const member of replies[2 * p]![1] as string[]) candidates.push({ member, p });
    total += Number(replies[2 * p + 1]![1]);
  }
  candidates.sort((a, b) => (a.member < b.member ? 1 : a.member > b.member ? -1 : 0));
  const page = candidates.slice(0, limit);
  const externalIds = page.map(({ member }) => indexedExternalId(member));
  const items = (await loadSubscribers(redis, keys, scope, externalIds)).filter((s): s is Subscriber => s !== null);
  return { items, next: candidates.length > limit ? page[page.length - 1]!.member : null, total };
}
