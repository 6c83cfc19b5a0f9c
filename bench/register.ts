import { parseArgs } from 'node:util';
import { resolve } from 'node:path';
import { cpuProfEnv } from './lib/cpu-prof.js';
import { createApiKey, ensureWorkspace, type Writer } from '../streams/identity.js';
import { createKeys } from '../streams/keys.js';
import { connectRedis } from '../streams/redis.js';
import { numberOption, UsageError } from './lib/args.js';
import { bodyLoad } from './lib/body-load.js';
import { eventBodies } from './lib/event-bodies.js';
import { commandStats, commandStatsDelta, SlowlogProfile, slowlogLines } from './lib/herald-state.js';
import { cpuDelta, cpuSnapshot, formatCpu } from './lib/proc-cpu.js';
import { startRedis } from './lib/redis.js';
import { ratioOf, round, type BenchResult } from './lib/result.js';
import { startService } from './lib/service.js';
import { startWorker } from './lib/worker.js';

export const description = 'client registrations/s (POST /v1/client/subscriptions over many subscribers) against events/s of batch ingest in the same run';

export const usage = `register [--subscribers 200000] [--connections 32] [--duration 10] [--warmup 2] [--worker on|off] [--cpu-prof <dir>] [--redis-profile]
  --subscribers  distinct externalIds (each registration is a new device of one of them)
  --duration     seconds measured for each phase (registrations, then batch ingest for comparison)
  --worker       on (default): bin/worker.ts runs during the bench and applies the registrations' events; off: not started
  --redis-profile  log every top-level Redis command's time (SLOWLOG, threshold 0) during the measured registrations`;

const SLUG = 'bench-register';
const BY_BENCH: Writer = { actor: { type: 'system', id: null }, request: null };
const fmt = (n: number) => Math.round(n).toLocaleString('en-US');

/** Registration bodies: a new 64-hex token per body, externalIds spread over `subscribers`. */
function registrationBodies(count: number, subscribers: number, offset: number): Buffer[] {
  return Array.from({ length: count }, (_, i) => {
    const n = offset + i;
    return Buffer.from(JSON.stringify({
      externalId: `reg-${(n * 2654435761) % subscribers}`, channel: 'push', platform: 'ios', token: n.toString(16).padStart(64, '0'), // '0' padding: distinct n, distinct tokens
      environment: 'production', authorizationStatus: 'authorized', device: { appVersion: '2.1.0', osVersion: '18.1', model: 'iPhone16,2' },
    }));
  });
}

