import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { hostname, tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { parseArgs } from 'node:util';
import { Webhook } from 'standardwebhooks';
import { isoNow } from '../lib/clock.js';
import { newId } from '../lib/ids.js';
import { createApiKey, ensureWorkspace, type Writer } from '../streams/identity.js';
import { createKeys } from '../streams/keys.js';
import { LEDGER_FIELDS } from '../streams/ledger.js';
import { numberOption } from './lib/args.js';
import { spawnNode, stopChild } from './lib/child.js';
import { cpuProfEnv } from './lib/cpu-prof.js';
import { cpuDelta, cpuSnapshot, formatCpu } from './lib/proc-cpu.js';
import { rateLoad } from './lib/rate-load.js';
import { startRedisWithClient } from './lib/redis.js';
import { ratioOf, round, type BenchResult, fmt, say } from './lib/result.js';
import { startService } from './lib/service.js';

export const description = 'webhook deliveries/s of one dispatcher process to a local receiver; event-to-delivery latency p50/p99 at a fixed event rate';

export const usage = `webhooks [--deliveries 30000] [--rate 1000] [--duration 10] [--concurrency 20] [--baseline-requests 30000]
  --deliveries         events put in the workspace ledger before the dispatcher starts; the throughput phase sends them all
  --rate               events/s tracked through POST /v1/events (batches of 10) in the latency phase
  --duration           seconds of the latency phase (at most 60)
  --concurrency        WEBHOOK_ENDPOINT_CONCURRENCY of the dispatcher, and the baseline client's connections
  --baseline-requests  requests of the baseline (bench/lib/post-loop.ts: a bare node:http client process posting the same body to the same receiver)
  --cpu-prof           write a V8 CPU profile of the dispatcher into <dir>/webhooks/`;

const SLUG = 'bench-webhooks';
const BY_BENCH: Writer = { actor: { type: 'system', id: null }, request: null };
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

function percentile(sorted: number[], p: number): number {
  if (sorted.length === 0) return Number.NaN;
  return sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1))]!;
}

/** The receiver: answers 204 at once; notes when each webhook-id first arrived and the event's createdAt. */
type Receiver = { url: string; received: number; firstAt: Map<string, { at: number; createdAt: number }>; bodies: { raw: string; headers: Record<string, string> }[]; close: () => Promise<void> };

async function startReceiver(): Promise<Receiver> {
  const r: Receiver = { url: '', received: 0, firstAt: new Map(), bodies: [], close: async () => undefined };
  const server: Server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const at = Date.now();
      r.received++;
      const id = req.headers['webhook-id'];
      if (typeof id === 'string' && !r.firstAt.has(id)) {
        const raw = Buffer.concat(chunks).toString();
        const createdAt = /"createdAt":"([^"]+)"/.exec(raw)?.[1];
        r.firstAt.set(id, { at, createdAt: createdAt ? Date.parse(createdAt) : Number.NaN });
        if (r.firstAt.size % 1000 === 1) r.bodies.push({ raw, headers: req.headers as Record<string, string> });
      }
      res.writeHead(204).end();
    });
  });
  server.keepAliveTimeout = 30_000;
  await new Promise<void>((done) => server.listen(0, '127.0.0.1', () => done()));
  r.url = `http://127.0.0.1:${(server.address() as AddressInfo).port}/hook`;
  r.close = () => new Promise((done) => {
    server.close(() => done());
    server.closeAllConnections();
  });
  return r;
}

/** CPU seconds (user + system) a process has used, from /proc (Linux); NaN elsewhere. */
function processCpuSeconds(pid: number): number {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    return (Number(fields[11]) + Number(fields[12])) / 100;
  } catch {
    return Number.NaN;
  }
}

/** Resolves once `check` holds (polled every 20 ms) or `timeoutMs` passed. */
async function until(check: () => boolean | Promise<boolean>, timeoutMs: number): Promise<void> {
  for (const deadline = Date.now() + timeoutMs; !(await check()) && Date.now() < deadline;) await sleep(20);
}

