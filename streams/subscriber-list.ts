import type { Redis } from 'ioredis';
import type { Keys } from './keys.js';
import type { TenantScope } from './subscriber-writes.js';
import { loadSubscribers, type Subscriber } from './subscribers.js';

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
  const externalIds = page.map(({ member }) => member.slice(member.indexOf('|') + 1));
  const items = (await loadSubscribers(redis, keys, scope, externalIds)).filter((s): s is Subscriber => s !== null);
  return { items, next: candidates.length > limit ? page[page.length - 1]!.member : null, total };
}
