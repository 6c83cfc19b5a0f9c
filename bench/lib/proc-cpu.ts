import { readdirSync, readFileSync } from 'node:fs';
import { availableParallelism } from 'node:os';

/**
 * CPU time of this process and of its direct children (redis-server, the service, the hello-world),
 * from /proc (Linux), to show how the 2 cores are shared during a measured phase.
 */
export type CpuSnapshot = { at: number; procs: Map<number, { label: string; seconds: number }>; machineBusy: number | null };

/** Busy CPU seconds of the whole machine (all cores) from /proc/stat, null when unreadable. */
function machineBusy(): number | null {
  try {
    const line = readFileSync('/proc/stat', 'utf8').split('\n')[0]!;
    const [, user, nice, system, , , irq, softirq, steal] = line.trim().split(/\s+/).map(Number);
    return (user! + nice! + system! + irq! + softirq! + steal!) / TICK;
  } catch {
    return null;
  }
}

const TICK = 100; // USER_HZ on Linux

function label(pid: number): string {
  try {
    const argv = readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0').filter(Boolean);
    if (argv.some((a) => a.includes('redis-server'))) return 'redis-server';
    const script = argv.find((a) => /\.(ts|js)$/.test(a) && !a.includes('tsx'));
    return script ? script.replace(/^.*\/(bin|bench)\//, '$1/') : argv.join(' ').slice(0, 40);
  } catch {
    return String(pid);
  }
}

function seconds(pid: number): number | null {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    return (Number(fields[11]) + Number(fields[12])) / TICK; // utime, stime
  } catch {
    return null;
  }
}

function children(): number[] {
  const out: number[] = [];
  try {
    for (const tid of readdirSync('/proc/self/task')) {
      const text = readFileSync(`/proc/self/task/${tid}/children`, 'utf8').trim();
      if (text) out.push(...text.split(/\s+/).map(Number));
    }
  } catch {
    // not Linux
  }
  return out;
}

export function cpuSnapshot(): CpuSnapshot {
  const procs = new Map<number, { label: string; seconds: number }>();
  const self = process.cpuUsage();
  procs.set(process.pid, { label: 'bench (load generator)', seconds: (self.user + self.system) / 1e6 });
  for (const pid of children()) {
    const s = seconds(pid);
    if (s !== null) procs.set(pid, { label: label(pid), seconds: s });
  }
  return { at: performance.now(), procs, machineBusy: machineBusy() };
}

/** Cores used by each process between two snapshots, busiest first. */
export function cpuDelta(a: CpuSnapshot, b: CpuSnapshot): { label: string; cores: number }[] {
  const wall = (b.at - a.at) / 1000;
  const rows: { label: string; cores: number }[] = [];
  for (const [pid, after] of b.procs) {
    const before = a.procs.get(pid);
    if (!before) continue;
    rows.push({ label: after.label, cores: wall > 0 ? (after.seconds - before.seconds) / wall : 0 });
  }
  const ours = rows.reduce((s, r) => s + r.cores, 0);
  if (a.machineBusy !== null && b.machineBusy !== null && wall > 0) {
    rows.push({ label: 'other processes', cores: Math.max(0, (b.machineBusy - a.machineBusy) / wall - ours) });
  }
  return rows.filter((r) => r.cores >= 0.005).sort((x, y) => y.cores - x.cores);
}

export function formatCpu(rows: { label: string; cores: number }[]): string {
  const total = rows.reduce((s, r) => s + r.cores, 0);
  return `cpu (cores): ${rows.map((r) => `${r.label} ${r.cores.toFixed(2)}`).join(', ')}; total ${total.toFixed(2)} of ${availableParallelism()}`;
}
