import { Ajv, type ErrorObject, type SchemaValidateFunction, type ValidateFunction } from 'ajv';
import addFormatsModule from 'ajv-formats';
import { MAX_DETAILS, validationError, type ErrorDetail } from './errors.js';
import { allSchemas, type Schema } from './schemas/index.js';
import { isTimeZone } from './time-zones.js';

// ajv-formats ships CommonJS with a default export property
const addFormats = ((addFormatsModule as unknown as { default?: typeof addFormatsModule }).default ?? addFormatsModule) as unknown as (ajv: Ajv) => Ajv;

const ROOT = 'herald';

/** A local part of atoms (ASCII atext or any non-ASCII letter or digit) joined by single dots, then a domain of two or more labels. */
const INTERNATIONAL_EMAIL = /^[\p{L}\p{N}\p{M}!#$%&'*+/=?^_`{|}~-]+(?:\.[\p{L}\p{N}\p{M}!#$%&'*+/=?^_`{|}~-]+)*@(?:[\p{L}\p{N}](?:[\p{L}\p{N}\p{M}-]{0,61}[\p{L}\p{N}\p{M}])?\.)+[\p{L}\p{M}]{2,63}$/u;

/** One ajv instance holding every schema of `lib/schemas` under `herald#/components/schemas/<Name>`. */
export function createAjv(schemas: Record<string, Schema>, options: { coerceTypes?: boolean; allErrors?: boolean } = {}): Ajv {
  // verbose: an error carries its schema, so a failed oneOf can say what its alternatives are (`x-errorMessage`)
  const ajv = new Ajv({ allErrors: options.allErrors ?? true, strict: false, verbose: true, coerceTypes: options.coerceTypes ?? false, useDefaults: true });
  addFormats(ajv);
  // A date-time must also be one the code can read: ajv-formats accepts RFC 3339 forms `Date.parse`
  // cannot (`+00` offsets, leap second `23:59:60`), whose NaN would be stored and break every read.
  const dateTime = ajv.formats['date-time'] as { validate: (s: string) => boolean; compare: (a: string, b: string) => number | undefined };
  ajv.addFormat('date-time', { type: 'string', validate: (s: string) => dateTime.validate(s) && Number.isFinite(Date.parse(s)), compare: dateTime.compare });
  // An email address may be internationalized (RFC 6531: UTF-8 in the local part, a Unicode domain):
  // what ajv-formats accepts, or the same shape with letters and digits of any script
  const asciiEmail = ajv.formats.email as RegExp;
  // under JSON Schema's name for it, `idn-email` (RFC 6531), which the published document uses: a client
  // checking `format: email` (ASCII only) refused addresses the service takes (probe F1)
  // A local part is at most 64 octets (RFC 5321 4.5.3.1.1, UTF-8 under RFC 6531): a mail server refuses a longer one
  const localPartFits = (s: string) => Buffer.byteLength(s.slice(0, s.lastIndexOf('@'))) <= 64;
  ajv.addFormat('idn-email', { type: 'string', validate: (s: string) => (asciiEmail.test(s) || (/[^\x00-\x7f]/.test(s) && INTERNATIONAL_EMAIL.test(s))) && localPartFits(s) });
  // `x-timeZone`: a time zone this runtime knows (IANA), checked with the rest of the body so a bad
  // one is listed beside the body's other failing fields (an extension keyword other validators skip)
  const timeZone: SchemaValidateFunction = (on: boolean, value: string) => {
    if (!on || isTimeZone(value)) return true;
    timeZone.errors = [{ keyword: 'x-timeZone', message: 'is not an IANA time zone', params: {} }];
    return false;
  };
  ajv.addKeyword({ keyword: 'x-timeZone', type: 'string', schemaType: 'boolean', validate: timeZone, errors: true });
  ajv.addSchema({ $id: ROOT, components: { schemas } });
  return ajv;
}

const bodies = createAjv(allSchemas());
/** The same schemas, stopping at a body's first problem: what a valid body costs, and all a huge invalid one gets. */
const firstProblem = createAjv(allSchemas(), { allErrors: false });
const queries = createAjv(allSchemas(), { coerceTypes: true });

/**
 * Milliseconds of `text` read as the API's schemas read a `date-time` (RFC 3339 with its offset,
 * `T` or a space between date and time, read to the millisecond), or null where they refuse it: the
 * one rule for date-times read outside a schema too, such as a source's mapped timestamp (probe FB:
 * a source refused `2026-12-01 08:37:47Z` that `POST /v1/events` takes, and took a time without seconds it refuses).
 */
export function dateTimeMs(text: string): number | null {
  const format = bodies.formats['date-time'] as { validate: (s: string) => boolean };
  return format.validate(text) ? Date.parse(text) : null;
}
const cache = new Map<string, ValidateFunction>();

function compiled(ajv: Ajv, name: string, kind: string): ValidateFunction {
  const key = `${kind}:${name}`;
  let fn = cache.get(key);
  if (!fn) {
    fn = ajv.getSchema(`${ROOT}#/components/schemas/${name}`);
    if (!fn) throw new Error(`unknown schema ${name}`);
    cache.set(key, fn);
  }
  return fn;
}

/** `/events/3/name` → `events[3].name`, the path as the caller wrote it. */
function callerPath(instancePath: string, base: string): string {
  let out = base;
  for (const part of instancePath.split('/').slice(1)) {
    const segment = part.replace(/~1/g, '/').replace(/~0/g, '~');
    out += /^\d+$/.test(segment) ? `[${segment}]` : out ? `.${segment}` : segment;
  }
  return out;
}

/** Errors that say the value has another shape than an alternative wants (not what is inside it). */
const SHAPE = new Set(['type', 'required', 'additionalProperties', 'oneOf', 'anyOf', 'alternatives']);

/**
 * A failed `oneOf`/`anyOf` as the caller should read it. When exactly one alternative fits the
 * value's shape (none of its errors is a type, required or additional field at the value itself),
 * its errors stand and name what is wrong inside (`to.topic` must match pattern…). Otherwise one
 * error at the value, with the schema's `x-errorMessage` (the alternatives in words), replaces
 * every alternative's errors: a dump of each alternative's complaints explains nothing.
 */
function collapseAlternatives(errors: ErrorObject[]): ErrorObject[] {
  let out = errors;
  for (const alt of errors) {
    if (alt.keyword !== 'oneOf' && alt.keyword !== 'anyOf') continue;
    const prefix = `${alt.schemaPath}/`;
    const branches = new Map<string, ErrorObject[]>();
    for (const e of out) {
      if (!e.schemaPath.startsWith(prefix)) continue;
      const branch = e.schemaPath.slice(prefix.length).split('/')[0]!;
      const list = branches.get(branch);
      if (list) list.push(e);
      else branches.set(branch, [e]);
    }
    // (a oneOf that several alternatives matched has no single one to explain)
    const nonePassed = alt.keyword === 'anyOf' || alt.params.passingSchemas == null;
    const fitting = [...branches.values()].filter((list) => !list.some((e) => e.instancePath === alt.instancePath && SHAPE.has(e.keyword)));
    const inside = new Set([...branches.values()].flat());
    if (nonePassed && fitting.length === 1) {
      const keep = new Set(fitting[0]);
      out = out.filter((e) => e !== alt && (!inside.has(e) || keep.has(e)));
    } else {
      const message = (alt.parentSchema as Record<string, unknown> | undefined)?.['x-errorMessage'];
      const one: ErrorObject = { ...alt, keyword: 'alternatives', message: typeof message === 'string' ? message : `must match ${alt.keyword === 'oneOf' ? 'exactly one' : 'one'} of the allowed forms` };
      out = out.filter((e) => !inside.has(e)).map((e) => (e === alt ? one : e));
    }
  }
  return out;
}

/** One `{param, message}` per failing field, the first problem of each. */
export function errorDetails(errors: ErrorObject[], base = ''): ErrorDetail[] {
  const byParam = new Map<string, string>();
  for (const e of collapseAlternatives(errors)) {
    let param = callerPath(e.instancePath, base);
    let message = e.message ?? 'is invalid';
    // a `propertyNames` failure is about one key of the object: name it (`categories.Bad Name`)
    const propertyName = (e as ErrorObject & { propertyName?: string }).propertyName ?? (e.keyword === 'propertyNames' ? (e.params.propertyName as string | undefined) : undefined);
    if (propertyName !== undefined) {
      param = param ? `${param}.${propertyName}` : propertyName;
      if (e.keyword !== 'propertyNames') message = `is not an allowed name: ${message}`;
    }
    if (e.keyword === 'required') {
      param = param ? `${param}.${e.params.missingProperty}` : e.params.missingProperty;
      message = 'is required';
    } else if (e.keyword === 'additionalProperties') {
      param = param ? `${param}.${e.params.additionalProperty}` : e.params.additionalProperty;
      message = 'is not an allowed field';
    } else if (e.keyword === 'enum') {
      message = `must be one of ${(e.params.allowedValues as unknown[]).map((v) => JSON.stringify(v)).join(', ')}`;
    } else if (e.keyword === 'pattern' && typeof (e.parentSchema as Record<string, unknown> | undefined)?.['x-errorMessage'] === 'string') {
      // a pattern said in words (a raw regex left callers to work out a length bound: probe D1)
      message = (e.parentSchema as Record<string, string>)['x-errorMessage']!;
    } else if (e.keyword === 'if') {
      continue; // the branch errors that caused it say more
    }
    if (!param) param = base || 'body';
    if (!byParam.has(param)) byParam.set(param, message);
  }
  if (byParam.size === 0 && errors.length) byParam.set(base || 'body', errors[0]!.message ?? 'is invalid');
  return [...byParam].map(([param, message]) => ({ param, message }));
}

/** Values (objects, arrays, scalars) of a body past which a failing one gets its first problem only. */
export const FULL_CHECK_VALUES = 10_000;

/** Whether `value` holds more than `limit` values, counted until it does. */
function holdsMoreThan(value: unknown, limit: number): boolean {
  const stack: unknown[] = [value];
  for (let n = 0; stack.length > 0; n++) {
    if (n >= limit) return true;
    const v = stack.pop();
    if (v !== null && typeof v === 'object') for (const inner of Array.isArray(v) ? v : Object.values(v)) stack.push(inner);
  }
  return false;
}

/**
 * What is wrong with a JSON body against schema `name`: one detail per failing field (at most
 * MAX_DETAILS), none when it is valid. A body is checked first up to its first problem (all a
 * valid body costs); a failing one is then checked whole for every failing field, unless it holds
 * more than FULL_CHECK_VALUES values: then its first problem is the answer (an array over its
 * `maxItems`, say, is refused without looking inside). Listing every problem of a body of 100,000
 * unknown keys or 30,000 empty events held the process from seconds to minutes (probe K2).
 */
export function bodyProblems(name: string, value: unknown): ErrorDetail[] {
  const first = compiled(firstProblem, name, 'body-first');
  if (first(value)) return [];
  if (holdsMoreThan(value, FULL_CHECK_VALUES)) return errorDetails(first.errors ?? []);
  const fn = compiled(bodies, name, 'body');
  fn(value);
  return errorDetails(fn.errors ?? []).slice(0, MAX_DETAILS);
}

/** Validates a JSON body against schema `name`; throws 400 `validation` naming each failing field. */
export function checkBody<T>(name: string, value: unknown): T {
  const details = bodyProblems(name, value);
  if (details.length) throw validationError(details);
  return value as T;
}

const integerParams = new Map<string, Set<string>>();

/** The properties of query schema `name` that are integers (ajv would coerce `1e1` or `0x10` to one). */
function integersOf(name: string): Set<string> {
  let found = integerParams.get(name);
  if (!found) {
    const properties = (allSchemas()[name]?.properties ?? {}) as Record<string, Schema>;
    found = new Set(Object.entries(properties).filter(([, schema]) => schema.type === 'integer').map(([k]) => k));
    integerParams.set(name, found);
  }
  return found;
}

/** One name or value of a query string, decoded as a form does (`+` is a space); null when its percent-encoding is not UTF-8. */
function decodeQueryPart(raw: string): string | null {
  try {
    return decodeURIComponent(raw.replace(/\+/g, ' '));
  } catch {
    return null;
  }
}

/**
 * The parameters of a raw query string (`ctx.querystring`), every one of them: a name given twice
 * is an array, so it can be refused. Node's `querystring.parse` (what Koa's `ctx.query` is) keeps
 * the first 1,000 pairs only, so a filter sent after 1,000 others (`&` repeated) went unread and
 * the list came back wider (probe T); it also reads malformed or non-UTF-8 percent-encoding as
 * U+FFFD or as the raw text, so `?externalId=%FF` addressed the subscriber "\uFFFD". The URL is
 * bounded by the header size limit, and so is the number of pairs. Empty pairs (`a=1&&b=2`) are
 * nothing; a pair without a name (`?=x`) or with an encoding that is not UTF-8 is a problem.
 */
export function parseQuery(querystring: string): { params: Map<string, string | string[]>; problems: ErrorDetail[] } {
  const params = new Map<string, string | string[]>();
  const problems: ErrorDetail[] = [];
  for (const pair of querystring.split('&')) {
    if (pair === '') continue;
    const eq = pair.indexOf('=');
    const rawName = eq < 0 ? pair : pair.slice(0, eq);
    const name = decodeQueryPart(rawName);
    const value = decodeQueryPart(eq < 0 ? '' : pair.slice(eq + 1));
    if (name === null || name === '') {
      problems.push({ param: 'query', message: name === '' ? 'holds a parameter without a name' : 'holds a parameter name that is not percent-encoded UTF-8' });
      continue;
    }
    if (value === null) {
      problems.push({ param: name, message: 'is not percent-encoded UTF-8' });
      continue;
    }
    const before = params.get(name);
    params.set(name, before === undefined ? value : Array.isArray(before) ? [...before, value] : [before, value]);
  }
  return { params, problems };
}

/**
 * Validates (and coerces) the parameters of a raw query string (`ctx.querystring`, read by
 * `parseQuery`) against schema `name`. An integer parameter is written in decimal digits
 * (`limit=10`, not `1e1`, `0x0a` or `10.0`). Every parameter is given at most once:
 * `?limit=500&limit=1` is 400 naming `limit`, not the last value read and the others unchecked.
 */
export function checkQuery<T>(name: string, querystring: string): T {
  const { query, details } = readQuery<T>(name, querystring);
  if (details.length) throw validationError(details);
  return query;
}

/**
 * The problems of a query string under query schema `name` (those checkQuery throws), for a route
 * that tells them together with its body's (Part 7: `details` lists each failing field).
 */
export function queryProblems(name: string, querystring: string): ErrorDetail[] {
  return readQuery(name, querystring).details;
}

function readQuery<T>(name: string, querystring: string): { query: T; details: ErrorDetail[] } {
  // no prototype: `copy.__proto__ = v` on a plain object would set its prototype (ignored for a
  // string) instead of keeping the key, and `?__proto__=1` would pass unnamed
  const copy: Record<string, unknown> = Object.create(null);
  const { params, problems } = parseQuery(querystring);
  const details: ErrorDetail[] = [];
  const named = new Set<string>();
  const add = (d: ErrorDetail) => {
    if (!named.has(d.param)) details.push(d);
    named.add(d.param);
  };
  problems.forEach(add);
  const integers = integersOf(name);
  for (const [k, v] of params) {
    if (Array.isArray(v)) add({ param: k, message: 'must be given once' });
    else if (!named.has(k)) {
      copy[k] = v;
      if (integers.has(k) && !/^-?\d+$/.test(v)) add({ param: k, message: 'must be an integer, in decimal digits' });
    }
  }
  const fn = compiled(queries, name, 'query');
  if (!fn(copy)) errorDetails(fn.errors ?? []).forEach(add);
  return { query: copy as T, details: details.slice(0, MAX_DETAILS) };
}
