import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { fileURLToPath } from 'node:url';
export { stopChild } from '../../lib/stop-child.js';

/** The repository root (bench/lib/../..). */
export const ROOT = fileURLToPath(new URL('../../', import.meta.url));

const live = new Set<ChildProcess>();
let exitHookInstalled = false;

/** Children still running when the bench process exits (even on a crash) are killed. */
function track(child: ChildProcess): void {
  live.add(child);
  child.once('exit', () => live.delete(child));
  if (!exitHookInstalled) {
    exitHookInstalled = true;
    process.once('exit', () => {
      for (const c of live) c.kill('SIGKILL');
    });
  }
}

export type Child = { process: ChildProcess; /** the last lines it wrote to stderr */ stderr: () => string };

/**
 * Spawns a child process (cwd: the repository root). Its stdout is discarded so that it can
 * never come after the bench's final JSON line; the tail of its stderr is kept for error messages.
 */
export function spawnChild(command: string, args: string[], env: Record<string, string> = {}): Child {
  const child = spawn(command, args, { cwd: ROOT, env: { ...process.env, ...env }, stdio: ['ignore', 'ignore', 'pipe'] });
  track(child);
  let tail = '';
  child.stderr!.on('data', (chunk: Buffer) => {
    tail = (tail + chunk.toString()).slice(-4000);
  });
  return { process: child, stderr: () => tail.trim() };
}

let built = false;

/**
 * The service's own roles (`bin/<name>.ts`) run the way the Procfile runs them: plain `node` on the
 * built output `dist/bin/<name>.js`, built first when older than the sources (as `npm start` does,
 * with `bin/ensure-build.js`). Any other script (the bench's helpers and baselines) runs with
 * `node --import tsx`.
 */
export function spawnNode(script: string, args: string[] = [], env: Record<string, string> = {}): Child {
  const role = /^bin\/([a-z-]+)\.ts$/.exec(script);
  if (!role) return spawnChild(process.execPath, ['--import', 'tsx', script, ...args], env);
  if (!built) {
    const build = spawnSync(process.execPath, ['bin/ensure-build.js'], { cwd: ROOT, stdio: ['ignore', 'ignore', 'inherit'] });
    if (build.status !== 0) throw new Error('building dist/ failed (bin/ensure-build.js)');
    built = true;
  }
  return spawnChild(process.execPath, [`dist/bin/${role[1]}.js`, ...args], env);
}

/** Resolves once `url` answers `status` to a GET; fails when the child exits first or after `timeoutMs`. */
export async function waitForHttp(url: string, child: Child, status = 200, timeoutMs = 20_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  let exited: number | string | null = null;
  child.process.once('exit', (code, signal) => (exited = code ?? signal));
  while (Date.now() < deadline) {
    if (exited !== null) throw new Error(`child exited (${exited}) before ${url} answered:\n${child.stderr()}`);
    try {
      const res = await fetch(url, { signal: AbortSignal.timeout(1_000) });
      await res.arrayBuffer();
      if (res.status === status) return;
    } catch {
      // not listening yet
    }
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`${url} did not answer ${status} within ${timeoutMs} ms:\n${child.stderr()}`);
}

