import { randomBytes } from 'node:crypto';
import { existsSync, readdirSync, readFileSync, statSync } from 'node:fs';
import { resolve } from 'node:path';
import { parseArgs } from 'node:util';
import { createKeys } from '../streams/keys.js';
import { numberOption, UsageError } from './lib/args.js';
import { bodyLoad, type BodyLoadResult } from './lib/body-load.js';
import { cpuProfEnv } from './lib/cpu-prof.js';
import { formatSummary, summarize } from './lib/cpuprofile.js';
import { commandStats, commandStatsDelta, HeraldState, SlowlogProfile, slowlogLines, waitUntil } from './lib/herald-state.js';
import { mergeLoads } from './lib/http-load.js';
import { startKoaHello } from './lib/koa-hello.js';
import { cpuDelta, cpuSnapshot, formatCpu } from './lib/proc-cpu.js';
import { BUNDLE_ID, createPushTenant, getData, postData, putApnsCredentials, registerDevices, startPeerWithProvider, subscriberId } from './lib/push-fixture.js';
import { rateLoad, type RateLoadResult } from './lib/rate-load.js';
import { startRedisWithClient } from './lib/redis.js';
import { ratioOf, round, type BenchResult, fmt, say } from './lib/result.js';
import { startRole } from './lib/role-process.js';
import { startService } from './lib/service.js';
import { startWorker } from './lib/worker.js';

export const description = 'POST /v1/messages to single subscribers (one device each) with the dispatcher delivering: accepted/s and p50/p99 vs a Koa hello-world; deliveries by the end';

export const usage = `send [--subscribers 60000] [--connections 50] [--duration 10] [--warmup 2] [--rounds 2] [--rate 5000] [--rate-duration 10]
     [--drain 30] [--worker on|off] [--partitions 64] [--cpu-prof <dir>] [--redis-profile]
  --subscribers    externalIds with one iOS device each (made through the library, timed apart); request i is sent to
                     sub-<i mod subscribers>, so every request of a run names a different one until they are used up
  --connections    autocannon connections of the closed-loop phase (both sides)
  --duration       seconds measured per side in the closed-loop phase, split into --rounds alternating rounds, after --warmup
  --rate           messages/s offered in the open-loop phase (0 skips it): latency at the target rate, backlog and all
  --rate-duration  seconds of the open-loop phase
  --drain          seconds to wait after the load for the dispatcher to deliver what was accepted (bounded)
  --worker         on (default): bin/worker.ts applies the $send events too; off: not started
  --cpu-prof       write V8 CPU profiles of the web and dispatcher children into <dir>/send/ and print their summaries
  --redis-profile  log every top-level Redis command's time (SLOWLOG, threshold 0) during the closed loop's Herald rounds
                     and print Redis time per call and per message of each script by name (slows Redis: for where the
                     time goes, not for the figures)`;

const SLUG = 'bench-send';
const TARGET_PER_S = 5_000;
const TARGET_P99_MS = 50;
const QUEUED = '"status":"queued"';

const codes = (c: Record<string, number>) => Object.entries(c).map(([k, n]) => `${k}×${n}`).join(' ') || '-';

type MessageView = { id: string; status: string; counts: Record<string, number> };

