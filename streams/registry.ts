import type { Redis } from 'ioredis';

/** Members one command of `readRegistry` returns at most. */
export const REGISTRY_PAGE = 1_000;

/**
 * Every member of a registry sorted set (the tenants with message queues, the workspaces with
 * webhook endpoints), read in pages of REGISTRY_PAGE by rank so that no one command returns an
 * unbounded reply; at most as many pages as the set held when the read began, plus one (a set that
 * grows meanwhile is read again at the next refresh).
 */
export async function readRegistry(redis: Redis, key: string): Promise<string[]> {
  const pages = Math.ceil((await redis.zcard(key)) / REGISTRY_PAGE) + 1;
  const out: string[] = [];
  for (let page = 0; page < pages; page++) {
    const members = await redis.zrange(key, page * REGISTRY_PAGE, (page + 1) * REGISTRY_PAGE - 1);
    out.push(...members);
    if (members.length < REGISTRY_PAGE) break;
  }
  return out;
}
