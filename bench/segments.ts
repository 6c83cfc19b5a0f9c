import { mkdirSync } from 'node:fs';
import { resolve } from 'node:path';
import { parseArgs } from 'node:util';
import { partitionOf } from '../lib/partition.js';
import { createApiKey, ensureWorkspace, SYSTEM_WRITER } from '../streams/identity.js';
import { createKeys } from '../streams/keys.js';
import { createTopic } from '../streams/topics.js';
import { numberOption, UsageError } from './lib/args.js';
import { api, automationBodies, createAudience, SEGMENTS, type AudienceStats } from './lib/automation-fixture.js';
import { cpuProfEnv } from './lib/cpu-prof.js';
import { externalIdOf } from './lib/event-bodies.js';
import { HeraldState, waitUntil } from './lib/herald-state.js';
import { postAll } from './lib/post-all.js';
import { startRedisWithClient } from './lib/redis.js';
import { ratioOf, round, type BenchResult, fmt, say } from './lib/result.js';
import { startRole } from './lib/role-process.js';
import { startService } from './lib/service.js';
import { startWorker } from './lib/worker.js';
import { drainOnce, type DrainResult } from './lib/worker-drain.js';

export const description = 'worker events/s with 20 segments kept against the same events without segments (same run); member counts, automation memory per subscriber';

export const usage = `segments [--subscribers 100000] [--events 100000] [--history 2] [--rounds 2] [--partitions 64]
     [--setup-concurrency 64] [--cpu-prof <dir>]
  --subscribers        subscribers of each of the two tenants (attributes, devices, topics, --history events each; not measured)
  --events             events per measured drain (one drain per tenant per round; the same events for both tenants)
  --history            events per subscriber sent during the set-up, so that counters and members exist before measuring
  --rounds             measured rounds; the order of the two tenants alternates (without, with / with, without / …)
  --setup-concurrency  subscribers written at a time by the set-up
  --cpu-prof           write V8 CPU profiles of the service children into <dir>/segments/ (one worker per drain)`;

const BY_BENCH = SYSTEM_WRITER;
const codes = (c: Record<string, number>) => Object.entries(c).map(([k, n]) => `${k}×${n}`).join(' ') || '-';

type SegmentView = { slug: string; memberCount: number; backfill: { status: string; processed: number; total: number | null } };

