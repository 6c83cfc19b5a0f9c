import { parseArgs } from 'node:util';
import type { Redis } from 'ioredis';
import { loadConfig } from '../lib/config.js';
import { createApiKey, createTenant, ensureWorkspace, type Tenant, type Workspace, type Writer } from '../streams/identity.js';
import { createKeys, type Keys } from '../streams/keys.js';
import { numberOption, UsageError } from './lib/args.js';
import { bodyLoad, type BodyLoadResult } from './lib/body-load.js';
import { eventBodies } from './lib/event-bodies.js';
import { HeraldState, waitUntil } from './lib/herald-state.js';
import { LagSampler } from './lib/lag-sampler.js';
import { cpuDelta, cpuSnapshot, formatCpu } from './lib/proc-cpu.js';
import { rateLoad, type RateLoadResult } from './lib/rate-load.js';
import { startRedisWithClient } from './lib/redis.js';
import { ratioOf, round, type BenchResult, fmt, say } from './lib/result.js';
import { startEventRoles, startService } from './lib/service.js';
import { startWorker } from './lib/worker.js';

export const description = "one tenant floods POST /v1/events, another sends a few events/s, the worker is stopped for a while: the victim's read-model lag with TENANT_INBOX_MAX_BACKLOG vs without it";

export const usage = `fairness [--stall 8] [--stall-at 4] [--duration 20] [--warmup 2] [--flood-connections 16] [--victim-rate 20] [--limit <n>]
     [--mode separate|combined] [--partitions 64] [--batch 100] [--flood-subscribers 20000] [--victim-subscribers 2000]
  Two phases, each on a flushed private Redis with a freshly started service: "limit" (TENANT_INBOX_MAX_BACKLOG
  the service default, or --limit) and "no limit" (TENANT_INBOX_MAX_BACKLOG=1000000000). Two tenants of one workspace:
  --flood-connections    the flooder's connections, closed loop (autocannon): each sends its next batch of --batch events
                           over --flood-subscribers as soon as the last one is answered, a 429 included (counted)
  --victim-rate          the victim's single events (bare event body) per second over --victim-subscribers, open loop;
                           every accepted one is followed until the worker has applied it (read-model lag)
  --stall                seconds the worker process is stopped (SIGSTOP, then SIGCONT) during the measured load while
                           both tenants go on sending (a GC pause, a deploy, a slow automation); 0: no stall
  --stall-at             seconds into the measured load the stall starts
  --warmup               seconds of flood before measuring
  --duration             seconds measured (flood and victim together), at most 60; default 20, or --stall-at + --stall + 8
                           if more; with a stall it must end at least 2 s after SIGCONT
  --limit                TENANT_INBOX_MAX_BACKLOG of the "limit" phase (default: not set, the service's default)
  --mode                 separate (default): bin/web.ts and bin/worker.ts; combined: bin/start.ts with HERALD_ROLES=web,worker
                           (only with --stall 0: stopping it would stop the web role too)`;

const SLUG = 'bench-fairness';
const BY_BENCH: Writer = { actor: { type: 'system', id: null }, request: null };
const ACCEPTED = '"status":"accepted"';
const NO_LIMIT = 1_000_000_000;
/** how long after the load the victim's events are waited for (one not applied by then is `lost`, its lag more than from its acceptance to then) */
const LAG_WAIT_MS = 30_000;
const LAG_TARGET_MS = 2000;
/** the victim's lag under which it counts as recovered after the stall */
const RECOVERED_MS = 1000;
/** the worker's lease with a stall: longer than any stall, so that a stopped worker keeps its partitions */
const STALL_LEASE_MS = 30_000;

const codes = (c: Record<string, number>) => Object.entries(c).map(([k, n]) => `${k}×${n}`).join(' ') || '-';
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const msText = (v: number, isBound: boolean) => `${isBound ? '> ' : ''}${fmt(v, 1)} ms`;

type Party = { tenant: Tenant; headers: Record<string, string> };

/**
 * Lag percentiles (nearest rank, as `percentile` of lag-sampler.ts) of a set of samples. A sample never applied counts with a lower bound of its lag (`lostMs`: from its
 * acceptance to the end of the wait for it); a figure at or above one in the order is a lower bound (`…Bound`): the
 * sample's real lag may rank higher.
 */
type LagStats = { samples: number; lost: number; p50: number; p99: number; max: number; p50Bound: boolean; p99Bound: boolean; maxBound: boolean };

function lagStats(lagsMs: number[], lostMs: number[]): LagStats {
  const all = [...lagsMs.map((v) => ({ v, bound: false })), ...lostMs.map((v) => ({ v, bound: true }))].sort((a, b) => a.v - b.v);
  const firstLost = all.findIndex((x) => x.bound);
  const at = (p: number) => {
    if (all.length === 0) return { v: Number.NaN, bound: false };
    const i = Math.min(all.length - 1, Math.max(0, Math.ceil((p / 100) * all.length) - 1));
    return { v: all[i]!.v, bound: firstLost >= 0 && firstLost <= i };
  };
  const p50 = at(50), p99 = at(99), max = at(100);
  return { samples: all.length, lost: lostMs.length, p50: p50.v, p99: p99.v, max: max.v, p50Bound: p50.bound, p99Bound: p99.bound, maxBound: max.bound };
}

