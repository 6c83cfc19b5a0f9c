import { mkdirSync } from 'node:fs';
import { resolve } from 'node:path';
import { parseArgs } from 'node:util';
import { partitionOf } from '../lib/partition.js';
import { createApiKey, ensureWorkspace, type Writer } from '../streams/identity.js';
import { createKeys } from '../streams/keys.js';
import { numberOption, UsageError } from './lib/args.js';
import { cpuProfEnv } from './lib/cpu-prof.js';
import { eventBodies } from './lib/event-bodies.js';
import { commandStats, commandStatsDelta, HeraldState, SlowlogProfile, waitUntil } from './lib/herald-state.js';
import { LagSampler, percentile } from './lib/lag-sampler.js';
import { postAll } from './lib/post-all.js';
import { cpuDelta, cpuSnapshot, formatCpu } from './lib/proc-cpu.js';
import { rateLoad } from './lib/rate-load.js';
import { redisBenchmark, startRedisWithClient } from './lib/redis.js';
import { ratioOf, round, type BenchResult, fmt, say } from './lib/result.js';
import { startEventRoles } from './lib/service.js';

export const description = 'worker events/s and read-model lag p50/p99 under a fixed ingest rate; Redis memory per stored event';

export const usage = `pipeline [--rate 30000] [--duration 20] [--batch 100] [--subscribers 50000] [--mode separate|combined]
     [--sample-ms 100] [--partitions 64] [--memory-events 20000] [--memory-data 1024] [--xadd-requests 500000]
     [--cpu-prof <dir>] [--redis-profile]
  --rate           events/s offered, open loop (requests of --batch events at rate/batch per second)
  --duration       seconds of fixed-rate load (at most 120)
  --subscribers    distinct externalIds; every one is created (one event each, not measured) before the load
  --mode           separate (default): bin/web.ts and bin/worker.ts; combined: bin/start.ts with HERALD_ROLES=web,worker
  --sample-ms      how often one just-accepted event is followed until the worker has applied it (lag)
  --memory-events  events per memory phase (0 skips the memory phases); --memory-data bytes of their data JSON
  --xadd-requests  redis-benchmark -P 32 XADD requests (the Redis baseline)
  --cpu-prof       write V8 CPU profiles of the service children into <dir>/pipeline/
  --redis-profile  log every top-level Redis command's time (SLOWLOG, threshold 0) during the load and print the
                     cost per script call and per event of ingestEvents and applyEvents (the last 50,000 commands);
                     logging every command slows Redis noticeably: use it to see costs, not for the figures`;

const SLUG = 'bench-pipeline';
const BY_BENCH: Writer = { actor: { type: 'system', id: null }, request: null };
const ACCEPTED = '"status":"accepted"';
/** how long after the load sampled events are waited for (a sample not applied by then is `lost`, its lag > this) */
const LAG_WAIT_MS = 25_000;

const codes = (c: Record<string, number>) => Object.entries(c).map(([k, n]) => `${k}×${n}`).join(' ') || '-';
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

type MemoryPhase = {
  label: string;
  /** Δ MEMORY USAGE per event of each kind of key, and what Δused_memory leaves unexplained */
  parts: Record<string, number>;
  events: number;
  accepted: number;
  usedDelta: number;
  ledgerDelta: number;
  inboxDelta: number;
  inboxResidual: number;
  perEvent: number;
  perEventNoLedger: number;
  /** Δused_memory per event once the ledger stream (holding this phase's copies only) was deleted */
  perEventTrimmed: number;
  ledgerPerEvent: number;
  inboxPerEvent: number;
  drained: boolean;
};

