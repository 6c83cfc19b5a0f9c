import type { Redis } from 'ioredis';
import { pause, sharedAbortController } from '../lib/abortable.js';
import { now } from '../lib/clock.js';
import type { Logger } from '../lib/log.js';
import { waitAtMost } from '../lib/wait-at-most.js';
import { recordOf } from '../lib/field-list.js';
import { callScript } from './lua-scripts.js';
import { retryWhileUnavailable } from './redis.js';

export type StreamEntry = { id: string; fields: Record<string, string> };
/**
 * Works a batch of one stream. `signal` aborts when another process of a shared group took over
 * some of the batch (this one stalled longer than `claimIdleMs`): the handler should stop at its
 * next safe point; nothing of the batch is acked then, and what is still this process's is
 * claimed again later (handlers are idempotent). With `giveBackOnStop` it aborts too when the
 * consumer stops (reason `STOPPING`), and what is still this process's is given back at once.
 */
export type StreamHandler = (stream: string, entries: StreamEntry[], signal: AbortSignal) => Promise<void>;

/**
 * Which streams a consumer reads, and how it takes over entries others read but never acked:
 * - `exclusive`: the streams are leased to this process alone (partitions); on taking one it claims
 *   every pending entry at once (`XAUTOCLAIM` min-idle 0), before reading new ones;
 * - `shared`: every process of the group reads every stream; entries idle longer than `claimIdleMs`
 *   (a dead process's) are claimed periodically.
 */
export type StreamSource = { streams: () => string[]; mode: 'exclusive' } | { streams: () => string[]; mode: 'shared'; claimIdleMs: number };

export type ConsumerOptions = {
  /** connection for commands (acks, claims, trims) */
  redis: Redis;
  /** a dedicated connection for the blocking XREADGROUP */
  blocking: Redis;
  source: StreamSource;
  group: string;
  consumer: string;
  handle: StreamHandler;
  log: Logger;
  /** most entries read from one stream at a time (default 500; a read budget spread over many streams still gives each at least 16, within this) */
  batchSize?: number;
  /** most entries read across all streams at a time (default READ_BUDGET) */
  readBudget?: number;
  blockMs?: number;
  trimEveryMs?: number;
  /** where a new group starts: `0` (everything in the stream) or `$` (only what comes next) */
  startAt?: '0' | '$';
  /**
   * Least time from one read to the next when the read was less than half full and no stream's batch
   * came back full (default 0): what arrives meanwhile is read and handled together, so a handler's
   * fixed cost per batch is shared by more entries. Adds at most this much latency; a backlog (a
   * full read, or one stream's full batch) is read without pause.
   */
  lingerMs?: number;
  /** how long a consumer of the group must have read nothing, with nothing pending, to be forgotten as dead (default DEAD_CONSUMER_IDLE_MS) */
  deadConsumerIdleMs?: number;
  /**
   * Shared mode: up to this many streams' batches are worked at once without the next read waiting
   * for them; the next read names the other streams (a stream's batches stay one at a time, in
   * order, unless `batchesPerStream` allows more). Unset: a read's batches are all worked before the
   * next read. The message dispatcher sets it, so one tenant's slow batch (a cold or unreachable
   * push provider) does not hold up the others' messages.
   */
  overlapStreams?: number;
  /**
   * With `overlapStreams`: up to this many batches of one stream are worked at once (default 1: a
   * stream's batches one at a time, in order). The message dispatcher's one-subscriber lane sets
   * more, so a batch held by one push that is retried for a long time (a device that never answers:
   * five attempts of the request timeout, ~30 s) does not hold up the tenant's later messages.
   */
  batchesPerStream?: number;
  /**
   * With `batchesPerStream`: a busy stream is read again only once its latest batch has run this
   * long (default 0). Batches that end quickly then keep their stream one batch at a time, so the
   * extra batches go only to a stream held up (on 2 cores, reading every busy stream again at once
   * moved CPU from the web role to the dispatcher: send bench acceptance −20 to −35 %).
   */
  slowBatchMs?: number;
  /**
   * Shared mode: a stop aborts the batches being worked (their signal, with reason `STOPPING`: the
   * handler stops at its next safe point) and gives back what of them is still this consumer's as
   * new entries at the stream's end, which the group's other processes read at once (`ownedEntries`
   * 'requeue'). Unset, a stop waits for its batches, however long. Only for streams whose entries
   * name resumable work (the message queues: a long fan-out outlasted the stop's limit and, cut
   * there, waited for its claim idle time, probe AU), never for a ledger, whose entries are records.
   */
  giveBackOnStop?: boolean;
};

