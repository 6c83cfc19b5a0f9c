import { hostname } from 'node:os';
import { createKeys } from '../../streams/keys.js';
import { connectRedis } from '../../streams/redis.js';
import { spawnNode, stopChild } from './child.js';

export type WorkerOptions = {
  redisUrl: string;
  keyPrefix: string;
  /** the script, default `bin/worker.ts` (the Procfile's worker process type) */
  script?: string;
  /** more environment, e.g. HERALD_PARTITIONS, NODE_OPTIONS */
  env?: Record<string, string>;
  timeoutMs?: number;
};

/**
 * Starts the worker role in a child process (`node --import tsx bin/worker.ts`). It has no HTTP
 * port: it is ready once its heartbeat (`keys.processes` field `worker:<host>:<pid>`, written
 * after its actors have started and leased their partitions) is in Redis.
 */
export async function startWorker(options: WorkerOptions): Promise<{ pid: number; stop: () => Promise<void> }> {
  const env: Record<string, string> = { REDIS_URL: options.redisUrl, REDIS_KEY_PREFIX: options.keyPrefix, LOG_LEVEL: 'error', ...options.env };
  const child = spawnNode(options.script ?? 'bin/worker.ts', [], env);
  const keys = createKeys(options.keyPrefix);
  const redis = connectRedis({ url: options.redisUrl }, { maxRetriesPerRequest: 3 });
  const field = `worker:${hostname()}:${child.process.pid}`;
  const deadline = Date.now() + (options.timeoutMs ?? 30_000);
  try {
    for (;;) {
      if (child.process.exitCode !== null || child.process.signalCode !== null) {
        throw new Error(`worker exited (${child.process.exitCode ?? child.process.signalCode}) before it was ready:\n${child.stderr()}`);
      }
      if (await redis.hexists(keys.processes, field)) break;
      if (Date.now() > deadline) throw new Error(`worker did not announce itself within ${options.timeoutMs ?? 30_000} ms:\n${child.stderr()}`);
      await new Promise((r) => setTimeout(r, 100));
    }
  } catch (err) {
    child.process.kill('SIGKILL');
    throw err;
  } finally {
    await redis.quit().catch(() => redis.disconnect());
  }
  return { pid: child.process.pid!, stop: () => stopChild(child.process, 10_000) };
}
