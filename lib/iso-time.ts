/**
 * ISO 8601 text as Herald reads it where no schema does (CLI flags, expression operands): a date-time
 * with its offset (`2027-01-01T09:00:00Z`, `…T09:00+02:00`, fractions of a second allowed), or, where
 * the caller allows it, a date alone (its midnight UTC). A time without an offset is refused rather
 * than read in the local time zone of whatever machine reads it, and so is every other text that
 * `Date.parse` would take leniently (`2027-01-01 (note)`, `… 10:00 PST`: probe V), and a day or time
 * that does not exist (`2030-02-30`, `24:00`), which `Date.parse` rolls over. A fraction of any length
 * is read to the millisecond.
 */
const ISO = /^(\d{4})-(\d{2})-(\d{2})(?:[Tt](\d{2}):(\d{2})(?::(\d{2})(?:\.(\d+))?)?(?:([Zz])|([+-])(\d{2}):?(\d{2})))?$/;

/** Milliseconds since the epoch of `text`, or null when it is not such a date-time (or date, with `date: true`). */
export function isoTimeMs(text: string, options: { date?: boolean } = {}): number | null {
  const m = ISO.exec(text);
  if (!m) return null;
  const [, y, mo, d, hh, mi, ss, fraction, , sign, oh, om] = m;
  if (hh === undefined && !options.date) return null;
  // setUTCFullYear, not Date.UTC, which reads years 0–99 as 1900–1999 (probe ET: such a date was no date)
  const check = new Date(0);
  const day = check.setUTCFullYear(Number(y), Number(mo) - 1, Number(d));
  if (check.getUTCFullYear() !== Number(y) || check.getUTCMonth() !== Number(mo) - 1 || check.getUTCDate() !== Number(d)) return null;
  if (hh === undefined) return day;
  if (Number(hh) > 23 || Number(mi) > 59 || Number(ss ?? 0) > 59 || Number(oh ?? 0) > 23 || Number(om ?? 0) > 59) return null;
  const offsetMinutes = sign === undefined ? 0 : (sign === '-' ? -1 : 1) * (Number(oh) * 60 + Number(om));
  const ms = Number((fraction ?? '').padEnd(3, '0').slice(0, 3));
  return day + ((Number(hh) * 60 + Number(mi) - offsetMinutes) * 60 + Number(ss ?? 0)) * 1000 + ms;
}
