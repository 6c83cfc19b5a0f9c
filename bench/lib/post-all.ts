import { Agent, request } from 'node:http';
import { countOccurrences } from './event-bodies.js';

export type PostAllResult = { answered: number; errors: number; statusCodes: Record<string, number>; matches: number; seconds: number };

/**
 * POSTs every body once, `concurrency` at a time, over keep-alive connections (for set-up and
 * measured-memory phases, not for throughput figures). Bounded by `timeoutMs` overall.
 */
export async function postAll(options: {
  url: string;
  headers?: Record<string, string>;
  bodies: Buffer[];
  concurrency?: number;
  /** counted in every answer */
  count?: string;
  timeoutMs?: number;
}): Promise<PostAllResult> {
  const url = new URL(options.url);
  if (url.hostname !== '127.0.0.1') throw new Error(`postAll only targets 127.0.0.1, not ${url.hostname}`);
  const concurrency = options.concurrency ?? 8;
  const agent = new Agent({ keepAlive: true, maxSockets: concurrency });
  const deadline = Date.now() + (options.timeoutMs ?? 120_000);
  const statusCodes: Record<string, number> = {};
  let answered = 0, errors = 0, matches = 0, next = 0;
  const started = performance.now();

  const one = (body: Buffer) => new Promise<void>((done) => {
    const req = request({
      host: url.hostname, port: url.port, path: url.pathname + url.search, method: 'POST', agent,
      headers: { 'content-type': 'application/json', 'content-length': String(body.length), ...options.headers },
    }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => {
        answered++;
        const code = String(res.statusCode);
        statusCodes[code] = (statusCodes[code] ?? 0) + 1;
        if (options.count) matches += countOccurrences(Buffer.concat(chunks).toString(), options.count);
        done();
      });
    });
    req.on('error', () => {
      errors++;
      done();
    });
    req.setTimeout(30_000, () => req.destroy(new Error('timeout')));
    req.end(body);
  });

  const lane = async () => {
    while (next < options.bodies.length && Date.now() < deadline) await one(options.bodies[next++]!);
  };
  await Promise.all(Array.from({ length: concurrency }, lane));
  agent.destroy();
  return { answered, errors, statusCodes, matches, seconds: (performance.now() - started) / 1000 };
}