type Stall = {
  /** seconds into the measured load of SIGSTOP and SIGCONT */
  stopAtS: number;
  contAtS: number;
  /** SIGSTOP → SIGCONT, seconds (the set --stall plus the backlog read before SIGCONT) */
  stoppedS: number;
  /** the flooder's unprocessed events per partition (tenant backlog hash) right after SIGSTOP and right before SIGCONT */
  pendingAtStop: number[];
  pendingAtCont: number[];
  /** the flooder's events accepted during the stall (Σ i|flooder at SIGCONT − at SIGSTOP) per second */
  floodAcceptedPerSec: number;
  /** the same from SIGCONT to the end of the load */
  floodAfterPerSec: number;
  /** both tenants' tenant-log growth per second, load start → SIGSTOP and SIGCONT → load end */
  workerBeforePerSec: number;
  workerAfterPerSec: number;
  /** seconds from SIGCONT to the acceptance of the first victim event accepted after it with a lag < RECOVERED_MS; null: none in the load */
  recoverS: number | null;
  recoverLagMs: number | null;
  /** seconds from SIGCONT to the acceptance of the first victim event from which on every one accepted in the load had a lag < RECOVERED_MS; null: not so by the end */
  settleS: number | null;
  /** the victim's samples accepted from SIGSTOP to the end of the load */
  window: LagStats;
  /** the same samples' wait beyond the stall itself: the lag less what was left of the stall at acceptance (the time spent behind the backlog) */
  beyond: LagStats;
};

type Phase = {
  label: 'limit' | 'no limit';
  limit: number;
  setupS: number;
  setupDrained: boolean;
  flood: BodyLoadResult;
  floodWarmup: BodyLoadResult | null;
  victim: RateLoadResult;
  loadS: number;
  floodAcceptedPerSec: number;
  workerPerSec: number;
  workerFloodPerSec: number;
  workerVictimPerSec: number;
  backlogAtEnd: number;
  floodPendingTotal: number;
  floodPendingMax: number;
  /** the most of the flooder's unprocessed events in one partition, sampled every second and at the end */
  floodPendingPeak: number;
  /** every victim sample of the measured load */
  all: LagStats;
  stall: Stall | null;
  cpu: string;
  progress: string[];
};

/**
 * POSTs every body once, `concurrency` at a time, for the set-up: a 429 (the tenant limit) is
 * retried after 50 ms, any other answer but 202 fails the bench.
 */
async function postEvery(url: string, headers: Record<string, string>, bodies: Buffer[], concurrency: number, timeoutMs = 120_000): Promise<number> {
  const deadline = Date.now() + timeoutMs;
  let next = 0, retried = 0;
  const lane = async () => {
    while (next < bodies.length) {
      const body = bodies[next++]!;
      for (;;) {
        if (Date.now() > deadline) throw new Error(`set-up: not every body was accepted within ${timeoutMs / 1000} s`);
        const res = await fetch(url, { method: 'POST', headers: { ...headers, 'content-type': 'application/json' }, body, signal: AbortSignal.timeout(30_000) });
        const text = await res.text();
        if (res.status === 202) break;
        if (res.status !== 429) throw new Error(`set-up: POST ${url} answered ${res.status}: ${text.slice(0, 300)}`);
        retried++;
        await sleep(50);
      }
    }
  };
  await Promise.all(Array.from({ length: concurrency }, lane));
  return retried;
}

async function party(redis: Redis, keys: Keys, workspace: Workspace, slug: string): Promise<Party> {
  const { tenant } = await createTenant(redis, keys, workspace, slug, BY_BENCH);
  const key = (await createApiKey(redis, keys, { workspace, tenant, kind: 'tenant', scopes: ['*'], expiresAt: null, name: `bench ${slug}` }, BY_BENCH)).key;
  return { tenant, headers: { authorization: `Bearer ${key}` } };
}

/**
 * The tenant's unprocessed events per partition (`keys.tenantBacklog(p)`: i|tenant − d|tenant), as the limit
 * counts them, and Σ i|tenant (its events accepted so far, every partition).
 */
async function tenantCounters(redis: Redis, keys: Keys, tenantId: string, partitions: number): Promise<{ pending: number[]; issued: number }> {
  const pipeline = redis.pipeline();
  for (let p = 0; p < partitions; p++) pipeline.hmget(keys.tenantBacklog(p), `i|${tenantId}`, `d|${tenantId}`);
  let issued = 0;
  const pending = ((await pipeline.exec()) ?? []).map(([err, v]) => {
    if (err) throw err;
    const [i, d] = v as [string | null, string | null];
    issued += Number(i ?? 0);
    return Math.max(0, Number(i ?? 0) - Number(d ?? 0));
  });
  return { pending, issued };
}

const sum = (xs: number[]) => xs.reduce((a, b) => a + b, 0);

