import type { Redis } from 'ioredis';
import { now } from '../lib/clock.js';
import { ConfigError } from '../lib/config.js';
import type { Logger } from '../lib/log.js';
import type { Keys } from './keys.js';
import { callScript } from './lua-scripts.js';

/**
 * Records the deployment's partition count on first start and refuses a process configured with
 * another: it would hash subscribers into other partitions (a second stream per externalId, a
 * second `$subscriber.created`, dedupe ids accepted twice) and lease partitions that do not exist.
 */
export async function checkPartitionCount(redis: Redis, keys: Keys, partitions: number): Promise<void> {
  await redis.set(keys.partitionCount, String(partitions), 'NX');
  const stored = Number(await redis.get(keys.partitionCount));
  if (stored !== partitions) {
    throw new ConfigError(`HERALD_PARTITIONS is ${partitions}, but this deployment (REDIS_KEY_PREFIX ${JSON.stringify(keys.prefix)}) runs with ${stored} partitions; the count is fixed for the life of a deployment`);
  }
}

/** The leasing group of the worker role's partitions (its lease keys fence lua/applyEvents and lua/commitAutomation). */
export const WORKER_LEASES = 'worker';

export type LeaseOptions = {
  /** the leasing group: `worker` or `scheduler` */
  group: string;
  /** this process's unique id in the group */
  owner: string;
  partitions: number;
  /** how long a lease lasts without renewal; a dead owner's partitions are free after it */
  leaseMs?: number;
  /** how often leases are renewed and the share rebalanced */
  tickMs?: number;
  log: Logger;
};

/**
 * Leases partitions to the live members of a group, about `ceil(P / members)` each. Every tick a
 * member renews what it holds, gives up what is over its share, and takes free partitions up to
 * its share, so a dead member's partitions move to the others within `leaseMs + tickMs`.
 */
export class PartitionLeases {
  private held = new Set<number>();
  private timer: NodeJS.Timeout | null = null;
  private readonly leaseMs: number;
  private readonly tickMs: number;
  private ticking: Promise<void> = Promise.resolve();

  constructor(private readonly redis: Redis, private readonly keys: Keys, private readonly options: LeaseOptions) {
    this.leaseMs = options.leaseMs ?? 10_000;
    this.tickMs = options.tickMs ?? 2_000;
  }

  /** Partitions this member holds now. */
  owned(): number[] {
    return [...this.held].sort((a, b) => a - b);
  }

  /**
   * Forgets partition `p` at once, before the next tick would: a write fenced by the lease found
   * another owner (this process stalled past the lease), so its reads of `p` must stop now.
   */
  lose(p: number): void {
    if (this.held.delete(p)) this.options.log.warn('lease lost', { partition: p, group: this.options.group });
  }

  async start(): Promise<void> {
    await this.tick();
    this.timer = setInterval(() => {
      this.ticking = this.tick().catch((err: Error) => this.options.log.warn('lease tick failed', { err: err.message }));
    }, this.tickMs);
  }

  /** Stops renewing and releases every lease, so others take over at once. */
  async stop(): Promise<void> {
    if (this.timer) clearInterval(this.timer);
    this.timer = null;
    await this.ticking;
    const { group, owner } = this.options;
    await Promise.all(this.owned().map((p) => callScript(this.redis, 'releaseLease', [this.keys.lease(p, group)], [owner]).catch(() => 0)));
    this.held.clear();
    await this.redis.zrem(this.keys.leaseMembers(group), owner).catch(() => 0);
  }

  private async tick(): Promise<void> {
    const { group, owner, partitions } = this.options;
    const members = this.keys.leaseMembers(group);
    const at = now();
    await this.redis.zadd(members, at, owner);
    await this.redis.zremrangebyscore(members, '-inf', at - this.leaseMs);
    const live = Math.max(1, await this.redis.zcard(members));
    const share = Math.ceil(partitions / live);

    const renew = this.redis.pipeline();
    const mine = this.owned();
    for (const p of mine) callScript(renew, 'renewLease', [this.keys.lease(p, group)], [owner, this.leaseMs]);
    const renewed = (await renew.exec()) ?? [];
    mine.forEach((p, i) => {
      if (renewed[i]?.[1] !== 1) {
        this.held.delete(p);
        this.options.log.warn('lease lost', { partition: p, group });
      }
    });

    while (this.held.size > share) {
      const p = this.owned().pop()!;
      await callScript(this.redis, 'releaseLease', [this.keys.lease(p, group)], [owner]);
      this.held.delete(p);
    }
    if (this.held.size < share) {
      const offset = Math.floor(Math.random() * partitions);
      for (let k = 0; k < partitions && this.held.size < share; k++) {
        const p = (offset + k) % partitions;
        if (this.held.has(p)) continue;
        const won = await callScript<number>(this.redis, 'renewLease', [this.keys.lease(p, group)], [owner, this.leaseMs]);
        if (won === 1) this.held.add(p);
      }
    }
  }
}
