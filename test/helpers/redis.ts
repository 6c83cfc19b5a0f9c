import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { answersPing } from '../../streams/embedded-redis.js';
import { freePort } from './port.js';

export { freePort };

/**
 * The test Redis: `TEST_REDIS_URL` when set, else one `redis-server` on a free port started once
 * per run (never the shared 127.0.0.1:6379). Each test file isolates itself with its own key prefix.
 */
let server: { url: string; child: ChildProcess | null } | null = null;

export async function testRedisUrl(): Promise<string> {
  if (process.env.TEST_REDIS_URL) return process.env.TEST_REDIS_URL;
  if (server) return server.url;
  const port = await freePort();
  const dir = mkdtempSync(join(tmpdir(), 'herald-test-redis-'));
  const child = spawn('redis-server', ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no', '--dir', dir], { stdio: 'ignore' });
  child.unref();
  const deadline = Date.now() + 10_000;
  while (!(await answersPing({ host: '127.0.0.1', port }, 200))) {
    if (Date.now() > deadline) throw new Error('test redis-server did not start');
    await new Promise((r) => setTimeout(r, 50));
  }
  server = { url: `redis://127.0.0.1:${port}`, child };
  process.once('exit', () => server?.child?.kill('SIGKILL'));
  return server.url;
}

export async function stopTestRedis(): Promise<void> {
  server?.child?.kill('SIGTERM');
  server = null;
}

let counter = 0;
/** A key prefix no other test file uses. */
export function uniquePrefix(name: string): string {
  return `t${process.pid}-${++counter}-${name}:`;
}
