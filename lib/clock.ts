/**
 * The one source of time. Tests move it with `setClockOffset`; nothing else calls `Date.now()`.
 */
let offsetMs = 0;

/** Milliseconds since the epoch, as the service sees them. */
export function now(): number {
  return Date.now() + offsetMs;
}

let lastMs = Number.NaN;
let lastIso = '';

/** ISO 8601 form of `ms` (default: now). The last one is remembered: every answer asks for it. */
export function isoNow(ms: number = now()): string {
  if (ms !== lastMs) {
    lastIso = new Date(ms).toISOString();
    lastMs = ms;
  }
  return lastIso;
}

/** Shifts the clock of this process by `ms` (tests only). */
export function setClockOffset(ms: number): void {
  offsetMs = ms;
}
