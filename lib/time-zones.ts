/** IANA time zones as this runtime's Intl knows them (subscriber `timezone`, docs/subscribers.md). */

/** Whether `value` names a time zone this runtime knows (IANA; Intl matches names ignoring case). */
export function isTimeZone(value: string): boolean {
  try {
    new Intl.DateTimeFormat('en', { timeZone: value });
    return true;
  } catch {
    return false;
  }
}

/**
 * A known time zone written as IANA writes it: Intl takes `europe/paris` for `Europe/Paris`, so a
 * name differing from Intl's only by case is stored in Intl's case (one spelling per zone, so an
 * expression's `eq: "Europe/Paris"` finds it). An alias Intl resolves to another name
 * (`Asia/Kolkata` to `Asia/Calcutta`, `US/Eastern` to `America/New_York`) is kept as sent.
 */
export function timeZoneAsNamed(value: string): string {
  try {
    const resolved = new Intl.DateTimeFormat('en', { timeZone: value }).resolvedOptions().timeZone;
    return resolved.toLowerCase() === value.toLowerCase() ? resolved : value;
  } catch {
    return value;
  }
}
