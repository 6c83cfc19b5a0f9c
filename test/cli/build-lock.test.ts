import { spawn, spawnSync } from 'node:child_process';
import { cpSync, existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync, utimesSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';

const ROOT = join(import.meta.dirname, '..', '..');

/**
 * A project laid out as this one (its bin/ensure-build.js, tsconfigs and package.json; node_modules
 * linked) whose dist/ is never built, with two small sources in place of the service's: the lock is
 * under test here, not the build, and three builds of the whole service took most of a minute (the
 * real entry building the real dist/ is test/cli/cli.test.ts's).
 */
function copy(): string {
  const dir = mkdtempSync(join(tmpdir(), 'herald-build-lock-'));
  for (const entry of ['bin/ensure-build.js', 'tsconfig.json', 'tsconfig.build.json', 'package.json']) cpSync(join(ROOT, entry), join(dir, entry));
  for (const source of ['lib', 'http', 'actors', 'streams']) mkdirSync(join(dir, source));
  writeFileSync(join(dir, 'lib', 'config.ts'), 'export const port: number = Number(process.env.PORT ?? 3000);\n');
  writeFileSync(join(dir, 'bin', 'start.ts'), "import { port } from '../lib/config.js';\n\nprocess.stdout.write(`${port}\\n`);\n");
  symlinkSync(join(ROOT, 'node_modules'), join(dir, 'node_modules'));
  return dir;
}

function build(dir: string): Promise<{ code: number | null; stderr: string }> {
  return new Promise((done) => {
    const child = spawn(process.execPath, [join(dir, 'bin', 'ensure-build.js')], { cwd: dir, stdio: ['ignore', 'ignore', 'pipe'] });
    let stderr = '';
    child.stderr.on('data', (d) => (stderr += d));
    child.on('close', (code) => done({ code, stderr }));
  });
}

test('two processes finding dist/ stale at once build it once: the second waits for the first\'s build and uses it (probe BG: both ran tsc into dist/)', async () => {
  const dir = copy();
  try {
    // while the build runs, its lock names the compiler it runs (tsc itself, through the shell's exec)
    let compilerSeen = '';
    const watching = (async () => {
      for (let i = 0; i < 600 && !compilerSeen; i++) {
        try {
          const pid = readFileSync(join(dir, 'var', 'build.lock', 'child'), 'utf8').trim();
          if (pid) compilerSeen = readFileSync(`/proc/${pid}/cmdline`, 'utf8');
        } catch {
          // not there yet, or ended already
        }
        await new Promise((r) => setTimeout(r, 20));
      }
    })();
    const runs = await Promise.all([build(dir), build(dir)]);
    await watching;
    assert.match(compilerSeen, /tsc/, 'the lock named the running tsc');
    assert.equal(runs.map((r) => r.code), [0, 0], runs.map((r) => r.stderr).join('\n'));
    assert.is(runs.filter((r) => r.stderr.includes('building dist/')).length, 1, runs.map((r) => r.stderr).join('\n'));
    assert.ok(existsSync(join(dir, 'dist', '.build-stamp')));
    assert.ok(existsSync(join(dir, 'dist', 'bin', 'start.js')));
    assert.not.ok(existsSync(join(dir, 'var', 'build.lock')), 'the lock is released');

    // a lock left by a build killed midway (its pid gone) is taken over
    const gone = spawnSync(process.execPath, ['-e', '0']).pid!;
    mkdirSync(join(dir, 'var', 'build.lock'), { recursive: true });
    writeFileSync(join(dir, 'var', 'build.lock', 'pid'), String(gone));
    const later = new Date(Date.now() + 60_000);
    utimesSync(join(dir, 'lib', 'config.ts'), later, later);
    const again = await build(dir);
    assert.is(again.code, 0, again.stderr);
    assert.match(again.stderr, /building dist\//);
    assert.not.ok(existsSync(join(dir, 'var', 'build.lock')));

    // a lock whose owner is gone (SIGTERM to npm start mid-build) while its compiler still writes
    // dist/ is waited for until that compiler ends (probe I: a second tsc ran beside it)
    const compiler = spawn(process.execPath, ['-e', 'setTimeout(() => {}, 1500)']);
    const compilerEnded = new Promise<number>((done) => compiler.once('exit', () => done(Date.now())));
    mkdirSync(join(dir, 'var', 'build.lock'), { recursive: true });
    writeFileSync(join(dir, 'var', 'build.lock', 'pid'), String(gone));
    writeFileSync(join(dir, 'var', 'build.lock', 'child'), String(compiler.pid));
    const touched = new Date(Date.now() + 90_000);
    utimesSync(join(dir, 'lib', 'config.ts'), touched, touched);
    const waited = await build(dir);
    const builtAt = Date.now();
    assert.is(waited.code, 0, waited.stderr);
    assert.ok(builtAt >= await compilerEnded, 'the build waited for the compiler the dead owner left');
    assert.not.ok(existsSync(join(dir, 'var', 'build.lock')));

    // a lock naming a live pid but older than any build (a container restarted after a build killed
    // midway hands out the same pids again, probe BL) is taken over too: here, this test's own pid
    mkdirSync(join(dir, 'var', 'build.lock'), { recursive: true });
    writeFileSync(join(dir, 'var', 'build.lock', 'pid'), String(process.pid));
    const old = new Date(Date.now() - 10 * 60_000);
    utimesSync(join(dir, 'var', 'build.lock'), old, old);
    const newer = new Date(Date.now() + 120_000);
    utimesSync(join(dir, 'lib', 'config.ts'), newer, newer);
    const third = await build(dir);
    assert.is(third.code, 0, third.stderr);
    assert.match(third.stderr, /building dist\//);
    assert.not.ok(existsSync(join(dir, 'var', 'build.lock')));
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test.run();
