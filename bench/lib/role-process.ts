import { readFileSync } from 'node:fs';
import { hostname } from 'node:os';
import { createKeys } from '../../streams/keys.js';
import { connectRedis } from '../../streams/redis.js';
import { spawnNode, stopChild, type Child } from './child.js';

/**
 * One Procfile role without an HTTP port (`node --import tsx bin/<role>.ts`, e.g. the dispatcher)
 * in a child process, ready once its heartbeat (`keys.processes` field `<role>:<host>:<pid>`,
 * written after its actors have started) is in Redis. Like bench/lib/worker.ts, for any role.
 */
export type RoleOptions = {
  role: 'dispatcher' | 'worker' | 'scheduler';
  redisUrl: string;
  keyPrefix: string;
  /** more environment, e.g. HERALD_PARTITIONS, APNS_* */
  env?: Record<string, string>;
  timeoutMs?: number;
};

export type RoleProcess = { pid: number; child: Child; stop: () => Promise<void> };

export async function startRole(options: RoleOptions): Promise<RoleProcess> {
  const env: Record<string, string> = { REDIS_URL: options.redisUrl, REDIS_KEY_PREFIX: options.keyPrefix, LOG_LEVEL: 'error', ...options.env };
  const child = spawnNode(`bin/${options.role}.ts`, [], env);
  const keys = createKeys(options.keyPrefix);
  const redis = connectRedis({ url: options.redisUrl }, { maxRetriesPerRequest: 3 });
  const field = `${options.role}:${hostname()}:${child.process.pid}`;
  const timeoutMs = options.timeoutMs ?? 30_000;
  const deadline = Date.now() + timeoutMs;
  try {
    for (;;) {
      if (child.process.exitCode !== null || child.process.signalCode !== null) {
        throw new Error(`${options.role} exited (${child.process.exitCode ?? child.process.signalCode}) before it was ready:\n${child.stderr()}`);
      }
      if (await redis.hexists(keys.processes, field)) break;
      if (Date.now() > deadline) throw new Error(`${options.role} did not announce itself within ${timeoutMs} ms:\n${child.stderr()}`);
      await new Promise((r) => setTimeout(r, 100));
    }
  } catch (err) {
    child.process.kill('SIGKILL');
    throw err;
  } finally {
    await redis.quit().catch(() => redis.disconnect());
  }
  return { pid: child.process.pid!, child, stop: () => stopChild(child.process, 15_000) };
}

/** VmRSS and VmHWM (peak RSS) of a process from /proc/<pid>/status, in bytes; null when unreadable. */
export function memoryOf(pid: number): { rss: number; hwm: number } | null {
  try {
    const status = readFileSync(`/proc/${pid}/status`, 'utf8');
    const kb = (name: string) => Number(new RegExp(`^${name}:\\s+(\\d+) kB`, 'm').exec(status)?.[1] ?? Number.NaN) * 1024;
    return { rss: kb('VmRSS'), hwm: kb('VmHWM') };
  } catch {
    return null;
  }
}

/**
 * Samples a process's RSS every `everyMs` (default 100 ms): the peak seen, VmHWM (the kernel's
 * own peak, which also counts the moments between samples), and the samples with their time.
 */
export class RssSampler {
  readonly samples: { at: number; rss: number }[] = [];
  peak = 0;
  private readonly timer: NodeJS.Timeout;

  constructor(private readonly pid: number, everyMs = 100) {
    this.sample();
    this.timer = setInterval(() => this.sample(), everyMs);
  }

  private sample(): void {
    const m = memoryOf(this.pid);
    if (!m || !Number.isFinite(m.rss)) return;
    this.samples.push({ at: performance.now(), rss: m.rss });
    this.peak = Math.max(this.peak, m.rss);
  }

  /** the kernel's peak RSS of the process since it started (VmHWM) */
  hwm(): number {
    return memoryOf(this.pid)?.hwm ?? Number.NaN;
  }

  /** the largest sample between two times (performance.now()) */
  peakBetween(from: number, to: number): number {
    let peak = 0;
    for (const s of this.samples) if (s.at >= from && s.at <= to) peak = Math.max(peak, s.rss);
    return peak;
  }

  stop(): void {
    clearInterval(this.timer);
    this.sample();
  }
}