export async function run(args: string[]): Promise<BenchResult> {
  const { values } = parseArgs({
    args,
    strict: true,
    options: {
      subscribers: { type: 'string' },
      connections: { type: 'string' },
      duration: { type: 'string' },
      warmup: { type: 'string' },
      rounds: { type: 'string' },
      rate: { type: 'string' },
      'rate-duration': { type: 'string' },
      drain: { type: 'string' },
      worker: { type: 'string', default: 'on' },
      partitions: { type: 'string' },
      'cpu-prof': { type: 'string' },
      'redis-profile': { type: 'boolean', default: false },
    },
  });
  const subscribers = Math.round(numberOption(values.subscribers, 'subscribers', 60_000, 100, 1_000_000));
  const connections = Math.round(numberOption(values.connections, 'connections', 50, 1, 1000));
  const duration = numberOption(values.duration, 'duration', 10, 1, 60);
  const warmup = numberOption(values.warmup, 'warmup', 2, 0, 30);
  const rounds = Math.round(numberOption(values.rounds, 'rounds', 2, 1, 10));
  const rate = Math.round(numberOption(values.rate, 'rate', TARGET_PER_S, 0, 100_000));
  const rateDuration = numberOption(values['rate-duration'], 'rate-duration', 10, 1, 60);
  const drainS = numberOption(values.drain, 'drain', 30, 0, 300);
  if (values.worker !== 'on' && values.worker !== 'off') throw new UsageError(`--worker must be on or off, got "${values.worker}"`);
  const withWorker = values.worker === 'on';
  const partitions = Math.round(numberOption(values.partitions, 'partitions', 64, 1, 4096));
  const profDir = values['cpu-prof'] ? resolve(values['cpu-prof'], 'send') : null;
  const prefix = `bench-send-${process.pid}:`;
  const startedWall = Date.now();

  // One body per subscriber, made once: the load generator only copies buffers.
  const bodies = Array.from({ length: subscribers }, (_, i) => Buffer.from(JSON.stringify({ to: subscriberId(i), title: 'Bench', body: `Hello ${subscriberId(i)}` })));

  const stops: Array<() => Promise<void>> = [];
  try {
    const { server: redis, client } = await startRedisWithClient(stops);
    const keys = createKeys(prefix);
    const state = new HeraldState(client, keys, partitions);

    // The APNs peer, in its own process, with the provider key Herald will be given.
    const { provider, peer } = await startPeerWithProvider(stops);

    say(`send: ${fmt(subscribers)} subscribers with one iOS device each; setting up through the library…`);
    const tenant = await createPushTenant(client, keys, SLUG, partitions);
    const registerS = await registerDevices(client, keys, tenant.scope, 0, subscribers + 1, 128, (n) => n % 20_000 === 0 && say(`  registered ${fmt(n)}`));
    say(`setup: registerSubscription ×${fmt(subscribers + 1)} in ${registerS.toFixed(1)} s (${fmt((subscribers + 1) / registerS)}/s)`);

    const env: Record<string, string> = {
      HERALD_PARTITIONS: String(partitions),
      HERALD_ENCRYPTION_KEY: randomBytes(32).toString('hex'),
      APNS_HOST: '127.0.0.1', APNS_SANDBOX_HOST: '127.0.0.1', APNS_PORT: String(peer.port), APNS_CA_FILE: peer.caFile,
    };
    const profEnv = profDir ? cpuProfEnv(profDir) : {};
    const web = await startService({ redisUrl: redis.url, keyPrefix: prefix, env: { ...env, ...profEnv } });
    let webRunning = true;
    stops.push(async () => {
      if (webRunning) await web.stop();
    });
    await putApnsCredentials(web.url, tenant.tenantKey, provider, BUNDLE_ID);
    let catchUpS: number | null = null;
    if (withWorker) {
      const worker = await startWorker({ redisUrl: redis.url, keyPrefix: prefix, env });
      stops.push(worker.stop);
      const t0 = performance.now();
      if (!(await waitUntil(async () => (await state.pendingAndUnread()) === 0, 300_000, 250))) throw new Error('the worker did not catch up with the set-up events within 300 s');
      catchUpS = (performance.now() - t0) / 1000;
      say(`worker: applied the set-up events in ${catchUpS.toFixed(1)} s`);
    }
    const dispatcher = await startRole({ role: 'dispatcher', redisUrl: redis.url, keyPrefix: prefix, env: { ...env, ...profEnv } });
    let dispatcherRunning = true;
    stops.push(async () => {
      if (dispatcherRunning) await dispatcher.stop();
    });
    const hello = await startKoaHello();
    stops.push(hello.stop);

    // Probe (and warm the dispatcher: it finds the tenant's queue within 2 s and opens its APNs session).
    const probe = await postData<MessageView>(web.url, tenant.tenantKey, '/v1/messages', { to: subscriberId(subscribers), title: 'Bench', body: 'probe' });
    if (probe.status !== 202) throw new Error(`POST /v1/messages answered ${probe.status}: ${JSON.stringify(probe.data).slice(0, 300)}`);
    let probeView: MessageView | null = null;
    await waitUntil(async () => {
      probeView = await getData<MessageView>(web.url, tenant.tenantKey, `/v1/messages/${probe.data.id}`);
      return ['completed', 'failed', 'canceled'].includes(probeView.status);
    }, 30_000, 100);
    const pv = probeView as MessageView | null;
    if (pv?.status !== 'completed' || pv.counts.sent !== 1) throw new Error(`the probe message did not reach the peer: ${JSON.stringify(pv)}\ndispatcher: ${dispatcher.child.stderr()}`);

    const completedCount = () => client.zcard(keys.messagesByStatus(tenant.tenant.id, 'completed'));
    const messageCount = () => client.zcard(keys.messageIndex(tenant.tenant.id));
    const headers = { authorization: `Bearer ${tenant.tenantKey}` };
    const herald = { url: `${web.url}/v1/messages`, headers, bodies, connections, count: QUEUED };
    const helloSide = { url: `${hello.url}/`, bodies, connections };
    let next = 0;

    // Closed loop: autocannon, alternating rounds of hello-world and Herald.
    if (warmup > 0) {
      await bodyLoad({ ...helloSide, duration: warmup });
      next = (await bodyLoad({ ...herald, start: next, duration: warmup })).next;
    }
    const slowlog = values['redis-profile'] ? new SlowlogProfile(client, 500_000) : null;
    const stats0 = await commandStats(client);
    const peer0 = await peer.stats();
    const completed0 = await completedCount();
    const messages0 = await messageCount();
    const heralds: BodyLoadResult[] = [];
    const hellos: BodyLoadResult[] = [];
    const cores = new Map<string, number>();
    const slowlogs: (Awaited<ReturnType<SlowlogProfile['collect']>> | undefined)[] = [];
    for (let i = 0; i < rounds; i++) {
      const order = i % 2 === 0 ? (['hello', 'herald'] as const) : (['herald', 'hello'] as const);
      for (const side of order) {
        if (side === 'hello') hellos.push(await bodyLoad({ ...helloSide, duration: duration / rounds }));
        else {
          const c0 = cpuSnapshot();
          await slowlog?.start();
          const r = await bodyLoad({ ...herald, start: next, duration: duration / rounds });
          slowlogs.push(await slowlog?.collect());
          for (const row of cpuDelta(c0, cpuSnapshot())) cores.set(row.label, (cores.get(row.label) ?? 0) + row.cores / rounds);
          next = r.next;
          heralds.push(r);
        }
      }
    }
    const stats1 = await commandStats(client);
    const base = mergeLoads(hellos);
    const measured = mergeLoads(heralds);
    const accepted = measured.statusCodes['202'] ?? 0;
    const acceptedPerSec = measured.durationS > 0 ? accepted / measured.durationS : 0;
    const queuedAnswers = heralds.reduce((a, r) => a + r.matches, 0);
    const completedAfterClosed = await completedCount();
    const messagesAfterClosed = await messageCount();

    // Open loop at the target rate: the latency a steady 5,000/s would see, the dispatcher's backlog included.
    let fixed: RateLoadResult | null = null;
    let fixedAccepted = 0;
    if (rate > 0) {
      fixed = await rateLoad({ url: herald.url, headers, bodies, start: next, rate, duration: rateDuration, maxInFlight: 512 });
      next = fixed.next;
      fixedAccepted = fixed.statusCodes['202'] ?? 0;
    }
    const loadEnded = performance.now();
    const completedAtLoadEnd = await completedCount();
    const messagesAtLoadEnd = await messageCount();

    // Deliveries: how far the dispatcher got, then a bounded wait for the rest.
    say(`load done: ${fmt(messagesAtLoadEnd - messages0)} messages accepted in the measured phases; ${fmt(completedAtLoadEnd - completed0)} of them delivered so far; waiting up to ${drainS} s…`);
    await waitUntil(async () => (await completedCount()) - completed0 >= messagesAtLoadEnd - messages0, drainS * 1000, 500);
    const drainedS = (performance.now() - loadEnded) / 1000;
    const completedEnd = await completedCount();
    const peerEnd = await peer.stats();
    const deliveredEnd = completedEnd - completed0;
    const deliveredDuringLoad = completedAtLoadEnd - completed0;
    const deliveryRate = (completedEnd - completedAtLoadEnd) / Math.max(0.001, drainedS);

    // The CPU profiles are written when the children exit.
    const profileLines: string[] = [];
    if (profDir) {
      dispatcherRunning = false;
      await dispatcher.stop();
      webRunning = false;
      await web.stop();
      const files = existsSync(profDir) ? readdirSync(profDir).filter((f) => f.endsWith('.cpuprofile') && statSync(resolve(profDir, f)).mtimeMs >= startedWall) : [];
      for (const f of files.sort()) profileLines.push(`CPU profile ${resolve(profDir, f)}`, formatSummary(summarize(JSON.parse(readFileSync(resolve(profDir, f), 'utf8')), 20)));
      if (files.length === 0) profileLines.push(`no CPU profile was written in ${profDir}`);
    }

    const ratio = ratioOf(acceptedPerSec, base.requestsPerSec);
    const met = acceptedPerSec >= TARGET_PER_S && measured.p99Ms <= TARGET_P99_MS;
    const rateMet = fixed ? fixedAccepted / fixed.durationS >= 0.98 * rate && fixed.p99Ms <= TARGET_P99_MS : null;
    const line = (name: string, perSec: number, p50: number, p99: number, errors: number, answers: string) =>
      `${name.padEnd(34)}${fmt(perSec).padStart(10)}${p50.toFixed(2).padStart(9)}${p99.toFixed(2).padStart(9)}${String(errors).padStart(8)}   ${answers}`;
    const out = [
      '',
      `closed loop: autocannon in this process, ${connections} connections, ${duration} s per side in ${rounds} alternating round(s) after ${warmup} s warm-up; `
        + `every request names another externalId (${fmt(subscribers)} in the set); web, dispatcher${withWorker ? ', worker' : ''}, peer and redis-server are separate processes on 2 cores`,
      '',
      `${''.padEnd(34)}${'req/s'.padStart(10)}${'p50 ms'.padStart(9)}${'p99 ms'.padStart(9)}${'errors'.padStart(8)}   answers`,
      line('koa-hello-world', base.requestsPerSec, base.p50Ms, base.p99Ms, base.errors + base.timeouts, codes(base.statusCodes)),
      line('POST /v1/messages (202 accepted)', acceptedPerSec, measured.p50Ms, measured.p99Ms, measured.errors + measured.timeouts, codes(measured.statusCodes)),
      fixed ? line(`open loop at ${fmt(rate)}/s`, fixedAccepted / fixed.durationS, fixed.p50Ms, fixed.p99Ms, fixed.errors, `${codes(fixed.statusCodes)}${fixed.skipped ? `, ${fmt(fixed.skipped)} skipped (512 in flight)` : ''}`) : null,
      '',
      `ratio ${ratio} (accepted/s / hello-world req/s); target ≥ ${fmt(TARGET_PER_S)}/s accepted with p99 ≤ ${TARGET_P99_MS} ms: closed loop ${met ? 'met' : 'NOT met'}`
        + `${rateMet === null ? '' : `, open loop at ${fmt(rate)}/s ${rateMet ? 'met' : 'NOT met'}`}`,
      `deliveries: ${fmt(deliveredDuringLoad)} of ${fmt(messagesAtLoadEnd - messages0)} messages completed by the end of the load (${fmt(messagesAfterClosed - messages0)} after the closed loop, `
        + `${fmt(completedAfterClosed - completed0)} delivered by then); ${fmt(deliveredEnd)} after ${drainedS.toFixed(1)} s more `
        + `(${fmt(deliveryRate)} messages/s while draining); the peer answered ${fmt(peerEnd.accepted - peer0.accepted)} × 200, ${fmt(peerEnd.rejected - peer0.rejected)} errors`,
      `answers with "status":"queued" in the closed loop: ${fmt(queuedAnswers)}`,
      formatCpu([...cores].map(([label, c]) => ({ label, cores: c })).sort((a, b) => b.cores - a.cores)) + ' (closed loop, Herald side)',
      'redis commands during the closed loop (INFO commandstats):',
      ...commandStatsDelta(stats0, stats1, 12).lines,
      ...slowlogLines(slowlogs, queuedAnswers, 'message accepted'),
      ...profileLines,
    ];
    say(out.filter((l) => l !== null).join('\n'));

    return {
      bench: 'send',
      metric: 'accepted_per_s',
      value: round(acceptedPerSec, 1),
      unit: 'messages/s',
      baseline: { name: 'koa-hello-world', value: round(base.requestsPerSec, 1) },
      ratio,
      target: TARGET_PER_S,
      target_kind: 'value: messages/s accepted (202) in the closed loop, with p99 ≤ 50 ms',
      met,
      p50_ms: round(measured.p50Ms, 3),
      p99_ms: round(measured.p99Ms, 3),
      baseline_p50_ms: round(base.p50Ms, 3),
      baseline_p99_ms: round(base.p99Ms, 3),
      accepted,
      errors: measured.errors + measured.timeouts,
      non_202: measured.total - accepted,
      rate_offered: rate || null,
      rate_accepted_per_s: fixed ? round(fixedAccepted / fixed.durationS, 1) : null,
      rate_p50_ms: fixed ? round(fixed.p50Ms, 3) : null,
      rate_p99_ms: fixed ? round(fixed.p99Ms, 3) : null,
      rate_skipped: fixed ? fixed.skipped : null,
      rate_met: rateMet,
      messages_accepted: messagesAtLoadEnd - messages0,
      delivered_by_load_end: deliveredDuringLoad,
      delivered_after_drain: deliveredEnd,
      drain_s: round(drainedS, 1),
      delivery_rate_while_draining: round(deliveryRate, 1),
      peer_accepted: peerEnd.accepted - peer0.accepted,
      subscribers,
      connections,
      duration_s: duration,
      warmup_s: warmup,
      rounds,
      worker: withWorker,
      setup_register_s: round(registerS, 2),
      setup_worker_catch_up_s: catchUpS === null ? null : round(catchUpS, 2),
      cpu_cores: Object.fromEntries([...cores].map(([k, v]) => [k, round(v, 2)])),
    };
  } finally {
    for (const stop of stops.reverse()) await stop().catch(() => {});
  }
}
