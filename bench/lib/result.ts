/**
 * What every benchmark returns, and the one line that ends its output. The JSON line is the
 * machine-readable record: scripts read the LAST line of stdout and nothing else.
 */
export type BenchResult = {
  /** the bench's name, as given to `npm run bench -- <name>` */
  bench: string;
  /** what `value` measures, e.g. `requests_per_s` */
  metric: string;
  value: number;
  unit: string;
  /** the same metric measured in the same run on the reference (Koa hello-world, raw redis-benchmark) */
  baseline: { name: string; value: number };
  /** value / baseline.value */
  ratio: number;
  /** the ratio the bench should reach */
  target: number;
  /** any further figures (latencies, counts, settings) */
  [extra: string]: unknown;
};

/** Rounds to `digits` decimals (figures in the JSON line need no more). */
export function round(value: number, digits = 2): number {
  const f = 10 ** digits;
  return Math.round(value * f) / f;
}

/** `value / baseline`, 0 when the baseline is 0. */
export function ratioOf(value: number, baseline: number): number {
  return baseline > 0 ? round(value / baseline, 3) : 0;
}

/** The final JSON line (no newline). */
export function resultLine(result: BenchResult): string {
  return JSON.stringify(result);
}

/** Writes the final JSON line to stdout and resolves once it is flushed. */
export function printResult(result: BenchResult): Promise<void> {
  return new Promise((done) => process.stdout.write(resultLine(result) + '\n', () => done()));
}

/** A figure for the printed report: grouped thousands, `digits` decimals. */
export const fmt = (n: number, digits = 0): string => n.toLocaleString('en-US', { minimumFractionDigits: digits, maximumFractionDigits: digits });

/** Prints one line of the report. */
export const say = (line = ''): void => void process.stdout.write(line + '\n');
