import type { Redis } from 'ioredis';
import type { Keys } from './keys.js';

const MAX_TENANTS = 50;
const MAX_NAMES = 1000;

/**
 * The stream event names the workspace's tenants have seen (the subscriber actors' catalog read
 * models, `<name>|all` fields), for the webhook catalog: the first 50 tenants, at most 1,000 names.
 */
export async function seenEventNames(redis: Redis, keys: Keys, partitions: number, workspaceId: string): Promise<string[]> {
  const tenants = await redis.zrange(keys.tenantIndex(workspaceId), 0, MAX_TENANTS - 1);
  if (tenants.length === 0) return [];
  const pipeline = redis.pipeline();
  for (const t of tenants) for (let p = 0; p < partitions; p++) pipeline.hkeys(keys.catalog(p, t));
  const names = new Set<string>();
  for (const [err, fields] of (await pipeline.exec()) ?? []) {
    if (err) throw err;
    for (const field of fields as string[]) {
      if (field.endsWith('|all')) names.add(field.slice(0, -'|all'.length));
      if (names.size >= MAX_NAMES) return [...names];
    }
  }
  return [...names];
}
