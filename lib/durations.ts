/**
 * Durations, as callers write them in definitions and operators in settings
 * (`WEBHOOK_RETRY_SCHEDULE`): a positive integer and a unit, `30s`, `15m`, `24h`, `7d`.
 */

/** JSON Schema `pattern` of a duration: 1 to 6 digits without a leading zero, then `s`, `m`, `h` or `d`. */
export const DURATION_PATTERN = '^[1-9][0-9]{0,5}[smhd]$';

export const UNIT_MS = { s: 1_000, m: 60_000, h: 3_600_000, d: 86_400_000 } as const;

const DURATION = new RegExp(DURATION_PATTERN);

/**
 * Milliseconds of a duration string, or null for anything else: `0s`, decimals, spaces, signs,
 * numbers, other units.
 */
export function parseDuration(value: unknown): number | null {
  if (typeof value !== 'string' || !DURATION.test(value)) return null;
  return Number(value.slice(0, -1)) * UNIT_MS[value[value.length - 1] as keyof typeof UNIT_MS];
}
