import type { Redis } from 'ioredis';
import type { Keys } from '../../streams/keys.js';
import { scriptNamesBySha } from '../../streams/lua-scripts.js';

/**
 * Read-only views of Herald's partition keys for the benches (what the worker applied, what is
 * still in the inboxes, memory). One pipeline per call, one command per partition.
 */
export class HeraldState {
  constructor(private readonly redis: Redis, private readonly keys: Keys, private readonly partitions: number) {}

  private async perPartition(command: (p: number) => [string, ...(string | number)[]]): Promise<unknown[]> {
    const pipeline = this.redis.pipeline();
    for (let p = 0; p < this.partitions; p++) {
      const [name, ...args] = command(p);
      pipeline.call(name, ...args);
    }
    const replies = (await pipeline.exec()) ?? [];
    return replies.map(([err, value]) => {
      if (err) throw err;
      return value;
    });
  }

  private async sum(command: (p: number) => [string, ...(string | number)[]]): Promise<number> {
    return (await this.perPartition(command)).reduce<number>((a, v) => a + Number(v ?? 0), 0);
  }

  /** Entries in the tenant's logs (every applied event, `$subscriber.created` included). */
  tenantLogLength(tenantId: string): Promise<number> {
    return this.sum((p) => ['XLEN', this.keys.tenantLog(p, tenantId)]);
  }

  /** Entries still in the partition inboxes (applied or not: the consumer trims acked ones every ~5 s). */
  inboxLength(): Promise<number> {
    return this.sum((p) => ['XLEN', this.keys.inbox(p)]);
  }

  /** Subscribers that exist (`keys.subscribers` fields). */
  subscriberCount(): Promise<number> {
    return this.sum((p) => ['HLEN', this.keys.subscribers(p)]);
  }

  /** Entries of the inboxes (event and timer) not yet acked by the worker's consumer group (0 when caught up). */
  async pendingAndUnread(group = 'actors'): Promise<number> {
    const infos = await this.perPartition((p) => ['XINFO', 'GROUPS', this.keys.inbox(p)]).catch(() => null);
    if (!infos) return Number.NaN;
    // the timer inboxes exist once a worker has read them (none yet: nothing fired waits there)
    const timerInfos = await this.perPartition((p) => ['XINFO', 'GROUPS', this.keys.timerInbox(p)]).catch(() => []);
    let total = 0;
    for (const groups of [...infos, ...timerInfos] as unknown[][][]) {
      for (const g of groups ?? []) {
        const fields: Record<string, unknown> = {};
        for (let i = 0; i < g.length; i += 2) fields[String(g[i])] = g[i + 1];
        if (fields.name !== group) continue;
        total += Number(fields.pending ?? 0) + Number(fields.lag ?? 0);
      }
    }
    return total;
  }

  /** Bytes of `key` (MEMORY USAGE … SAMPLES 0: every element counted), 0 when it does not exist. */
  async memoryUsage(key: string): Promise<number> {
    return Number((await this.redis.call('MEMORY', 'USAGE', key, 'SAMPLES', '0')) ?? 0);
  }

  /** Sum of MEMORY USAGE of `keys` (pipelined in chunks). */
  async memoryOf(keys: string[]): Promise<number> {
    let total = 0;
    for (let i = 0; i < keys.length; i += 5_000) {
      const pipeline = this.redis.pipeline();
      for (const key of keys.slice(i, i + 5_000)) pipeline.call('MEMORY', 'USAGE', key, 'SAMPLES', '0');
      for (const [err, value] of (await pipeline.exec()) ?? []) {
        if (err) throw err;
        total += Number(value ?? 0);
      }
    }
    return total;
  }

  /** Every partition's key made by `key` (e.g. `(p) => keys.tenantLog(p, tenantId)`). */
  partitionKeys(key: (p: number) => string): string[] {
    return Array.from({ length: this.partitions }, (_, p) => key(p));
  }

  /** Sum of MEMORY USAGE of the partition inboxes. */
  inboxMemory(): Promise<number> {
    return this.sum((p) => ['MEMORY', 'USAGE', this.keys.inbox(p), 'SAMPLES', '0']);
  }

  /** `used_memory` of INFO memory. */
  async usedMemory(): Promise<number> {
    const info = await this.redis.info('memory');
    return Number(/^used_memory:(\d+)/m.exec(info)?.[1] ?? Number.NaN);
  }
}

