// Runs every test/**/*.test.ts (or those whose path contains one of the arguments) with uvu, then
// prints "N passed, N failed". Files run one at a time in each of TEST_JOBS shard processes (default:
// three, or one on a one-core machine), each with its own test Redis; a shard takes the next file when
// it finishes one, and a file's output is printed whole once it ends. A shard that dies or overruns
// FILE_TIMEOUT_MS fails the file it was running, and a new shard takes the files left.
import { fork, spawnSync } from 'node:child_process';
import { readdirSync, statSync } from 'node:fs';
import { availableParallelism } from 'node:os';
import { join, relative } from 'node:path';
import { pathToFileURL } from 'node:url';
import { stopTestRedis } from './helpers/redis.js';

const root = join(import.meta.dirname, '.');
const SHARD_ENV = 'HERALD_TEST_SHARD';
/** The longest one test file may take (the slowest take ~100 s here; waits allow three times their limit); a file still running after it fails and its shard is replaced. */
const FILE_TIMEOUT_MS = 600_000;

type Outcome = { file: string; passed: number; total: number; skipped: number; output: string; ms: number };
type ToShard = { file: string } | { stop: true };

function find(dir: string): string[] {
  return readdirSync(dir).flatMap((name) => {
    const path = join(dir, name);
    if (statSync(path).isDirectory()) return name === 'helpers' ? [] : find(path);
    return name.endsWith('.test.ts') ? [path] : [];
  });
}