export async function run(args: string[]): Promise<BenchResult> {
  const { values } = parseArgs({ args, options: { subscribers: { type: 'string' }, connections: { type: 'string' }, duration: { type: 'string' }, warmup: { type: 'string' }, worker: { type: 'string', default: 'on' }, 'cpu-prof': { type: 'string' }, 'redis-profile': { type: 'boolean', default: false } } });
  const subscribers = numberOption(values.subscribers, 'subscribers', 200_000, 100, 10_000_000);
  const connections = numberOption(values.connections, 'connections', 32, 1, 500);
  const duration = numberOption(values.duration, 'duration', 10, 1, 60);
  const warmup = numberOption(values.warmup, 'warmup', 2, 0, 30);
  if (!Number.isFinite(subscribers)) throw new UsageError('--subscribers');
  if (values.worker !== 'on' && values.worker !== 'off') throw new UsageError(`--worker must be on or off, got "${values.worker}"`);
  const withWorker = values.worker === 'on';

  const redisServer = await startRedis();
  const keyPrefix = 'bench-register:';
  const redis = connectRedis({ url: redisServer.url });
  const keys = createKeys(keyPrefix);
  const { workspace, tenant } = await ensureWorkspace(redis, keys, SLUG, BY_BENCH);
  const clientKey = (await createApiKey(redis, keys, { workspace, tenant, kind: 'client', scopes: ['client'], expiresAt: null, name: null }, BY_BENCH)).key;
  const tenantKey = (await createApiKey(redis, keys, { workspace, tenant, kind: 'tenant', scopes: ['*'], expiresAt: null, name: null }, BY_BENCH)).key;
  const service = await startService({ redisUrl: redisServer.url, keyPrefix, env: values['cpu-prof'] ? cpuProfEnv(resolve(values['cpu-prof'], 'register')) : {} });
  const worker = withWorker ? await startWorker({ redisUrl: redisServer.url, keyPrefix }) : null;
  try {
    const url = `${service.url}/v1/client/subscriptions`;
    const headers = { authorization: `Bearer ${clientKey}`, 'content-type': 'application/json' };
    const bodies = registrationBodies(Math.max(50_000, 12_000 * (duration + warmup)), subscribers, 0);
    process.stdout.write(`register: POST /v1/client/subscriptions, ${fmt(subscribers)} subscribers, ${connections} connections, ${duration} s measured after ${warmup} s, worker ${withWorker ? 'on' : 'off'}\n`);
    let next = 0;
    if (warmup > 0) next = (await bodyLoad({ url, headers, bodies, connections, duration: warmup })).next;
    const slowlog = values['redis-profile'] ? new SlowlogProfile(redis, 500_000) : null;
    const stats0 = await commandStats(redis);
    await slowlog?.start();
    const cpu0 = cpuSnapshot();
    const reg = await bodyLoad({ url, headers, bodies, start: next, connections, duration, count: '"id":"scr_' });
    const cpu1 = cpuSnapshot();
    const profile = await slowlog?.collect();
    const stats1 = await commandStats(redis);
    const cpuRows = cpuDelta(cpu0, cpu1);
    const redisTop = commandStatsDelta(stats0, stats1, 12).lines;
    const created = reg.statusCodes['201'] ?? 0;

    const events = eventBodies({ subscribers, batch: 100, bodies: 2_000, seed: 7 });
    const ingest = await bodyLoad({ url: `${service.url}/v1/events`, headers: { authorization: `Bearer ${tenantKey}`, 'content-type': 'application/json' }, bodies: events.bodies, connections, duration, count: '"status":"accepted"' });
    const eventsPerSec = ingest.matches / ingest.durationS;

    process.stdout.write(`\n                                 req/s   p50 ms   p99 ms   answers\n`);
    process.stdout.write(`registrations (one per request) ${fmt(reg.requestsPerSec).padStart(8)} ${reg.p50Ms.toFixed(2).padStart(8)} ${reg.p99Ms.toFixed(2).padStart(8)}   ${Object.entries(reg.statusCodes).map(([c, n]) => `${c}×${n}`).join(' ')}\n`);
    process.stdout.write(`ingest (100 events per request) ${fmt(ingest.requestsPerSec).padStart(8)} ${ingest.p50Ms.toFixed(2).padStart(8)} ${ingest.p99Ms.toFixed(2).padStart(8)}   ${fmt(eventsPerSec)} events/s\n`);
    const value = round(reg.requestsPerSec, 1);
    const perReg = (label: string) => { const row = cpuRows.find((r) => r.label === label); return row && reg.requestsPerSec > 0 ? ` (${fmt((1e6 * row.cores) / reg.requestsPerSec)} µs of CPU per registration)` : ''; };
    process.stdout.write(`\nregistration phase: ${formatCpu(cpuRows)}\n  web process${perReg('bin/web.js')}, redis-server${perReg('redis-server')}, worker${perReg('bin/worker.js')}\n`);
    process.stdout.write(`redis commands during the registration phase (INFO commandstats; Redis 7 counts the commands scripts run too):\n${redisTop.join('\n')}\n`);
    // SLOWLOG keeps the last 500,000 commands (a few seconds of the phase): per registration is per claimToken call (one each)
    if (profile) process.stdout.write(`${slowlogLines([profile], profile.rows.find((r) => r.kind === 'claimToken')?.calls ?? 0, 'registration').join('\n')}\n`);
    process.stdout.write(`\nregistrations/s ${fmt(value)} (target 5,000: ${value >= 5000 ? 'met' : 'NOT met'}); ingest in the same run ${fmt(eventsPerSec)} events/s\n`);
    return {
      bench: 'register', metric: 'registrations_per_s', value, unit: 'registrations/s',
      baseline: { name: 'ingest-events-per-s-same-run', value: round(eventsPerSec, 1) }, ratio: ratioOf(value, eventsPerSec), target: 5000,
      met: value >= 5000, p50_ms: round(reg.p50Ms, 3), p99_ms: round(reg.p99Ms, 3), created, errors: reg.errors, non2xx: reg.non2xx, connections, duration_s: duration,
      cpu_cores: Object.fromEntries(cpuRows.map((r) => [r.label, round(r.cores, 2)])), worker: withWorker,
    };
  } finally {
    await worker?.stop();
    await service.stop();
    redis.disconnect();
    await redisServer.stop();
  }
}
