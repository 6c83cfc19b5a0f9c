import { mkdirSync } from 'node:fs';
import { resolve } from 'node:path';
import { parseArgs } from 'node:util';
import type { Redis } from 'ioredis';
import { createApiKey, ensureWorkspace, type Writer } from '../streams/identity.js';
import { createKeys } from '../streams/keys.js';
import { numberOption, UsageError } from './lib/args.js';
import { bodyLoad, type BodyLoadResult } from './lib/body-load.js';
import { eventBodies } from './lib/event-bodies.js';
import { commandStats, commandStatsDelta, HeraldState, SlowlogProfile, waitUntil } from './lib/herald-state.js';
import { httpLoad, mergeLoads, type LoadResult } from './lib/http-load.js';
import { postAll } from './lib/post-all.js';
import { startKoaHello } from './lib/koa-hello.js';
import { redisBenchmark, startRedisWithClient } from './lib/redis.js';
import { ratioOf, round, type BenchResult, fmt } from './lib/result.js';
import { cpuProfEnv } from './lib/cpu-prof.js';
import { cpuDelta, cpuSnapshot, formatCpu } from './lib/proc-cpu.js';
import { startEventRoles } from './lib/service.js';

export const description = 'accepted events/s of POST /v1/events (batches) with web + worker running vs redis-benchmark XADD; single-event req/s vs a Koa hello-world';

export const usage = `ingest [--mode separate|combined|both] [--subscribers 100000] [--batch 100] [--connections 32] [--duration 10]
     [--warmup 3] [--single-connections 50] [--single-duration 6] [--rounds 2] [--partitions 64]
     [--xadd-requests 500000] [--cpu-prof <dir>] [--redis-profile]
  --mode            separate: bin/web.ts and bin/worker.ts as two child processes; combined: bin/start.ts with
                      HERALD_ROLES=web,worker (one process); both (default): one after the other on a flushed Redis,
                      the headline figures from the one with more events/s (see its worker column)
  --batch           events per request of the batch phase (1 to 100)
  --duration        seconds of the measured batch phase (after --warmup seconds not measured)
  --single-*        the single-event phase (bare event body), measured in --rounds rounds alternating with the hello-world
  --xadd-requests   requests of redis-benchmark -P 32 XADD (the baseline of events/s)
  --cpu-prof        write V8 CPU profiles of the service children into <dir>/ingest-<mode>/ (a preload, see bench/lib/cpu-prof.ts); slows them a little
  --redis-profile   SLOWLOG (threshold 0) during the measured batch phase: Redis time per call and per event of the
                      ingestEvents and applyEvents scripts (the last 50,000 commands); logging every command slows
                      Redis noticeably: use it to see costs, not for the figures`;

type Mode = 'separate' | 'combined';
const SLUG = 'bench-ingest';
const BY_BENCH: Writer = { actor: { type: 'system', id: null }, request: null };
const ACCEPTED = '"status":"accepted"';

const codes = (r: { statusCodes: Record<string, number> }) => Object.entries(r.statusCodes).map(([c, n]) => `${c}×${n}`).join(' ') || '-';

type ModeResult = {
  mode: Mode;
  batch: BodyLoadResult;
  eventsPerSec: number;
  eventsInAnswers: number;
  created: number;
  workerAppliedPerSec: number;
  single: LoadResult;
  singleAccepted: number;
  hello: LoadResult;
  redisTop: string[];
  drainedBeforeBatch: boolean;
  batchCpu: string;
  singleCpu: string;
};

async function provision(redis: Redis, prefix: string): Promise<{ apiKey: string; tenantId: string }> {
  const keys = createKeys(prefix);
  const { workspace, tenant } = await ensureWorkspace(redis, keys, SLUG, BY_BENCH);
  const apiKey = (await createApiKey(redis, keys, { workspace, tenant, kind: 'tenant', scopes: ['*'], expiresAt: null, name: 'bench' }, BY_BENCH)).key;
  return { apiKey, tenantId: tenant.id };
}

