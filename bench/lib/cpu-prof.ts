import { fileURLToPath } from 'node:url';

const PRELOAD = fileURLToPath(new URL('./cpu-prof-preload.mjs', import.meta.url));

/**
 * Environment that makes a `node` child profile itself: Node 20 refuses `--cpu-prof` in
 * NODE_OPTIONS, so `cpu-prof-preload.mjs` is imported instead; it writes
 * `<dir>/<script>-<pid>.cpuprofile` when the child exits normally (SIGTERM, not SIGKILL).
 */
export function cpuProfEnv(dir: string, intervalUs = 1000): Record<string, string> {
  const inherited = process.env.NODE_OPTIONS ? `${process.env.NODE_OPTIONS} ` : '';
  return { NODE_OPTIONS: `${inherited}--import ${PRELOAD}`, HERALD_BENCH_CPU_PROF_DIR: dir, HERALD_BENCH_CPU_PROF_INTERVAL_US: String(intervalUs) };
}