export async function run(args: string[]): Promise<BenchResult> {
  const { values } = parseArgs({
    args,
    strict: true,
    options: {
      subscribers: { type: 'string' },
      events: { type: 'string' },
      history: { type: 'string' },
      rounds: { type: 'string' },
      partitions: { type: 'string' },
      'setup-concurrency': { type: 'string' },
      'cpu-prof': { type: 'string' },
    },
  });
  const subscribers = Math.round(numberOption(values.subscribers, 'subscribers', 100_000, 1_000, 1_000_000));
  const events = Math.round(numberOption(values.events, 'events', 100_000, 1_000, 1_000_000));
  const history = Math.round(numberOption(values.history, 'history', 2, 0, 20));
  const rounds = Math.round(numberOption(values.rounds, 'rounds', 2, 1, 10));
  const partitions = Math.round(numberOption(values.partitions, 'partitions', 64, 1, 4096));
  const setupConcurrency = Math.round(numberOption(values['setup-concurrency'], 'setup-concurrency', 64, 1, 1024));
  const profDir = values['cpu-prof'] ? resolve(values['cpu-prof'], 'segments') : null;
  if (profDir) mkdirSync(profDir, { recursive: true });
  if (events % 100 !== 0) throw new UsageError('--events must be a multiple of 100 (batches of 100 events)');

  const prefix = `bench-segments-${process.pid}:`;
  const keys = createKeys(prefix);
    const stops: Array<() => Promise<void>> = [];
  let worker: { pid: number; stop: () => Promise<void> } | null = null;
  const stopWorker = async () => {
    if (worker) await worker.stop();
    worker = null;
  };
  try {
    const { server: redis, client } = await startRedisWithClient(stops);
    const state = new HeraldState(client, keys, partitions);
    const env: Record<string, string> = { HERALD_PARTITIONS: String(partitions), ...(profDir ? cpuProfEnv(profDir) : {}) };

    // two tenants (each the default tenant of its own workspace): A never defines a segment, B has 20
    const tenants = await Promise.all((['off', 'on'] as const).map(async (kind) => {
      const { workspace, tenant } = await ensureWorkspace(client, keys, `bench-segments-${kind}`, BY_BENCH);
      const apiKey = (await createApiKey(client, keys, { workspace, tenant, kind: 'tenant', scopes: ['*'], expiresAt: null, name: 'bench' }, BY_BENCH)).key;
      const topics = {
        news: await createTopic(client, keys, { workspace, tenant }, { slug: 'news' }, BY_BENCH),
        vip: await createTopic(client, keys, { workspace, tenant }, { slug: 'vip' }, BY_BENCH),
      };
      return { kind, label: kind === 'off' ? 'without segments' : 'with 20 segments', workspace, tenant, apiKey, topics, scope: { workspaceId: workspace.id, tenantId: tenant.id, partitions } };
    }));
    const [off, on] = tenants as [typeof tenants[0], typeof tenants[0]];

    const web = await startService({ redisUrl: redis.url, keyPrefix: prefix, env });
    stops.push(web.stop);
    const scheduler = await startRole({ role: 'scheduler', redisUrl: redis.url, keyPrefix: prefix, env });
    stops.push(scheduler.stop);
    worker = await startWorker({ redisUrl: redis.url, keyPrefix: prefix, env });
    say(`segments: bin/web.ts + bin/worker.ts + bin/scheduler.ts + private redis, ${partitions} partitions; two tenants of ${fmt(subscribers)} subscribers each, `
      + `the same attributes, devices, topics and events; tenant "${on.workspace.slug}" keeps ${SEGMENTS.length} segments, "${off.workspace.slug}" none`);

    // 1. Set-up (not measured): the segments first, so members are kept incrementally from the first event
    for (const s of SEGMENTS) {
      const res = await api(web.url, on.apiKey, 'POST', '/v1/segments', { slug: s.slug, where: s.where });
      if (res.status !== 201) throw new Error(`POST /v1/segments ${s.slug} answered ${res.status}: ${JSON.stringify(res.error)}`);
    }
    const audiences: AudienceStats[] = [];
    for (const t of tenants) {
      const a = await createAudience(client, keys, t.scope, { from: 0, to: subscribers }, t.topics, {
        concurrency: setupConcurrency,
        onProgress: (done) => done % 50_000 === 0 && say(`  set-up ${t.label}: ${fmt(done)} subscribers written`),
      });
      audiences.push(a);
      say(`set-up ${t.label}: ${fmt(a.subscribers)} subscribers with attributes, ${fmt(a.subscriptions)} subscriptions, topic members `
        + `${Object.entries(a.topicMembers).map(([k, v]) => `${k} ${fmt(v)}`).join(', ')} in ${a.seconds.toFixed(1)} s (library calls from this process)`);
    }
    if (history > 0) {
      const set = automationBodies({ subscribers, events: history * subscribers, offset: 0 });
      for (const t of tenants) {
        const sent = await postAll({ url: `${web.url}/v1/events`, headers: { authorization: `Bearer ${t.apiKey}` }, bodies: set.bodies, concurrency: 8, count: '"status":"accepted"', timeoutMs: 300_000 });
        if ((sent.statusCodes['202'] ?? 0) !== set.bodies.length) throw new Error(`set-up events (${t.label}): answers ${codes(sent.statusCodes)}, ${sent.errors} errors`);
        say(`set-up ${t.label}: ${fmt(sent.matches)} events (${history} per subscriber) posted in ${sent.seconds.toFixed(1)} s`);
      }
    }
    const drainStart = performance.now();
    const drained = await waitUntil(async () => (await state.pendingAndUnread()) === 0, 600_000, 500);
    if (!drained) throw new Error('the worker did not apply the set-up within 600 s');
    // backfills of segments created before their subscribers: done once the scheduler walked every partition
    const segmentsOf = async () => (await api<{ items: SegmentView[] }>(web.url, on.apiKey, 'GET', '/v1/segments?limit=100')).data?.items ?? [];
    const backfilled = await waitUntil(async () => (await segmentsOf()).every((s) => s.backfill.status === 'completed'), 120_000, 500);
    await waitUntil(async () => (await state.pendingAndUnread()) === 0, 120_000, 500);
    say(`set-up: the worker finished the set-up's backlog ${((performance.now() - drainStart) / 1000).toFixed(1)} s after the last post`
      + `${backfilled ? '; every segment backfill completed' : '; WARNING: some segment backfills did not complete within 120 s'}`);
    const overdue = await dueTimers(client, keys, partitions);
    if (overdue > 0) say(`  note: ${overdue} timers already due (fired by the scheduler meanwhile)`);
    await stopWorker();

    // 2. Measured drains: per round, the same new events to each tenant, the order alternating
    say('');
    say(`measured: per round and tenant, ${fmt(events)} events (the same for both tenants; names and data the segments test) posted with no worker running,`);
    say('then a fresh worker applies that backlog alone; events/s over the whole drain and between 10 % and 90 % of it (steady)');
    const results: { tenant: 'off' | 'on'; round: number; r: DrainResult }[] = [];
    for (let round = 0; round < rounds; round++) {
      const set = automationBodies({ subscribers, events, offset: history * subscribers + round * events });
      const order = round % 2 === 0 ? [off, on] : [on, off];
      for (const t of order) {
        const r = await drainOnce({
          redis: client, redisUrl: redis.url, keys, keyPrefix: prefix, partitions, tenantId: t.tenant.id,
          url: web.url, apiKey: t.apiKey, bodies: set.bodies, events: set.events, env,
        });
        worker = r.worker;
        results.push({ tenant: t.kind, round: round + 1, r });
        say(`  round ${round + 1}, ${t.label.padEnd(17)} ${fmt(r.ratePerS).padStart(8)} events/s whole drain (${r.drainS.toFixed(2)} s), `
          + `${fmt(r.steadyPerS).padStart(8)} events/s steady; posted in ${r.postSeconds.toFixed(1)} s; first applied ${r.startToFirstS.toFixed(2)} s after the worker was spawned`
          + `${r.completed ? '' : '  (NOT complete: timed out)'}`);
        say(`    ${r.cpu}`);
        const other = r.cpuRows.find((c) => c.label === 'other processes')?.cores ?? 0;
        if (other > 0.25) say(`    WARNING: other processes on the machine took ${other.toFixed(2)} cores during this drain: its figure is not comparable (repeat the run)`);
        await stopWorker();
      }
    }
    say('');
    for (const kind of ['off', 'on'] as const) {
      const last = [...results].reverse().find((x) => x.tenant === kind)!;
      say(`redis commandstats during the last drain ${kind === 'off' ? 'without' : 'with'} segments (commands run by scripts are counted inside evalsha too):`);
      for (const line of last.r.commandStats) say(line);
    }

    // aggregate: events over drain time, all rounds
    const agg = (kind: 'off' | 'on', key: 'whole' | 'steady') => {
      const rs = results.filter((x) => x.tenant === kind).map((x) => x.r);
      const total = rs.reduce((a, r) => a + r.events * (key === 'whole' ? 1 : 0.8), 0);
      const seconds = rs.reduce((a, r) => a + (key === 'whole' ? r.events / r.ratePerS : (0.8 * r.events) / r.steadyPerS), 0);
      return total / seconds;
    };
    const withSteady = agg('on', 'steady');
    const withoutSteady = agg('off', 'steady');
    const withWhole = agg('on', 'whole');
    const withoutWhole = agg('off', 'whole');

    // 3. Members and automation memory
    const views = await segmentsOf();
    const bySlug = new Map(views.map((v) => [v.slug, v]));
    say('');
    say(`segment members (GET /v1/segments memberCount) of ${fmt(subscribers)} subscribers:`);
    const rows = SEGMENTS.map((s) => `${s.slug} ${fmt(bySlug.get(s.slug)?.memberCount ?? 0)}`);
    for (let i = 0; i < rows.length; i += 5) say(`  ${rows.slice(i, i + 5).join(', ')}`);
    const empty = SEGMENTS.filter((s) => !(bySlug.get(s.slug)?.memberCount ?? 0)).map((s) => s.slug);
    if (empty.length) say(`  WARNING: no members in ${empty.join(', ')}`);

    const memory = await automationMemory(client, keys, partitions, on.tenant.id, subscribers, SEGMENTS.length);
    say(`automation memory (MEMORY USAGE, tenant with segments): ${fmt(memory.perSubscriber)} bytes per subscriber: automation state with its counters ${fmt(memory.autoPer)} `
      + `(averages over ${fmt(memory.sampled)} subscribers) + member sets ${fmt(memory.membersPer)} + timers ${fmt(memory.timersPer)}; ${fmt(memory.timers)} timers armed`);

    const ratio = withSteady / withoutSteady;
    say('');
    say(`worker ${fmt(withSteady)} events/s with ${SEGMENTS.length} segments against ${fmt(withoutSteady)} without (steady, all rounds): ratio ${ratio.toFixed(3)} `
      + `(whole drains: ${fmt(withWhole)} / ${fmt(withoutWhole)} = ${(withWhole / withoutWhole).toFixed(3)}); target ≥ 0.7 (segments cost at most 30 %): ${ratio >= 0.7 ? 'met' : 'NOT met'}`);
    if (profDir) say(`CPU profiles written to ${profDir} (one bin/worker per drain, in drain order; summarize: node --import tsx bench/lib/cpuprofile.ts <file>)`);

    return {
      bench: 'segments',
      metric: 'worker_events_per_s_with_segments',
      value: round(withSteady, 1),
      unit: 'events/s',
      baseline: { name: 'pipeline-without-segments', value: round(withoutSteady, 1) },
      ratio: ratioOf(withSteady, withoutSteady),
      target: 0.7,
      met: ratio >= 0.7,
      whole_drain_events_per_s: round(withWhole, 1),
      whole_drain_baseline_events_per_s: round(withoutWhole, 1),
      whole_drain_ratio: ratioOf(withWhole, withoutWhole),
      drains: results.map((x) => ({
        round: x.round, segments: x.tenant === 'on', events_per_s: round(x.r.ratePerS, 1), steady_events_per_s: round(x.r.steadyPerS, 1), drain_s: round(x.r.drainS, 2),
        other_processes_cores: round(x.r.cpuRows.find((c) => c.label === 'other processes')?.cores ?? 0, 2),
      })),
      segment_members: Object.fromEntries(SEGMENTS.map((s) => [s.slug, bySlug.get(s.slug)?.memberCount ?? 0])),
      segments_without_members: empty.length,
      automation_bytes_per_subscriber: round(memory.perSubscriber, 0),
      automation_memory_breakdown_bytes: { automation_state_with_counters: round(memory.autoPer, 0), member_sets: round(memory.membersPer, 0), timers: round(memory.timersPer, 0) },
      timers_armed: memory.timers,
      segments: SEGMENTS.length,
      subscribers,
      events_per_drain: events,
      history_events_per_subscriber: history,
      rounds,
      partitions,
      setup_seconds: round(audiences.reduce((a, x) => a + x.seconds, 0), 1),
    };
  } finally {
    await stopWorker().catch(() => {});
    for (const stop of stops.reverse()) await stop().catch(() => {});
  }
}