async function probe(url: string, headers: Record<string, string>, body: Buffer, expectItems: number): Promise<void> {
  const res = await fetch(url, { method: 'POST', headers: { ...headers, 'content-type': 'application/json' }, body });
  const text = await res.text();
  if (res.status !== 202) throw new Error(`POST ${url} answered ${res.status}, expected 202: ${text.slice(0, 300)}`);
  const items = (JSON.parse(text) as { data: { items: { status: string }[] } }).data.items;
  const accepted = items.filter((i) => i.status === 'accepted').length;
  if (items.length !== expectItems || accepted !== expectItems) throw new Error(`probe: ${items.length} items, ${accepted} accepted, expected ${expectItems}`);
}

export async function run(args: string[]): Promise<BenchResult> {
  const { values } = parseArgs({
    args,
    strict: true,
    options: {
      mode: { type: 'string', default: 'both' },
      subscribers: { type: 'string' },
      batch: { type: 'string' },
      connections: { type: 'string' },
      duration: { type: 'string' },
      warmup: { type: 'string' },
      'single-connections': { type: 'string' },
      'single-duration': { type: 'string' },
      rounds: { type: 'string' },
      partitions: { type: 'string' },
      'xadd-requests': { type: 'string' },
      'cpu-prof': { type: 'string' },
      'redis-profile': { type: 'boolean', default: false },
    },
  });
  if (!['separate', 'combined', 'both'].includes(values.mode!)) throw new UsageError(`--mode must be separate, combined or both, got "${values.mode}"`);
  const modes: Mode[] = values.mode === 'both' ? ['separate', 'combined'] : [values.mode as Mode];
  const subscribers = Math.round(numberOption(values.subscribers, 'subscribers', 100_000, 100, 10_000_000));
  const batch = Math.round(numberOption(values.batch, 'batch', 100, 1, 100));
  const connections = Math.round(numberOption(values.connections, 'connections', 32, 1, 1000));
  const duration = numberOption(values.duration, 'duration', 10, 1, 60);
  const warmup = numberOption(values.warmup, 'warmup', 3, 0, 30);
  const singleConnections = Math.round(numberOption(values['single-connections'], 'single-connections', 50, 1, 1000));
  const singleDuration = numberOption(values['single-duration'], 'single-duration', 6, 1, 60);
  const rounds = Math.round(numberOption(values.rounds, 'rounds', 2, 1, 10));
  const partitions = Math.round(numberOption(values.partitions, 'partitions', 64, 1, 4096));
  const xaddRequests = Math.round(numberOption(values['xadd-requests'], 'xadd-requests', 500_000, 10_000, 10_000_000));
  const profDir = values['cpu-prof'] ? resolve(values['cpu-prof']) : null;
  if (profDir) mkdirSync(profDir, { recursive: true });

  // Bodies, generated once. Every subscriber is created before it is measured (first sightings write more):
  // the single phase names the first `singlePool` subscribers of the order (created first), the batch phase all.
  const singlePool = Math.min(subscribers, 10_000);
  const createSingle = eventBodies({ subscribers, batch: 100, bodies: Math.ceil(singlePool / 100), pool: singlePool });
  const createAll = eventBodies({ subscribers, batch: 100, bodies: Math.ceil(subscribers / 100) });
  const batchSet = eventBodies({ subscribers, batch, bodies: Math.max(1, Math.ceil((2 * subscribers) / batch)), offset: 13 });
  const singleSet = eventBodies({ subscribers, batch: 0, bodies: 20_000, pool: singlePool, offset: 7 });

  const stops: Array<() => Promise<void>> = [];
  try {
    const { server: redis, client } = await startRedisWithClient(stops);

    // The Redis baseline: raw XADD, pipelined 32 deep, on the same private Redis.
    const xadd = await redisBenchmark({ port: redis.port, requests: xaddRequests, command: ['XADD', 'bench:xadd', '*', 'f', 'v'] });
    await client.del('bench:xadd');

    const hello = await startKoaHello();
    stops.push(hello.stop);

    const results: ModeResult[] = [];
    for (const mode of modes) {
      await client.flushall();
      const prefix = `bench-ingest-${process.pid}-${mode}:`;
      const keys = createKeys(prefix);
      const state = new HeraldState(client, keys, partitions);
      const { apiKey, tenantId } = await provision(client, prefix);
      const env: Record<string, string> = { HERALD_PARTITIONS: String(partitions) };
      if (profDir) Object.assign(env, cpuProfEnv(resolve(profDir, `ingest-${mode}`)));

      const local: Array<() => Promise<void>> = [];
      try {
        const url = await startEventRoles(mode, { redisUrl: redis.url, keyPrefix: prefix, env }, local);
        const target = `${url}/v1/events`;
        const headers = { authorization: `Bearer ${apiKey}` };
        await probe(target, headers, batchSet.bodies[batchSet.bodies.length - 1]!, batch);
        await probe(target, headers, singleSet.bodies[singleSet.bodies.length - 1]!, 1);

        // Single-event phase first (its subscribers created, the worker caught up), so the worker only has its own backlog to follow.
        const made = await postAll({ url: target, headers, bodies: createSingle.bodies, concurrency: 8 });
        if ((made.statusCodes['202'] ?? 0) !== createSingle.bodies.length) throw new Error(`creating subscribers: ${codes(made)}, ${made.errors} errors`);
        await waitUntil(async () => (await state.pendingAndUnread()) === 0, 30_000, 250);
        const singleSide = { url: target, headers, bodies: singleSet.bodies, connections: singleConnections, count: ACCEPTED };
        const helloSide = { url: `${hello.url}/`, method: 'GET' as const, connections: singleConnections };
        let singleNext = 0;
        if (warmup > 0) {
          singleNext = (await bodyLoad({ ...singleSide, duration: warmup })).next;
          await httpLoad({ ...helloSide, duration: warmup });
        }
        const singles: BodyLoadResult[] = [];
        const hellos: LoadResult[] = [];
        const singleCores = new Map<string, number>();
        for (let i = 0; i < rounds; i++) {
          const order = i % 2 === 0 ? (['hello', 'single'] as const) : (['single', 'hello'] as const);
          for (const side of order) {
            if (side === 'hello') hellos.push(await httpLoad({ ...helloSide, duration: singleDuration / rounds }));
            else {
              const c0 = cpuSnapshot();
              const r = await bodyLoad({ ...singleSide, start: singleNext, duration: singleDuration / rounds });
              for (const row of cpuDelta(c0, cpuSnapshot())) singleCores.set(row.label, (singleCores.get(row.label) ?? 0) + row.cores / rounds);
              singleNext = r.next;
              singles.push(r);
            }
          }
        }
        const single = mergeLoads(singles);
        const singleAccepted = singles.reduce((a, r) => a + r.matches, 0);

        // Every subscriber created (not measured); the worker works through that backlog during the batch phase,
        // as it would through the batch phase's own.
        const drainedBeforeBatch = await waitUntil(async () => (await state.pendingAndUnread()) === 0, 30_000, 250);
        const madeAll = await postAll({ url: target, headers, bodies: createAll.bodies, concurrency: 8 });
        if ((madeAll.statusCodes['202'] ?? 0) !== createAll.bodies.length) throw new Error(`creating subscribers: ${codes(madeAll)}, ${madeAll.errors} errors`);

        // Batch phase: warm-up, then measured.
        const batchSide = { url: target, headers, bodies: batchSet.bodies, connections, count: ACCEPTED };
        let next = 0;
        if (warmup > 0) next = (await bodyLoad({ ...batchSide, duration: warmup })).next;
        const subsBefore = await state.subscriberCount();
        const logBefore = await state.tenantLogLength(tenantId);
        const slowlog = values['redis-profile'] ? new SlowlogProfile(client, 50_000) : null;
        await slowlog?.start();
        const statsBefore = await commandStats(client);
        const t0 = performance.now();
        const cpu0 = cpuSnapshot();
        const measured = await bodyLoad({ ...batchSide, start: next, duration });
        const batchCpu = formatCpu(cpuDelta(cpu0, cpuSnapshot()));
        const elapsedS = (performance.now() - t0) / 1000;
        const statsAfter = await commandStats(client);
        const scripts = await slowlog?.collect();
        const logAfter = await state.tenantLogLength(tenantId);
        const subsAfter = await state.subscriberCount();
        const redisTop = commandStatsDelta(statsBefore, statsAfter, 10).lines;
        if (scripts) redisTop.push(`  redis time per command from SLOWLOG, script-run commands included and inside their script's time (last ${fmt(scripts.entries)} commands, about ${scripts.spanS} s):`, ...scripts.lines);

        results.push({
          mode, batch: measured,
          eventsPerSec: measured.durationS > 0 ? measured.matches / measured.durationS : 0,
          eventsInAnswers: measured.matches,
          created: subsAfter - subsBefore,
          workerAppliedPerSec: (logAfter - logBefore) / elapsedS,
          single, singleAccepted, hello: mergeLoads(hellos), redisTop, drainedBeforeBatch,
          batchCpu, singleCpu: formatCpu([...singleCores].map(([label, cores]) => ({ label, cores })).sort((x, y) => y.cores - x.cores)),
        });
      } finally {
        for (const stop of local.reverse()) await stop().catch(() => {});
      }
    }

    const best = results.reduce((a, b) => (b.eventsPerSec > a.eventsPerSec ? b : a));
    const helloAll = mergeLoads(results.map((r) => r.hello));
    const target = 100_000;
    const singleTarget = 0.6;
    const out: string[] = [
      `ingest: POST /v1/events, ${batch} events per request over ${fmt(subscribers)} subscribers (data a small object), `
        + `web + worker + private redis on this machine (${partitions} partitions); autocannon in this process`,
      `baseline: redis-benchmark -P 32 -n ${fmt(xaddRequests)} XADD bench:xadd * f v: ${fmt(xadd.opsPerSec)} ops/s`,
      `batch phase: ${connections} connections, ${warmup} s warm-up, ${duration} s measured; `
        + `single phase: bare event bodies, ${singleConnections} connections, ${singleDuration} s per side in ${rounds} round(s) alternating with the hello-world`,
      '',
      `${'mode'.padEnd(10)}${'events/s'.padStart(11)}${'req/s'.padStart(9)}${'p50 ms'.padStart(9)}${'p99 ms'.padStart(9)}${'created'.padStart(9)}${'worker ev/s'.padStart(13)}   answers`,
      ...results.map((r) => `${r.mode.padEnd(10)}${fmt(r.eventsPerSec).padStart(11)}${fmt(r.batch.requestsPerSec).padStart(9)}${fmt(r.batch.p50Ms, 2).padStart(9)}`
        + `${fmt(r.batch.p99Ms, 2).padStart(9)}${fmt(r.created).padStart(9)}${fmt(r.workerAppliedPerSec).padStart(13)}   ${codes(r.batch)}`),
      '  (events/s: items answered "accepted" per second; created: subscribers first seen while measured (all are created before, not measured);',
      '   worker ev/s: tenant-log entries the worker applied per second meanwhile, $subscriber.created included)',
      '',
      `${'single'.padEnd(22)}${'req/s'.padStart(10)}${'p50 ms'.padStart(9)}${'p99 ms'.padStart(9)}${'ratio'.padStart(8)}   answers`,
      ...results.flatMap((r) => [
        `${`koa-hello (${r.mode})`.padEnd(22)}${fmt(r.hello.requestsPerSec).padStart(10)}${fmt(r.hello.p50Ms, 2).padStart(9)}${fmt(r.hello.p99Ms, 2).padStart(9)}${''.padStart(8)}   ${codes(r.hello)}`,
        `${`herald ${r.mode}`.padEnd(22)}${fmt(r.single.requestsPerSec).padStart(10)}${fmt(r.single.p50Ms, 2).padStart(9)}${fmt(r.single.p99Ms, 2).padStart(9)}`
          + `${String(ratioOf(r.single.requestsPerSec, r.hello.requestsPerSec)).padStart(8)}   ${codes(r.single)}`,
      ]),
      '',
      ...results.flatMap((r) => [`${r.mode} batch phase ${r.batchCpu}`, `${r.mode} single phase ${r.singleCpu}`]),
      '',
      ...results.flatMap((r) => [`redis commandstats during the measured batch phase (${r.mode}; commands run by scripts are counted inside evalsha too):`, ...r.redisTop]),
      '',
    ];
    const ratio = ratioOf(best.eventsPerSec, xadd.opsPerSec);
    const singleRatio = ratioOf(best.single.requestsPerSec, best.hello.requestsPerSec);
    if (results.length > 1) {
      const [a, b] = results;
      out.push(`faster: ${best.mode} (${fmt(a!.eventsPerSec)} vs ${fmt(b!.eventsPerSec)} events/s; single ${fmt(a!.single.requestsPerSec)} vs ${fmt(b!.single.requestsPerSec)} req/s)`);
    }
    out.push(
      `${best.mode}: ${fmt(best.eventsPerSec)} events/s, ratio to XADD ${ratio}; target ${fmt(target)} events/s: ${best.eventsPerSec >= target ? 'met' : 'NOT met'}`,
      `${best.mode}: single ${fmt(best.single.requestsPerSec)} req/s / hello ${fmt(best.hello.requestsPerSec)} req/s = ${singleRatio}, target ${singleTarget}: ${singleRatio >= singleTarget ? 'met' : 'NOT met'}`,
    );
    for (const r of results) {
      const bad = r.batch.total - (r.batch.statusCodes['202'] ?? 0);
      const badSingle = r.single.total - (r.single.statusCodes['202'] ?? 0);
      if (bad > 0 || badSingle > 0) out.push(`WARNING (${r.mode}): ${bad} batch and ${badSingle} single answers were not 202; the figures are not trustworthy`);
      if (r.singleAccepted !== (r.single.statusCodes['202'] ?? 0)) out.push(`WARNING (${r.mode}): ${r.singleAccepted} single events answered accepted of ${r.single.statusCodes['202'] ?? 0} 202 answers`);
      if (r.batch.errors + r.batch.timeouts + r.single.errors + r.single.timeouts > 0) out.push(`WARNING (${r.mode}): connection errors or timeouts`);
      if (r.workerAppliedPerSec < 0.5 * r.eventsPerSec) {
        out.push(`note (${r.mode}): the worker applied ${fmt(r.workerAppliedPerSec)} entries/s while ${fmt(r.eventsPerSec)} events/s were accepted: its backlog grew all along`);
      }
      if (!r.drainedBeforeBatch) out.push(`note (${r.mode}): the worker had not caught up with the single phase within 30 s after it`);
    }
    if (profDir) out.push(`CPU profiles written to ${profDir} (summarize: node --import tsx bench/lib/cpuprofile.ts <file>)`);
    process.stdout.write(out.join('\n') + '\n');

    const perMode = Object.fromEntries(results.map((r) => [r.mode, {
      events_per_s: round(r.eventsPerSec, 1), req_per_s: round(r.batch.requestsPerSec, 1), p50_ms: round(r.batch.p50Ms, 3), p99_ms: round(r.batch.p99Ms, 3),
      subscribers_created: r.created, worker_applied_per_s: round(r.workerAppliedPerSec, 1),
      single_rps: round(r.single.requestsPerSec, 1), hello_rps: round(r.hello.requestsPerSec, 1), single_ratio: ratioOf(r.single.requestsPerSec, r.hello.requestsPerSec),
      single_p50_ms: round(r.single.p50Ms, 3), single_p99_ms: round(r.single.p99Ms, 3), non_202: r.batch.total - (r.batch.statusCodes['202'] ?? 0) + r.single.total - (r.single.statusCodes['202'] ?? 0),
    }]));
    return {
      bench: 'ingest',
      metric: 'events_per_s',
      value: round(best.eventsPerSec, 1),
      unit: 'events/s',
      baseline: { name: 'redis-benchmark XADD -P 32', value: round(xadd.opsPerSec, 0) },
      ratio,
      target,
      target_kind: 'absolute events/s',
      met: best.eventsPerSec >= target,
      mode: best.mode,
      p50_ms: round(best.batch.p50Ms, 3),
      p99_ms: round(best.batch.p99Ms, 3),
      req_per_s: round(best.batch.requestsPerSec, 1),
      batch,
      subscribers,
      single_rps: round(best.single.requestsPerSec, 1),
      hello_rps: round(best.hello.requestsPerSec, 1),
      single_ratio: singleRatio,
      single_target: singleTarget,
      single_met: singleRatio >= singleTarget,
      single_p50_ms: round(best.single.p50Ms, 3),
      single_p99_ms: round(best.single.p99Ms, 3),
      hello_all_rps: round(helloAll.requestsPerSec, 1),
      modes: perMode,
      errors: results.reduce((a, r) => a + r.batch.errors + r.batch.timeouts + r.single.errors + r.single.timeouts, 0),
      connections,
      single_connections: singleConnections,
      duration_s: duration,
      single_duration_s: singleDuration,
      warmup_s: warmup,
      rounds,
      partitions,
    };
  } finally {
    for (const stop of stops.reverse()) await stop().catch(() => {});
  }
}