/** The reason a batch's signal carries when its consumer stops (`giveBackOnStop`). */
export const STOPPING = 'stopping';

const CLAIM_PAGE = 500;
/** Shared mode: times a batch is worked before it is left to a claim, and the waits between (0.2, 0.4, … s, at most 5 s: ~6 s in all). */
const SHARED_BATCH_TRIES = 6;
const SHARED_RETRY_FIRST_MS = 200;
const SHARED_RETRY_MAX_MS = 5_000;
/** Shared mode: how long the ack of a worked batch is retried while Redis refuses it. */
const ACK_WITHIN_MS = 15_000;
/** Entries one XTRIM call may remove (whole stream nodes of 100, about 2 ms of Redis), and calls one trim makes at most. */
const TRIM_LIMIT = 10_000;
const TRIM_ROUNDS = 100;
/** Entries lua/ownedEntries checks per call (one XPENDING each). */
const OWNED_PER_CALL = 500;
/** Longest a stop waits to leave its streams' groups (`stop`). */
const LEAVE_WAIT_MS = 1_000;
/**
 * Entries one read takes across all its streams. A read's batches are handled together and held
 * until the slowest is done, so 500 from each of 64 partitions (32,000 entries) kept hundreds of MB
 * alive, made young-generation GC copy them again and again (half the worker's CPU) and stalled the
 * worker for seconds; ~2,000 per read (32 per partition) keeps the heap near 100 MB and the applied
 * rate steady (measured with the pipeline bench, docs/events.md).
 */
export const READ_BUDGET = 2_048;
const MIN_PER_STREAM = 16;
/**
 * How often a consumer forgets the dead consumers of the groups it reads, and how long one must have
 * read nothing (with nothing pending) to count as dead (lua/forgetIdleConsumers). Live consumers
 * read at least every `blockMs`.
 */
const FORGET_CONSUMERS_EVERY_MS = 3_600_000;
const DEAD_CONSUMER_IDLE_MS = 3_600_000;
const FORGET_CONSUMERS_PER_CALL = 1_000;
/** Streams a periodic pass (claims, forgetting dead consumers) covers per pipelined round trip. */
const STREAMS_PER_PIPELINE = 500;
const IDLE_SLEEP_MS = 200;
/**
 * While batches of some streams are being worked (`overlapStreams`), the other streams are read
 * without blocking, and a read that finds nothing waits at most this long, or until one of those
 * batches is done: a blocked read would hold up the next batch of a stream whose batch just ended.
 */
const BUSY_POLL_MS = 50;
/** How often an exclusive consumer looks for entries of its streams pending with another consumer. */
const STRAY_CHECK_MS = 5_000;


function toEntries(raw: [string, string[]][]): StreamEntry[] {
  const out: StreamEntry[] = [];
  for (const item of raw) {
    if (!item || !item[1]) continue; // an id whose entry was deleted
    out.push({ id: item[0], fields: recordOf(item[1]) });
  }
  return out;
}

/**
 * The one consumer runtime: reads streams through a consumer group, hands each stream's entries to
 * `handle` in stream order (different streams' batches concurrently), acks them after the handler returns, and trims what the group has
 * acked. Entries another process read but never acked are claimed (see `StreamSource`), so nothing
 * is lost when a process dies mid-batch; handlers make their effects idempotent. A group lost with
 * a Redis restart (`NOGROUP`) is recreated instead of looping on the error.
 */
