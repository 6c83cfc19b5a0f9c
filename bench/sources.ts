import { mkdirSync } from 'node:fs';
import { resolve } from 'node:path';
import { parseArgs } from 'node:util';
import { createHistogram, type RecordableHistogram } from 'node:perf_hooks';
import autocannon from 'autocannon';
import { webhookHeaders } from '../lib/webhook-signing.js';
import { createApiKey, ensureWorkspace, type Writer } from '../streams/identity.js';
import { createKeys } from '../streams/keys.js';
import { numberOption } from './lib/args.js';
import { bodyLoad, type BodyLoadResult } from './lib/body-load.js';
import { cpuProfEnv } from './lib/cpu-prof.js';
import { countOccurrences, eventBodies, externalIdOf, permutation, prng } from './lib/event-bodies.js';
import { commandStats, commandStatsDelta, HeraldState, waitUntil } from './lib/herald-state.js';
import { httpLoad, mergeLoads, type LoadResult } from './lib/http-load.js';
import { startKoaHello } from './lib/koa-hello.js';
import { postAll } from './lib/post-all.js';
import { cpuDelta, cpuSnapshot, formatCpu } from './lib/proc-cpu.js';
import { startRedisWithClient } from './lib/redis.js';
import { ratioOf, round, type BenchResult, fmt } from './lib/result.js';
import { startService } from './lib/service.js';
import { startWorker } from './lib/worker.js';

export const description = 'accepted inbound deliveries/s of POST /v1/sources/{id}/inbound (standard-webhooks) vs a Koa hello-world and single-event POST /v1/events, same run';

export const usage = `sources [--subscribers 10000] [--connections 32] [--duration 10] [--warmup 2] [--rounds 2] [--cpu-prof <dir>]
  --subscribers  distinct externalIds the deliveries map to (all created before anything is measured)
  --duration     seconds measured per side (hello-world, single events, deliveries), split into --rounds rounds alternating the order
  --warmup       seconds per side before measuring, not counted
  --cpu-prof     write V8 CPU profiles of the web and worker children into <dir>/sources/ (slows them a little)`;

const SLUG = 'bench-sources';
const BY_BENCH: Writer = { actor: { type: 'system', id: null }, request: null };
const PROVIDER = 'bench';
const ACCEPTED = '"status":"accepted"';
const DUPLICATE = '"status":"duplicate"';
/** Deliveries signed per second of a load: more than this machine answers, so no webhook-id is sent twice. */
const SIGNED_PER_SECOND = 15_000;
/** Bytes of each delivery's JSON payload. */
const PAYLOAD_BYTES = 300;
const TYPES = ['invoice.paid', 'invoice.created', 'customer.updated', 'subscription.renewed', 'payment.failed', 'user.signed_in'];

const codes = (r: { statusCodes: Record<string, number> }) => Object.entries(r.statusCodes).map(([c, n]) => `${c}×${n}`).join(' ') || '-';

/**
 * A provider's payload of `PAYLOAD_BYTES` bytes, in the Standard Webhooks shape (`type`, `timestamp`,
 * `data`): the source maps `data.userId` to the externalId and `type` to the name (its default);
 * the whole payload is the event's `data` (the default mapping).
 */
function payloadOf(n: number, externalId: string): Record<string, unknown> {
  const payload: Record<string, unknown> = {
    type: TYPES[n % TYPES.length],
    timestamp: new Date().toISOString(),
    data: {
      userId: externalId,
      invoice: { id: `in_${String(n).padStart(10, '0')}`, amount: 1000 + (n % 9000), currency: 'eur', plan: n % 3 === 0 ? 'pro' : 'free' },
      customer: { email: `user${n % 100_000}@example.com`, country: 'DE' },
      pad: '',
    },
  };
  const missing = PAYLOAD_BYTES - Buffer.byteLength(JSON.stringify(payload));
  (payload.data as Record<string, unknown>).pad = 'x'.repeat(Math.max(0, missing));
  return payload;
}

/** The subscriber order of the run (seeded, so two runs send the same subscribers in the same order). */
class Subscribers {
  private readonly order: Uint32Array;
  constructor(private readonly count: number) {
    this.order = permutation(count, prng(11));
  }
  of(k: number): string {
    return externalIdOf(this.order[k % this.count]!);
  }
}

