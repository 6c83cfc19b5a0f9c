import { Agent, request } from 'node:http';
import { createHistogram, type RecordableHistogram } from 'node:perf_hooks';

/**
 * An open-loop load at a fixed rate of requests: every `tickMs` it sends the requests due by then
 * (rate × elapsed − sent), whatever the answers so far, over keep-alive connections, so a slow
 * server gets a backlog instead of a lower offered rate (as real traffic would). Bounded by
 * `duration` and by `maxInFlight` (a request due while that many are in flight is counted as
 * `skipped`, not queued). Each answer's body is handed to `onAnswer` with its status and the time
 * (performance.now()) it was complete.
 */
export type RateLoadOptions = {
  /** must be on 127.0.0.1 */
  url: string;
  headers?: Record<string, string>;
  bodies: Buffer[];
  start?: number;
  /** requests per second */
  rate: number;
  /** seconds (at most 120) */
  duration: number;
  maxInFlight?: number;
  tickMs?: number;
  onAnswer?: (status: number, body: string, at: number) => void;
};

export type RateLoadResult = {
  sent: number;
  answered: number;
  skipped: number;
  errors: number;
  statusCodes: Record<string, number>;
  /** achieved answers per second over the load time */
  answersPerSec: number;
  durationS: number;
  p50Ms: number;
  p99Ms: number;
  latencyUs: RecordableHistogram;
  next: number;
};

export async function rateLoad(options: RateLoadOptions): Promise<RateLoadResult> {
  const url = new URL(options.url);
  if (url.hostname !== '127.0.0.1') throw new Error(`rateLoad only targets 127.0.0.1, not ${url.hostname}`);
  const durationMs = Math.min(options.duration, 120) * 1000;
  const maxInFlight = options.maxInFlight ?? 256;
  const tickMs = options.tickMs ?? 5;
  const agent = new Agent({ keepAlive: true, maxSockets: maxInFlight });
  const latencyUs = createHistogram();
  const statusCodes: Record<string, number> = {};
  const { bodies } = options;
  let next = options.start ?? 0;
  let sent = 0, answered = 0, skipped = 0, errors = 0, inFlight = 0;
  let lastAnswerAt = 0;

  const send = () => {
    const body = bodies[next++ % bodies.length]!;
    const t0 = performance.now();
    inFlight++;
    sent++;
    const req = request({
      host: url.hostname, port: url.port, path: url.pathname + url.search, method: 'POST', agent,
      headers: { 'content-type': 'application/json', 'content-length': String(body.length), ...options.headers },
    }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => {
        const at = performance.now();
        inFlight--;
        answered++;
        lastAnswerAt = at;
        latencyUs.record(Math.max(1, Math.round((at - t0) * 1000)));
        const code = String(res.statusCode);
        statusCodes[code] = (statusCodes[code] ?? 0) + 1;
        options.onAnswer?.(res.statusCode ?? 0, Buffer.concat(chunks).toString(), at);
      });
    });
    req.on('error', () => {
      inFlight--;
      errors++;
    });
    req.setTimeout(10_000, () => req.destroy(new Error('timeout')));
    req.end(body);
  };

  const started = performance.now();
  await new Promise<void>((done) => {
    const timer = setInterval(() => {
      const elapsed = performance.now() - started;
      const due = Math.floor((Math.min(elapsed, durationMs) / 1000) * options.rate);
      while (sent + skipped < due) {
        if (inFlight >= maxInFlight) skipped++;
        else send();
      }
      if (elapsed >= durationMs) {
        clearInterval(timer);
        done();
      }
    }, tickMs);
  });
  const sendingEnded = performance.now();
  // answers still in flight: wait for them (bounded)
  const deadline = sendingEnded + 15_000;
  while (inFlight > 0 && performance.now() < deadline) await new Promise((r) => setTimeout(r, 10));
  agent.destroy();
  const durationS = (Math.max(sendingEnded, lastAnswerAt) - started) / 1000;
  const pct = (p: number) => (latencyUs.count > 0 ? latencyUs.percentile(p) / 1000 : 0);
  return {
    sent, answered, skipped, errors, statusCodes, durationS,
    answersPerSec: durationS > 0 ? answered / durationS : 0,
    p50Ms: pct(50), p99Ms: pct(99), latencyUs, next: next % bodies.length,
  };
}