export class StreamConsumer {
  private stopped = false;
  private running: Promise<void> | null = null;
  private readonly adopted = new Set<string>();
  private readonly lastTrim = new Map<string, number>();
  /**
   * Streams with entries this consumer acked since their last trim: only they are trimmed, so a
   * consumer over many streams (every tenant's message queue) costs nothing per idle stream.
   */
  private readonly untrimmed = new Set<string>();
  private lastClaim = 0;
  /** When this consumer last forgot the dead consumers of its streams (0: at its first read). */
  private lastForget = 0;
  /** When this consumer (exclusive mode) last looked for entries of its streams pending with others. */
  private lastStrayCheck = 0;
  /** Streams whose batches are being worked while the loop reads on (`overlapStreams`), with that work and when the latest began. */
  private readonly busy = new Map<string, { batches: Set<Promise<void>>; latestAt: number }>();
  /** The batches being worked in shared mode, by their abort (`giveBackOnStop`). */
  private readonly inFlight = new Set<AbortController>();

  constructor(private readonly o: ConsumerOptions) {}

  start(): void {
    this.running = this.loop();
  }

  /**
   * Whether `stream` is this consumer's with nothing left behind: adopted, and (exclusive mode) every
   * entry pending at adoption handled. False again from a failed read until the stream is adopted anew.
   */
  caughtUp(stream: string): boolean {
    return this.adopted.has(stream);
  }

  /**
   * Stops reading, then leaves the group of each stream it read where it holds no pending entry
   * (`XGROUP DELCONSUMER`), so consumer names do not pile up with every process start (each start is
   * a new name). One holding entries it never acked stays, for another process to claim them. At
   * most LEAVE_WAIT_MS: a stop never waits long on a Redis that does not answer. With
   * `giveBackOnStop` the batches being worked are cut short and given back first.
   */
  async stop(): Promise<void> {
    this.stopped = true;
    if (this.o.giveBackOnStop) for (const controller of this.inFlight) controller.abort(STOPPING);
    this.o.blocking.disconnect();
    await this.running?.catch(() => undefined);
    await Promise.all(this.working());
    let timer: NodeJS.Timeout | undefined;
    await Promise.race([
      this.leaveGroups().catch(() => undefined),
      new Promise<void>((done) => (timer = setTimeout(done, LEAVE_WAIT_MS))),
    ]);
    clearTimeout(timer);
  }

  /** Every batch being worked while the loop reads on. */
  private working(): Promise<void>[] {
    return [...this.busy.values()].flatMap(({ batches }) => [...batches]);
  }

  private async leaveGroups(streams = [...this.adopted]): Promise<void> {
    if (streams.length === 0) return;
    const { redis, group, consumer } = this.o;
    const pending = await redis.pipeline(streams.map((s) => ['xpending', s, group, '-', '+', '1', consumer])).exec();
    const idle = streams.filter((_, i) => !pending?.[i]?.[0] && (pending?.[i]?.[1] as unknown[] | undefined)?.length === 0);
    if (idle.length) await redis.pipeline(idle.map((s) => ['xgroup', 'DELCONSUMER', s, group, consumer])).exec();
  }

  /**
   * Deletes the consumer names that processes killed without a clean stop left in the groups of
   * `streams` (nothing pending, nothing read for DEAD_CONSUMER_IDLE_MS), checked and deleted
   * atomically per stream. At start and hourly after, so names do not pile up with every SIGKILL.
   */
  private async forgetDeadConsumers(streams: string[]): Promise<number> {
    let forgotten = 0;
    for (let i = 0; i < streams.length; i += STREAMS_PER_PIPELINE) {
      const pipeline = this.o.redis.pipeline();
      for (const stream of streams.slice(i, i + STREAMS_PER_PIPELINE)) {
        callScript(pipeline, 'forgetIdleConsumers', [stream], [this.o.group, this.o.deadConsumerIdleMs ?? DEAD_CONSUMER_IDLE_MS, this.o.consumer, FORGET_CONSUMERS_PER_CALL]);
      }
      for (const [err, n] of (await pipeline.exec()) ?? []) if (!err) forgotten += Number(n);
    }
    return forgotten;
  }

