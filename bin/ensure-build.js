#!/usr/bin/env node
// Builds dist/ with tsc when it is missing or older than any source file. Plain JavaScript so it
// runs before anything is compiled. Build output goes to stderr: stdout belongs to the CLI.
import { existsSync, readdirSync, statSync, writeFileSync } from 'node:fs';
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

export function ensureBuilt() {
  const built = existsSync(stamp) ? statSync(stamp).mtimeMs : 0;
  const sources = Math.max(...SOURCES.map((d) => newest(join(root, d))), statSync(join(root, 'tsconfig.build.json')).mtimeMs, statSync(join(root, 'tsconfig.json')).mtimeMs);
  if (built && built >= sources) return;
  let tsc;
  try {
    tsc = createRequire(import.meta.url).resolve('typescript/bin/tsc');
  } catch {
    if (built) return; // a deployment without dev dependencies runs what was built
    process.stderr.write('herald: dist/ is missing and TypeScript is not installed; run npm install first\n');
    process.exit(1);
  }
  process.stderr.write('herald: building dist/ with tsc…\n');
  const run = spawnSync(process.execPath, [tsc, '-p', join(root, 'tsconfig.build.json')], { cwd: root, stdio: ['ignore', 2, 2] });
  if (run.status !== 0) {
    process.stderr.write('herald: the TypeScript build failed\n');
    process.exit(1);
  }
  writeFileSync(stamp, new Date().toISOString() + '\n');
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? '').href) ensureBuilt();
