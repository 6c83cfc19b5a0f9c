import { randomBytes } from 'node:crypto';
import { existsSync, readFileSync } from 'node:fs';
import { resolve } from 'node:path';
import { parseArgs } from 'node:util';
import { createKeys } from '../streams/keys.js';
import { numberOption, UsageError } from './lib/args.js';
import { h2Load } from './lib/apns-h2-client.js';
import { cpuProfEnv } from './lib/cpu-prof.js';
import { formatSummary, summarize } from './lib/cpuprofile.js';
import { commandStats, commandStatsDelta, HeraldState, waitUntil } from './lib/herald-state.js';
import { cpuDelta, cpuSnapshot, formatCpu } from './lib/proc-cpu.js';
import { BUNDLE_ID, createPushTenant, getData, joinTopic, makeTopic, postData, putApnsCredentials, registerDevices, startPeerWithProvider, subscriberId } from './lib/push-fixture.js';
import { startRedisWithClient } from './lib/redis.js';
import { ratioOf, round, type BenchResult, fmt, say } from './lib/result.js';
import { RssSampler, startRole } from './lib/role-process.js';
import { startService } from './lib/service.js';
import { startWorker } from './lib/worker.js';

export const description = 'one message to a topic of N push subscriptions, delivered to a local APNs peer: notifications/s vs a bare http2 client, dispatcher peak RSS, Redis bytes per delivery';

export const usage = `fanout [--members 100000] [--chunk-size N] [--max-concurrent N] [--rate-limit N] [--concurrency N]
     [--worker on|off] [--partitions 64] [--setup-concurrency 128] [--timeout 360] [--cpu-prof <dir>]
  --members            subscribers in the topic, one iOS device each (created through the library, timed apart)
  --chunk-size         FANOUT_CHUNK_SIZE of the dispatcher (default: the product's, 500)
  --max-concurrent     APNS_MAX_CONCURRENT_PER_TENANT (default: the product's, 1000)
  --rate-limit         APNS_RATE_PER_TENANT_PER_SECOND (default: the product's, 20000)
  --concurrency        streams in flight of the bare http2 baseline (default: what the dispatcher can have in flight,
                         min(chunk size, max concurrent))
  --worker             on (default): bin/worker.ts runs too and applies the $send events during the fan-out; off: not started
  --timeout            seconds the fan-out may take before the bench gives up; it then reports what was sent by then
                         (completed: false, met: false)
  --cpu-prof           write a V8 CPU profile of the dispatcher child into <dir>/fanout/ and print its summary`;

const SLUG = 'bench-fanout';
const TOPIC = 'everyone';
const PRODUCT = { chunkSize: 500, maxConcurrent: 1000, rateLimit: 20_000 };
const TARGET_PER_S = 20_000;
const TARGET_RSS_MB = 300;
const CONTENT = { title: 'Bench', body: 'One message to everyone in the topic' };

const mb = (bytes: number) => bytes / 1_048_576;
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

type MessageView = { id: string; status: string; counts: Record<string, number>; startedAt: string | null; completedAt: string | null; error: string | null };