  /**
   * Claims the entries of `streams` pending for at least `minIdleMs` (shared mode's periodic pass).
   * One pipelined XPENDING summary per STREAMS_PER_PIPELINE streams finds those with anything
   * pending, so a consumer over thousands of mostly idle streams (every tenant's message queue)
   * pays a few round trips, not one XAUTOCLAIM per stream.
   */
  private async claimIdle(streams: string[], minIdleMs: number): Promise<void> {
    for (let i = 0; i < streams.length; i += STREAMS_PER_PIPELINE) {
      const chunk = streams.slice(i, i + STREAMS_PER_PIPELINE);
      const replies = (await this.o.redis.pipeline(chunk.map((s) => ['xpending', s, this.o.group])).exec()) ?? [];
      for (let k = 0; k < chunk.length; k++) {
        const [err, summary] = replies[k] ?? [];
        // an error (a group not there any more) is left to the read, which recreates it
        if (!err && Number((summary as [number] | undefined)?.[0] ?? 0) > 0) await this.claim(chunk[k]!, minIdleMs);
      }
    }
  }

  /**
   * Exclusive mode: a stream of this consumer's with entries pending under another consumer (one
   * that read them after it had lost the stream: a process that stalled past its lease and resumed;
   * its fenced writes refused them) is adopted again, which claims and handles every pending entry
   * first. Every STRAY_CHECK_MS, one pipelined `XPENDING` summary per stream.
   */
  private async readoptStrays(): Promise<void> {
    const streams = [...this.adopted];
    for (let i = 0; i < streams.length; i += STREAMS_PER_PIPELINE) {
      const chunk = streams.slice(i, i + STREAMS_PER_PIPELINE);
      const replies = (await this.o.redis.pipeline(chunk.map((s) => ['xpending', s, this.o.group])).exec()) ?? [];
      chunk.forEach((stream, k) => {
        const [err, summary] = replies[k] ?? [];
        const holders = (summary as [number, string | null, string | null, [string, string][] | null] | undefined)?.[3] ?? [];
        if (!err && holders.some(([name]) => name !== this.o.consumer)) this.adopted.delete(stream);
      });
    }
  }

  private async ensureGroup(stream: string): Promise<void> {
    try {
      await this.o.redis.xgroup('CREATE', stream, this.o.group, this.o.startAt ?? '0', 'MKSTREAM');
    } catch (err) {
      if (!String((err as Error).message).includes('BUSYGROUP')) throw err;
    }
  }

  /** Claims and processes entries of `stream` pending for at least `minIdleMs`. */
  private async claim(stream: string, minIdleMs: number): Promise<void> {
    let cursor = '0-0';
    for (let page = 0; page < 10_000; page++) {
      // no larger than a read's batch: a handler sized for its batch works a claimed page the same way
      const [next, claimed] = (await this.o.redis.xautoclaim(stream, this.o.group, this.o.consumer, minIdleMs, cursor, 'COUNT', Math.min(CLAIM_PAGE, this.o.batchSize ?? CLAIM_PAGE))) as [string, [string, string[]][]];
      const entries = toEntries(claimed);
      if (entries.length) await this.process(stream, entries);
      cursor = next;
      if (cursor === '0-0') break;
    }
  }