/** Polls `check` every `everyMs` until it returns true or `timeoutMs` passes; resolves to whether it did. */
export async function waitUntil(check: () => Promise<boolean>, timeoutMs: number, everyMs = 200): Promise<boolean> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    if (await check()) return true;
    if (Date.now() > deadline) return false;
    await new Promise((r) => setTimeout(r, everyMs));
  }
}

/** `INFO commandstats` as { command: { calls, usec, usecPerCall } }. */
export async function commandStats(redis: Redis): Promise<Record<string, { calls: number; usec: number; usecPerCall: number }>> {
  const info = await redis.info('commandstats');
  const out: Record<string, { calls: number; usec: number; usecPerCall: number }> = {};
  for (const m of info.matchAll(/^cmdstat_([^:]+):calls=(\d+),usec=(\d+),usec_per_call=([\d.]+)/gm)) {
    out[m[1]!] = { calls: Number(m[2]), usec: Number(m[3]), usecPerCall: Number(m[4]) };
  }
  return out;
}

/** The top commands by total time between two `commandStats` snapshots, as printable lines. */
export function commandStatsDelta(
  before: Awaited<ReturnType<typeof commandStats>>, after: Awaited<ReturnType<typeof commandStats>>, top = 12,
): { lines: string[]; totalUsec: number } {
  const rows = Object.entries(after).map(([cmd, a]) => {
    const b = before[cmd] ?? { calls: 0, usec: 0 };
    return { cmd, calls: a.calls - b.calls, usec: a.usec - b.usec };
  }).filter((r) => r.calls > 0).sort((x, y) => y.usec - x.usec);
  const totalUsec = rows.reduce((a, r) => a + r.usec, 0);
  const lines = rows.slice(0, top).map((r) =>
    `  ${r.cmd.padEnd(28)}${String(r.calls).padStart(10)} calls${(r.usec / 1e6).toFixed(2).padStart(9)} s${(r.usec / r.calls).toFixed(2).padStart(10)} µs/call`
    + `${((100 * r.usec) / Math.max(1, totalUsec)).toFixed(1).padStart(7)}%`);
  return { lines, totalUsec };
}

export type ScriptCost = {
  kind: string; calls: number; usec: number; events: number;
  /** least-squares fit usec = perCall + perEvent × events over the calls (scripts with events only) */
  fit?: { perCall: number; perEvent: number };
};

/**
 * Per-call cost of Herald's scripts and other commands from SLOWLOG (Redis logs every command's
 * execution time when slowlog-log-slower-than is 0; Redis 7 logs the commands scripts run too,
 * and a script's own time includes them).
 * `start` turns it on (with room for `maxLen` entries) and clears it; `collect` reads it, turns it
 * back off, and names EVALSHA calls by their script's SHA-1 (`scriptNamesBySha`). Events per call of
 * ingestEvents and applyEvents (told apart by their first key, `:in` and `:applied`) are counted from the number of arguments
 * (12 per event for ingestEvents, 14 per inbox entry for applyEvents; the fixed ones are fewer).
 */
export class SlowlogProfile {
  private saved: [string, string] | null = null;
  private readonly scriptNames = scriptNamesBySha();

  constructor(private readonly redis: Redis, private readonly maxLen = 20_000) {}

  async start(): Promise<void> {
    const [, slower] = (await this.redis.config('GET', 'slowlog-log-slower-than')) as [string, string];
    const [, len] = (await this.redis.config('GET', 'slowlog-max-len')) as [string, string];
    this.saved = [slower, len];
    await this.redis.config('SET', 'slowlog-max-len', String(this.maxLen));
    await this.redis.config('SET', 'slowlog-log-slower-than', '0');
    await this.redis.call('SLOWLOG', 'RESET');
  }