export async function run(args: string[]): Promise<BenchResult> {
  const { values } = parseArgs({
    args,
    strict: true,
    options: {
      members: { type: 'string' },
      'chunk-size': { type: 'string' },
      'max-concurrent': { type: 'string' },
      'rate-limit': { type: 'string' },
      concurrency: { type: 'string' },
      worker: { type: 'string', default: 'on' },
      partitions: { type: 'string' },
      'setup-concurrency': { type: 'string' },
      timeout: { type: 'string' },
      'cpu-prof': { type: 'string' },
    },
  });
  const members = Math.round(numberOption(values.members, 'members', 100_000, 1, 2_000_000));
  const chunkSize = Math.round(numberOption(values['chunk-size'], 'chunk-size', PRODUCT.chunkSize, 1, 10_000));
  const maxConcurrent = Math.round(numberOption(values['max-concurrent'], 'max-concurrent', PRODUCT.maxConcurrent, 1, 100_000));
  const rateLimit = Math.round(numberOption(values['rate-limit'], 'rate-limit', PRODUCT.rateLimit, 1, 1_000_000));
  const concurrency = Math.round(numberOption(values.concurrency, 'concurrency', Math.min(chunkSize, maxConcurrent), 1, 1000));
  if (values.worker !== 'on' && values.worker !== 'off') throw new UsageError(`--worker must be on or off, got "${values.worker}"`);
  const withWorker = values.worker === 'on';
  const partitions = Math.round(numberOption(values.partitions, 'partitions', 64, 1, 4096));
  const setupConcurrency = Math.round(numberOption(values['setup-concurrency'], 'setup-concurrency', 128, 1, 2000));
  const timeoutS = numberOption(values.timeout, 'timeout', 360, 5, 900);
  const profDir = values['cpu-prof'] ? resolve(values['cpu-prof'], 'fanout') : null;
  const prefix = `bench-fanout-${process.pid}:`;

  const stops: Array<() => Promise<void>> = [];
  const stopAll = async () => {
    for (const stop of stops.reverse()) await stop().catch(() => {});
    stops.length = 0;
  };
  try {
    const { server: redis, client } = await startRedisWithClient(stops);
    const keys = createKeys(prefix);
    const state = new HeraldState(client, keys, partitions);

    // The APNs peer, in its own process, with the provider key Herald will be given.
    const { provider, peer } = await startPeerWithProvider(stops);

    // The audience, straight through the library (timed apart: not part of the figures).
    say(`fanout: ${fmt(members)} subscribers with one iOS device each in topic "${TOPIC}"; setting up through the library (${setupConcurrency} at a time)…`);
    const tenant = await createPushTenant(client, keys, SLUG, partitions);
    const registerS = await registerDevices(client, keys, tenant.scope, 0, members + 1, setupConcurrency, (n) => say(`  registered ${fmt(n)}`));
    const topic = await makeTopic(client, keys, tenant, TOPIC);
    const joinS = await joinTopic(client, keys, tenant.scope, topic, 0, members, 1000, 4, (n) => say(`  joined ${fmt(Math.min(n, members))}`));
    say(`setup: registerSubscription ×${fmt(members + 1)} in ${registerS.toFixed(1)} s (${fmt((members + 1) / registerS)}/s), `
      + `addTopicMembers ×${fmt(Math.ceil(members / 1000))} chunks of 1,000 in ${joinS.toFixed(1)} s (${fmt(members / joinS)}/s)`);

    // The roles, each in its own process, pointed at the peer the way they would be at Apple.
    const env: Record<string, string> = {
      HERALD_PARTITIONS: String(partitions),
      HERALD_ENCRYPTION_KEY: randomBytes(32).toString('hex'),
      APNS_HOST: '127.0.0.1', APNS_SANDBOX_HOST: '127.0.0.1', APNS_PORT: String(peer.port), APNS_CA_FILE: peer.caFile,
      ...(values['chunk-size'] ? { FANOUT_CHUNK_SIZE: String(chunkSize) } : {}),
      ...(values['max-concurrent'] ? { APNS_MAX_CONCURRENT_PER_TENANT: String(maxConcurrent) } : {}),
      ...(values['rate-limit'] ? { APNS_RATE_PER_TENANT_PER_SECOND: String(rateLimit) } : {}),
    };
    const web = await startService({ redisUrl: redis.url, keyPrefix: prefix, env });
    stops.push(web.stop);
    await putApnsCredentials(web.url, tenant.tenantKey, provider, BUNDLE_ID);
    let catchUpS: number | null = null;
    if (withWorker) {
      const worker = await startWorker({ redisUrl: redis.url, keyPrefix: prefix, env });
      stops.push(worker.stop);
      const t0 = performance.now();
      if (!(await waitUntil(async () => (await state.pendingAndUnread()) === 0, 300_000, 250))) throw new Error('the worker did not catch up with the set-up events within 300 s');
      catchUpS = (performance.now() - t0) / 1000;
      say(`worker: applied the set-up events (${fmt(3 * members)} or so) in ${catchUpS.toFixed(1)} s`);
    }
    const dispatcher = await startRole({ role: 'dispatcher', redisUrl: redis.url, keyPrefix: prefix, env: { ...env, ...(profDir ? cpuProfEnv(profDir) : {}) } });
    let dispatcherRunning = true;
    stops.push(async () => {
      if (dispatcherRunning) await dispatcher.stop();
    });

    // Warm-up (not measured): one message to one device makes the dispatcher find the tenant's
    // queue (it refreshes the tenant list every 2 s) and open its APNs session.
    const warm = await postData<MessageView>(web.url, tenant.tenantKey, '/v1/messages', { to: subscriberId(members), ...CONTENT });
    if (warm.status !== 202) throw new Error(`warm-up POST /v1/messages answered ${warm.status}: ${JSON.stringify(warm.data).slice(0, 300)}`);
    let warmView: MessageView | null = null;
    await waitUntil(async () => {
      warmView = await getData<MessageView>(web.url, tenant.tenantKey, `/v1/messages/${warm.data.id}`);
      return ['completed', 'failed', 'canceled'].includes(warmView.status);
    }, 30_000, 100);
    const wv = warmView as MessageView | null;
    if (wv?.status !== 'completed' || wv.counts.sent !== 1) {
      throw new Error(`the warm-up message did not reach the peer: ${JSON.stringify(wv)}\ndispatcher: ${dispatcher.child.stderr()}`);
    }

    // The ceiling: a bare http2 client to the same peer, same payload, same streams in flight.
    say(`baseline: bare http2 client → APNs peer, ${fmt(members)} pushes, ${concurrency} streams in flight on one session…`);
    const base = await h2Load({
      port: peer.port, ca: peer.ca, keyId: provider.keyId, teamId: provider.teamId, privateKeyPem: provider.privateKeyPem,
      topic: BUNDLE_ID, content: CONTENT, messageId: `msg_${'0'.repeat(26)}`, total: members, concurrency,
    });
    if (base.ok !== members) say(`WARNING: the baseline got ${fmt(base.ok)} 200s of ${fmt(members)} (${JSON.stringify(base.statuses)}, ${base.errors} errors)`);

    // Before: memory (outside the inboxes, which the worker trims on its own schedule), Redis and CPU counters.
    if (withWorker) await waitUntil(async () => (await state.pendingAndUnread()) === 0, 30_000, 100);
    const used0 = await state.usedMemory();
    const inbox0 = await state.inboxMemory();
    const peer0 = await peer.stats();
    const stats0 = await commandStats(client);
    const cpu0 = cpuSnapshot();
    const rss = new RssSampler(dispatcher.pid, 100);
    const rssAtStart = rss.samples.at(-1)?.rss ?? Number.NaN;

    // The message.
    const posted = performance.now();
    const postedWall = Date.now();
    const sent = await postData<MessageView>(web.url, tenant.tenantKey, '/v1/messages', { to: { topic: TOPIC }, ...CONTENT });
    const accepted = performance.now();
    const acceptedWall = Date.now();
    if (sent.status !== 202) throw new Error(`POST /v1/messages answered ${sent.status}: ${JSON.stringify(sent.data).slice(0, 300)}`);
    const id = sent.data.id;
    say(`POST /v1/messages {to: {topic: "${TOPIC}"}} → 202 in ${(accepted - posted).toFixed(1)} ms (${id}); polling GET /v1/messages/${id} every 100 ms`);

    let view: MessageView = sent.data;
    const progress: { at: number; sent: number; rss: number }[] = [];
    let lastPrint = accepted;
    let doneAt: number | null = null;
    const deadline = accepted + timeoutS * 1000;
    while (performance.now() < deadline) {
      view = await getData<MessageView>(web.url, tenant.tenantKey, `/v1/messages/${id}`);
      const at = performance.now();
      progress.push({ at, sent: view.counts.sent ?? 0, rss: rss.samples.at(-1)?.rss ?? Number.NaN });
      if (['completed', 'failed', 'canceled'].includes(view.status)) {
        doneAt = at;
        break;
      }
      if (at - lastPrint >= 10_000) {
        const prev = progress.find((p) => p.at >= lastPrint) ?? progress[0]!;
        lastPrint = at;
        say(`  ${((at - accepted) / 1000).toFixed(1).padStart(6)} s  sent ${fmt(view.counts.sent ?? 0).padStart(9)}  `
          + `${fmt(((view.counts.sent ?? 0) - prev.sent) / Math.max(0.001, (at - prev.at) / 1000)).padStart(7)}/s  `
          + `pending ${fmt(view.counts.pending ?? 0).padStart(6)}  dispatcher RSS ${mb(rss.samples.at(-1)?.rss ?? 0).toFixed(0)} MB`);
      }
      await sleep(100);
    }
    const cpu1 = cpuSnapshot();
    const stats1 = await commandStats(client);
    rss.stop();
    const peer1 = await peer.stats();
    const completed = view.status === 'completed';
    // The last delivery: completedAt (ms resolution, written by the settle of the last push) when
    // the message completed; else the moment the bench gave up.
    const completedWall = view.completedAt ? Date.parse(view.completedAt) : null;
    const seconds = completed && completedWall !== null ? Math.max(0.001, (completedWall - acceptedWall) / 1000) : ((doneAt ?? performance.now()) - accepted) / 1000;
    const delivered = view.counts.sent ?? 0;
    const perSec = delivered / seconds;
    const startedWall = view.startedAt ? Date.parse(view.startedAt) : null;
    const peakRss = rss.peak;
    const hwm = rss.hwm();
    const fanoutEnd = doneAt ?? performance.now();
    const mid = accepted + (fanoutEnd - accepted) / 2;
    const firstHalfPeak = rss.peakBetween(accepted, mid);
    const secondHalfPeak = rss.peakBetween(mid, fanoutEnd);

    // After: let the worker apply the $send events, then measure memory again.
    if (withWorker) await waitUntil(async () => (await state.pendingAndUnread()) === 0, 120_000, 250);
    const used1 = await state.usedMemory();
    const inbox1 = await state.inboxMemory();
    // The delivery records themselves: every delivery hash and the message's delivery indexes.
    const ids = await client.zrange(keys.messageDeliveries(tenant.tenant.id, id), 0, -1);
    const hashBytes = await state.memoryOf(ids.map((d) => keys.delivery(tenant.tenant.id, d)));
    const indexKeys = [keys.messageDeliveries(tenant.tenant.id, id), ...['pending', 'sent', 'failed', 'skipped', 'canceled'].map((s) => keys.messageDeliveriesByStatus(tenant.tenant.id, id, s))];
    const indexBytes = await state.memoryOf(indexKeys);
    const records = Math.max(1, ids.length);
    const sampleKey = ids.length ? keys.delivery(tenant.tenant.id, ids[0]!) : null;
    const sample = sampleKey
      ? { key: sampleKey.length, fields: await client.hlen(sampleKey), encoding: String(await client.call('OBJECT', 'ENCODING', sampleKey)), bytes: await state.memoryUsage(sampleKey), value: (await client.hgetall(sampleKey)) }
      : null;
    const outsideInboxes = (used1 - inbox1) - (used0 - inbox0);

    const cpuRows = cpuDelta(cpu0, cpu1);
    const redisTop = commandStatsDelta(stats0, stats1, 14).lines;

    // The dispatcher's CPU profile is written when it exits.
    let profileLines: string[] = [];
    if (profDir) {
      const pid = dispatcher.pid;
      dispatcherRunning = false;
      await dispatcher.stop();
      const file = resolve(profDir, `dispatcher-${pid}.cpuprofile`);
      if (existsSync(file)) profileLines = [`dispatcher CPU profile: ${file}`, formatSummary(summarize(JSON.parse(readFileSync(file, 'utf8')), 20))];
      else profileLines = [`no CPU profile was written at ${file}`];
    }

    const ratio = ratioOf(perSec, base.perSec);
    const metRate = completed && delivered === members && perSec >= TARGET_PER_S;
    const metRss = mb(peakRss) <= TARGET_RSS_MB && mb(hwm) <= TARGET_RSS_MB;
    const out = [
      '',
      `settings: FANOUT_CHUNK_SIZE ${chunkSize}, APNS_MAX_CONCURRENT_PER_TENANT ${maxConcurrent}, APNS_RATE_PER_TENANT_PER_SECOND ${rateLimit}`
        + `${values['chunk-size'] || values['max-concurrent'] || values['rate-limit'] ? ' (some set by options)' : ' (product defaults)'}, `
        + `HERALD_PARTITIONS ${partitions}, worker ${withWorker ? 'on' : 'off'}; every role, the peer, the baseline client and redis-server are separate processes on 2 cores`,
      '',
      `${''.padEnd(34)}${'pushes/s'.padStart(10)}${'pushes'.padStart(10)}${'seconds'.padStart(9)}${'p50 ms'.padStart(9)}${'p99 ms'.padStart(9)}`,
      `${'bare http2 client → peer'.padEnd(34)}${fmt(base.perSec).padStart(10)}${fmt(base.ok).padStart(10)}${base.seconds.toFixed(2).padStart(9)}${base.p50Ms.toFixed(2).padStart(9)}${base.p99Ms.toFixed(2).padStart(9)}`,
      `${'herald fan-out (202 → last sent)'.padEnd(34)}${fmt(perSec).padStart(10)}${fmt(delivered).padStart(10)}${seconds.toFixed(2).padStart(9)}`,
      '',
      `message ${view.status}: counts ${JSON.stringify(view.counts)}${view.error ? `, error ${view.error}` : ''}; the peer answered ${fmt(peer1.accepted - peer0.accepted)} × 200, ${fmt(peer1.rejected - peer0.rejected)} errors`,
      `the dispatcher started the fan-out (startedAt) ${startedWall !== null ? `${fmt(startedWall - postedWall)} ms` : '-'} after the POST was sent`,
      `ratio ${ratio} (herald / bare client); target ${fmt(TARGET_PER_S)} notifications/s: ${metRate ? 'met' : 'NOT met'}`,
      `dispatcher RSS: ${mb(rssAtStart).toFixed(0)} MB before, peak ${mb(peakRss).toFixed(0)} MB sampled every 100 ms (first half ${mb(firstHalfPeak).toFixed(0)} MB, `
        + `second half ${mb(secondHalfPeak).toFixed(0)} MB), VmHWM ${mb(hwm).toFixed(0)} MB; target ≤ ${TARGET_RSS_MB} MB: ${metRss ? 'met' : 'NOT met'}`,
      `redis memory: delivery records ${fmt(hashBytes / records)} B/delivery (hash) + ${fmt(indexBytes / records)} B/delivery (message's delivery indexes) `
        + `= ${fmt((hashBytes + indexBytes) / records)} B; used_memory outside the inboxes +${fmt(outsideInboxes / Math.max(1, delivered))} B/delivery `
        + `(${mb(outsideInboxes).toFixed(1)} MB in all${withWorker ? ', with the $send events the worker applied' : ''}); raw used_memory +${mb(used1 - used0).toFixed(1)} MB`,
      sample ? `one delivery hash: ${sample.fields} fields, ${sample.encoding}, ${sample.bytes} B with its ${sample.key}-byte key name; `
        + `field and value bytes ${Object.entries(sample.value).reduce((a, [k, v]) => a + k.length + v.length, 0)}` : null,
      formatCpu(cpuRows),
      'redis commands during the fan-out (INFO commandstats; Redis 7 counts the commands scripts run too):',
      ...redisTop,
      ...profileLines,
    ];
    say(out.filter((l) => l !== null).join('\n'));

    return {
      bench: 'fanout',
      metric: 'notifications_per_s',
      value: round(perSec, 1),
      unit: 'notifications/s',
      baseline: { name: 'bare-http2-client-to-apns-peer', value: round(base.perSec, 1) },
      ratio,
      target: TARGET_PER_S,
      target_kind: 'value: notifications/s from the 202 to the last delivery',
      met: metRate && metRss,
      met_rate: metRate,
      met_rss: metRss,
      members,
      completed,
      status: view.status,
      counts: view.counts,
      seconds: round(seconds, 3),
      peer_accepted: peer1.accepted - peer0.accepted,
      baseline_seconds: round(base.seconds, 3),
      baseline_p50_ms: round(base.p50Ms, 3),
      baseline_p99_ms: round(base.p99Ms, 3),
      baseline_concurrency: concurrency,
      started_after_post_ms: startedWall !== null ? startedWall - postedWall : null,
      dispatcher_rss_start_mb: round(mb(rssAtStart), 1),
      dispatcher_rss_peak_mb: round(mb(peakRss), 1),
      dispatcher_rss_first_half_peak_mb: round(mb(firstHalfPeak), 1),
      dispatcher_rss_second_half_peak_mb: round(mb(secondHalfPeak), 1),
      dispatcher_vmhwm_mb: round(mb(hwm), 1),
      rss_target_mb: TARGET_RSS_MB,
      redis_delivery_record_bytes: round((hashBytes + indexBytes) / records, 1),
      redis_delivery_hash_bytes: round(hashBytes / records, 1),
      redis_delivery_index_bytes: round(indexBytes / records, 1),
      redis_used_memory_per_delivery_bytes: round(outsideInboxes / Math.max(1, delivered), 1),
      redis_used_memory_delta_mb: round(mb(used1 - used0), 2),
      setup_register_s: round(registerS, 2),
      setup_join_s: round(joinS, 2),
      setup_worker_catch_up_s: catchUpS === null ? null : round(catchUpS, 2),
      cpu_cores: Object.fromEntries(cpuRows.map((r) => [r.label, round(r.cores, 2)])),
      chunk_size: chunkSize,
      max_concurrent: maxConcurrent,
      rate_limit: rateLimit,
      partitions,
      worker: withWorker,
    };
  } finally {
    await stopAll();
  }
}
