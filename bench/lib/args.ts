/** A mistake in a bench's options: `run.ts` prints the message and the bench's usage, exit 2. */
export class UsageError extends Error {}

/** True for a `UsageError` or an error of `node:util` parseArgs (unknown option, missing value…). */
export function isUsageError(err: unknown): boolean {
  return err instanceof UsageError || String((err as { code?: unknown })?.code ?? '').startsWith('ERR_PARSE_ARGS');
}

/** A numeric option from `min` to `max`, or `fallback` when absent. */
export function numberOption(raw: string | undefined, name: string, fallback: number, min: number, max: number): number {
  if (raw === undefined) return fallback;
  const value = Number(raw);
  if (raw.trim() === '' || !Number.isFinite(value) || value < min || value > max) {
    throw new UsageError(`--${name} must be a number from ${min} to ${max}, got "${raw}"`);
  }
  return value;
}