  async collect(): Promise<{ rows: ScriptCost[]; spanS: number; entries: number; lines: string[] }> {
    await this.redis.config('SET', 'slowlog-log-slower-than', this.saved?.[0] ?? '10000');
    const log = (await this.redis.call('SLOWLOG', 'GET', String(this.maxLen))) as [number, number, number, string[]][];
    await this.redis.call('SLOWLOG', 'RESET');
    await this.redis.config('SET', 'slowlog-max-len', this.saved?.[1] ?? '128');
    const rows = new Map<string, ScriptCost>();
    const points = new Map<string, [number, number][]>();
    let minT = Infinity, maxT = -Infinity;
    for (const [, at, usec, argv] of log) {
      minT = Math.min(minT, at);
      maxT = Math.max(maxT, at);
      const cmd = String(argv[0] ?? '').toLowerCase();
      let kind = cmd;
      let events = 0;
      if (cmd === 'evalsha' || cmd === 'eval') {
        // SLOWLOG keeps 31 arguments and then "... (N more arguments)"; fixed ARGV (< 12) come before the per-event groups
        const more = /^\.\.\. \((\d+) more arguments\)$/.exec(String(argv[argv.length - 1] ?? ''));
        const argc = more ? argv.length - 1 + Number(more[1]) : argv.length;
        const numKeys = Number(argv[2]);
        const rest = argc - 3 - numKeys;
        // by the script's SHA-1 (writeSubscriber's first key is the inbox too: keys alone cannot tell)
        kind = this.scriptNames.get(String(argv[1] ?? '')) ?? 'unknown script';
        if (kind === 'ingestEvents') events = Math.floor((rest - 8) / 13); // 8 fixed ARGV, then 13 per event (lua/ingestEvents)
        else if (kind === 'applyEvents') events = Math.max(0, rest - 7); // 4 fixed ARGV, one inbox entry id per entry, then the 3 of the batch guard (lua/applyEvents)
      }
      const row = rows.get(kind) ?? { kind, calls: 0, usec: 0, events: 0 };
      row.calls++;
      row.usec += usec;
      row.events += events;
      rows.set(kind, row);
      if (events > 0) {
        const list = points.get(kind) ?? [];
        list.push([events, usec]);
        points.set(kind, list);
      }
    }
    for (const [kind, list] of points) {
      const n = list.length;
      const mx = list.reduce((a, [x]) => a + x, 0) / n;
      const my = list.reduce((a, [, y]) => a + y, 0) / n;
      const sxx = list.reduce((a, [x]) => a + (x - mx) ** 2, 0);
      const sxy = list.reduce((a, [x, y]) => a + (x - mx) * (y - my), 0);
      if (n >= 10 && sxx > 0) rows.get(kind)!.fit = { perEvent: sxy / sxx, perCall: my - (sxy / sxx) * mx };
    }
    const sorted = [...rows.values()].sort((a, b) => b.usec - a.usec);
    const spanS = log.length > 1 ? Math.max(1, maxT - minT) : 0;
    const total = sorted.reduce((s, r) => s + r.usec, 0);
    const lines = sorted.slice(0, 10).map((r) =>
      `  ${r.kind.padEnd(16)}${String(r.calls).padStart(8)} calls${(r.usec / 1e6).toFixed(2).padStart(8)} s${((100 * r.usec) / Math.max(1, total)).toFixed(1).padStart(6)}%`
      + `${(r.usec / r.calls).toFixed(1).padStart(10)} µs/call${r.events ? `${(r.events / r.calls).toFixed(1).padStart(8)} events/call${(r.usec / r.events).toFixed(2).padStart(8)} µs/event` : ''}`
      + `${r.fit ? `  (fit: ${r.fit.perCall.toFixed(1)} µs/call + ${r.fit.perEvent.toFixed(2)} µs/event)` : ''}`);
    return { rows: sorted, spanS, entries: log.length, lines };
  }
}

/** Redis time per script (and other command) over the profiled rounds, per call and per `unit` (`count` of them in those rounds). */
export function slowlogLines(profiles: (Awaited<ReturnType<SlowlogProfile['collect']>> | undefined)[], count: number, unit: string): string[] {
  const rows = new Map<string, { calls: number; usec: number }>();
  let entries = 0;
  for (const profile of profiles) {
    if (!profile) continue;
    entries += profile.entries;
    for (const r of profile.rows) {
      const row = rows.get(r.kind) ?? { calls: 0, usec: 0 };
      row.calls += r.calls;
      row.usec += r.usec;
      rows.set(r.kind, row);
    }
  }
  if (rows.size === 0) return [];
  const sorted = [...rows].sort((a, b) => b[1].usec - a[1].usec);
  const total = sorted.reduce((sum, [, r]) => sum + r.usec, 0);
  return [
    `redis time by command and script (SLOWLOG, ${entries.toLocaleString('en-US')} top-level calls; ${(total / Math.max(1, count)).toFixed(1)} µs per ${unit}):`,
    ...sorted.slice(0, 16).map(([kind, r]) => `  ${kind.padEnd(26)}${String(r.calls).padStart(9)} calls${(r.usec / 1e6).toFixed(2).padStart(8)} s${((100 * r.usec) / Math.max(1, total)).toFixed(1).padStart(6)}%`
      + `${(r.usec / r.calls).toFixed(1).padStart(9)} µs/call${(r.usec / Math.max(1, count)).toFixed(1).padStart(8)} µs/${unit.split(' ')[0]}`),
  ];
}