  /**
   * Hands a batch to the handler, then acks it. In a shared group the batch's claims are kept
   * fresh while the handler works (every third of `claimIdleMs`, lua/ownedEntries), so no other
   * process takes over a batch that is merely long (a fan-out to a large topic, a slow push
   * provider); should one take over some of it all the same (this process stalled), the handler's
   * signal aborts and nothing of the batch is acked here, and otherwise only the entries still this
   * consumer's are acked.
   */
  private async process(stream: string, entries: StreamEntry[]): Promise<void> {
    const ids = entries.map((e) => e.id);
    // the handler's pushes and waits all listen on it (a fan-out: up to 12 sendAll at once)
    const controller = sharedAbortController();
    const { source } = this.o;
    if (source.mode !== 'shared') {
      await this.o.handle(stream, entries, controller.signal);
      await this.o.redis.xack(stream, this.o.group, ...ids);
      this.untrimmed.add(stream);
      return;
    }
    const stopping = () => controller.signal.reason === STOPPING;
    this.inFlight.add(controller);
    if (this.stopped && this.o.giveBackOnStop) controller.abort(STOPPING);
    let keeping: Promise<unknown> = Promise.resolve();
    const keep = setInterval(() => {
      keeping = this.owned(stream, ids, 'touch').then((lost) => {
        if (lost > 0) controller.abort();
      }, (err: unknown) => this.o.log.warn('could not keep the claims of a batch fresh', { group: this.o.group, err: String((err as Error)?.message ?? err) }));
    }, Math.max(50, Math.floor(source.claimIdleMs / 3)));
    try {
      // a failed batch is worked again here, its claims kept fresh meanwhile, before it is left to a
      // claim after `claimIdleMs` (until session 48 at once: a Redis refusing writes for one second
      // held the dispatcher's messages 60-90 s, probe P); the handlers are idempotent
      for (let attempt = 1; ; attempt++) {
        try {
          await this.o.handle(stream, entries, controller.signal);
          break;
        } catch (err) {
          if (stopping()) break; // cut short by the stop: given back below
          if (this.stopped || controller.signal.aborted || attempt >= SHARED_BATCH_TRIES) throw err;
          this.o.log.warn('batch failed; working it again', { group: this.o.group, stream, attempt, err: String((err as Error)?.message ?? err) });
          await pause(Math.min(SHARED_RETRY_FIRST_MS * 2 ** (attempt - 1), SHARED_RETRY_MAX_MS), controller.signal);
          // a stop during the pause gives the batch back rather than working it again; a takeover
          // meanwhile leaves it to the new owner (called again, the handler began its work anew: a
          // fan-out wrote its deliveries and `$send`, probe BE)
          if (controller.signal.aborted) break;
        }
      }
    } finally {
      clearInterval(keep);
      this.inFlight.delete(controller);
      await keeping;
    }
    if (stopping()) {
      // what is still this consumer's goes back to the stream's end, for a live process to read now
      // (left pending, it waited `claimIdleMs` for a claim); entries the handler finished are worked
      // again there, which the handlers' idempotence makes a no-op
      const lost = await this.owned(stream, ids, 'requeue');
      this.o.log.info('stopping: gave back a batch cut short', { group: this.o.group, stream, entries: ids.length - lost });
      return;
    }
    if (controller.signal.aborted) {
      this.o.log.warn('another process took over part of a batch; leaving it to them', { group: this.o.group, stream, entries: ids.length });
      return;
    }
    // the batch's effects are made: a brief refusal of the ack is waited out rather than the batch worked again after a claim
    await retryWhileUnavailable(() => this.owned(stream, ids, 'ack'), ACK_WITHIN_MS);
    this.untrimmed.add(stream);
  }

  /** Touches, acks or gives back (lua/ownedEntries) the entries `ids` of `stream` this consumer still owns; the number it does not. */
  private async owned(stream: string, ids: string[], mode: 'touch' | 'ack' | 'requeue'): Promise<number> {
    let lost = 0;
    for (let i = 0; i < ids.length; i += OWNED_PER_CALL) {
      lost += Number(await callScript(this.o.redis, 'ownedEntries', [stream], [this.o.group, this.o.consumer, mode, ...ids.slice(i, i + OWNED_PER_CALL)]));
    }
    return lost;
  }

