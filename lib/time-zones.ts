/** IANA time zones as this runtime's Intl knows them (subscriber `timezone`, docs/subscribers.md). */
import { IANA_TIME_ZONE_NAMES } from './iana-time-zones.js';

/** Lowercased name → IANA's spelling, zones and links (aliases) alike. */
const SPELLING = new Map(IANA_TIME_ZONE_NAMES.map((name) => [name.toLowerCase(), name]));

/** This runtime's canonical zones, lowercased: a zone newer than the list's tzdata is among them. */
const CANONICAL = new Set(Intl.supportedValuesOf('timeZone').map((name) => name.toLowerCase()));

/**
 * Whether `value` names an IANA time zone this runtime knows (Intl matches names ignoring case): a
 * zone or link of the list, or a zone Intl calls canonical. ICU's own extra names, which IANA
 * removed (`SystemV/AST4`, `US/Pacific-New`, tzdata 2020b), were taken too (probe EK).
 */
export function isTimeZone(value: string): boolean {
  const lower = value.toLowerCase();
  if (!SPELLING.has(lower) && !CANONICAL.has(lower)) return false;
  try {
    new Intl.DateTimeFormat('en', { timeZone: value });
    return true;
  } catch {
    return false;
  }
}

/**
 * A known time zone written as IANA writes it: Intl takes `europe/paris` for `Europe/Paris`, so a
 * name differing from IANA's only by case is stored in IANA's case (one spelling per zone, so an
 * expression's `eq: "Europe/Paris"` finds it). An alias (`Asia/Kolkata`, which Intl resolves to
 * `Asia/Calcutta`; `US/Eastern`) is kept as the alias, in IANA's case too: `asia/kolkata` was kept
 * as sent, and one zone had as many spellings as callers (probe DL). A name outside the database's
 * list that Intl knows gets Intl's case when it differs only by case, else is kept as sent.
 */
export function timeZoneAsNamed(value: string): string {
  const spelled = SPELLING.get(value.toLowerCase());
  if (spelled !== undefined && isTimeZone(spelled)) return spelled;
  try {
    const resolved = new Intl.DateTimeFormat('en', { timeZone: value }).resolvedOptions().timeZone;
    return resolved.toLowerCase() === value.toLowerCase() ? resolved : value;
  } catch {
    return value;
  }
}
