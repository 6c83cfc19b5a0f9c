// Preloaded into a bench's child processes with NODE_OPTIONS="--import <this file>" (Node 20 refuses
// --cpu-prof in NODE_OPTIONS): starts the V8 CPU profiler and, when the process exits (the
// service's SIGTERM handler ends with process.exit), writes <HERALD_BENCH_CPU_PROF_DIR>/<script>-<pid>.cpuprofile.
// Summarize with: node --import tsx bench/lib/cpuprofile.ts <file>
import { mkdirSync, writeFileSync } from 'node:fs';
import { Session } from 'node:inspector';
import { basename, join } from 'node:path';
import { isMainThread } from 'node:worker_threads';

const dir = process.env.HERALD_BENCH_CPU_PROF_DIR;
if (dir && isMainThread) {
  const session = new Session();
  session.connect();
  session.post('Profiler.enable');
  session.post('Profiler.setSamplingInterval', { interval: Number(process.env.HERALD_BENCH_CPU_PROF_INTERVAL_US || 1000) });
  session.post('Profiler.start');
  process.once('exit', () => {
    // the in-process inspector session answers synchronously
    session.post('Profiler.stop', (err, result) => {
      if (err || !result) return;
      mkdirSync(dir, { recursive: true });
      const script = basename(process.argv[1] || 'node').replace(/\.[cm]?[jt]s$/, '');
      writeFileSync(join(dir, `${script}-${process.pid}.cpuprofile`), JSON.stringify(result.profile));
    });
  });
}