type Delivery = { headers: Record<string, string>; body: Buffer };

/**
 * `count` deliveries, each with a distinct webhook-id (`msg_<run>_<k>`), signed now with `secret`
 * (the signature's timestamp must be within 5 minutes of the service's clock: call right before a load).
 */
function signDeliveries(secret: string, subscribers: Subscribers, from: number, count: number, run: string): Delivery[] {
  const nowS = Math.floor(Date.now() / 1000);
  const out: Delivery[] = new Array(count);
  for (let i = 0; i < count; i++) {
    const k = from + i;
    const body = Buffer.from(JSON.stringify(payloadOf(k, subscribers.of(k))));
    out[i] = { headers: { ...webhookHeaders([secret], `msg_${run}_${k}`, body, nowS) }, body };
  }
  return out;
}

/** Single-event bodies for `POST /v1/events` carrying the same event a delivery stores: same name, data, and a caller `id`. */
function singleEventBodies(subscribers: Subscribers, from: number, count: number, run: string): Buffer[] {
  return Array.from({ length: count }, (_, i) => {
    const k = from + i;
    const externalId = subscribers.of(k);
    return Buffer.from(JSON.stringify({ externalId, name: `${PROVIDER}.${TYPES[k % TYPES.length]}`, id: `single_${run}_${k}`, data: payloadOf(k, externalId) }));
  });
}

type SignedLoadResult = LoadResult & { accepted: number; duplicates: number; sent: number; wrapped: boolean };

// The part of autocannon's options this bench adds to the declared ones (bench/lib/autocannon.d.ts), as bench/lib/body-load.ts does.
type RequestSpec = {
  method: string;
  path: string;
  headers: Record<string, string>;
  setupRequest: (req: Record<string, unknown>) => Record<string, unknown>;
  onResponse: (status: number, body: string) => void;
};
/** autocannon's connection (lib/httpClient.js): it ends itself, without sending, once `reqsMade` reaches `responseMax`. */
type Connection = { reqsMade: number; responseMax?: number };

/**
 * Like `bodyLoad` (bench/lib/body-load.ts), but every request carries the next delivery's own
 * headers (webhook-id, webhook-timestamp, webhook-signature) as well as its body, taken in turn by
 * every connection. It ends gracefully: after `duration` s each connection sends nothing more once
 * its request in flight is answered, so every delivery sent is answered (a request cut by the stop
 * could still be stored and counted by the service, and the counts would not match the answers).
 * The rate is over the time from the start to the last answer. `sent` counts the deliveries written.
 */
async function signedLoad(options: { url: string; deliveries: Delivery[]; connections: number; duration: number }): Promise<SignedLoadResult> {
  const url = new URL(options.url);
  if (url.hostname !== '127.0.0.1') throw new Error(`signedLoad only targets 127.0.0.1, not ${url.hostname}`);
  const { deliveries } = options;
  const duration = Math.min(options.duration, 118);
  const latencyUs: RecordableHistogram = createHistogram();
  let next = 0, accepted = 0, duplicates = 0;
  const headers = { 'content-type': 'application/json' };
  const spec: RequestSpec = {
    method: 'POST',
    path: url.pathname,
    headers,
    setupRequest: (req) => {
      const d = deliveries[next++ % deliveries.length]!;
      return { ...req, headers: { ...headers, ...d.headers }, body: d.body };
    },
    onResponse: (_status, body) => {
      accepted += countOccurrences(body, ACCEPTED);
      duplicates += countOccurrences(body, DUPLICATE);
    },
  };
  // autocannon's own stop (2 s later) only if a connection hangs; `timeout` still bounds each request
  const opts = {
    url: options.url, method: 'POST', headers, connections: options.connections, pipelining: 1,
    duration: duration + 2, timeout: 10, requests: [spec],
  } as autocannon.Options;
  const started = performance.now();
  const deadline = started + duration * 1000;
  let lastAnswer = started;
  const result = await new Promise<autocannon.Result>((done, fail) => {
    const instance = autocannon(opts, (err, res) => (err ? fail(err) : done(res)));
    instance.on('response', (client, _status, _bytes, ms) => {
      latencyUs.record(Math.max(1, Math.round(ms * 1000)));
      lastAnswer = performance.now();
      // past the deadline: this connection ends instead of sending its next request (autocannon checks right after this event)
      if (lastAnswer >= deadline) (client as Connection).responseMax = (client as Connection).reqsMade;
    });
  });
  const statusCodes: Record<string, number> = {};
  for (const [code, { count }] of Object.entries(result.statusCodeStats ?? {})) statusCodes[code] = count;
  const pct = (p: number) => (latencyUs.count > 0 ? latencyUs.percentile(p) / 1000 : 0);
  const elapsedS = (lastAnswer - started) / 1000;
  return {
    requestsPerSec: elapsedS > 0 ? result.requests.total / elapsedS : 0,
    p50Ms: pct(50), p99Ms: pct(99), total: result.requests.total, durationS: elapsedS,
    errors: result.errors, timeouts: result.timeouts, non2xx: result.non2xx, statusCodes, latencyUs,
    accepted, duplicates, sent: next, wrapped: next > deliveries.length,
  };
}

