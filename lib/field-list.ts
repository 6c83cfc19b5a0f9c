/**
 * A Redis field/value list (`[field, value, field, value, …]`: an `HGETALL` reply as a Lua script
 * returns it, a stream entry's fields) as a record, from index `from` on (a reply may lead with a
 * status).
 */
export function recordOf(list: readonly string[], from = 0): Record<string, string> {
  const out: Record<string, string> = {};
  for (let i = from; i + 1 < list.length; i += 2) out[list[i]!] = list[i + 1]!;
  return out;
}
