import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { Redis } from 'ioredis';
import { answersPing } from '../../streams/embedded-redis.js';
import { connectRedis } from '../../streams/redis.js';
import { spawnChild, stopChild } from './child.js';
import { freePort } from '../../test/helpers/port.js';

export type PrivateRedis = { url: string; port: number; stop: () => Promise<void> };

/**
 * Starts a private `redis-server` on a free port of 127.0.0.1 with no persistence, so a bench
 * never touches the shared Redis at 127.0.0.1:6379. `stop` kills it and removes its directory.
 */
export async function startRedis(timeoutMs = 10_000): Promise<PrivateRedis> {
  const port = await freePort();
  const dir = mkdtempSync(join(tmpdir(), 'herald-bench-redis-'));
  const child = spawnChild('redis-server', ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no', '--dir', dir]);
  const deadline = Date.now() + timeoutMs;
  while (!(await answersPing({ host: '127.0.0.1', port }, 200))) {
    if (child.process.exitCode !== null || Date.now() > deadline) {
      child.process.kill('SIGKILL');
      rmSync(dir, { recursive: true, force: true });
      throw new Error(`private redis-server did not start on port ${port}: ${child.stderr() || 'is redis-server installed?'}`);
    }
    await new Promise((r) => setTimeout(r, 50));
  }
  return {
    url: `redis://127.0.0.1:${port}`,
    port,
    stop: async () => {
      await stopChild(child.process);
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

export type RedisBenchmarkOptions = {
  port: number;
  /** number of requests (-n); the run is bounded by it */
  requests: number;
  /** pipeline depth (-P), default 32 */
  pipeline?: number;
  /** one built-in test (-t), e.g. `get`, `set`, `incr`; or… */
  test?: string;
  /** …a custom command with its arguments, e.g. ['XADD', 'bench:s', '*', 'f', 'v'] */
  command?: string[];
  /** killed after this long, default 60 s */
  timeoutMs?: number;
};

export type RedisBenchmarkResult = { label: string; opsPerSec: number; p50Ms: number | null };

/** Parses `redis-benchmark -q` output: the last `<label>: <n> requests per second[, p50=<x> msec]` line. */
export function parseRedisBenchmark(output: string): RedisBenchmarkResult | null {
  let found: RedisBenchmarkResult | null = null;
  for (const line of output.split(/[\r\n]+/)) {
    const m = /^(.*?):\s+([\d.]+) requests per second(?:, p50=([\d.]+) msec)?/.exec(line.trim());
    if (m) found = { label: m[1]!, opsPerSec: Number(m[2]), p50Ms: m[3] === undefined ? null : Number(m[3]) };
  }
  return found;
}

/** Runs `redis-benchmark -h 127.0.0.1 -p <port> -P <pipeline> -n <requests> -q` for one test or command. */
export function redisBenchmark(options: RedisBenchmarkOptions): Promise<RedisBenchmarkResult> {
  const { port, requests, pipeline = 32, test, command, timeoutMs = 60_000 } = options;
  if ((test === undefined) === (command === undefined)) throw new Error('redisBenchmark: give exactly one of test or command');
  const args = ['-h', '127.0.0.1', '-p', String(port), '-P', String(pipeline), '-n', String(requests), '-q'];
  if (test !== undefined) args.push('-t', test);
  else args.push(...command!);
  return new Promise((done, fail) => {
    const child = spawn('redis-benchmark', args, { stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    child.stdout.on('data', (chunk: Buffer) => (out += chunk.toString()));
    child.stderr.on('data', (chunk: Buffer) => (out += chunk.toString()));
    const timer = setTimeout(() => child.kill('SIGKILL'), timeoutMs);
    child.once('error', (err) => {
      clearTimeout(timer);
      fail(new Error(`cannot run redis-benchmark: ${err.message}`));
    });
    child.once('close', (code, signal) => {
      clearTimeout(timer);
      const parsed = parseRedisBenchmark(out);
      if (code === 0 && parsed) return done(parsed);
      fail(new Error(`redis-benchmark ${args.join(' ')} failed (${code ?? signal}): ${out.trim().slice(-500)}`));
    });
  });
}

/**
 * A private `redis-server` (as `startRedis`) and one ioredis client to it, both pushed on `stops`
 * (the client first to go), for the benches that write their fixtures through the library.
 */
export async function startRedisWithClient(stops: Array<() => Promise<void>>): Promise<{ server: PrivateRedis; client: Redis }> {
  const server = await startRedis();
  stops.push(server.stop);
  const client = connectRedis({ url: server.url });
  stops.push(async () => void (await client.quit().catch(() => client.disconnect())));
  return { server, client };
}
