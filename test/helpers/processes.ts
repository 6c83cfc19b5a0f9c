import { spawn, type ChildProcess } from 'node:child_process';
import { join } from 'node:path';
import { PROJECT_ROOT } from '../../lib/paths.js';

export type RoleProcess = { child: ChildProcess; output: () => string; exited: Promise<number | null> };

/**
 * Starts one Procfile role as its own process, as an operator would scale it: plain `node` on the
 * built output (`dist/bin/<role>.js`, which test/run.ts builds first). Under tsx each start cost
 * some 0.3 s more of CPU, and the suite starts dozens.
 */
export function startRoleProcess(role: string, env: Record<string, string>): RoleProcess {
  return startProcess([join(PROJECT_ROOT, 'dist', 'bin', `${role}.js`)], env);
}

/** Starts a TypeScript file (a test's writer) as its own process, under tsx. */
export function startScriptProcess(path: string, env: Record<string, string>): RoleProcess {
  return startProcess(['--import', 'tsx', path], env);
}

function startProcess(args: string[], env: Record<string, string>): RoleProcess {
  const child = spawn(process.execPath, args, {
    cwd: PROJECT_ROOT,
    env: { ...process.env, LOG_LEVEL: 'warn', ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let out = '';
  child.stdout!.on('data', (d) => (out = (out + d).slice(-20_000)));
  child.stderr!.on('data', (d) => (out = (out + d).slice(-20_000)));
  const exited = new Promise<number | null>((done) => child.once('exit', (code) => done(code)));
  return { child, output: () => out, exited };
}

/** Stops a role process: SIGTERM (graceful), or SIGKILL after `graceMs`. */
export async function stopRoleProcess(p: RoleProcess, graceMs = 5_000): Promise<void> {
  if (p.child.exitCode !== null || p.child.signalCode !== null) return;
  const timer = setTimeout(() => p.child.kill('SIGKILL'), graceMs);
  p.child.kill('SIGTERM');
  await p.exited;
  clearTimeout(timer);
}