/** Timers already due in every partition (ZCOUNT -inf now). */
async function dueTimers(redis: import('ioredis').Redis, keys: ReturnType<typeof createKeys>, partitions: number): Promise<number> {
  const pipeline = redis.pipeline();
  const at = Date.now();
  for (let p = 0; p < partitions; p++) pipeline.zcount(keys.timers(p), '-inf', at);
  return ((await pipeline.exec()) ?? []).reduce((a, [, v]) => a + Number(v ?? 0), 0);
}

/**
 * Redis memory of the automation keys of one tenant, per subscriber: the per-subscriber hashes
 * (`auto:` state with its counters), from up to 20,000 subscribers spread over the range
 * (MEMORY USAGE … SAMPLES 0), and the partition-wide member sets and timer sets exactly.
 */
async function automationMemory(redis: import('ioredis').Redis, keys: ReturnType<typeof createKeys>, partitions: number, tenantId: string, subscribers: number, segments: number) {
  const state = new HeraldState(redis, keys, partitions);
  const step = Math.max(1, Math.floor(subscribers / 20_000));
  const auto: string[] = [];
  for (let n = 0; n < subscribers; n += step) {
    const x = externalIdOf(n);
    const p = partitionOf(tenantId, x, partitions);
    auto.push(keys.automation(p, tenantId, x));
  }
  const segmentIds = await redis.zrange(keys.segmentIndex(tenantId), 0, segments + 10);
  const memberKeys: string[] = [];
  for (const id of segmentIds) for (let p = 0; p < partitions; p++) memberKeys.push(keys.segmentMembers(p, tenantId, id));
  const [autoBytes, memberBytes, timerBytes] = await Promise.all([
    state.memoryOf(auto), state.memoryOf(memberKeys), state.memoryOf(state.partitionKeys((p) => keys.timers(p))),
  ]);
  const pipeline = redis.pipeline();
  for (let p = 0; p < partitions; p++) pipeline.zcard(keys.timers(p));
  const timers = ((await pipeline.exec()) ?? []).reduce((a, [, v]) => a + Number(v ?? 0), 0);
  const autoPer = autoBytes / auto.length;
  const membersPer = memberBytes / subscribers;
  const timersPer = timerBytes / subscribers;
  return { autoPer, membersPer, timersPer, timers, sampled: auto.length, perSubscriber: autoPer + membersPer + timersPer };
}