  /**
   * Trims entries the group has acked (below the oldest pending one, else up to the last delivered),
   * at most every `trimEveryMs` per stream; a stream stays `untrimmed` until it is.
   */
  private async trim(stream: string): Promise<void> {
    const at = now();
    if (at - (this.lastTrim.get(stream) ?? 0) < (this.o.trimEveryMs ?? 5_000)) return;
    this.lastTrim.set(stream, at);
    this.untrimmed.delete(stream);
    const [pending, groups] = await Promise.all([
      this.o.redis.xpending(stream, this.o.group) as Promise<[number, string | null, string | null, unknown]>,
      this.o.redis.xinfo('GROUPS', stream) as Promise<unknown[][]>,
    ]);
    const mine = groups.map((g) => Object.fromEntries(Array.from({ length: g.length / 2 }, (_, i) => [g[2 * i], g[2 * i + 1]]))).find((g) => g.name === this.o.group);
    const floor = pending[0] > 0 ? pending[1] : (mine?.['last-delivered-id'] as string | undefined);
    if (!floor || floor === '0-0') return;
    // an approximate trim removes at most TRIM_LIMIT entries a call (Redis's own default cap is
    // 10,000): after a burst, one call a trim left the applied entries there, and once the stream
    // went quiet (no ack, no trim) for good, where they counted against INBOX_MAX_BACKLOG and
    // refused every tenant's events in that partition (probe K1: 280,879 applied entries kept)
    for (let round = 0; round < TRIM_ROUNDS; round++) {
      if (Number(await this.o.redis.xtrim(stream, 'MINID', '~', floor, 'LIMIT', TRIM_LIMIT)) === 0) return;
    }
    this.untrimmed.add(stream); // more than TRIM_ROUNDS calls' worth: the next trim goes on
  }

