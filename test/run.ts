// Runs every test/**/*.test.ts in one process with uvu, then prints "N passed, N failed".
import { readdirSync, statSync } from 'node:fs';
import { join, relative } from 'node:path';
import { pathToFileURL } from 'node:url';
import { stopTestRedis } from './helpers/redis.js';

const root = join(import.meta.dirname, '.');
const only = process.argv.slice(2);

function find(dir: string): string[] {
  return readdirSync(dir).flatMap((name) => {
    const path = join(dir, name);
    if (statSync(path).isDirectory()) return name === 'helpers' ? [] : find(path);
    return name.endsWith('.test.ts') ? [path] : [];
  });
}

const files = find(root).sort().filter((f) => only.length === 0 || only.some((o) => relative(root, f).includes(o)));

// uvu prints its totals; keep a copy of stdout to read them back.
let printed = '';
const write = process.stdout.write.bind(process.stdout);
process.stdout.write = ((chunk: string | Uint8Array, ...rest: unknown[]) => {
  printed += typeof chunk === 'string' ? chunk : Buffer.from(chunk).toString();
  if (printed.length > 200_000) printed = printed.slice(-100_000);
  return (write as (...a: unknown[]) => boolean)(chunk, ...rest);
}) as typeof process.stdout.write;

(globalThis as Record<string, unknown>).UVU_DEFER = 1;
const uvu = await import('uvu');
let index = 0;
for (const file of files) {
  (globalThis as Record<string, unknown>).UVU_INDEX = index++;
  ((globalThis as Record<string, unknown>).UVU_QUEUE as unknown[][]).push([relative(root, file)]);
  await import(pathToFileURL(file).href);
}
await uvu.exec(false);
await stopTestRedis();

const plain = printed.replace(/\x1b\[[0-9;]*m/g, '');
const total = Number(/Total:\s+(\d+)/.exec(plain)?.[1] ?? 0);
const passed = Number(/Passed:\s+(\d+)/.exec(plain)?.[1] ?? 0);
const skipped = Number(/Skipped:\s+(\d+)/.exec(plain)?.[1] ?? 0);
const failed = total - passed; // uvu's Total leaves skipped tests out
write(`${passed} passed, ${failed} failed${skipped ? `, ${skipped} skipped` : ''}\n`);
process.exitCode = failed > 0 || total === 0 ? 1 : 0;
// c8 writes coverage on exit; open handles left by a failed test must not hang the run.
setTimeout(() => process.exit(), 200).unref();
