import { ACTOR_GROUP } from '../../actors/subscriber-actor.js';
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

/** True when the actors have read every entry of partition `p`'s inbox and acked it (applied and handled by the automation step). */
export async function actorsCaughtUp(service: TestService, p: number): Promise<boolean> {
  const inbox = service.keys.inbox(p);
  const [stream, groups] = await Promise.all([
    service.redis.xinfo('STREAM', inbox) as Promise<unknown[]>,
    service.redis.xinfo('GROUPS', inbox) as Promise<unknown[][]>,
  ]);
  const field = (list: unknown[], name: string) => list[list.indexOf(name) + 1];
  const group = groups.find((g) => field(g, 'name') === ACTOR_GROUP);
  return Boolean(group) && field(group!, 'pending') === 0 && field(group!, 'last-delivered-id') === field(stream, 'last-generated-id');
}