/** Runs one test file's suites in this process and answers what they printed and counted. */
async function runFile(file: string): Promise<Outcome> {
  const started = Date.now();
  let printed = '';
  const write = process.stdout.write;
  process.stdout.write = ((chunk: string | Uint8Array) => {
    printed += typeof chunk === 'string' ? chunk : Buffer.from(chunk).toString();
    return true;
  }) as typeof process.stdout.write;
  try {
    const g = globalThis as Record<string, unknown>;
    g.UVU_DEFER = 1;
    g.UVU_QUEUE = [[file]];
    g.UVU_INDEX = 0;
    const uvu = await import('uvu');
    await import(pathToFileURL(join(root, file)).href);
    await uvu.exec(false);
  } catch (err) {
    // a file that throws while loading (not from a test) counts as one failed test
    printed = `${file}\n  did not load: ${(err as Error)?.stack ?? String(err)}\n  Total:     1\n  Passed:    0\n  Skipped:   0\n`;
  } finally {
    process.stdout.write = write;
  }
  const plain = printed.replace(/\x1b\[[0-9;]*m/g, '');
  const count = (label: string) => Number(new RegExp(`${label}:\\s+(\\d+)`).exec(plain)?.[1] ?? 0);
  // uvu's Total leaves skipped tests out; its totals block is replaced by the sum over all files
  let output = `${printed.replace(/\n\s*Total:[\s\S]*$/, '').trimEnd()}\n\n`;
  // a suite whose `before` hook throws counts its tests failed without a word (uvu's runner returns
  // from its finally block, which drops the error): say so, so the failure is not a mystery
  if (count('Passed') < count('Total') && !plain.includes('FAIL')) {
    output += `  (no test failed by itself: a suite's before or after hook threw, and uvu does not print its error;\n   wrap that hook's body in try/catch and log the error to see it)\n\n`;
  }
  const ms = Date.now() - started;
  // the file's own line (uvu prints its path first) says how long it took, so slow files are easy to find
  output = output.replace(/^[^\n]*/, (line) => `${line}  (${(ms / 1000).toFixed(1)} s)`);
  return { file, passed: count('Passed'), total: count('Total'), skipped: count('Skipped'), output, ms };
}

/** A shard process: runs the files the parent sends, one at a time, answering each outcome. */
async function shard(): Promise<void> {
  process.on('message', (msg: ToShard) => {
    if ('stop' in msg) {
      // what a test left open (a timer, a socket) must not keep the shard alive; coverage is written on exit
      void stopTestRedis().finally(() => process.exit(0));
      return;
    }
    void runFile(msg.file).then((outcome) => process.send!(outcome));
  });
  process.send!({ ready: true });
}

/** Runs `files` over `jobs` shards; answers every file's outcome, printing each as it ends. */
async function runShards(files: string[], jobs: number): Promise<Outcome[]> {
  const queue = [...files];
  const outcomes: Outcome[] = [];
  return new Promise((done) => {
    let live = 0;
    const start = (): void => {
      live++;
      const child = fork(import.meta.filename, [], { env: { ...process.env, [SHARD_ENV]: '1' }, stdio: ['ignore', 'inherit', 'inherit', 'ipc'], execArgv: process.execArgv });
      let current: { file: string; since: number; timer: NodeJS.Timeout } | null = null;
      const next = (): void => {
        const file = queue.shift();
        if (file === undefined) return void child.send({ stop: true });
        current = { file, since: Date.now(), timer: setTimeout(() => child.kill('SIGKILL'), FILE_TIMEOUT_MS) };
        child.send({ file });
      };
      child.on('message', (msg: Outcome | { ready: true }) => {
        if ('file' in msg) {
          clearTimeout(current!.timer);
          current = null;
          outcomes.push(msg);
          process.stdout.write(msg.output);
        }
        next();
      });
      child.on('exit', (code, signal) => {
        live--;
        if (current) {
          clearTimeout(current.timer);
          const why = Date.now() - current.since >= FILE_TIMEOUT_MS ? `ran over ${FILE_TIMEOUT_MS / 1000} s` : `exit ${code ?? signal}`;
          const output = `${current.file}\n  its shard process ended while running it (${why}): counted as one failed test\n\n`;
          outcomes.push({ file: current.file, passed: 0, total: 1, skipped: 0, output, ms: Date.now() - current.since });
          process.stdout.write(output);
          current = null;
        }
        if (queue.length > 0) start();
        else if (live === 0) done(outcomes);
      });
    };
    for (let i = 0; i < Math.min(jobs, files.length); i++) start();
  });
}

async function main(): Promise<void> {
  // a part of a file's path below test/ (`sources/`, `ingest.test`); a leading `test/` is dropped
  const only = process.argv.slice(2).map((o) => o.replace(/^(?:\.\/)?test\//, ''));
  const files = find(root).map((f) => relative(root, f)).sort().filter((f) => only.length === 0 || only.some((o) => f.includes(o)));
  if (files.length === 0) {
    process.stdout.write(`no test file's path holds ${only.map((o) => `"${o}"`).join(' or ')}\n0 passed, 0 failed\n`);
    process.exitCode = 1;
    return;
  }
  // three on two cores: the suite waits on processes, timers and sockets as much as it computes (CI on
  // this machine: 514-576 s with two shards, 379 s with three; session 62)
  const jobs = Math.max(1, Number(process.env.TEST_JOBS) || (availableParallelism() === 1 ? 1 : 3));
  // tests that run bin/herald.js or `npm start` build dist/ when it is stale: once, here, not by two shards at once
  const build = spawnSync(process.execPath, [join(root, '..', 'bin', 'ensure-build.js')], { stdio: ['ignore', 'inherit', 'inherit'] });
  if (build.status !== 0) throw new Error(`bin/ensure-build.js failed (exit ${build.status ?? build.signal})`);
  const started = Date.now();
  const outcomes = await runShards(files, jobs);
  const passed = outcomes.reduce((n, o) => n + o.passed, 0);
  const total = outcomes.reduce((n, o) => n + o.total, 0);
  const skipped = outcomes.reduce((n, o) => n + o.skipped, 0);
  const slowest = [...outcomes].sort((a, b) => b.ms - a.ms).slice(0, 5).map((o) => `${o.file} ${(o.ms / 1000).toFixed(1)} s`).join(', ');
  process.stdout.write(`${files.length} files over ${jobs} shard(s) in ${((Date.now() - started) / 1000).toFixed(1)} s; slowest: ${slowest}\n`);
  process.stdout.write(`${passed} passed, ${total - passed} failed${skipped ? `, ${skipped} skipped` : ''}\n`);
  process.exitCode = total - passed > 0 || total === 0 ? 1 : 0;
}

if (process.env[SHARD_ENV]) await shard();
else await main();
