import { ApiError, validationError, type ErrorDetail } from '../lib/errors.js';
import { checkBody } from '../lib/validator.js';

const isObject = (v: unknown): v is Record<string, unknown> => typeof v === 'object' && v !== null && !Array.isArray(v);

/**
 * Reads a create or update body: the problems that `check` finds (rules a schema cannot state, with
 * exact paths) and those of schema `schemaName` come back in one `validation` answer, one detail per
 * param (the first found). `refused` names fields a PATCH cannot change (a slug, a source's format),
 * each refused by name with its message instead of as an unknown field.
 */
export function readBody<T>(schemaName: string, body: unknown, check: (body: Record<string, unknown>) => ErrorDetail[] = () => [], refused: Record<string, string> = {}): T {
  const details: ErrorDetail[] = [];
  let rest = body;
  let onlyRefused = false;
  if (isObject(body)) {
    const others = { ...body };
    for (const [field, message] of Object.entries(refused)) {
      if (!Object.hasOwn(others, field)) continue;
      details.push({ param: field, message });
      delete others[field];
    }
    onlyRefused = details.length > 0 && Object.keys(others).length === 0;
    rest = others;
    details.push(...check(others));
  }
  try {
    // a body holding only refused fields is answered for those, not also as an empty PATCH
    if (!onlyRefused) checkBody<T>(schemaName, rest);
  } catch (err) {
    if (!(err instanceof ApiError) || !err.details) throw err;
    details.push(...err.details);
  }
  const seen = new Set<string>();
  const unique = details.filter((d) => !seen.has(d.param) && seen.add(d.param));
  if (unique.length) throw validationError(unique);
  return rest as T;
}
