import { readFileSync } from 'node:fs';
import { pathToFileURL } from 'node:url';

/**
 * Summarizes a V8 `.cpuprofile` (from `node --cpu-prof`, e.g. a bench's `--cpu-prof <dir>`):
 * self time by function, self time by file or package, and inclusive time of a few named
 * functions; or, with a function name, self time inside that function's calls.
 * `node --import tsx bench/lib/cpuprofile.ts <file> [top] [function]`.
 */
type Node = { id: number; callFrame: { functionName: string; url: string; lineNumber: number }; hitCount?: number; children?: number[] };
type Profile = { nodes: Node[]; startTime: number; endTime: number; samples?: number[]; timeDeltas?: number[] };

export type ProfileSummary = { totalMs: number; idleMs: number; byFunction: [string, number][]; byFile: [string, number][]; inclusive: [string, number][] };

function where(url: string): string {
  if (!url) return '(native)';
  const nm = url.lastIndexOf('node_modules/');
  if (nm >= 0) {
    const rest = url.slice(nm + 'node_modules/'.length).split('/');
    return `npm:${rest[0]!.startsWith('@') ? `${rest[0]}/${rest[1]}` : rest[0]}`;
  }
  if (url.startsWith('node:')) return url;
  const m = /\/work\/[^/]+\/(.*)$/.exec(url);
  return m ? m[1]! : url.replace(/^file:\/\//, '');
}

export function summarize(profile: Profile, top = 25): ProfileSummary {
  const byId = new Map(profile.nodes.map((n) => [n.id, n]));
  const selfUs = new Map<number, number>();
  const samples = profile.samples ?? [];
  const deltas = profile.timeDeltas ?? [];
  for (let i = 0; i < samples.length; i++) selfUs.set(samples[i]!, (selfUs.get(samples[i]!) ?? 0) + (deltas[i] ?? 0));
  const parent = new Map<number, number>();
  for (const n of profile.nodes) for (const c of n.children ?? []) parent.set(c, n.id);

  const fn = new Map<string, number>();
  const file = new Map<string, number>();
  const incl = new Map<string, number>();
  let total = 0, idle = 0;
  for (const [id, us] of selfUs) {
    const n = byId.get(id)!;
    const f = n.callFrame;
    total += us;
    if (f.functionName === '(idle)') idle += us;
    const label = `${f.functionName || '(anonymous)'} ${where(f.url)}${f.url ? `:${f.lineNumber + 1}` : ''}`;
    fn.set(label, (fn.get(label) ?? 0) + us);
    const w = f.functionName.startsWith('(') ? f.functionName : where(f.url);
    file.set(w, (file.get(w) ?? 0) + us);
    // inclusive: every distinct function on the stack gets the sample once
    const seen = new Set<string>();
    for (let cur: number | undefined = id; cur !== undefined; cur = parent.get(cur)) {
      const c = byId.get(cur)!.callFrame;
      if (!c.url || c.url.includes('node_modules') || c.url.startsWith('node:')) continue;
      const key = `${c.functionName || '(anonymous)'} ${where(c.url)}`;
      if (seen.has(key)) continue;
      seen.add(key);
      incl.set(key, (incl.get(key) ?? 0) + us);
    }
  }
  const sorted = (m: Map<string, number>) => [...m].sort((a, b) => b[1] - a[1]).slice(0, top).map(([k, v]) => [k, v / 1000] as [string, number]);
  return { totalMs: total / 1000, idleMs: idle / 1000, byFunction: sorted(fn), byFile: sorted(file), inclusive: sorted(incl) };
}

/** Self time by function inside the subtrees of calls to `fn` (e.g. `ingestEvents`), in ms. */
export function under(profile: Profile, fn: string, top = 20): { totalMs: number; rows: [string, number][] } {
  const byId = new Map(profile.nodes.map((n) => [n.id, n]));
  const parent = new Map<number, number>();
  for (const n of profile.nodes) for (const c of n.children ?? []) parent.set(c, n.id);
  const selfUs = new Map<number, number>();
  const samples = profile.samples ?? [];
  const deltas = profile.timeDeltas ?? [];
  for (let i = 0; i < samples.length; i++) selfUs.set(samples[i]!, (selfUs.get(samples[i]!) ?? 0) + (deltas[i] ?? 0));
  const rows = new Map<string, number>();
  let total = 0;
  for (const [id, us] of selfUs) {
    let inside = false;
    for (let cur: number | undefined = id; cur !== undefined; cur = parent.get(cur)) {
      if (byId.get(cur)!.callFrame.functionName === fn) {
        inside = true;
        break;
      }
    }
    if (!inside) continue;
    total += us;
    const f = byId.get(id)!.callFrame;
    const label = `${f.functionName || '(anonymous)'} ${where(f.url)}${f.url ? `:${f.lineNumber + 1}` : ''}`;
    rows.set(label, (rows.get(label) ?? 0) + us);
  }
  return { totalMs: total / 1000, rows: [...rows].sort((a, b) => b[1] - a[1]).slice(0, top).map(([k, v]) => [k, v / 1000]) };
}

export function formatSummary(s: ProfileSummary): string {
  const busy = s.totalMs - s.idleMs;
  const pct = (ms: number) => `${((100 * ms) / Math.max(1, busy)).toFixed(1).padStart(5)}%`;
  const table = (rows: [string, number][]) => rows.map(([k, ms]) => `  ${ms.toFixed(0).padStart(8)} ms ${pct(ms)}  ${k}`).join('\n');
  return [
    `profile: ${s.totalMs.toFixed(0)} ms sampled, ${s.idleMs.toFixed(0)} ms idle, ${busy.toFixed(0)} ms busy (percentages of busy)`,
    'self time by file / package:', table(s.byFile),
    'self time by function:', table(s.byFunction),
    'inclusive time (project code):', table(s.inclusive),
  ].join('\n');
}

if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) {
  const [file, top, fn] = process.argv.slice(2);
  if (!file) {
    process.stderr.write('usage: node --import tsx bench/lib/cpuprofile.ts <file.cpuprofile> [top] [function: self time inside its calls]\n');
    process.exit(2);
  }
  const profile = JSON.parse(readFileSync(file, 'utf8')) as Profile;
  if (fn) {
    const u = under(profile, fn, Number(top ?? 25));
    process.stdout.write(`inside ${fn}: ${u.totalMs.toFixed(0)} ms\n${u.rows.map(([k, ms]) => `  ${ms.toFixed(0).padStart(8)} ms ${((100 * ms) / Math.max(1, u.totalMs)).toFixed(1).padStart(5)}%  ${k}`).join('\n')}\n`);
  } else {
    process.stdout.write(formatSummary(summarize(profile, Number(top ?? 25))) + '\n');
  }
}
