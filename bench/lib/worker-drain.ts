import type { Redis } from 'ioredis';
import type { Keys } from '../../streams/keys.js';
import { commandStats, commandStatsDelta, HeraldState } from './herald-state.js';
import { postAll } from './post-all.js';
import { cpuDelta, cpuSnapshot, formatCpu } from './proc-cpu.js';
import { startWorker } from './worker.js';

/**
 * A worker-throughput measurement for the automation benches: with **no worker running**, `bodies`
 * (every answer must be 202) are posted to one tenant, so its events wait in the partition inboxes;
 * then a fresh worker (`bin/worker.ts`, a child) is started and the tenant's log growth is polled
 * every `pollMs` until it holds every accepted event and the inboxes are fully acked (the
 * automation step of a batch runs after its read models are applied and before its ack). The
 * worker has the backlog to itself: no ingest competes with it for the two cores.
 *
 * - `ratePerS`: the events applied after the first poll that saw one applied, ÷ the time from that
 *   poll to the first poll that saw them all applied and acked: the whole drain;
 * - `steadyPerS`: the applied rate between 10 % and 90 % of the events (linear interpolation
 *   between polls), without the worker's start (module load, leases, JIT) or its tail.
 *
 * The worker is left running; `stop` it before the next drain.
 */
export type DrainResult = {
  events: number;
  postSeconds: number;
  startToFirstS: number;
  drainS: number;
  ratePerS: number;
  steadyPerS: number;
  completed: boolean;
  cpu: string;
  cpuRows: { label: string; cores: number }[];
  commandStats: string[];
  worker: { pid: number; stop: () => Promise<void> };
};

export async function drainOnce(options: {
  redis: Redis; redisUrl: string; keys: Keys; keyPrefix: string; partitions: number; tenantId: string;
  url: string; apiKey: string; bodies: Buffer[]; events: number; env: Record<string, string>;
  timeoutMs?: number; pollMs?: number;
}): Promise<DrainResult> {
  const { redis, keys, tenantId } = options;
  const state = new HeraldState(redis, keys, options.partitions);
  const pollMs = options.pollMs ?? 50;
  const before = await state.tenantLogLength(tenantId);
  const posted = await postAll({ url: `${options.url}/v1/events`, headers: { authorization: `Bearer ${options.apiKey}` }, bodies: options.bodies, concurrency: 8, count: '"status":"accepted"' });
  if ((posted.statusCodes['202'] ?? 0) !== options.bodies.length || posted.matches !== options.events) {
    throw new Error(`posting the drain's events: answers ${JSON.stringify(posted.statusCodes)}, ${posted.errors} errors, ${posted.matches} of ${options.events} accepted`);
  }
  const t0 = performance.now();
  const samples: { t: number; applied: number }[] = [];
  const deadline = t0 + (options.timeoutMs ?? 300_000);
  let doneAt = Number.NaN;
  let polling = true;
  // polled from the moment the worker is spawned, so its first applied batch is seen
  const poll = (async () => {
    while (polling) {
      const t = performance.now();
      const applied = (await state.tenantLogLength(tenantId)) - before;
      samples.push({ t, applied });
      if (applied >= options.events && (await state.pendingAndUnread()) === 0) {
        doneAt = performance.now();
        return;
      }
      if (t > deadline) return;
      await new Promise((r) => setTimeout(r, pollMs));
    }
  })();
  let worker: DrainResult['worker'];
  try {
    worker = await startWorker({ redisUrl: options.redisUrl, keyPrefix: options.keyPrefix, env: options.env });
  } catch (err) {
    polling = false;
    await poll;
    throw err;
  }
  // CPU from the worker's heartbeat on (its module loading before is not counted)
  const cpu0 = cpuSnapshot();
  const stats0 = await commandStats(redis);
  await poll;
  const cpuRows = cpuDelta(cpu0, cpuSnapshot());
  const stats1 = await commandStats(redis);
  const first = samples.find((s) => s.applied > 0) ?? samples[samples.length - 1]!;
  const at = (fraction: number): number => {
    const goal = fraction * options.events;
    for (let i = 1; i < samples.length; i++) {
      const a = samples[i - 1]!, b = samples[i]!;
      if (b.applied >= goal) return b.applied === a.applied ? b.t : a.t + ((goal - a.applied) / (b.applied - a.applied)) * (b.t - a.t);
    }
    return Number.NaN;
  };
  const drainS = (doneAt - first.t) / 1000;
  const steadyS = (at(0.9) - at(0.1)) / 1000;
  return {
    events: options.events,
    postSeconds: posted.seconds,
    startToFirstS: (first.t - t0) / 1000,
    drainS,
    ratePerS: (options.events - first.applied) / drainS,
    steadyPerS: (0.8 * options.events) / steadyS,
    completed: Number.isFinite(doneAt),
    cpu: formatCpu(cpuRows),
    cpuRows,
    commandStats: commandStatsDelta(stats0, stats1, 8).lines,
    worker,
  };
}
