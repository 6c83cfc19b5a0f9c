import { createHistogram, type RecordableHistogram } from 'node:perf_hooks';
import autocannon from 'autocannon';

export type LoadOptions = {
  /** must be on 127.0.0.1 */
  url: string;
  method?: 'GET' | 'POST' | 'PUT' | 'PATCH' | 'DELETE';
  headers?: Record<string, string>;
  body?: string;
  connections?: number;
  pipelining?: number;
  /** seconds; the run ends after this long, or… */
  duration?: number;
  /** …after this many requests (`duration`, default 120 s, still caps the time) */
  amount?: number;
};

export type LoadResult = {
  requestsPerSec: number;
  /** latency percentiles in ms (µs resolution) over every answer, 2xx or not */
  p50Ms: number;
  p99Ms: number;
  total: number;
  durationS: number;
  /** connection errors and timeouts */
  errors: number;
  timeouts: number;
  non2xx: number;
  /** answers by status code */
  statusCodes: Record<string, number>;
  /** every answer's latency in µs (for `mergeLoads`) */
  latencyUs: RecordableHistogram;
};

const MAX_DURATION_S = 120;

function percentileMs(h: RecordableHistogram, p: number): number {
  return h.count > 0 ? h.percentile(p) / 1000 : 0;
}

/** Loads `url` with autocannon (in this process) for a bounded time or count. */
export async function httpLoad(options: LoadOptions): Promise<LoadResult> {
  const host = new URL(options.url).hostname;
  if (host !== '127.0.0.1') throw new Error(`httpLoad only targets 127.0.0.1, not ${host}`);
  const duration = Math.min(options.duration ?? (options.amount ? MAX_DURATION_S : 10), MAX_DURATION_S);
  // autocannon's own latency histogram has 1 ms resolution and skips non-2xx; this one keeps µs and every answer.
  const latencyUs = createHistogram();
  const result = await new Promise<autocannon.Result>((done, fail) => {
    // autocannon ignores `duration` when `amount` is set: the timer caps a count-bounded run too.
    let timer: NodeJS.Timeout | undefined;
    const instance = autocannon({
      url: options.url,
      method: options.method ?? 'GET',
      headers: options.headers ?? {},
      body: options.body,
      connections: options.connections ?? 50,
      pipelining: options.pipelining ?? 1,
      duration,
      amount: options.amount,
      timeout: 10,
    }, (err, res) => {
      clearTimeout(timer);
      if (err) fail(err);
      else done(res);
    });
    instance.on('response', (_client, _status, _bytes, ms) => latencyUs.record(Math.max(1, Math.round(ms * 1000))));
    if (options.amount) timer = setTimeout(() => instance.stop(), duration * 1000);
  });
  const statusCodes: Record<string, number> = {};
  for (const [code, { count }] of Object.entries(result.statusCodeStats ?? {})) statusCodes[code] = count;
  return {
    requestsPerSec: result.duration > 0 ? result.requests.total / result.duration : 0,
    p50Ms: percentileMs(latencyUs, 50),
    p99Ms: percentileMs(latencyUs, 99),
    total: result.requests.total,
    durationS: result.duration,
    errors: result.errors,
    timeouts: result.timeouts,
    non2xx: result.non2xx,
    statusCodes,
    latencyUs,
  };
}

/** Several runs against the same target as one: totals added, rate over the summed time, percentiles over every answer. */
export function mergeLoads(runs: LoadResult[]): LoadResult {
  const latencyUs = createHistogram();
  const statusCodes: Record<string, number> = {};
  let total = 0, durationS = 0, errors = 0, timeouts = 0, non2xx = 0;
  for (const r of runs) {
    latencyUs.add(r.latencyUs);
    for (const [code, count] of Object.entries(r.statusCodes)) statusCodes[code] = (statusCodes[code] ?? 0) + count;
    total += r.total;
    durationS += r.durationS;
    errors += r.errors;
    timeouts += r.timeouts;
    non2xx += r.non2xx;
  }
  return {
    requestsPerSec: durationS > 0 ? total / durationS : 0,
    p50Ms: percentileMs(latencyUs, 50),
    p99Ms: percentileMs(latencyUs, 99),
    total, durationS, errors, timeouts, non2xx, statusCodes, latencyUs,
  };
}