export async function run(args: string[]): Promise<BenchResult> {
  const { values } = parseArgs({
    args,
    strict: true,
    options: {
      stall: { type: 'string' },
      'stall-at': { type: 'string' },
      duration: { type: 'string' },
      warmup: { type: 'string' },
      'flood-connections': { type: 'string' },
      'victim-rate': { type: 'string' },
      limit: { type: 'string' },
      mode: { type: 'string', default: 'separate' },
      partitions: { type: 'string' },
      batch: { type: 'string' },
      'flood-subscribers': { type: 'string' },
      'victim-subscribers': { type: 'string' },
    },
  });
  if (values.mode !== 'separate' && values.mode !== 'combined') throw new UsageError(`--mode must be separate or combined, got "${values.mode}"`);
  const mode = values.mode;
  const stall = numberOption(values.stall, 'stall', 8, 0, 50);
  const stallAt = numberOption(values['stall-at'], 'stall-at', 4, 0, 50);
  if (mode === 'combined' && stall > 0) throw new UsageError('--mode combined stops the web role with the worker: use --stall 0 with it (or --mode separate)');
  const duration = numberOption(values.duration, 'duration', Math.min(60, Math.max(20, stall > 0 ? stallAt + stall + 8 : 0)), 2, 60);
  if (stall > 0 && stallAt + stall + 2 > duration) {
    throw new UsageError(`--stall-at ${stallAt} + --stall ${stall} must end at least 2 s before the measured load does (--duration ${duration})`);
  }
  const warmup = numberOption(values.warmup, 'warmup', 2, 0, 30);
  const floodConnections = Math.round(numberOption(values['flood-connections'], 'flood-connections', 16, 1, 256));
  const victimRate = numberOption(values['victim-rate'], 'victim-rate', 20, 1, 1000);
  const limitOption = values.limit === undefined ? null : Math.round(numberOption(values.limit, 'limit', 500, 1, NO_LIMIT));
  const partitions = Math.round(numberOption(values.partitions, 'partitions', 64, 1, 4096));
  const batch = Math.round(numberOption(values.batch, 'batch', 100, 1, 100));
  const floodSubscribers = Math.round(numberOption(values['flood-subscribers'], 'flood-subscribers', 20_000, 100, 1_000_000));
  const victimSubscribers = Math.round(numberOption(values['victim-subscribers'], 'victim-subscribers', 2_000, 10, 1_000_000));
  // the limit the "limit" phase runs with: --limit, or what the service makes of the variable left empty (its default)
  const limitEnv = limitOption === null ? '' : String(limitOption);
  const limitUsed = loadConfig({}, { TENANT_INBOX_MAX_BACKLOG: limitEnv }).tenantInboxMaxBacklog;

  // The flooder's bodies name every one of its subscribers once in the first ceil(subscribers / batch) (the set-up
  // sends those), then again in the same order; the flood cycles through them (no caller ids: a repeat is a new event).
  const floodSet = eventBodies({ subscribers: floodSubscribers, batch, bodies: 2 * Math.ceil(floodSubscribers / batch), seed: 11 });
  const floodCreate = floodSet.bodies.slice(0, Math.ceil(floodSubscribers / batch));
  const victimCreate = eventBodies({ subscribers: victimSubscribers, batch: 100, bodies: Math.ceil(victimSubscribers / 100), seed: 13 });
  const victimSet = eventBodies({ subscribers: victimSubscribers, batch: 0, bodies: Math.ceil(victimRate * duration * 1.1) + 10, offset: 5, seed: 13 });

  const stops: Array<() => Promise<void>> = [];
  try {
    const { server: redis, client } = await startRedisWithClient(stops);
    say(`fairness: ${mode === 'separate' ? 'bin/web.ts + bin/worker.ts' : 'bin/start.ts (web,worker)'} + private redis, ${partitions} partitions; two tenants of one workspace:`);
    say(`  flooder: batches of ${batch} events over ${fmt(floodSubscribers)} subscribers, closed loop on ${floodConnections} connections (a 429 is followed by the next batch at once), `
      + `${warmup} s warm-up then ${duration} s measured`);
    say(`  victim: ${fmt(victimRate)} single events/s over ${fmt(victimSubscribers)} subscribers, open loop, during the measured ${duration} s; every accepted one followed until applied`);
    say('  load generators and lag sampler in this process; the machine has 2 cores shared by all of it (figures are noisy: compare the two phases of one run)');

    const phases: Phase[] = [];
    for (const [label, limit, env] of [['limit', limitUsed, limitEnv], ['no limit', NO_LIMIT, String(NO_LIMIT)]] as const) {
      await client.flushall();
      const prefix = `bench-fairness-${process.pid}-${label === 'limit' ? 'limit' : 'nolimit'}:`;
      const keys = createKeys(prefix);
      const state = new HeraldState(client, keys, partitions);
      const { workspace } = await ensureWorkspace(client, keys, SLUG, BY_BENCH);
      const flooder = await party(client, keys, workspace, 'flooder');
      const victim = await party(client, keys, workspace, 'victim');

      const local: Array<() => Promise<void>> = [];
      // the stopped worker: SIGCONT once the stall is over, and whatever ends the phase (an error, the stops, a signal)
      const worker = { pid: 0, stopped: false, over: false };
      const resume = () => {
        if (!worker.stopped) return;
        worker.stopped = false;
        try {
          process.kill(worker.pid, 'SIGCONT');
        } catch {
          // already gone
        }
      };
      const onSignal = (signal: NodeJS.Signals) => {
        worker.over = true;
        resume();
        process.exit(signal === 'SIGINT' ? 130 : 143); // the exit hook of child.ts kills the children
      };
      process.once('SIGINT', onSignal);
      process.once('SIGTERM', onSignal);
      try {
        // the other limits of ingest (per subscriber, requests in progress per tenant) at the service's
        // defaults in the "limit" phase and off in the other (bench/lib/service.ts turns them off by default)
        const off = label !== 'limit';
        const roleEnv = {
          HERALD_PARTITIONS: String(partitions), TENANT_INBOX_MAX_BACKLOG: env,
          SUBSCRIBER_INBOX_MAX_BACKLOG: off ? String(NO_LIMIT) : '', TENANT_INGEST_CONCURRENCY: off ? '1000000' : '',
          ...(stall > 0 ? { PARTITION_LEASE_MS: String(STALL_LEASE_MS) } : {}),
        };
        let url: string;
        if (mode === 'combined') {
          url = await startEventRoles(mode, { redisUrl: redis.url, keyPrefix: prefix, env: roleEnv }, local);
        } else {
          // the roles in their own processes (as startEventRoles), the worker's pid kept for SIGSTOP/SIGCONT
          const web = await startService({ redisUrl: redis.url, keyPrefix: prefix, env: roleEnv });
          local.push(web.stop);
          const w = await startWorker({ redisUrl: redis.url, keyPrefix: prefix, env: roleEnv });
          local.push(w.stop);
          worker.pid = w.pid;
          local.push(async () => { // runs before w.stop: a stopped process would not act on its SIGTERM
            worker.over = true;
            resume();
          });
          url = web.url;
        }
        const target = `${url}/v1/events`;

        // 1. Every subscriber of both tenants once (not measured), then let the worker catch up.
        const s0 = performance.now();
        const retried = await postEvery(target, flooder.headers, floodCreate, 8) + await postEvery(target, victim.headers, victimCreate.bodies, 4);
        const setupDrained = await waitUntil(async () => (await state.pendingAndUnread()) === 0, 60_000, 250);
        const setupS = (performance.now() - s0) / 1000;
        say('');
        say(`[${label}] TENANT_INBOX_MAX_BACKLOG=${fmt(limit)}${label === 'limit' && limitOption === null ? ' (the service default: not set)' : ''}; `
          + `set-up: ${fmt(floodSubscribers + victimSubscribers)} subscribers created in ${setupS.toFixed(1)} s${retried ? ` (${retried} set-up requests answered 429 and were retried)` : ''}`
          + `${setupDrained ? '' : ' (worker NOT caught up within 60 s)'}`);

        // 2. Warm-up: the flood alone.
        const floodSide = { url: target, headers: flooder.headers, bodies: floodSet.bodies, connections: floodConnections, count: ACCEPTED };
        const floodWarmup = warmup > 0 ? await bodyLoad({ ...floodSide, duration: warmup }) : null;

        // 3. Measured: flood and victim together, the worker stopped from --stall-at for --stall s; every accepted
        //    victim event followed until applied.
        const logs = async () => {
          const [f, v] = await Promise.all([state.tenantLogLength(flooder.tenant.id), state.tenantLogLength(victim.tenant.id)]);
          return { flood: f, victim: v, at: performance.now() };
        };
        const logs0 = await logs();
        const sampler = new LagSampler(client, keys, victim.tenant.id, partitions, 0);
        const progress: { t: number; flood: number; victim: number; backlog: number }[] = [];
        let progressOn = true;
        let floodPendingPeak = 0;
        const t0 = performance.now();
        const progressLoop = (async () => {
          while (progressOn) {
            const [flood, vict, backlog, counters] = await Promise.all([state.tenantLogLength(flooder.tenant.id), state.tenantLogLength(victim.tenant.id), state.pendingAndUnread(),
              tenantCounters(client, keys, flooder.tenant.id, partitions)]);
            floodPendingPeak = Math.max(floodPendingPeak, ...counters.pending);
            progress.push({ t: (performance.now() - t0) / 1000, flood, victim: vict, backlog });
            await sleep(1000);
          }
        })();
        type StallMarks = { stopAt: number; contAt: number; atStop: Awaited<ReturnType<typeof tenantCounters>>; atCont: Awaited<ReturnType<typeof tenantCounters>>;
          logsAtStop: Awaited<ReturnType<typeof logs>>; logsAtCont: Awaited<ReturnType<typeof logs>> };
        const stallTask = (async (): Promise<StallMarks | null> => {
          if (stall === 0 || mode === 'combined') return null;
          try {
            await sleep(t0 + stallAt * 1000 - performance.now());
            if (worker.over) return null;
            process.kill(worker.pid, 'SIGSTOP');
            worker.stopped = true;
            const stopAt = performance.now();
            // read once it is stopped: nothing moves these but the web role's ingest
            const [atStop, logsAtStop] = await Promise.all([tenantCounters(client, keys, flooder.tenant.id, partitions), logs()]);
            await sleep(stopAt + stall * 1000 - performance.now());
            if (worker.over) return null;
            const [atCont, logsAtCont] = await Promise.all([tenantCounters(client, keys, flooder.tenant.id, partitions), logs()]);
            resume();
            return { stopAt, contAt: performance.now(), atStop, atCont, logsAtStop, logsAtCont };
          } finally {
            resume();
          }
        })();
        const cpu0 = cpuSnapshot();
        const [flood, victimLoad, marks] = await Promise.all([
          bodyLoad({ ...floodSide, start: floodWarmup?.next ?? 0, duration }),
          rateLoad({ url: target, headers: victim.headers, bodies: victimSet.bodies, rate: victimRate, duration, maxInFlight: 64, onAnswer: (s, b, at) => sampler.offer(s, b, at) }),
          stallTask,
        ]);
        const loadS = (performance.now() - t0) / 1000;
        const cpu = formatCpu(cpuDelta(cpu0, cpuSnapshot()));
        const logs1 = await logs();
        const backlogAtEnd = await state.pendingAndUnread();
        const { pending, issued: floodIssuedAtEnd } = await tenantCounters(client, keys, flooder.tenant.id, partitions);
        const floodIssuedAtEndAt = performance.now();
        progressOn = false;
        await progressLoop;
        await sampler.finish(LAG_WAIT_MS);

        const lostMs = (from: number) => sampler.lost.filter((at) => at >= from).map((at) => sampler.finishedAt - at);
        const all = lagStats(sampler.applied.map((x) => x.lagMs), lostMs(-Infinity));
        let stallResult: Stall | null = null;
        if (marks) {
          const inWindow = sampler.applied.filter((x) => x.t0 >= marks.stopAt);
          const recovered = sampler.applied.filter((x) => x.t0 >= marks.contAt && x.lagMs < RECOVERED_MS).sort((a, b) => a.t0 - b.t0)[0];
          const after = [...sampler.applied, ...sampler.lost.map((t) => ({ t0: t, lagMs: Infinity }))].filter((x) => x.t0 >= marks.contAt).sort((a, b) => a.t0 - b.t0);
          let settled = after.length;
          while (settled > 0 && after[settled - 1]!.lagMs < RECOVERED_MS) settled--;
          const applied = (a: Awaited<ReturnType<typeof logs>>, b: Awaited<ReturnType<typeof logs>>) => (b.flood - a.flood + b.victim - a.victim) / Math.max(0.001, (b.at - a.at) / 1000);
          stallResult = {
            stopAtS: (marks.stopAt - t0) / 1000,
            contAtS: (marks.contAt - t0) / 1000,
            stoppedS: (marks.contAt - marks.stopAt) / 1000,
            pendingAtStop: marks.atStop.pending,
            pendingAtCont: marks.atCont.pending,
            floodAcceptedPerSec: (marks.atCont.issued - marks.atStop.issued) / Math.max(0.001, (marks.logsAtCont.at - marks.logsAtStop.at) / 1000),
            floodAfterPerSec: (floodIssuedAtEnd - marks.atCont.issued) / Math.max(0.001, (floodIssuedAtEndAt - marks.contAt) / 1000),
            workerBeforePerSec: applied(logs0, marks.logsAtStop),
            workerAfterPerSec: applied(marks.logsAtCont, logs1),
            recoverS: recovered ? (recovered.t0 - marks.contAt) / 1000 : null,
            recoverLagMs: recovered?.lagMs ?? null,
            settleS: settled < after.length ? (after[settled]!.t0 - marks.contAt) / 1000 : null,
            window: lagStats(inWindow.map((x) => x.lagMs), lostMs(marks.stopAt)),
            beyond: lagStats(inWindow.map((x) => x.lagMs - Math.max(0, marks.contAt - x.t0)),
              sampler.lost.filter((at) => at >= marks.stopAt).map((at) => sampler.finishedAt - at - Math.max(0, marks.contAt - at))),
          };
        }
        const per = progress.map((s, i) => (i === 0 ? null : `${fmt((s.flood + s.victim - progress[i - 1]!.flood - progress[i - 1]!.victim) / (s.t - progress[i - 1]!.t) / 1000, 1)}k/${fmt(s.backlog / 1000, 1)}k`)).filter((x): x is string => x !== null);
        phases.push({
          label, limit, setupS, setupDrained, flood, floodWarmup, victim: victimLoad, loadS,
          floodAcceptedPerSec: flood.durationS > 0 ? flood.matches / flood.durationS : 0,
          workerPerSec: (logs1.flood - logs0.flood + logs1.victim - logs0.victim) / loadS,
          workerFloodPerSec: (logs1.flood - logs0.flood) / loadS,
          workerVictimPerSec: (logs1.victim - logs0.victim) / loadS,
          backlogAtEnd,
          floodPendingTotal: sum(pending),
          floodPendingMax: Math.max(...pending),
          floodPendingPeak: Math.max(floodPendingPeak, ...pending),
          all, stall: stallResult,
          cpu, progress: per,
        });
        const ph = phases[phases.length - 1]!;
        const lagLine = (l: LagStats) => `${l.samples} samples, p50 ${msText(l.p50, l.p50Bound)}, p99 ${msText(l.p99, l.p99Bound)}, max ${msText(l.max, l.maxBound)}`
          + `${l.lost ? `; ${l.lost} not applied ${LAG_WAIT_MS / 1000} s after the load (their lag counts as the time from their acceptance to then, a lower bound)` : ''}`;
        say(`  flooder: warm-up ${floodWarmup ? codes(floodWarmup.statusCodes) : 'none'}; measured ${fmt(flood.total)} requests in ${flood.durationS.toFixed(1)} s (${codes(flood.statusCodes)}, `
          + `${flood.errors} errors, ${flood.timeouts} timeouts), ${fmt(ph.floodAcceptedPerSec)} events/s accepted, request p50 ${fmt(flood.p50Ms, 2)} ms, p99 ${fmt(flood.p99Ms, 2)} ms`);
        say(`  victim: sent ${fmt(victimLoad.sent)}, answered ${fmt(victimLoad.answered)} (${codes(victimLoad.statusCodes)}), skipped ${victimLoad.skipped}, errors ${victimLoad.errors}; `
          + `request p50 ${fmt(victimLoad.p50Ms, 2)} ms, p99 ${fmt(victimLoad.p99Ms, 2)} ms`);
        say(`  victim read-model lag (202 answer → applied field visible, polled every ~2 ms), all: ${lagLine(all)}`);
        const st = ph.stall;
        if (st) {
          say(`  stall: worker (pid ${worker.pid}) stopped ${st.stopAtS.toFixed(1)} s into the load for ${st.stoppedS.toFixed(2)} s (SIGCONT at ${st.contAtS.toFixed(1)} s); `
            + `flooder accepted ${fmt(st.floodAcceptedPerSec)} events/s meanwhile, ${fmt(st.floodAfterPerSec)} after SIGCONT; worker ${fmt(st.workerBeforePerSec)} events/s before the stall, ${fmt(st.workerAfterPerSec)} after SIGCONT`);
          say(`  victim lag, events accepted from SIGSTOP to the end of the load (during stall and recovery): ${lagLine(st.window)}`);
          say(`  time to recover: ${st.recoverS === null ? `none of the victim's events accepted in the ${(ph.loadS - st.contAtS).toFixed(1)} s after SIGCONT was applied within ${fmt(RECOVERED_MS)} ms`
            : `${st.recoverS.toFixed(2)} s after SIGCONT the first victim event applied within ${fmt(RECOVERED_MS)} ms was accepted (lag ${fmt(st.recoverLagMs ?? 0)} ms)`}`
            + `; every one accepted from ${st.settleS === null ? '(none: the last was over it)' : `${st.settleS.toFixed(2)} s after SIGCONT`} on was`);
          say(`  the flooder's unprocessed events (tenant backlog hash): at SIGSTOP ${fmt(sum(st.pendingAtStop))} (at most ${fmt(Math.max(...st.pendingAtStop))} in one partition), `
            + `at SIGCONT ${fmt(sum(st.pendingAtCont))} (at most ${fmt(Math.max(...st.pendingAtCont))} in one partition)`);
          // A victim event waits behind what is ahead of it in its partition (later entries do not delay it), at the rate the
          // worker goes through all the partitions; one accepted during the stall waits also for the rest of it. After SIGCONT
          // the flood goes on, so the backlog shrinks by what the worker applies less what the flood adds; the victim is under
          // 1 s once the backlog is under what the worker applies in 1 s.
          const w = st.workerAfterPerSec;
          const backlog = sum(st.pendingAtCont);
          const net = w - st.floodAfterPerSec;
          const recoverText = `the wait is under ${fmt(RECOVERED_MS)} ms once the backlog is under ${fmt(w * RECOVERED_MS / 1000)}; it shrinks by worker − flood after SIGCONT = `
            + `${fmt(w)} − ${fmt(st.floodAfterPerSec)} = ${fmt(net)} ev/s: time to recover ≈ (${fmt(backlog)} − ${fmt(w * RECOVERED_MS / 1000)}) / ${fmt(net)} `
            + `≈ ${net > 0 ? `${(Math.max(0, backlog - w * RECOVERED_MS / 1000) / net).toFixed(1)} s` : 'never while the flood goes on'}`;
          if (ph.label === 'limit') {
            const ahead = limit * partitions;
            say(`  expected: a victim event waits behind at most limit × partitions = ${fmt(limit)} × ${partitions} = ${fmt(ahead)} flooder events, `
              + `${fmt(ahead)} / ${fmt(w)} ev/s (worker after SIGCONT) ≈ ${(ahead / w).toFixed(1)} s; one accepted during the stall: the rest of it + at most that, `
              + `< ${(st.stoppedS + ahead / w).toFixed(1)} s; ${recoverText}`);
          } else {
            const inStall = st.floodAcceptedPerSec * st.stoppedS;
            say(`  expected: a victim event accepted at SIGCONT waits behind what the flood put in during the stall, ${fmt(st.floodAcceptedPerSec)} ev/s × ${st.stoppedS.toFixed(1)} s `
              + `≈ ${fmt(inStall)} events, ${fmt(inStall)} / ${fmt(w)} ev/s (worker after SIGCONT) ≈ ${(inStall / w).toFixed(1)} s; one accepted t s into the stall: `
              + `the rest of it + ${fmt(st.floodAcceptedPerSec)} × t / ${fmt(w)}; ${recoverText}${net > 0 ? ' if the flood went on' : ''}`);
          }
          const bySecond = new Map<number, number>();
          for (const x of sampler.applied) bySecond.set(Math.floor((x.t0 - t0) / 1000), Math.max(bySecond.get(Math.floor((x.t0 - t0) / 1000)) ?? 0, x.lagMs));
          for (const at of sampler.lost) bySecond.set(Math.floor((at - t0) / 1000), Infinity);
          const secs = [...bySecond.keys()].sort((a, b) => a - b);
          say(`  victim lag by second of acceptance (max, s): ${secs.map((k) => `${k}:${Number.isFinite(bySecond.get(k)!) ? (bySecond.get(k)! / 1000).toFixed(1) : 'lost'}`).join(' ')}`);
        }
        say(`  worker: ${fmt(ph.workerPerSec)} events/s applied over the ${loadS.toFixed(1)} s${st ? ' (the stall included)' : ''} (flooder ${fmt(ph.workerFloodPerSec)}, victim ${fmt(ph.workerVictimPerSec, 1)}); `
          + `inbox entries not yet processed at the end: ${fmt(backlogAtEnd)}`);
        say(`  the flooder's unprocessed events (tenant backlog hash, what the limit counts): ${fmt(ph.floodPendingTotal)} at the end, at most ${fmt(ph.floodPendingMax)} in one partition; `
          + `peak in one partition during the load (sampled every second): ${fmt(ph.floodPendingPeak)}`);
        say(`  each second, events applied/s / inbox entries not yet processed: ${per.join(' ')}`);
        say(`  ${cpu}`);
      } finally {
        worker.over = true;
        resume();
        process.removeListener('SIGINT', onSignal);
        process.removeListener('SIGTERM', onSignal);
        for (const stop of local.reverse()) await stop().catch(() => {});
      }
    }

    const [lim, free] = phases as [Phase, Phase];
    const ms = (v: number, isBound: boolean) => `${isBound ? '>' : ''}${fmt(v)}`;
    const lag3 = (l: LagStats) => `${ms(l.p50, l.p50Bound)}/${ms(l.p99, l.p99Bound)}/${ms(l.max, l.maxBound)}`;
    say('');
    say(`${'phase'.padEnd(10)}${'limit'.padStart(14)}${'lag p50/p99/max ms'.padStart(22)}${'lost'.padStart(6)}${'req p50/p99 ms'.padStart(16)}`
      + `${'flood ev/s'.padStart(12)}${'flood 429'.padStart(11)}${'flood peak/p'.padStart(14)}${'worker ev/s'.padStart(13)}   victim answers`);
    for (const p of phases) {
      say(`${p.label.padEnd(10)}${fmt(p.limit).padStart(14)}${lag3(p.all).padStart(22)}`
        + `${String(p.all.lost).padStart(6)}${`${fmt(p.victim.p50Ms)}/${fmt(p.victim.p99Ms)}`.padStart(16)}${fmt(p.floodAcceptedPerSec).padStart(12)}${fmt(p.flood.statusCodes['429'] ?? 0).padStart(11)}`
        + `${fmt(p.floodPendingPeak).padStart(14)}${fmt(p.workerPerSec).padStart(13)}   ${codes(p.victim.statusCodes)}`);
    }
    say('  lag: victim events, 202 answer → applied field visible, all the measured load; req: the victim\'s POST answer times; flood ev/s: the flooder\'s events answered accepted per second;');
    say(`  flood peak/p: the most of the flooder's unprocessed events in one partition (sampled every second); worker ev/s: both tenants' tenant-log growth per second (measured window${stall > 0 ? ', the stall included' : ''})`);
    if (lim.stall && free.stall) {
      say('');
      say(`stall of ${stall} s at ${stallAt} s:`);
      say(`${'phase'.padEnd(10)}${'stall+recovery lag p50/p99/max ms'.padStart(36)}${'lost'.padStart(6)}${'recover/settle s'.padStart(18)}${'flood backlog at SIGCONT max/p, total'.padStart(40)}`
        + `${'flood ev/s in/after stall'.padStart(27)}${'worker ev/s before/after'.padStart(26)}`);
      for (const p of phases) {
        const st = p.stall!;
        say(`${p.label.padEnd(10)}${lag3(st.window).padStart(36)}${String(st.window.lost).padStart(6)}${`${st.recoverS === null ? `>${(p.loadS - st.contAtS).toFixed(1)}` : st.recoverS.toFixed(2)}/${st.settleS === null ? `>${(p.loadS - st.contAtS).toFixed(1)}` : st.settleS.toFixed(2)}`.padStart(18)}`
          + `${`${fmt(Math.max(...st.pendingAtCont))}, ${fmt(sum(st.pendingAtCont))}`.padStart(40)}${`${fmt(st.floodAcceptedPerSec)}/${fmt(st.floodAfterPerSec)}`.padStart(27)}${`${fmt(st.workerBeforePerSec)}/${fmt(st.workerAfterPerSec)}`.padStart(26)}`);
      }
      say(`  stall+recovery: the victim's events accepted from SIGSTOP to the end of the load (one accepted during the stall waits at least until SIGCONT);`);
      say(`  recover: from SIGCONT to the acceptance of the first victim event after it applied within ${fmt(RECOVERED_MS)} ms (">": none in the rest of the load); `
        + 'settle: … of the first from which on all were');
    }
    // the metric: with a stall, the victim's wait beyond the stall itself (what the flood's backlog costs
    // it: the lag less what was left of the stall when it was accepted), over the stall-and-recovery
    // samples; without one, the lag over all of them
    const windowed = stall > 0 && lim.stall !== null && free.stall !== null;
    const limW = windowed ? lim.stall!.beyond : lim.all;
    const freeW = windowed ? free.stall!.beyond : free.all;
    const met = limW.p99 <= LAG_TARGET_MS && limW.lost === 0;
    say('');
    say(`victim ${windowed ? 'wait beyond the stall (lag less what was left of the stall at acceptance; stall and recovery samples)' : 'lag'} p99 with the limit `
      + `${ms(limW.p99, limW.p99Bound)} ms vs ${ms(freeW.p99, freeW.p99Bound)} ms without (ratio ${ratioOf(limW.p99, freeW.p99)}); `
      + `target ≤ ${fmt(LAG_TARGET_MS)} ms with no lost sample: ${met ? 'met' : 'NOT met'}`);
    for (const p of phases) {
      const victimBad = p.victim.answered - (p.victim.statusCodes['202'] ?? 0);
      if (victimBad > 0 || p.victim.errors > 0 || p.victim.skipped > 0) say(`WARNING (${p.label}): ${victimBad} victim answers were not 202, ${p.victim.errors} failed, ${p.victim.skipped} skipped`);
      const floodOther = p.flood.total - (p.flood.statusCodes['202'] ?? 0) - (p.flood.statusCodes['429'] ?? 0);
      if (floodOther > 0 || p.flood.errors + p.flood.timeouts > 0) say(`WARNING (${p.label}): ${floodOther} flooder answers were neither 202 nor 429; ${p.flood.errors} errors, ${p.flood.timeouts} timeouts`);
      if (!p.setupDrained) say(`note (${p.label}): the worker had not caught up with the set-up within 60 s`);
    }
    if (lim.floodPendingPeak > lim.limit) say(`note: with the limit, the flooder held ${fmt(lim.floodPendingPeak)} unprocessed events in one partition at some point, more than the limit of ${fmt(lim.limit)}`);
    if ((lim.flood.statusCodes['429'] ?? 0) === 0) {
      say(`note: the flooder never reached the limit (no 429; at most ${fmt(lim.floodPendingPeak)} of its events waiting in one partition): the worker kept up with its flood, `
        + 'so the two phases differ by the machine\'s noise only (a stall, or a lower --limit, makes it act)');
    }
    if (lim.floodAcceptedPerSec < 0.5 * lim.workerFloodPerSec) say('note: with the limit, the flooder was accepted at less than half the rate the worker applied its events');

    const n = (v: number, digits = 1) => (Number.isFinite(v) ? round(v, digits) : null);
    const windowKeys = (prefix: string, p: Phase) => ({
      [`${prefix}victim_lag_all_p50_ms`]: n(p.all.p50),
      [`${prefix}victim_lag_all_p99_ms`]: n(p.all.p99),
      [`${prefix}victim_lag_all_max_ms`]: n(p.all.max),
      [`${prefix}victim_lag_all_samples`]: p.all.samples,
      [`${prefix}victim_lag_all_lost`]: p.all.lost,
      ...(p.stall ? {
        [`${prefix}victim_lag_stall_p50_ms`]: n(p.stall.window.p50),
        [`${prefix}victim_lag_stall_p99_ms`]: n(p.stall.window.p99),
        [`${prefix}victim_lag_stall_max_ms`]: n(p.stall.window.max),
        [`${prefix}victim_lag_stall_samples`]: p.stall.window.samples,
        [`${prefix}victim_lag_stall_lost`]: p.stall.window.lost,
        [`${prefix}victim_wait_beyond_stall_p50_ms`]: n(p.stall.beyond.p50),
        [`${prefix}victim_wait_beyond_stall_p99_ms`]: n(p.stall.beyond.p99),
        [`${prefix}victim_wait_beyond_stall_max_ms`]: n(p.stall.beyond.max),
        [`${prefix}time_to_recover_s`]: p.stall.recoverS === null ? null : round(p.stall.recoverS, 2),
        [`${prefix}time_to_settle_s`]: p.stall.settleS === null ? null : round(p.stall.settleS, 2),
        [`${prefix}flood_backlog_at_sigcont_max_partition`]: Math.max(...p.stall.pendingAtCont),
        [`${prefix}flood_backlog_at_sigcont_total`]: sum(p.stall.pendingAtCont),
        [`${prefix}flood_accepted_events_per_s_in_stall`]: round(p.stall.floodAcceptedPerSec, 1),
        [`${prefix}flood_accepted_events_per_s_after_sigcont`]: round(p.stall.floodAfterPerSec, 1),
        [`${prefix}worker_events_per_s_before_stall`]: round(p.stall.workerBeforePerSec, 1),
        [`${prefix}worker_events_per_s_after_sigcont`]: round(p.stall.workerAfterPerSec, 1),
        [`${prefix}stalled_s`]: round(p.stall.stoppedS, 2),
      } : {}),
    });

    return {
      bench: 'fairness',
      metric: windowed ? 'victim_wait_beyond_stall_p99_ms' : 'victim_lag_p99_ms',
      value: round(limW.p99, 1),
      unit: 'ms',
      baseline: { name: 'ingest limits off (TENANT_INBOX_MAX_BACKLOG, SUBSCRIBER_INBOX_MAX_BACKLOG, TENANT_INGEST_CONCURRENCY), same run', value: round(freeW.p99, 1) },
      ratio: ratioOf(limW.p99, freeW.p99),
      target: LAG_TARGET_MS,
      target_kind: 'absolute ms, p99 of the metric with the limit (over victim_window), and no lost sample in it',
      met,
      victim_window: windowed ? 'stall_and_recovery' : 'all',
      metric_p50_ms: round(limW.p50, 1),
      metric_max_ms: round(limW.max, 1),
      metric_p99_lower_bound: limW.p99Bound,
      metric_samples: limW.samples,
      metric_lost: limW.lost,
      victim_non_202: lim.victim.answered - (lim.victim.statusCodes['202'] ?? 0),
      victim_request_p99_ms: round(lim.victim.p99Ms, 2),
      no_limit_metric_p50_ms: round(freeW.p50, 1),
      no_limit_metric_max_ms: round(freeW.max, 1),
      no_limit_metric_p99_lower_bound: freeW.p99Bound,
      no_limit_metric_samples: freeW.samples,
      no_limit_metric_lost: freeW.lost,
      no_limit_victim_non_202: free.victim.answered - (free.victim.statusCodes['202'] ?? 0),
      no_limit_victim_request_p99_ms: round(free.victim.p99Ms, 2),
      ...windowKeys('', lim),
      ...windowKeys('no_limit_', free),
      flood_accepted_events_per_s: round(lim.floodAcceptedPerSec, 1),
      flood_requests: lim.flood.total,
      flood_429: lim.flood.statusCodes['429'] ?? 0,
      flood_status_codes: lim.flood.statusCodes,
      no_limit_flood_accepted_events_per_s: round(free.floodAcceptedPerSec, 1),
      no_limit_flood_requests: free.flood.total,
      no_limit_flood_429: free.flood.statusCodes['429'] ?? 0,
      worker_events_per_s: round(lim.workerPerSec, 1),
      no_limit_worker_events_per_s: round(free.workerPerSec, 1),
      backlog_at_end: lim.backlogAtEnd,
      no_limit_backlog_at_end: free.backlogAtEnd,
      flood_pending_peak_per_partition: lim.floodPendingPeak,
      no_limit_flood_pending_peak_per_partition: free.floodPendingPeak,
      limit: limitUsed,
      limit_default: limitOption === null,
      stall_s: stall,
      stall_at_s: stallAt,
      mode,
      duration_s: duration,
      warmup_s: warmup,
      flood_connections: floodConnections,
      victim_rate: victimRate,
      batch,
      flood_subscribers: floodSubscribers,
      victim_subscribers: victimSubscribers,
      partitions,
    };
  } finally {
    for (const stop of stops.reverse()) await stop().catch(() => {});
  }
}