  private async loop(): Promise<void> {
    const { blocking, source, log } = this.o;
    let backoff = 100;
    while (!this.stopped) {
      try {
        const streams = source.streams();
        const current = new Set(streams);
        const dropped = [...this.adopted].filter((s) => !current.has(s));
        for (const s of dropped) this.adopted.delete(s);
        // a stream no longer this consumer's (a partition's lease released to a process that joined)
        // is left at once where nothing is pending for it, not an hour later as a dead name (probe AU)
        if (dropped.length) await this.leaveGroups(dropped);
        for (const s of this.untrimmed) if (!current.has(s)) this.untrimmed.delete(s);
        if (source.mode === 'exclusive' && now() - this.lastStrayCheck >= STRAY_CHECK_MS) {
          this.lastStrayCheck = now();
          await this.readoptStrays();
        }
        for (const s of streams) {
          if (this.adopted.has(s)) continue;
          await this.ensureGroup(s);
          if (source.mode === 'exclusive') await this.claim(s, 0);
          this.adopted.add(s);
        }
        if (source.mode === 'shared' && now() - this.lastClaim > source.claimIdleMs / 2) {
          this.lastClaim = now();
          await this.claimIdle(streams, source.claimIdleMs);
        }
        if (now() - this.lastForget >= FORGET_CONSUMERS_EVERY_MS) {
          this.lastForget = now();
          await this.forgetDeadConsumers(streams);
        }
        if (streams.length === 0) {
          await new Promise((r) => setTimeout(r, IDLE_SLEEP_MS));
          continue;
        }
        const overlap = source.mode === 'shared' ? this.o.overlapStreams ?? 0 : 0;
        let readable = streams;
        if (overlap > 0 && this.busy.size > 0) {
          // a busy stream is read again while it has batches to spare, once its latest batch has run
          // `slowBatchMs`; another stream while fewer than `overlap` streams are busy
          const perStream = this.o.batchesPerStream ?? 1;
          const slowMs = this.o.slowBatchMs ?? 0;
          const room = this.busy.size < overlap;
          const at = performance.now();
          let soonest = Infinity; // when a held stream may be read again
          readable = streams.filter((s) => {
            const busy = this.busy.get(s);
            if (!busy) return room;
            if (busy.batches.size >= perStream) return false;
            const wait = busy.latestAt + slowMs - at;
            if (wait > 0) soonest = Math.min(soonest, wait);
            return wait <= 0;
          });
          if (readable.length === 0) {
            // at the overlap: the next free slot; below it, every known stream is busy, and a stream
            // the source lists meanwhile (a tenant's first message) must not wait for one of those
            // batches to end (probe V: 25 s, and minutes behind a push that never ended)
            const waits: Promise<unknown>[] = this.working();
            const sleepMs = Math.min(room ? IDLE_SLEEP_MS : Infinity, soonest);
            if (sleepMs < Infinity) waits.push(new Promise((r) => setTimeout(r, Math.ceil(sleepMs))));
            await Promise.race(waits);
            continue;
          }
        }
        const working = this.working();
        const perStream = Math.min(this.o.batchSize ?? 500, Math.max(MIN_PER_STREAM, Math.floor((this.o.readBudget ?? READ_BUDGET) / readable.length)));
        const readAt = performance.now(); // monotonic: the service clock may be moved (tests)
        const readGroup = blocking.xreadgroup.bind(blocking) as (...args: (string | number)[]) => Promise<unknown>;
        const reply = (await readGroup(
          'GROUP', this.o.group, this.o.consumer, 'COUNT', perStream, ...(working.length > 0 ? [] : ['BLOCK', this.o.blockMs ?? 1_000]),
          'STREAMS', ...readable, ...readable.map(() => '>'),
        )) as [string, [string, string[]][]][] | null;
        if (overlap > 0) {
          // each stream's batch is worked on its own; one that fails (after `process`'s retries)
          // stays pending and is claimed again after `claimIdleMs` (shared mode), as a failed read's batches are
          for (const [stream, raw] of reply ?? []) {
            let busy = this.busy.get(stream);
            if (!busy) this.busy.set(stream, (busy = { batches: new Set(), latestAt: 0 }));
            const { batches } = busy;
            busy.latestAt = performance.now();
            const work: Promise<void> = this.process(stream, toEntries(raw))
              .catch((err: unknown) => log.warn('batch failed; left pending for a claim', { group: this.o.group, stream, err: String((err as Error)?.message ?? err) }))
              .finally(() => {
                batches.delete(work);
                if (batches.size === 0 && this.busy.get(stream)?.batches === batches) this.busy.delete(stream);
              });
            batches.add(work);
          }
          await Promise.all([...this.untrimmed].map((s) => this.trim(s)));
          backoff = 100;
          if (!reply && working.length > 0) await waitAtMost(working, BUSY_POLL_MS);
          continue;
        }
        // streams are independent (partitions, tenants' queues): their batches are handled at once,
        // so one stream's Redis round trips overlap another's; each stream's entries stay in order
        const settled = await Promise.allSettled((reply ?? []).map(([stream, raw]) => this.process(stream, toEntries(raw))));
        const failed = settled.find((r): r is PromiseRejectedResult => r.status === 'rejected');
        if (failed) throw failed.reason; // after every batch finished: none runs on into the next read
        await Promise.all([...this.untrimmed].map((s) => this.trim(s)));
        backoff = 100;
        const read = (reply ?? []).reduce((sum, [, raw]) => sum + raw.length, 0);
        // a stream whose batch came back full has a backlog: it is read again at once, however empty
        // the others (probe C1: one subscriber's burst drained at ~430 events/s, a read of 32 every
        // 50 ms + the apply, and every subscriber of its partition, any tenant's, waited behind it)
        const backlog = (reply ?? []).some(([, raw]) => raw.length >= perStream);
        const pause = (this.o.lingerMs ?? 0) - (performance.now() - readAt);
        if (pause > 0 && read > 0 && !backlog && read < (perStream * streams.length) / 2) await new Promise((r) => setTimeout(r, pause));
      } catch (err) {
        if (this.stopped) break;
        const message = String((err as Error).message);
        if (message.includes('NOGROUP')) {
          log.warn('consumer group missing; recreating', { group: this.o.group });
          this.adopted.clear();
          continue;
        }
        log.warn('consumer loop error', { group: this.o.group, err: message });
        // a batch that failed stays pending: adopting the streams again claims it first (exclusive
        // mode), so it is retried before anything after it and nothing is left behind
        this.adopted.clear();
        await new Promise((r) => setTimeout(r, backoff));
        backoff = Math.min(backoff * 2, 5_000);
      }
    }
  }
}
