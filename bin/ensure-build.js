#!/usr/bin/env node
// Builds dist/ with tsc when it is missing or older than any source file. Plain JavaScript so it
// runs before anything is compiled. Build output goes to stderr: stdout belongs to the CLI.
import { existsSync, mkdirSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { spawnSync } from 'node:child_process';
import { dirname, join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { createRequire } from 'node:module';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const stamp = join(root, 'dist', '.build-stamp');
const SOURCES = ['lib', 'http', 'actors', 'streams', 'bin'];

function newest(dir) {
  let latest = 0;
  if (!existsSync(dir)) return latest;
  for (const entry of readdirSync(dir, { withFileTypes: true })) {
    const path = join(dir, entry.name);
    if (entry.isDirectory()) latest = Math.max(latest, newest(path));
    else if (entry.name.endsWith('.ts')) latest = Math.max(latest, statSync(path).mtimeMs);
  }
  return latest;
}

/** ms of the build stamp (0: never built), and whether it is at least as new as every source. */
function freshness() {
  const built = existsSync(stamp) ? statSync(stamp).mtimeMs : 0;
  const sources = Math.max(...SOURCES.map((d) => newest(join(root, d))), statSync(join(root, 'tsconfig.build.json')).mtimeMs, statSync(join(root, 'tsconfig.json')).mtimeMs);
  return { built, fresh: built > 0 && built >= sources };
}

// One build at a time: `npm start` and an `npx herald` run moments later on a fresh checkout both
// found dist/ stale and ran tsc into it together, one able to import a file the other was rewriting
// (probe BG). The lock is a directory (mkdir is atomic) holding its owner's pid and its compiler's
// (`child`); one whose owner is gone (killed mid-build) is taken over once its compiler is gone too:
// a SIGTERM to `npm start` mid-build ends the owner and leaves tsc writing dist/ (probe I: a second
// tsc ran beside it).
const lockDir = join(root, 'var', 'build.lock');
const LOCK_WAIT_MS = 300_000;
/** A lock older than this is a dead build's whatever its pid says: a build takes seconds. */
const STALE_LOCK_MS = 120_000;

function sleep(ms) {
  Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, ms);
}

function alive(pid) {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return err.code === 'EPERM';
  }
}

function lock() {
  mkdirSync(dirname(lockDir), { recursive: true });
  for (const deadline = Date.now() + LOCK_WAIT_MS; ;) {
    try {
      mkdirSync(lockDir);
      writeFileSync(join(lockDir, 'pid'), String(process.pid));
      return;
    } catch (err) {
      if (err.code !== 'EEXIST') throw err;
    }
    let owner = 0;
    let compiler = 0;
    try {
      compiler = Number(readFileSync(join(lockDir, 'child'), 'utf8'));
    } catch {
      // no compiler started yet (or none recorded)
    }
    try {
      owner = Number(readFileSync(join(lockDir, 'pid'), 'utf8'));
    } catch {
      // made, its pid not yet written; a maker that died there leaves it for good: taken after 10 s
      try {
        if (Date.now() - statSync(lockDir).mtimeMs > 10_000) owner = -1;
      } catch {
        continue; // released meanwhile
      }
    }
    // stale: its owner is gone, or its pid is this process's or is older than any build takes (a
    // container restarted after a build killed midway hands out the same pids again, probe BL)
    let age = 0;
    try {
      age = Date.now() - statSync(lockDir).mtimeMs;
    } catch {
      continue;
    }
    const compiling = Number.isInteger(compiler) && compiler > 0 && alive(compiler);
    if (owner === -1 || owner === process.pid || age > STALE_LOCK_MS || (Number.isInteger(owner) && owner > 0 && !alive(owner) && !compiling)) {
      rmSync(lockDir, { recursive: true, force: true });
      continue;
    }
    if (Date.now() > deadline) {
      process.stderr.write(`herald: another build of dist/ (pid ${owner}) has held ${lockDir} for ${LOCK_WAIT_MS / 1000} s; remove it if no build runs\n`);
      process.exit(1);
    }
    sleep(100);
  }
}

function unlock() {
  rmSync(lockDir, { recursive: true, force: true });
}

export function ensureBuilt() {
  const { built, fresh } = freshness();
  if (fresh) return;
  let tsc;
  try {
    tsc = createRequire(import.meta.url).resolve('typescript/bin/tsc');
  } catch {
    if (built) return; // a deployment without dev dependencies runs what was built
    process.stderr.write('herald: dist/ is missing and TypeScript is not installed; run npm install first\n');
    process.exit(1);
  }
  lock();
  try {
    if (freshness().fresh) return; // built by the process this one waited for
    process.stderr.write('herald: building dist/ with tsc…\n');
    // the compiler's pid goes into the lock (the shell records its own, then becomes tsc): a build
    // whose owner is killed is waited for while its compiler still runs
    const run = spawnSync('/bin/sh', ['-c', 'echo $$ > "$1" && exec "$2" "$3" -p "$4"', 'sh', join(lockDir, 'child'), process.execPath, tsc, join(root, 'tsconfig.build.json')], { cwd: root, stdio: ['ignore', 2, 2] });
    if (run.status !== 0) {
      unlock();
      process.stderr.write('herald: the TypeScript build failed\n');
      process.exit(1);
    }
    writeFileSync(stamp, new Date().toISOString() + '\n');
  } finally {
    unlock();
  }
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? '').href) ensureBuilt();
