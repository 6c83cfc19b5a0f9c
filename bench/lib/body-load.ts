import { createHistogram, type RecordableHistogram } from 'node:perf_hooks';
import autocannon from 'autocannon';
import { countOccurrences } from './event-bodies.js';
import type { LoadResult } from './http-load.js';

/**
 * Like `httpLoad` (bench/lib/http-load.ts), but every request carries the next body of a
 * pre-generated set (one counter shared by all connections, so concurrent requests carry
 * different bodies), and the answers can be searched for a marker such as `"status":"accepted"`.
 */
export type BodyLoadOptions = {
  /** must be on 127.0.0.1 */
  url: string;
  method?: 'POST' | 'PUT' | 'PATCH';
  headers?: Record<string, string>;
  bodies: Buffer[];
  /** where in `bodies` to start; the returned `next` says where the run stopped */
  start?: number;
  connections?: number;
  /** seconds (at most 120) */
  duration: number;
  /** counted in every answer's body (2xx or not) */
  count?: string;
};

export type BodyLoadResult = LoadResult & { matches: number; next: number };

const MAX_DURATION_S = 120;

// The part of autocannon's options this helper adds to the declared ones (bench/lib/autocannon.d.ts).
type RequestSpec = {
  method: string;
  path: string;
  headers: Record<string, string>;
  setupRequest: (req: Record<string, unknown>) => Record<string, unknown>;
  onResponse?: (status: number, body: string) => void;
};
type Options = autocannon.Options & { requests: RequestSpec[] };

export async function bodyLoad(options: BodyLoadOptions): Promise<BodyLoadResult> {
  const url = new URL(options.url);
  if (url.hostname !== '127.0.0.1') throw new Error(`bodyLoad only targets 127.0.0.1, not ${url.hostname}`);
  if (options.bodies.length === 0) throw new Error('bodyLoad: no bodies');
  const duration = Math.min(options.duration, MAX_DURATION_S);
  const latencyUs: RecordableHistogram = createHistogram();
  const { bodies } = options;
  let next = options.start ?? 0;
  let matches = 0;
  const needle = options.count;
  const headers = { 'content-type': 'application/json', ...options.headers };
  const spec: RequestSpec = {
    method: options.method ?? 'POST',
    path: url.pathname + url.search,
    headers,
    setupRequest: (req) => ({ ...req, body: bodies[next++ % bodies.length] }),
    ...(needle ? { onResponse: (_status: number, body: string) => void (matches += countOccurrences(body, needle)) } : {}),
  };
  const opts: Options = {
    url: options.url,
    method: spec.method,
    headers,
    connections: options.connections ?? 50,
    pipelining: 1,
    duration,
    timeout: 10,
    requests: [spec],
  };
  const result = await new Promise<autocannon.Result>((done, fail) => {
    const instance = autocannon(opts, (err, res) => (err ? fail(err) : done(res)));
    instance.on('response', (_client, _status, _bytes, ms) => latencyUs.record(Math.max(1, Math.round(ms * 1000))));
  });
  const statusCodes: Record<string, number> = {};
  for (const [code, { count }] of Object.entries(result.statusCodeStats ?? {})) statusCodes[code] = count;
  const pct = (p: number) => (latencyUs.count > 0 ? latencyUs.percentile(p) / 1000 : 0);
  return {
    requestsPerSec: result.duration > 0 ? result.requests.total / result.duration : 0,
    p50Ms: pct(50),
    p99Ms: pct(99),
    total: result.requests.total,
    durationS: result.duration,
    errors: result.errors,
    timeouts: result.timeouts,
    non2xx: result.non2xx,
    statusCodes,
    latencyUs,
    matches,
    next: next % bodies.length,
  };
}