/** Deliveries per second from the receiver's view: first to last arrival of `ids` new webhook-ids. */
function arrivalRate(r: Receiver): { count: number; spanS: number; perSecond: number; first: number } {
  const times = [...r.firstAt.values()].map((v) => v.at).sort((a, b) => a - b);
  const spanS = (times[times.length - 1]! - times[0]!) / 1000;
  return { count: times.length, spanS, perSecond: times.length / spanS, first: times[0]! };
}

export async function run(args: string[]): Promise<BenchResult> {
  const { values } = parseArgs({
    args,
    strict: true,
    options: {
      deliveries: { type: 'string' },
      rate: { type: 'string' },
      duration: { type: 'string' },
      concurrency: { type: 'string' },
      'baseline-requests': { type: 'string' },
      'cpu-prof': { type: 'string' },
    },
  });
  const deliveries = Math.round(numberOption(values.deliveries, 'deliveries', 30_000, 100, 1_000_000));
  const rate = Math.round(numberOption(values.rate, 'rate', 1_000, 10, 20_000));
  const duration = numberOption(values.duration, 'duration', 10, 2, 60);
  const concurrency = Math.round(numberOption(values.concurrency, 'concurrency', 20, 1, 1000));
  const baselineRequests = Math.round(numberOption(values['baseline-requests'], 'baseline-requests', 30_000, 1000, 1_000_000));
  const batch = 10;
  if (values['cpu-prof']) mkdirSync(resolve(values['cpu-prof'], 'webhooks'), { recursive: true });
  const prefix = `bench-webhooks-${process.pid}:`;
  const keys = createKeys(prefix);
    const stops: Array<() => Promise<void>> = [];

  try {
    const { server: redis, client: db } = await startRedisWithClient(stops);
    const receiver = await startReceiver();
    stops.push(receiver.close);

    const { workspace, tenant } = await ensureWorkspace(db, keys, SLUG, BY_BENCH);
    const workspaceKey = (await createApiKey(db, keys, { workspace, tenant: null, kind: 'workspace', scopes: ['*'], expiresAt: null, name: 'bench' }, BY_BENCH)).key;
    const tenantKey = (await createApiKey(db, keys, { workspace, tenant, kind: 'tenant', scopes: ['*'], expiresAt: null, name: 'bench' }, BY_BENCH)).key;
    const env = { WEBHOOK_ALLOW_PRIVATE_NETWORKS: '127.0.0.0/8', WEBHOOK_ENDPOINT_CONCURRENCY: String(concurrency), HERALD_PARTITIONS: '16' };
    const web = await startService({ redisUrl: redis.url, keyPrefix: prefix, script: 'bin/start.ts', roles: ['web', 'worker'], env });
    stops.push(web.stop);

    const created = await fetch(`${web.url}/v1/workspaces/${SLUG}/webhooks`, {
      method: 'POST', headers: { authorization: `Bearer ${workspaceKey}`, 'content-type': 'application/json' }, body: JSON.stringify({ url: receiver.url, events: ['*'] }),
    });
    const endpoint = ((await created.json()) as { data: { id: string; secret: string } }).data;
    if (created.status !== 201) throw new Error(`creating the endpoint answered ${created.status}`);

    // The events of the throughput phase, as the worker forwards them (stream events, ~450-byte payloads).
    await sleep(5);
    const ledger = keys.ledger(workspace.id);
    let sampleBody = '';
    for (let i = 0; i < deliveries; i += 1000) {
      const pipeline = db.pipeline();
      for (let k = i; k < Math.min(deliveries, i + 1000); k++) {
        const id = newId('event');
        const payload = {
          id: 'whe_' + id.slice(4), type: 'order.completed', apiVersion: 'v1', createdAt: isoNow(), workspace: { id: workspace.id }, tenant: { id: tenant.id },
          data: { object: { id, sequence: k + 1, name: 'order.completed', source: 'server', timestamp: isoNow(), data: { orderId: `o-${k}`, total: 42.5, currency: 'EUR', items: 3 }, subscriber: { id: newId('subscriber'), externalId: `user-${k % 1000}` }, runId: null, messageId: null, step: null } },
        };
        const raw = JSON.stringify(payload);
        if (!sampleBody) sampleBody = raw;
        pipeline.xadd(ledger, '*', LEDGER_FIELDS.kind, 'stream', LEDGER_FIELDS.payload, raw);
      }
      await pipeline.exec();
    }

    say(`webhooks: one dispatcher process (bin/dispatcher.ts, WEBHOOK_ENDPOINT_CONCURRENCY=${concurrency}) + bin/start.ts (web,worker) + private redis; `
      + 'receiver and load generator in this process (2 cores shared)');

    // Baseline: a bare node:http client in a child process posting the same body to the same receiver.
    const bodyFile = join(mkdtempSync(join(tmpdir(), 'herald-bench-webhooks-')), 'body.json');
    writeFileSync(bodyFile, sampleBody);
    const client = spawnNode('bench/lib/post-loop.ts', [receiver.url, String(baselineRequests), String(concurrency), bodyFile]);
    await until(() => client.process.exitCode !== null, 120_000);
    await stopChild(client.process);
    const baseline = arrivalRate(receiver);
    const baselineCpuUs = Number(/cpu_us=(\d+)/.exec(client.stderr())?.[1] ?? Number.NaN) / baselineRequests;
    rmSync(dirname(bodyFile), { recursive: true, force: true });
    receiver.received = 0;
    receiver.firstAt.clear();
    receiver.bodies.length = 0;
    say(`baseline: bare node:http client (bench/lib/post-loop.ts, a child process), keep-alive, ${concurrency} in flight, ${fmt(baseline.count)} POSTs of a ${sampleBody.length}-byte body: `
      + `${fmt(baseline.perSecond)} requests/s (first to last arrival); its CPU ${fmt(baselineCpuUs)} µs per request`);

    // 1. Throughput: the dispatcher starts with `deliveries` events waiting in the ledger.
    const usedBefore = Number(/^used_memory:(\d+)/m.exec(await db.info('memory'))?.[1]);
    const cpu0 = cpuSnapshot();
    const profile = values['cpu-prof'] ? cpuProfEnv(resolve(values['cpu-prof'], 'webhooks')) : {};
    const dispatcher = spawnNode('bin/dispatcher.ts', [], { REDIS_URL: redis.url, REDIS_KEY_PREFIX: prefix, LOG_LEVEL: 'error', ...env, ...profile });
    stops.push(() => stopChild(dispatcher.process, 10_000));
    const field = `dispatcher:${hostname()}:${dispatcher.process.pid}`;
    for (const deadline = Date.now() + 30_000; !(await db.hexists(keys.processes, field));) {
      if (dispatcher.process.exitCode !== null || Date.now() > deadline) throw new Error(`the dispatcher did not start:\n${dispatcher.stderr()}`);
      await sleep(50);
    }
    const successKey = keys.webhookDeliveries(workspace.id, endpoint.id, 'success');
    const dispatcherCpu0 = processCpuSeconds(dispatcher.process.pid!);
    await until(() => receiver.firstAt.size >= deliveries, 120_000);
    await until(async () => (await db.zcard(successKey)) >= deliveries, 30_000);
    const recordedAt = Date.now();
    const cpu = formatCpu(cpuDelta(cpu0, cpuSnapshot()));
    const dispatcherCpuUs = ((processCpuSeconds(dispatcher.process.pid!) - dispatcherCpu0) * 1e6) / deliveries;
    const recorded = await db.zcard(successKey);
    const { count: sent, spanS, perSecond, first } = arrivalRate(receiver);
    const recordedPerSecond = recorded / ((recordedAt - first) / 1000);
    const usedAfter = Number(/^used_memory:(\d+)/m.exec(await db.info('memory'))?.[1]);
    const duplicates = receiver.received - receiver.firstAt.size;
    let verified = 0;
    for (const b of receiver.bodies) {
      new Webhook(endpoint.secret).verify(b.raw, b.headers);
      verified++;
    }
    say('');
    say(`throughput: ${fmt(sent)} of ${fmt(deliveries)} deliveries sent in ${spanS.toFixed(2)} s (first to last arrival): ${fmt(perSecond)} deliveries/s; `
      + `all ${fmt(recorded)} recorded as success ${((recordedAt - first) / 1000).toFixed(2)} s after the first arrival (${fmt(recordedPerSecond)}/s); ${duplicates} sent twice; `
      + `${verified} sampled requests verified with standardwebhooks`);
    say(`  ${cpu}; the dispatcher's CPU: ${fmt(dispatcherCpuUs)} µs per delivery (the bare client: ${fmt(baselineCpuUs)} µs per request)`);
    say(`  redis used_memory +${fmt((usedAfter - usedBefore) / Math.max(1, recorded))} bytes per delivery (record, attempt, indexes, stored payload; the ledger entries were trimmed)`);

    // 2. Latency: events tracked at a fixed rate; time from the API's receivedAt (payload createdAt) to the receiver.
    receiver.firstAt.clear();
    const bodies = Array.from({ length: Math.ceil((rate / batch) * duration) + 10 }, (_, i) => Buffer.from(JSON.stringify({
      events: Array.from({ length: batch }, (_, k) => ({ externalId: `user-${(i * batch + k) % 500}`, name: 'page.viewed', data: { i, k } })),
    })));
    // the 500 subscribers exist before the load, so the load makes no $subscriber.created events
    await rateLoad({ url: `${web.url}/v1/events`, headers: { authorization: `Bearer ${tenantKey}` }, bodies: bodies.slice(0, 50), rate: 50, duration: 1 });
    for (const deadline = Date.now() + 20_000; receiver.firstAt.size < 1000 && Date.now() < deadline;) await sleep(50);
    await sleep(1000);
    receiver.firstAt.clear();
    const loadStart = Date.now();
    const load = await rateLoad({ url: `${web.url}/v1/events`, headers: { authorization: `Bearer ${tenantKey}` }, bodies, start: 50, rate: rate / batch, duration, maxInFlight: 256 });
    const accepted = (load.statusCodes['202'] ?? 0) * batch;
    for (const deadline = Date.now() + 30_000; receiver.firstAt.size < accepted && Date.now() < deadline;) await sleep(50);
    const lags = [...receiver.firstAt.values()].filter((v) => v.createdAt >= loadStart).map((v) => v.at - v.createdAt).sort((a, b) => a - b);
    const p50 = percentile(lags, 50);
    const p99 = percentile(lags, 99);
    const max = lags[lags.length - 1] ?? Number.NaN;
    say('');
    say(`latency: ${fmt(rate)} events/s tracked (${batch} per request) for ${duration} s; ${fmt(accepted)} accepted, ${fmt(lags.length)} delivered; `
      + `event receivedAt → receiver: p50 ${fmt(p50)} ms, p99 ${fmt(p99)} ms, max ${fmt(max)} ms (through the worker, the ledger and the dispatcher)`);

    const targetRate = 5_000;
    const targetP99 = 250;
    const met = perSecond >= targetRate && p99 <= targetP99 && lags.length >= accepted;
    say('');
    say(`${fmt(perSecond)} deliveries/s (target ≥ ${fmt(targetRate)}): ${perSecond >= targetRate ? 'met' : 'NOT met'}; latency p99 ${fmt(p99)} ms at ${fmt(rate)} events/s (target ≤ ${targetP99}): ${p99 <= targetP99 ? 'met' : 'NOT met'}`);

    return {
      bench: 'webhooks',
      metric: 'deliveries_per_s',
      value: round(perSecond, 1),
      unit: 'deliveries/s',
      baseline: { name: 'bare node:http client process, same receiver', value: round(baseline.perSecond, 1) },
      ratio: ratioOf(perSecond, baseline.perSecond),
      target: targetRate,
      target_kind: 'absolute deliveries/s from one dispatcher process, with event-to-delivery p99 ≤ 250 ms at 1,000 events/s',
      met,
      deliveries: sent,
      recorded,
      recorded_per_s: round(recordedPerSecond, 1),
      sent_twice: duplicates,
      dispatcher_cpu_us_per_delivery: round(dispatcherCpuUs, 0),
      baseline_cpu_us_per_request: round(baselineCpuUs, 0),
      redis_bytes_per_delivery: round((usedAfter - usedBefore) / Math.max(1, recorded), 0),
      latency_rate: rate,
      latency_events: lags.length,
      latency_accepted: accepted,
      p50_ms: round(p50, 1),
      p99_ms: round(p99, 1),
      max_ms: round(max, 1),
      target_p99_ms: targetP99,
      concurrency,
      duration_s: duration,
    };
  } finally {
    for (const stop of stops.reverse()) await stop().catch(() => {});
  }
}
