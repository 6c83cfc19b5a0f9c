import { partitionOf } from '../../lib/partition.js';
import type { TestService } from './service.js';

/**
 * The engine and tracked events appended for one subscriber, read straight from its partition
 * inbox (for tests that run without a worker, so nothing is consumed or trimmed).
 */
export async function inboxEvents(service: TestService, tenantId: string, externalId: string): Promise<{ name: string; sequence: number; data: any; source: string }[]> {
  const p = partitionOf(tenantId, externalId, service.config.partitions);
  const entries = (await service.redis.xrange(service.keys.inbox(p), '-', '+')) as [string, string[]][];
  const out = [];
  for (const [, list] of entries) {
    const f: Record<string, string> = {};
    for (let i = 0; i < list.length; i += 2) f[list[i]!] = list[i + 1]!;
    if (f.t === tenantId && f.x === externalId) out.push({ name: f.n!, sequence: Number(f.q), data: JSON.parse(f.d || '{}'), source: f.o! });
  }
  return out;
}

export const names = (events: { name: string }[]) => events.map((e) => e.name);
