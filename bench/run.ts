// `npm run bench -- <name> [options]`: runs bench/<name>.ts and ends with its one JSON line.
import { readdirSync } from 'node:fs';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { isUsageError } from './lib/args.js';
import { printResult, type BenchResult } from './lib/result.js';

type BenchModule = { run: (args: string[]) => Promise<BenchResult>; description?: string; usage?: string };

const DIR = fileURLToPath(new URL('.', import.meta.url));

function available(): string[] {
  return readdirSync(DIR)
    .filter((f) => f.endsWith('.ts') && !f.endsWith('.d.ts') && f !== 'run.ts')
    .map((f) => f.slice(0, -3))
    .sort();
}

const load = (name: string) => import(pathToFileURL(`${DIR}${name}.ts`).href) as Promise<BenchModule>;

async function listAndExit(problem: string): Promise<never> {
  const lines = [problem, 'usage: npm run bench -- <name> [options]', '', 'benches:'];
  for (const name of available()) {
    const mod = await load(name);
    lines.push(`  ${name.padEnd(12)}${mod.description ?? ''}`);
    if (mod.usage) lines.push('', ...mod.usage.split('\n').map((l) => `    ${l}`), '');
  }
  process.stderr.write(lines.join('\n') + '\n');
  process.exit(2);
}

// Children (redis-server, service, hello-world) are killed by the exit hook of bench/lib/child.ts.
for (const signal of ['SIGINT', 'SIGTERM'] as const) process.once(signal, () => process.exit(130));

const [name, ...args] = process.argv.slice(2);
if (!name || name.startsWith('-')) await listAndExit('no bench named');
if (!available().includes(name!)) await listAndExit(`unknown bench "${name}"`);

const bench = await load(name!);
let result: BenchResult;
try {
  result = await bench.run(args);
} catch (err) {
  if (isUsageError(err)) {
    process.stderr.write(`bench ${name}: ${(err as Error).message}\n${bench.usage ? `usage: npm run bench -- ${bench.usage}\n` : ''}`);
    process.exit(2);
  }
  process.stderr.write(`bench ${name}: ${(err as Error).stack ?? String(err)}\n`);
  process.exit(1);
}
await printResult(result);
process.exit(0);