type Counts = { accepted: number; duplicate: number; ignored: number; rejected: number };

export async function run(args: string[]): Promise<BenchResult> {
  const { values } = parseArgs({
    args,
    strict: true,
    options: {
      subscribers: { type: 'string' }, connections: { type: 'string' }, duration: { type: 'string' }, warmup: { type: 'string' },
      rounds: { type: 'string' }, 'cpu-prof': { type: 'string' },
    },
  });
  const subscriberCount = Math.round(numberOption(values.subscribers, 'subscribers', 10_000, 100, 1_000_000));
  const connections = Math.round(numberOption(values.connections, 'connections', 32, 1, 500));
  const duration = numberOption(values.duration, 'duration', 10, 1, 60);
  const warmup = numberOption(values.warmup, 'warmup', 2, 0, 30);
  const rounds = Math.round(numberOption(values.rounds, 'rounds', 2, 1, 10));
  const profDir = values['cpu-prof'] ? resolve(values['cpu-prof'], 'sources') : null;
  if (profDir) mkdirSync(profDir, { recursive: true });
  const segment = duration / rounds;
  const runTag = Date.now().toString(36);
  const subscribers = new Subscribers(subscriberCount);

  const stops: Array<() => Promise<void>> = [];
  try {
    const { server: redisServer, client: redis } = await startRedisWithClient(stops);
    const keyPrefix = 'bench-sources:';
    const keys = createKeys(keyPrefix);
    const { workspace, tenant } = await ensureWorkspace(redis, keys, SLUG, BY_BENCH);
    const tenantKey = (await createApiKey(redis, keys, { workspace, tenant, kind: 'tenant', scopes: ['*'], expiresAt: null, name: 'bench' }, BY_BENCH)).key;
    const env = profDir ? cpuProfEnv(profDir) : {};
    const web = await startService({ redisUrl: redisServer.url, keyPrefix, env });
    stops.push(web.stop);
    const worker = await startWorker({ redisUrl: redisServer.url, keyPrefix, env });
    stops.push(worker.stop);
    const hello = await startKoaHello();
    stops.push(hello.stop);
    const state = new HeraldState(redis, keys, 64);
    const auth = { authorization: `Bearer ${tenantKey}`, 'content-type': 'application/json' };

    // The source, through the API as a tenant would create it: the secret is generated and answered once.
    const created = await fetch(`${web.url}/v1/sources`, {
      method: 'POST', headers: auth,
      body: JSON.stringify({ name: 'bench', provider: PROVIDER, format: 'standard-webhooks', mapping: { externalId: 'data.userId' } }),
    });
    const createdText = await created.text();
    if (created.status !== 201) throw new Error(`POST /v1/sources answered ${created.status}: ${createdText.slice(0, 300)}`);
    const source = (JSON.parse(createdText) as { data: { id: string; secret: string } }).data;
    const inboundUrl = `${web.url}/v1/sources/${source.id}/inbound`;
    const eventsUrl = `${web.url}/v1/events`;
    const countsNow = async (): Promise<Counts> => {
      const res = await fetch(`${web.url}/v1/sources/${source.id}`, { headers: auth });
      if (res.status !== 200) throw new Error(`GET /v1/sources/${source.id} answered ${res.status}`);
      return (await res.json() as { data: { counts: Counts } }).data.counts;
    };

    // Every subscriber exists before anything is measured (a first sighting writes $subscriber.created and more), the worker caught up.
    const creation = eventBodies({ subscribers: subscriberCount, batch: 100, bodies: Math.ceil(subscriberCount / 100) });
    const made = await postAll({ url: eventsUrl, headers: auth, bodies: creation.bodies, concurrency: 8 });
    if ((made.statusCodes['202'] ?? 0) !== creation.bodies.length) throw new Error(`creating subscribers: ${codes(made)}, ${made.errors} errors`);
    const caughtUp = () => waitUntil(async () => (await state.pendingAndUnread()) === 0, 30_000, 250);
    await caughtUp();

    // Probes: one delivery and one single event, each answered 202 accepted.
    let k = 0;
    {
      const [d] = signDeliveries(source.secret, subscribers, k++, 1, runTag);
      const res = await fetch(inboundUrl, { method: 'POST', headers: { ...d!.headers, 'content-type': 'application/json' }, body: d!.body });
      const text = await res.text();
      if (res.status !== 202 || !text.includes(ACCEPTED)) throw new Error(`probe delivery answered ${res.status}: ${text.slice(0, 300)}`);
      const [b] = singleEventBodies(subscribers, k++, 1, runTag);
      const single = await fetch(eventsUrl, { method: 'POST', headers: auth, body: b });
      const singleText = await single.text();
      if (single.status !== 202 || !singleText.includes(ACCEPTED)) throw new Error(`probe event answered ${single.status}: ${singleText.slice(0, 300)}`);
    }
    const countsStart = await countsNow();
    const payloadBytes = signDeliveries(source.secret, subscribers, 0, 1, 'size')[0]!.body.length;

    const helloSide = (seconds: number) => httpLoad({ url: `${hello.url}/`, method: 'GET', connections, duration: seconds });
    // Each Herald side's requests are made before its load (outside its CPU figures), and returned as the load to run.
    const singleSide = (seconds: number) => {
      const bodies = singleEventBodies(subscribers, k, Math.ceil(SIGNED_PER_SECOND * seconds), runTag);
      k += bodies.length;
      return () => bodyLoad({ url: eventsUrl, headers: auth, bodies, connections, duration: seconds, count: ACCEPTED });
    };
    const inboundSide = (seconds: number) => {
      // signed right before the load: webhook-timestamp must be within 5 minutes when each arrives
      const deliveries = signDeliveries(source.secret, subscribers, k, Math.ceil(SIGNED_PER_SECOND * seconds), runTag);
      k += deliveries.length;
      return () => signedLoad({ url: inboundUrl, deliveries, connections, duration: seconds });
    };

    const inboundLoads: SignedLoadResult[] = [];
    if (warmup > 0) {
      await helloSide(warmup);
      await singleSide(warmup)();
      inboundLoads.push(await inboundSide(warmup)());
    }

    process.stdout.write(`sources: POST /v1/sources/{id}/inbound (standard-webhooks, ${payloadBytes}-byte payloads, a distinct webhook-id each) over ${fmt(subscriberCount)} subscribers; `
      + `${connections} connections, ${duration} s per side in ${rounds} round(s) after ${warmup} s of warm-up; web + worker + private redis, autocannon in this process\n`);
    const hellos: LoadResult[] = [];
    const singles: BodyLoadResult[] = [];
    const measuredInbound: SignedLoadResult[] = [];
    const cores = { single: new Map<string, number>(), inbound: new Map<string, number>() };
    const redisStats = { single: [] as string[], inbound: [] as string[] };
    const addCores = (into: Map<string, number>, rows: { label: string; cores: number }[]) => {
      for (const row of rows) into.set(row.label, (into.get(row.label) ?? 0) + row.cores / rounds);
    };
    let backlogLeft = false;
    for (let r = 0; r < rounds; r++) {
      const order = r % 2 === 0 ? (['hello', 'single', 'inbound'] as const) : (['inbound', 'single', 'hello'] as const);
      for (const side of order) {
        if (side === 'hello') {
          hellos.push(await helloSide(segment));
          continue;
        }
        // each Herald side starts with the worker caught up, so that neither pays for the other's backlog
        if (!(await caughtUp())) backlogLeft = true;
        const load = side === 'single' ? singleSide(segment) : inboundSide(segment);
        const stats0 = await commandStats(redis);
        const cpu0 = cpuSnapshot();
        const result = await load();
        if ('sent' in result) measuredInbound.push(result);
        else singles.push(result);
        addCores(cores[side], cpuDelta(cpu0, cpuSnapshot()));
        if (r === 0) redisStats[side] = commandStatsDelta(stats0, await commandStats(redis), 10).lines;
      }
    }
    inboundLoads.push(...measuredInbound);

    // What the source counted against what was answered. The deliveries' loads end gracefully, so every
    // delivery sent was answered (`unanswered` 0) unless a connection failed; a delivery whose answer
    // was lost may or may not have been stored and counted, so then only bounds can be checked.
    await waitUntil(async () => {
      const a = await countsNow();
      await new Promise((done) => setTimeout(done, 200));
      const b = await countsNow();
      return a.accepted === b.accepted;
    }, 5_000, 0);
    const countsEnd = await countsNow();
    const answered202 = inboundLoads.reduce((a, l) => a + (l.statusCodes['202'] ?? 0), 0);
    const answeredAccepted = inboundLoads.reduce((a, l) => a + l.accepted, 0);
    const answeredDuplicate = inboundLoads.reduce((a, l) => a + l.duplicates, 0);
    const unanswered = inboundLoads.reduce((a, l) => a + (l.sent - l.total), 0);
    const countedAccepted = countsEnd.accepted - countsStart.accepted;
    const countedDuplicate = countsEnd.duplicate - countsStart.duplicate;
    const countedOther = countsEnd.ignored - countsStart.ignored + countsEnd.rejected - countsStart.rejected;
    const countsMatch = answered202 === answeredAccepted + answeredDuplicate && countedOther === 0 && (unanswered === 0
      ? countedAccepted === answeredAccepted && countedDuplicate === answeredDuplicate
      : countedAccepted >= answeredAccepted && countedAccepted + countedDuplicate <= answeredAccepted + answeredDuplicate + unanswered);
    const wrapped = inboundLoads.some((l) => l.wrapped);

    const helloAll = mergeLoads(hellos);
    const single = mergeLoads(singles);
    const inbound = mergeLoads(measuredInbound);
    const singleAccepted = singles.reduce((a, l) => a + l.matches, 0);
    const inboundAccepted = measuredInbound.reduce((a, l) => a + l.accepted, 0);
    const singlePerS = single.durationS > 0 ? singleAccepted / single.durationS : 0;
    const value = inbound.durationS > 0 ? inboundAccepted / inbound.durationS : 0;
    const ratio = ratioOf(value, helloAll.requestsPerSec);
    const target = 0.5;
    const non2xx = inbound.non2xx + single.non2xx;
    const errors = inbound.errors + inbound.timeouts + single.errors + single.timeouts + helloAll.errors + helloAll.timeouts;

    const table = (label: string, l: LoadResult, perS: number) =>
      `${label.padEnd(34)}${fmt(perS).padStart(9)}${fmt(l.requestsPerSec).padStart(9)}${fmt(l.p50Ms, 2).padStart(9)}${fmt(l.p99Ms, 2).padStart(9)}   ${codes(l)}`;
    const cpuRows = (m: Map<string, number>) => [...m].map(([label, c]) => ({ label, cores: c })).sort((x, y) => y.cores - x.cores);
    const perRequest = (m: Map<string, number>, perS: number) => ['bin/web.js', 'redis-server', 'bin/worker.js']
      .map((label) => `${label.replace('bin/', '').replace('.js', '')} ${perS > 0 ? fmt((1e6 * (m.get(label) ?? 0)) / perS) : '-'} µs`).join(', ');
    const out = [
      '',
      `${''.padEnd(34)}${'ok/s'.padStart(9)}${'req/s'.padStart(9)}${'p50 ms'.padStart(9)}${'p99 ms'.padStart(9)}   answers`,
      table('koa hello-world (GET /)', helloAll, helloAll.requestsPerSec),
      table('single event (POST /v1/events)', single, singlePerS),
      table('delivery (POST …/inbound)', inbound, value),
      '  (ok/s: answers "accepted" per second; the single events carry the delivery\'s name, data and a caller id, so both store the same event with a dedupe key)',
      '',
      `single events: ${formatCpu(cpuRows(cores.single))}`,
      `  CPU per event: ${perRequest(cores.single, single.requestsPerSec)}`,
      `deliveries:    ${formatCpu(cpuRows(cores.inbound))}`,
      `  CPU per delivery: ${perRequest(cores.inbound, inbound.requestsPerSec)}`,
      '',
      'redis commands during the first single-event round (INFO commandstats; commands run by scripts are counted too):', ...redisStats.single,
      'redis commands during the first delivery round:', ...redisStats.inbound,
      '',
      `source counts: accepted +${fmt(countedAccepted)}, duplicate +${fmt(countedDuplicate)}, ignored/rejected +${fmt(countedOther)}; `
        + `answers (warm-up included): 202 ×${fmt(answered202)} (${fmt(answeredAccepted)} accepted, ${fmt(answeredDuplicate)} duplicate), sent but not answered ${fmt(unanswered)}: `
        + (countsMatch ? (unanswered === 0 ? 'equal' : 'within bounds') : 'MISMATCH'),
      `deliveries/s ${fmt(value)} / hello-world ${fmt(helloAll.requestsPerSec)} req/s = ${ratio} (target ${target}: ${ratio >= target ? 'met' : 'NOT met'}); `
        + `single events ${fmt(singlePerS)}/s, deliveries ÷ single events ${ratioOf(value, singlePerS)}`,
    ];
    if (non2xx > 0) out.push(`WARNING: ${fmt(non2xx)} non-2xx answers (deliveries: ${codes(inbound)}; single events: ${codes(single)})`);
    if (errors > 0) out.push(`WARNING: ${errors} connection errors or timeouts`);
    if (!countsMatch) out.push('WARNING: the source\'s counts do not match the answers');
    if (wrapped) out.push(`WARNING: a load used more than its ${fmt(SIGNED_PER_SECOND)}/s of signed deliveries: webhook-ids were sent twice (duplicates)`);
    if (backlogLeft) out.push('note: the worker had not caught up within 30 s before a measured side');
    if (profDir) out.push(`CPU profiles written to ${profDir} (summarize: node --import tsx bench/lib/cpuprofile.ts <file>)`);
    process.stdout.write(out.join('\n') + '\n');

    const cpuJson = (m: Map<string, number>) => Object.fromEntries(cpuRows(m).map((r) => [r.label, round(r.cores, 2)]));
    const usPer = (m: Map<string, number>, perS: number) => Object.fromEntries(['bin/web.js', 'redis-server', 'bin/worker.js'].map((label) => [label, perS > 0 ? round((1e6 * (m.get(label) ?? 0)) / perS, 0) : 0]));
    return {
      bench: 'sources',
      metric: 'deliveries_per_s',
      value: round(value, 1),
      unit: 'deliveries/s',
      baseline: { name: 'koa-hello-world', value: round(helloAll.requestsPerSec, 1) },
      ratio,
      target,
      target_kind: 'Herald\'s own (no issue sets one)',
      met: ratio >= target,
      p50_ms: round(inbound.p50Ms, 3),
      p99_ms: round(inbound.p99Ms, 3),
      baseline_p50_ms: round(helloAll.p50Ms, 3),
      baseline_p99_ms: round(helloAll.p99Ms, 3),
      single_events_per_s: round(singlePerS, 1),
      vs_single_events: ratioOf(value, singlePerS),
      single_p50_ms: round(single.p50Ms, 3),
      single_p99_ms: round(single.p99Ms, 3),
      answered_202: answered202,
      counted_accepted: countedAccepted,
      counted_duplicate: countedDuplicate,
      unanswered_at_stop: unanswered,
      counts_match: countsMatch,
      non2xx,
      status_codes: { deliveries: inbound.statusCodes, single_events: single.statusCodes },
      errors,
      cpu_cores: { deliveries: cpuJson(cores.inbound), single_events: cpuJson(cores.single) },
      cpu_us_per_delivery: usPer(cores.inbound, inbound.requestsPerSec),
      cpu_us_per_single_event: usPer(cores.single, single.requestsPerSec),
      payload_bytes: payloadBytes,
      subscribers: subscriberCount,
      connections,
      duration_s: duration,
      warmup_s: warmup,
      rounds,
    };
  } finally {
    for (const stop of stops.reverse()) await stop().catch(() => {});
  }
}
