import { spawn, type ChildProcess } from 'node:child_process';
import { join } from 'node:path';
import { PROJECT_ROOT } from '../../lib/paths.js';

export type RoleProcess = { child: ChildProcess; output: () => string; exited: Promise<number | null> };

/** Starts one Procfile role (`bin/<role>.ts`) as its own process, as an operator would scale it. */
export function startRoleProcess(role: string, env: Record<string, string>): RoleProcess {
  return startScriptProcess(join(PROJECT_ROOT, 'bin', `${role}.ts`), env);
}

/** Starts a TypeScript file as its own process (a role, or a test's writer). */
export function startScriptProcess(path: string, env: Record<string, string>): RoleProcess {
  const child = spawn(process.execPath, ['--import', 'tsx', path], {
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
