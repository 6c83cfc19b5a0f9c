import { parseArgs } from 'node:util';
import { createApiKey, ensureWorkspace, type Writer } from '../streams/identity.js';
import { createKeys } from '../streams/keys.js';
import { connectRedis } from '../streams/redis.js';
import { numberOption, UsageError } from './lib/args.js';
import { httpLoad, mergeLoads, type LoadOptions, type LoadResult } from './lib/http-load.js';
import { startKoaFloor } from './lib/koa-floor.js';
import { startKoaHello } from './lib/koa-hello.js';
import { redisBenchmark, startRedis } from './lib/redis.js';
import { ratioOf, round, type BenchResult, fmt } from './lib/result.js';
import { startService } from './lib/service.js';
import { cpuProfEnv } from './lib/cpu-prof.js';
import { resolve } from 'node:path';

export const description = 'requests/s and p50/p99 of an authenticated route of the web role vs a Koa hello-world';

export const usage = `auth [--route whoami|keys-delete|events-list|"METHOD /path"] [--key workspace|tenant] [--expect <status>] [--cpu-prof <dir>]
     [--connections 50] [--duration 10] [--rounds 2] [--warmup 2] [--redis-requests 100000]
  --route         whoami (default): GET /v1/whoami with a tenant key; keys-delete: DELETE /v1/workspaces/{workspace}/keys/key_x with a workspace key,
                    403 missing_permission by design (keys:write is session-only) after full authentication;
                  events-list: GET /v1/events?limit=1 with a tenant key, 200;
                  or any "METHOD /path" ({workspace} is replaced by the bench workspace's slug)
  --key, --expect the key kind and the status every answer must have (defaults from the route)
  --duration      seconds measured on each side, after --warmup seconds not measured
  --rounds        the measured time is split into rounds alternating the sides (A B, B A, A B …) so that
                    drifting load from elsewhere on the machine weighs on both alike
  --redis-requests  requests of the redis-benchmark GET context figure (0 skips it)`;

type Route = { method: NonNullable<LoadOptions['method']>; path: string; key: 'workspace' | 'tenant'; expect: number; note: string };

const ROUTES: Record<string, Route> = {
  whoami: {
    method: 'GET', path: '/v1/whoami', key: 'tenant', expect: 200,
    note: 'the cheapest authenticated route: bearer parsing, key lookup (key cache), tenant resolution and the envelope, answering 200',
  },
  'keys-delete': {
    method: 'DELETE', path: '/v1/workspaces/{workspace}/keys/key_x', key: 'workspace', expect: 403,
    note: 'answers 403 missing_permission by design (keys:write is session-only): the request still goes through bearer parsing, '
      + 'key lookup (key cache), kind, workspace and scope checks and the error envelope',
  },
  'events-list': { method: 'GET', path: '/v1/events?limit=1', key: 'tenant', expect: 200, note: 'the cheapest data-plane read' },
};

const METHODS = ['GET', 'POST', 'PUT', 'PATCH', 'DELETE'] as const;
const SLUG = 'bench-auth';
const BY_BENCH: Writer = { actor: { type: 'system', id: null }, request: null };

function parseRoute(raw: string, key: string | undefined, expect: string | undefined): Route {
  let route = ROUTES[raw];
  if (!route) {
    const m = /^([A-Z]+)\s+(\/\S*)$/.exec(raw.trim());
    const method = METHODS.find((x) => x === m?.[1]);
    if (!m || !method) throw new UsageError(`--route must be ${Object.keys(ROUTES).join(', ')} or "METHOD /path", got "${raw}"`);
    route = { method, path: m[2]!, key: 'tenant', expect: 200, note: 'custom route' };
  }
  if (key !== undefined && key !== 'workspace' && key !== 'tenant') throw new UsageError(`--key must be workspace or tenant, got "${key}"`);
  return { ...route, key: (key as Route['key'] | undefined) ?? route.key, expect: numberOption(expect, 'expect', route.expect, 100, 599) };
}

const codes = (r: LoadResult) => Object.entries(r.statusCodes).map(([code, count]) => `${code}×${count}`).join(' ') || '-';