export async function run(args: string[]): Promise<BenchResult> {
  const { values } = parseArgs({
    args,
    strict: true,
    options: {
      rate: { type: 'string' },
      duration: { type: 'string' },
      batch: { type: 'string' },
      subscribers: { type: 'string' },
      mode: { type: 'string', default: 'separate' },
      'sample-ms': { type: 'string' },
      partitions: { type: 'string' },
      'memory-events': { type: 'string' },
      'memory-data': { type: 'string' },
      'xadd-requests': { type: 'string' },
      'cpu-prof': { type: 'string' },
      'redis-profile': { type: 'boolean', default: false },
    },
  });
  if (values.mode !== 'separate' && values.mode !== 'combined') throw new UsageError(`--mode must be separate or combined, got "${values.mode}"`);
  const mode = values.mode;
  const rate = numberOption(values.rate, 'rate', 30_000, 100, 1_000_000);
  const duration = numberOption(values.duration, 'duration', 20, 2, 120);
  const batch = Math.round(numberOption(values.batch, 'batch', 100, 1, 100));
  const subscribers = Math.round(numberOption(values.subscribers, 'subscribers', 50_000, 100, 10_000_000));
  const sampleMs = numberOption(values['sample-ms'], 'sample-ms', 100, 10, 10_000);
  const partitions = Math.round(numberOption(values.partitions, 'partitions', 64, 1, 4096));
  const memoryEvents = Math.round(numberOption(values['memory-events'], 'memory-events', 20_000, 0, 1_000_000));
  const memoryData = Math.round(numberOption(values['memory-data'], 'memory-data', 1024, 2, 8192));
  const xaddRequests = Math.round(numberOption(values['xadd-requests'], 'xadd-requests', 500_000, 10_000, 10_000_000));
  const profDir = values['cpu-prof'] ? resolve(values['cpu-prof'], 'pipeline') : null;
  if (profDir) mkdirSync(profDir, { recursive: true });
  if (memoryEvents > 0 && 2 * memoryEvents > subscribers) throw new UsageError('--memory-events must be at most half of --subscribers (one event per subscriber per memory phase)');

  const requestRate = rate / batch;
  const createSet = eventBodies({ subscribers, batch, bodies: Math.ceil(subscribers / batch), seed: 7 });
  const loadSet = eventBodies({ subscribers, batch, bodies: Math.max(1, Math.ceil((requestRate * duration * 1.05) + 10)), seed: 7 });
  const prefix = `bench-pipeline-${process.pid}:`;
  const keys = createKeys(prefix);

  const stops: Array<() => Promise<void>> = [];
  try {
    const { server: redis, client } = await startRedisWithClient(stops);
    const state = new HeraldState(client, keys, partitions);

    const xadd = await redisBenchmark({ port: redis.port, requests: xaddRequests, command: ['XADD', 'bench:xadd', '*', 'f', 'v'] });
    await client.del('bench:xadd');

    const { workspace, tenant } = await ensureWorkspace(client, keys, SLUG, BY_BENCH);
    const apiKey = (await createApiKey(client, keys, { workspace, tenant, kind: 'tenant', scopes: ['*'], expiresAt: null, name: 'bench' }, BY_BENCH)).key;
    const env: Record<string, string> = { HERALD_PARTITIONS: String(partitions), ...(profDir ? cpuProfEnv(profDir) : {}) };
    const url = await startEventRoles(mode, { redisUrl: redis.url, keyPrefix: prefix, env }, stops);
    const target = `${url}/v1/events`;
    const headers = { authorization: `Bearer ${apiKey}` };

    say(`pipeline: ${mode === 'separate' ? 'bin/web.ts + bin/worker.ts' : 'bin/start.ts (web,worker)'} + private redis, ${partitions} partitions, ${fmt(subscribers)} subscribers, `
      + `${batch} events per request; load generator and lag sampler in this process (2 cores shared)`);
    say(`baseline: redis-benchmark -P 32 -n ${fmt(xaddRequests)} XADD bench:xadd * f v: ${fmt(xadd.opsPerSec)} ops/s`);

    // 1. Every subscriber once (not measured), then let the worker catch up: the worker's rate alone.
    const created = await postAll({ url: target, headers, bodies: createSet.bodies, concurrency: 8, count: ACCEPTED });
    if ((created.statusCodes['202'] ?? 0) !== createSet.bodies.length) throw new Error(`creating subscribers: answers ${codes(created.statusCodes)}, ${created.errors} errors`);
    const drainStart = performance.now();
    const logAtDrainStart = await state.tenantLogLength(tenant.id);
    const drained0 = await waitUntil(async () => (await state.pendingAndUnread()) === 0, 60_000, 250);
    const drainS = (performance.now() - drainStart) / 1000;
    const logAfterCreate = await state.tenantLogLength(tenant.id);
    const drainRate = (logAfterCreate - logAtDrainStart) / drainS;
    say(`set-up: ${fmt(created.matches)} events creating ${fmt(await state.subscriberCount())} subscribers in ${created.seconds.toFixed(1)} s `
      + `(${fmt(created.matches / created.seconds)} events/s accepted, closed loop, 8 connections); the worker then applied the rest of its backlog `
      + `(${fmt(logAfterCreate - logAtDrainStart)} entries) in ${drainS.toFixed(1)} s: ${fmt(drainRate)} entries/s with no ingest${drained0 ? '' : ' (NOT drained within 60 s)'}`);

    // 2. Memory per stored event: before the load, so that a backlog the load leaves (when the worker falls
    //    behind) cannot delay these phases; they are measured on their own all the same.
    const memory: MemoryPhase[] = [];
    if (memoryEvents > 0) {
      const ledgerKey = keys.ledger(workspace.id);
      const settle = async (): Promise<{ drained: boolean; residual: number }> => {
        const drained = await waitUntil(async () => (await state.pendingAndUnread()) === 0, 60_000, 200);
        const since = performance.now();
        // the consumer trims acked entries every ~5 s per partition (XTRIM MINID ~, whole stream nodes)
        let residual = await state.inboxLength();
        while (performance.now() - since < 15_000) {
          await sleep(500);
          residual = await state.inboxLength();
          if (performance.now() - since >= 6_500 && residual <= Math.max(partitions * 8, memoryEvents * 0.01)) break;
        }
        return { drained, residual };
      };
      await settle();
      const phases = [
        { label: 'no caller id', callerIds: false, offset: 0 },
        { label: 'caller id', callerIds: true, offset: memoryEvents },
      ];
      for (const phase of phases) {
        const set = eventBodies({ subscribers, batch: 100, bodies: Math.ceil(memoryEvents / 100), dataBytes: memoryData, callerIds: phase.callerIds, idPrefix: `mem-${process.pid}`, offset: phase.offset, seed: 7 });
        // the keys an event of this phase writes, by kind (timelines: one per subscriber of the phase)
        const groups: Record<string, string[]> = {
          'tenant log': state.partitionKeys((p) => keys.tenantLog(p, tenant.id)),
          timelines: [...new Set(set.externalIds)].map((x) => keys.timeline(partitionOf(tenant.id, x, partitions), tenant.id, x)),
          dedupe: state.partitionKeys((p) => keys.dedupe(p)),
          'dedupe-age': state.partitionKeys((p) => keys.dedupeAge(p)),
          ledger: [ledgerKey],
          inbox: state.partitionKeys((p) => keys.inbox(p)),
        };
        const measureGroups = async () => Object.fromEntries(await Promise.all(Object.entries(groups).map(async ([k, list]) => [k, await state.memoryOf(list)] as const)));
        // the ledger (no dispatcher runs here) is emptied first, so that DEL measures exactly what the phase put in it
        await client.del(ledgerKey);
        const beforeParts = await measureGroups();
        const before = { used: await state.usedMemory(), ledger: beforeParts.ledger!, inbox: beforeParts.inbox! };
        const sent = await postAll({ url: target, headers, bodies: set.bodies, concurrency: 4, count: ACCEPTED });
        if ((sent.statusCodes['202'] ?? 0) !== set.bodies.length) throw new Error(`memory phase (${phase.label}): answers ${codes(sent.statusCodes)}, ${sent.errors} errors`);
        const { drained, residual } = await settle();
        const after = { used: await state.usedMemory() };
        const afterParts = await measureGroups();
        // cross-check of the ledger's share: used_memory once the ledger (this phase's entries only) is deleted
        await client.del(ledgerKey);
        const usedAfterTrim = await state.usedMemory();
        const usedDelta = after.used - before.used;
        const ledgerDelta = afterParts.ledger! - before.ledger;
        const inboxDelta = afterParts.inbox! - before.inbox;
        const parts: Record<string, number> = {};
        let explained = 0;
        for (const k of Object.keys(groups)) {
          const d = afterParts[k]! - beforeParts[k]!;
          explained += d;
          parts[k] = d / set.events;
        }
        parts['rest (used_memory − keys above)'] = (usedDelta - explained) / set.events;
        const perEventTrimmed = (usedAfterTrim - before.used) / set.events;
        memory.push({
          label: phase.label, parts, events: set.events, accepted: sent.matches, usedDelta, ledgerDelta, inboxDelta, inboxResidual: residual, drained,
          perEvent: usedDelta / set.events, perEventNoLedger: (usedDelta - ledgerDelta) / set.events, perEventTrimmed,
          ledgerPerEvent: ledgerDelta / set.events, inboxPerEvent: inboxDelta / set.events,
        });
      }
      say('');
      say(`memory: ${fmt(memoryEvents)} events per phase, data JSON ${fmt(memoryData)} bytes each, to existing subscribers (one event each), batches of 100;`
        + ' used_memory before and after the worker applied them and the inboxes were trimmed; the ledger stream is emptied before each phase (no dispatcher runs here)');
      say(`${''.padEnd(16)}${'bytes/event'.padStart(13)}${'no ledger'.padStart(11)}${'ledger'.padStart(9)}${'ledger DEL'.padStart(12)}${'inbox left'.padStart(12)}${'accepted'.padStart(10)}`);
      for (const m of memory) {
        say(`${m.label.padEnd(16)}${fmt(m.perEvent).padStart(13)}${fmt(m.perEventNoLedger).padStart(11)}${fmt(m.ledgerPerEvent).padStart(9)}${fmt(m.perEventTrimmed).padStart(12)}`
          + `${fmt(m.inboxPerEvent).padStart(12)}${fmt(m.accepted).padStart(10)}${m.drained ? '' : '  (worker NOT caught up)'}`);
      }
      say(`  bytes/event: Δused_memory / N; no ledger: minus Δ MEMORY USAGE of the workspace ledger stream (the webhook dispatcher's transient copy) / N;`);
      say(`  ledger DEL: cross-check, Δused_memory / N after deleting the ledger stream, emptied before the phase (it held only this phase's copies);`);
      say(`  inbox left: Δ MEMORY USAGE of the partition inboxes still held after trimming (included in both); target < ${fmt(2 * memoryData)} bytes (2× the payload)`);
      for (const m of memory) say(`  ${m.label}, bytes/event by key (Δ MEMORY USAGE, an estimate for streams): ${Object.entries(m.parts).map(([k, v]) => `${k} ${fmt(v)}`).join(', ')}`);
    }

    // 3. Fixed-rate load with lag sampling and worker progress.
    const logBeforeLoad = await state.tenantLogLength(tenant.id);
    const sampler = new LagSampler(client, keys, tenant.id, partitions, sampleMs);
    const progress: { t: number; applied: number }[] = [];
    let progressOn = true;
    const t0 = performance.now();
    const progressLoop = (async () => {
      while (progressOn) {
        progress.push({ t: (performance.now() - t0) / 1000, applied: await state.tenantLogLength(tenant.id) });
        await sleep(1000);
      }
    })();
    const slowlog = values['redis-profile'] ? new SlowlogProfile(client, 50_000) : null;
    await slowlog?.start();
    const stats0 = await commandStats(client);
    const cpu0 = cpuSnapshot();
    const load = await rateLoad({ url: target, headers, bodies: loadSet.bodies, rate: requestRate, duration, maxInFlight: 256, onAnswer: (s, b, at) => sampler.offer(s, b, at) });
    const loadEnd = (performance.now() - t0) / 1000;
    const cpu = formatCpu(cpuDelta(cpu0, cpuSnapshot()));
    const stats1 = await commandStats(client);
    const scripts = await slowlog?.collect();
    const appliedAtEnd = await state.tenantLogLength(tenant.id);
    const lost = await sampler.finish(LAG_WAIT_MS);
    const accepted = load.statusCodes['202'] ?? 0;
    const acceptedEvents = accepted * batch;
    let appliedTotal = 0;
    const drainedAfter = await waitUntil(async () => {
      appliedTotal = (await state.tenantLogLength(tenant.id)) - logBeforeLoad;
      return appliedTotal >= acceptedEvents;
    }, Math.max(0, LAG_WAIT_MS - ((performance.now() - t0) / 1000 - loadEnd) * 1000), 100);
    const catchUpS = (performance.now() - t0) / 1000 - loadEnd;
    progressOn = false;
    await progressLoop;

    const appliedInWindow = appliedAtEnd - logBeforeLoad;
    const appliedPerSec = appliedInWindow / loadEnd;
    // steady state: from 2 s in to the end of the load, from the 1-second progress samples
    const first = progress.find((s) => s.t >= 2) ?? progress[0]!;
    const lastInLoad = [...progress].reverse().find((s) => s.t <= loadEnd) ?? progress[progress.length - 1]!;
    const steadyPerSec = lastInLoad.t > first.t ? (lastInLoad.applied - first.applied) / (lastInLoad.t - first.t) : Number.NaN;
    // samples never applied count as lags above the wait: a percentile landing on them is only a lower bound
    const lags = [...sampler.lagsMs].sort((a, b) => a - b).concat(Array.from({ length: lost }, () => Infinity));
    const lagWaitMs = LAG_WAIT_MS; // a sample not applied by the end of the wait was taken ≥ that long before
    const bound = (v: number) => (Number.isFinite(v) ? v : lagWaitMs);
    const lagP50 = bound(percentile(lags, 50));
    const lagP99 = bound(percentile(lags, 99));
    const lagMax = bound(lags[lags.length - 1] ?? Number.NaN);
    const lagLowerBound = lost > 0 && !Number.isFinite(percentile(lags, 99));
    const ms = (v: number, isBound: boolean) => `${isBound ? '> ' : ''}${fmt(v, 1)} ms`;
    const per = progress.map((s, i) => (i === 0 ? null : `${fmt((s.applied - progress[i - 1]!.applied) / (s.t - progress[i - 1]!.t) / 1000, 1)}k`)).filter(Boolean);

    say('');
    say(`load: ${fmt(rate)} events/s offered (${fmt(requestRate, 1)} req/s of ${batch}) for ${duration} s, open loop, at most 256 in flight`);
    say(`  sent ${fmt(load.sent)} requests, answered ${fmt(load.answered)} (${codes(load.statusCodes)}), skipped ${load.skipped}, errors ${load.errors}; `
      + `accepted ${fmt(acceptedEvents / load.durationS)} events/s; request p50 ${fmt(load.p50Ms, 2)} ms, p99 ${fmt(load.p99Ms, 2)} ms`);
    say(`  ${cpu}`);
    say(`worker: ${fmt(appliedPerSec)} events/s applied over the load (${fmt(appliedInWindow)} of ${fmt(acceptedEvents)} accepted by its end), `
      + `${fmt(steadyPerSec)} events/s from 2 s to the end; the remaining ${fmt(acceptedEvents - appliedInWindow)} `
      + `${drainedAfter ? `applied ${catchUpS.toFixed(1)} s after the load` : `NOT all applied ${LAG_WAIT_MS / 1000} s after the load (${fmt(appliedTotal - appliedInWindow)} were; not waited for longer)`}`);
    say(`  applied per second: ${per.join(' ')}`);
    say(`read-model lag (202 answer → applied field visible, polled every ~2 ms): ${lags.length} samples, p50 ${ms(lagP50, lost > 0 && !Number.isFinite(percentile(lags, 50)))}, `
      + `p99 ${ms(lagP99, lagLowerBound)}, max ${ms(lagMax, lost > 0)}${lost ? `; ${lost} samples not applied ${LAG_WAIT_MS / 1000} s after the load (their lag counts as more than ${fmt(lagWaitMs)} ms)` : ''}`);
    say('redis commandstats during the load (commands run by scripts are counted inside evalsha too):');
    for (const line of commandStatsDelta(stats0, stats1, 10).lines) say(line);
    if (scripts) {
      say(`redis time per command from SLOWLOG, script-run commands included and inside their script's time (last ${fmt(scripts.entries)} commands, about ${scripts.spanS} s of the load):`);
      for (const line of scripts.lines) say(line);
    }

    const lagTargetMs = 2000;
    const targetRate = 30_000;
    const sustained = steadyPerSec >= 0.98 * Math.min(rate, targetRate) && rate >= targetRate;
    const lagMet = lagP99 <= lagTargetMs && lost === 0;
    const memNo = memory.find((m) => m.label === 'no caller id');
    const memId = memory.find((m) => m.label === 'caller id');
    say('');
    say(`worker ${fmt(steadyPerSec)} events/s steady (target ${fmt(targetRate)} at --rate ≥ ${fmt(targetRate)}): ${sustained ? 'met' : 'NOT met'}; `
      + `lag p99 ${ms(lagP99, lagLowerBound)} (target ≤ ${lagTargetMs}): ${lagMet ? 'met' : 'NOT met'}`);
    for (const m of [memNo, memId]) {
      if (m) say(`memory (${m.label}) ${fmt(m.perEvent)} B/event (${fmt(m.perEventNoLedger)} without the ledger copy), target < ${fmt(2 * memoryData)}: ${m.perEvent < 2 * memoryData ? 'met' : 'NOT met'} with the ledger, ${m.perEventNoLedger < 2 * memoryData ? 'met' : 'NOT met'} without`);
    }
    if ((load.statusCodes['202'] ?? 0) !== load.answered || load.errors > 0) say(`WARNING: ${load.answered - accepted} answers were not 202 and ${load.errors} requests failed`);
    if (load.skipped > 0) say(`WARNING: ${load.skipped} requests were due while 256 were in flight and were not sent: the web role did not keep up with the offered rate`);
    if (profDir) say(`CPU profiles written to ${profDir} (summarize: node --import tsx bench/lib/cpuprofile.ts <file>)`);

    return {
      bench: 'pipeline',
      metric: 'worker_events_per_s',
      value: round(steadyPerSec, 1),
      unit: 'events/s',
      baseline: { name: 'redis-benchmark XADD -P 32', value: round(xadd.opsPerSec, 0) },
      ratio: ratioOf(steadyPerSec, xadd.opsPerSec),
      target: targetRate,
      target_kind: 'absolute events/s, sustained (steady applied rate ≥ 98% of it) with lag p99 ≤ 2000 ms',
      met: sustained && lagMet,
      rate_offered: rate,
      accepted_events_per_s: round(acceptedEvents / load.durationS, 1),
      applied_over_load_per_s: round(appliedPerSec, 1),
      catch_up_s: drainedAfter ? round(catchUpS, 2) : null,
      lag_p50_ms: round(lagP50, 1),
      lag_p99_ms: round(lagP99, 1),
      lag_p99_lower_bound: lagLowerBound,
      lag_max_ms: round(lagMax, 1),
      lag_samples: lags.length,
      lag_lost: lost,
      lag_target_ms: lagTargetMs,
      request_p50_ms: round(load.p50Ms, 3),
      request_p99_ms: round(load.p99Ms, 3),
      non_202: load.answered - accepted,
      errors: load.errors,
      skipped: load.skipped,
      worker_drain_entries_per_s: round(drainRate, 1),
      memory_events: memoryEvents,
      memory_data_bytes: memoryData,
      memory_per_event_bytes: memNo ? round(memNo.perEvent, 0) : null,
      memory_per_event_no_ledger_bytes: memNo ? round(memNo.perEventNoLedger, 0) : null,
      memory_ledger_per_event_bytes: memNo ? round(memNo.ledgerPerEvent, 0) : null,
      memory_per_event_ledger_deleted_bytes: memNo ? round(memNo.perEventTrimmed, 0) : null,
      memory_per_event_caller_id_bytes: memId ? round(memId.perEvent, 0) : null,
      memory_per_event_caller_id_no_ledger_bytes: memId ? round(memId.perEventNoLedger, 0) : null,
      memory_per_event_caller_id_ledger_deleted_bytes: memId ? round(memId.perEventTrimmed, 0) : null,
      memory_target_bytes: 2 * memoryData,
      memory_breakdown_bytes: memNo ? Object.fromEntries(Object.entries(memNo.parts).map(([k, v]) => [k, round(v, 0)])) : null,
      memory_breakdown_caller_id_bytes: memId ? Object.fromEntries(Object.entries(memId.parts).map(([k, v]) => [k, round(v, 0)])) : null,
      memory_met: memNo ? memNo.perEvent < 2 * memoryData : null,
      mode,
      duration_s: duration,
      batch,
      subscribers,
      partitions,
    };
  } finally {
    for (const stop of stops.reverse()) await stop().catch(() => {});
  }
}
