import type { Redis } from 'ioredis';
import { partitionOf } from '../../lib/partition.js';
import type { Keys } from '../../streams/keys.js';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** The `p`th percentile (nearest rank) of `sorted` (ascending), NaN when empty. */
export function percentile(sorted: number[], p: number): number {
  if (sorted.length === 0) return Number.NaN;
  return sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1))]!;
}

type Sample = { p: number; field: string; seq: number; t0: number };

/**
 * Follows accepted events until the worker has applied them (`keys.applied(p)` field ≥ their
 * sequence), for the read-model lag of the `pipeline` and `fairness` benches: every ~2 ms one
 * pipeline of HGETs for all the samples still followed. With `everyMs` > 0, one event of an answer
 * every `everyMs` is followed; with 0, every accepted event of every answer. Each lag is kept with
 * the time its event was accepted (`applied`), so that the samples of a window can be told apart.
 */
export class LagSampler {
  /** applied samples: accepted at `t0` (performance.now() of the 202 answer), lag in ms */
  readonly applied: { t0: number; lagMs: number }[] = [];
  /** acceptance times of the samples not applied by the end of `finish` */
  readonly lost: number[] = [];
  /** when `finish` gave up on them */
  finishedAt = Number.NaN;
  picked = 0;
  private pending: Sample[] = [];
  /** samples of the pipeline in flight (out of `pending` meanwhile) */
  private polling = 0;
  private lastPick = -Infinity;
  private running = true;
  private error: unknown = null;
  private readonly loop: Promise<void>;

  constructor(private readonly redis: Redis, private readonly keys: Keys, private readonly tenantId: string, private readonly partitions: number, private readonly everyMs: number) {
    this.loop = this.poll().catch((err: unknown) => {
      this.error = err; // thrown by finish
    });
  }

  /** The applied samples' lags, in the order they were seen applied. */
  get lagsMs(): number[] {
    return this.applied.map((s) => s.lagMs);
  }

  /** Hands one answer to the sampler (only a 202's accepted events are followed). */
  offer(status: number, body: string, at: number): void {
    if (status !== 202 || !this.running || at - this.lastPick < this.everyMs) return;
    const items = (JSON.parse(body) as { data: { items: { externalId: string; sequence: number; status: string }[] } }).data.items.filter((i) => i.status === 'accepted');
    if (items.length === 0) return;
    this.lastPick = at;
    const picked = this.everyMs > 0 ? [items[Math.floor(Math.random() * items.length)]!] : items;
    for (const item of picked) {
      this.picked++;
      this.pending.push({ p: partitionOf(this.tenantId, item.externalId, this.partitions), field: `${this.tenantId}|${item.externalId}`, seq: item.sequence, t0: at });
    }
  }

  private async poll(): Promise<void> {
    while (this.running) {
      if (this.pending.length > 0) {
        const batch = this.pending;
        this.pending = [];
        this.polling = batch.length;
        const pipeline = this.redis.pipeline();
        for (const s of batch) pipeline.hget(this.keys.applied(s.p), s.field);
        const replies = (await pipeline.exec()) ?? [];
        this.polling = 0;
        const at = performance.now();
        const still: Sample[] = [];
        batch.forEach((s, i) => {
          if (Number(replies[i]?.[1] ?? 0) >= s.seq) this.applied.push({ t0: s.t0, lagMs: at - s.t0 });
          else still.push(s);
        });
        this.pending = still.concat(this.pending); // with those offered meanwhile
      }
      await sleep(2);
    }
  }

  /** Takes no more samples; waits (at most `timeoutMs`) for those still followed; the rest go to `lost`; resolves to how many. */
  async finish(timeoutMs: number): Promise<number> {
    this.lastPick = Infinity;
    const deadline = performance.now() + timeoutMs;
    while (this.pending.length + this.polling > 0 && performance.now() < deadline) await sleep(20);
    this.running = false;
    await this.loop; // its last round puts what it did not see applied back in `pending`
    if (this.error) throw this.error;
    this.lost.push(...this.pending.map((s) => s.t0));
    this.pending = [];
    this.finishedAt = performance.now();
    return this.lost.length;
  }
}