export async function run(args: string[]): Promise<BenchResult> {
  const { values } = parseArgs({
    args,
    strict: true,
    options: {
      route: { type: 'string', default: 'whoami' },
      key: { type: 'string' },
      expect: { type: 'string' },
      connections: { type: 'string' },
      duration: { type: 'string' },
      warmup: { type: 'string' },
      rounds: { type: 'string' },
      'redis-requests': { type: 'string' },
      'cpu-prof': { type: 'string' },
    },
  });
  const route = parseRoute(values.route!, values.key, values.expect);
  const connections = numberOption(values.connections, 'connections', 50, 1, 1000);
  const duration = numberOption(values.duration, 'duration', 10, 1, 60);
  const warmup = numberOption(values.warmup, 'warmup', 2, 0, 30);
  const rounds = Math.round(numberOption(values.rounds, 'rounds', 2, 1, 10));
  const redisRequests = numberOption(values['redis-requests'], 'redis-requests', 100_000, 0, 10_000_000);
  const prefix = `bench-auth-${process.pid}:`;

  const stops: Array<() => Promise<void>> = [];
  try {
    const redis = await startRedis();
    stops.push(redis.stop);

    let redisGet: number | null = null;
    if (redisRequests > 0) redisGet = (await redisBenchmark({ port: redis.port, requests: redisRequests, test: 'get' })).opsPerSec;

    // The workspace and keys, written straight through the library in this process.
    const client = connectRedis({ url: redis.url });
    const keys = createKeys(prefix);
    const { workspace, tenant } = await ensureWorkspace(client, keys, SLUG, BY_BENCH);
    const apiKey = (await createApiKey(client, keys, { workspace, tenant, kind: route.key, scopes: ['*'], expiresAt: null, name: 'bench' }, BY_BENCH)).key;
    await client.quit();

    const service = await startService({ redisUrl: redis.url, keyPrefix: prefix, env: values['cpu-prof'] ? cpuProfEnv(resolve(values['cpu-prof'], 'auth')) : {} });
    stops.push(service.stop);
    const hello = await startKoaHello();
    stops.push(hello.stop);
    const floor = route.path === '/v1/whoami' ? await startKoaFloor() : null;
    if (floor) stops.push(floor.stop);

    const path = route.path.replaceAll('{workspace}', SLUG);
    const headers = { authorization: `Bearer ${apiKey}` };
    const probe = await fetch(service.url + path, { method: route.method, headers });
    const probeBody = await probe.text();
    if (probe.status !== route.expect) {
      throw new Error(`${route.method} ${path} answered ${probe.status}, expected ${route.expect} (pass --expect to change): ${probeBody.slice(0, 300)}`);
    }

    const sides: Record<'hello' | 'herald' | 'floor', LoadOptions | null> = {
      hello: { url: `${hello.url}/`, method: 'GET' as const, headers: {} },
      herald: { url: service.url + path, method: route.method, headers },
      // whoami only: the same body through Herald's envelope, error middleware and router, no auth
      floor: floor ? { url: `${floor.url}/v1/whoami`, method: 'GET' as const, headers: {} } : null,
    };
    if (warmup > 0) {
      for (const side of Object.values(sides)) if (side) await httpLoad({ ...side, connections, duration: warmup });
    }
    const runs: Record<keyof typeof sides, LoadResult[]> = { hello: [], herald: [], floor: [] };
    for (let i = 0; i < rounds; i++) {
      const order = i % 2 === 0 ? (['hello', 'floor', 'herald'] as const) : (['herald', 'floor', 'hello'] as const);
      for (const name of order) {
        const side = sides[name];
        if (side) runs[name].push(await httpLoad({ ...side, connections, duration: duration / rounds }));
      }
    }
    const base = mergeLoads(runs.hello);
    const measured = mergeLoads(runs.herald);
    const floorLoad = runs.floor.length ? mergeLoads(runs.floor) : null;
    const floorRatio = floorLoad ? ratioOf(floorLoad.requestsPerSec, base.requestsPerSec) : null;

    const unexpected = measured.total - (measured.statusCodes[String(route.expect)] ?? 0);
    const ratio = ratioOf(measured.requestsPerSec, base.requestsPerSec);
    const target = 0.8;
    const line = (name: string, r: LoadResult) =>
      `${name.padEnd(22)}${fmt(r.requestsPerSec).padStart(10)}${fmt(r.p50Ms, 2).padStart(9)}${fmt(r.p99Ms, 2).padStart(9)}${String(r.errors).padStart(8)}   ${codes(r)}`;
    const out = [
      `auth: ${route.method} ${path} with a ${route.key} key; ${route.note}`,
      `load: autocannon in this process, ${connections} connections; per side ${warmup} s warm-up, then ${duration} s measured in ${rounds} alternating round(s)`
        + ' (2 cores: load generator and server share them)',
      redisGet === null ? null : `context: redis-benchmark GET -P 32 -n ${redisRequests} on the private redis: ${fmt(redisGet)} ops/s`,
      '',
      `${''.padEnd(22)}${'req/s'.padStart(10)}${'p50 ms'.padStart(9)}${'p99 ms'.padStart(9)}${'errors'.padStart(8)}   answers`,
      line('koa-hello-world', base),
      floorLoad ? line('stack floor (no auth)', floorLoad) : null,
      line(`herald ${route.key} key`, measured),
      '',
      `ratio ${ratio} (herald / hello-world), target ${target}: ${ratio >= target ? 'met' : 'NOT met'}`,
      floorLoad ? `stack floor ${floorRatio} of hello-world: Herald's envelope, error middleware and router with the same body, no authentication `
        + `and no Redis; authentication and the route cost ${ratioOf(measured.requestsPerSec, floorLoad.requestsPerSec)} of that floor` : null,
      unexpected > 0 ? `WARNING: ${unexpected} answers were not ${route.expect}; the figure is not trustworthy` : null,
    ];
    process.stdout.write(out.filter((l) => l !== null).join('\n') + '\n');

    return {
      bench: 'auth',
      metric: 'requests_per_s',
      value: round(measured.requestsPerSec, 1),
      unit: 'req/s',
      baseline: { name: 'koa-hello-world', value: round(base.requestsPerSec, 1) },
      ratio,
      target,
      met: ratio >= target,
      route: `${route.method} ${route.path}`,
      key_kind: route.key,
      status: route.expect,
      p50_ms: round(measured.p50Ms, 3),
      p99_ms: round(measured.p99Ms, 3),
      baseline_p50_ms: round(base.p50Ms, 3),
      baseline_p99_ms: round(base.p99Ms, 3),
      errors: measured.errors + measured.timeouts,
      unexpected_responses: unexpected,
      connections,
      duration_s: duration,
      warmup_s: warmup,
      rounds,
      redis_get_ops_per_s: redisGet === null ? null : round(redisGet, 0),
      floor_req_per_s: floorLoad ? round(floorLoad.requestsPerSec, 1) : null,
      floor_ratio: floorRatio,
    };
  } finally {
    for (const stop of stops.reverse()) await stop().catch(() => {});
  }
}
