import { createHash } from 'node:crypto';
import { canonicalJson } from './canonical-json.js';
import { codePoints } from './code-points.js';
import type { ErrorDetail } from './errors.js';
import { parseDuration } from './durations.js';
import { bucketWidthMs } from './event-counters.js';
import { isUnknownReserved, UNKNOWN_RESERVED_MESSAGE } from './event-names.js';
import { isoTimeMs } from './iso-time.js';
import { SLUG_MAX_LENGTH, SLUG_MIN_LENGTH, SLUG_PATTERN } from './slugs.js';

/**
 * The one expression language of segments, message `to.where`, workflow triggers, waits and
 * branches: a JSON tree of `all` / `any` / `not` over attribute, event-count, topic, subscription
 * and (in workflows) event-property conditions. `validateExpression` checks a tree as a caller sent
 * it; `evaluate` runs a validated one. docs/expressions.md is the user-facing description.
 */

export type Scalar = string | number | boolean | null;

export const OPERATORS = ['eq', 'ne', 'gt', 'gte', 'lt', 'lte', 'in', 'nin', 'exists', 'contains', 'startsWith'] as const;
export type Operator = (typeof OPERATORS)[number];
export const COUNT_OPERATORS = ['eq', 'ne', 'gt', 'gte', 'lt', 'lte'] as const;

/** One operator and its operand; the validator allows exactly one per condition. */
export type Comparison = {
  eq?: Scalar; ne?: Scalar;
  gt?: number | string; gte?: number | string; lt?: number | string; lte?: number | string;
  in?: Scalar[]; nin?: Scalar[];
  exists?: boolean; contains?: Scalar; startsWith?: string;
};
export type AttributeCondition = { attribute: string } & Comparison;
/** A test of a path into an event's `data`: in an event condition's `where`, or of the event being handled. */
export type PropertyFilter = { property: string } & Comparison;
/** One or more count comparisons, all of which must hold. */
export type CountOp = { eq?: number; ne?: number; gt?: number; gte?: number; lt?: number; lte?: number };
export type EventCondition = { event: string; count?: CountOp; within?: string; where?: PropertyFilter[] };
export type SubscriptionCondition = { subscription: { channel?: 'push' | 'email'; enabled?: boolean; platform?: 'ios' | 'android' } };
export type Expression =
  | { all: Expression[] }
  | { any: Expression[] }
  | { not: Expression }
  | AttributeCondition
  | EventCondition
  | { topic: string }
  | SubscriptionCondition
  | PropertyFilter;

// Bounds, stated in docs/expressions.md.
export const MAX_DEPTH = 8;
export const MAX_NODES = 100;
export const MAX_EXPRESSION_BYTES = 16 * 1024;
export const MAX_EVENT_CONDITIONS = 20;
export const MAX_GROUP_ITEMS = 50;
export const MAX_LIST_VALUES = 100;
export const MAX_STRING_LENGTH = 1_024;
export const MAX_WHERE_FILTERS = 10;
export const MAX_COUNT = 1_000_000;
export const MIN_WINDOW_MS = 60_000;
export const MAX_WINDOW_MS = 90 * 86_400_000;
export const MAX_NAME_LENGTH = 128;
/** The validator stops collecting after this many errors. */
export const MAX_ERRORS = 20;

export const BUILTIN_ATTRIBUTES = ['externalId', 'email', 'phone', 'locale', 'timezone', 'verified', 'createdAt'] as const;
export const NAME_PATTERN = '^[A-Za-z_$][A-Za-z0-9_$-]*(\\.[A-Za-z_$][A-Za-z0-9_$-]*)*$';
/** A caller's event name (as ingest takes it), or one with a leading `$` (then one of the reserved names, checked apart). */
export const EXPRESSION_EVENT_PATTERN = '^\\$?[a-z0-9][a-z0-9_.-]{0,99}$';

const NAME = new RegExp(NAME_PATTERN);
const EVENT = new RegExp(EXPRESSION_EVENT_PATTERN);
const SLUG = new RegExp(SLUG_PATTERN);
const BUILTINS: ReadonlySet<string> = new Set(BUILTIN_ATTRIBUTES);
const OPS: ReadonlySet<string> = new Set(OPERATORS);
const COUNT_OPS: ReadonlySet<string> = new Set(COUNT_OPERATORS);
const FORMS = ['all', 'any', 'not', 'attribute', 'event', 'topic', 'subscription', 'property'] as const;

// ---------------------------------------------------------------------------------------------
// Validation

type Ctx = { errors: ErrorDetail[]; nodes: number; events: number; eventProperties: boolean; tooDeep: boolean };

const isObject = (v: unknown): v is Record<string, unknown> => typeof v === 'object' && v !== null && !Array.isArray(v);
const isScalar = (v: unknown): v is Scalar => v === null || typeof v === 'string' || typeof v === 'boolean' || (typeof v === 'number' && Number.isFinite(v));
const list = (items: readonly string[]) => items.join(', ');

function add(ctx: Ctx, param: string, message: string): void {
  if (ctx.errors.length < MAX_ERRORS) ctx.errors.push({ param, message });
}

/**
 * Checks that `value` is an expression within the bounds; one detail per problem (at most 20),
 * each `param` the JSON path of the failing node under `path` (`where.all[2].count`).
 * `eventProperties` allows `{ property, <op> }` conditions on the event being handled.
 */
export function validateExpression(value: unknown, path: string, options: { eventProperties?: boolean } = {}): ErrorDetail[] {
  const ctx: Ctx = { errors: [], nodes: 0, events: 0, eventProperties: options.eventProperties === true, tooDeep: false };
  let text: string | undefined;
  try {
    text = JSON.stringify(value);
  } catch {
    text = undefined;
  }
  if (text !== undefined && Buffer.byteLength(text) > MAX_EXPRESSION_BYTES) {
    return [{ param: path, message: `expression is larger than ${MAX_EXPRESSION_BYTES / 1024} KB when serialized` }];
  }
  node(value, path, 1, ctx);
  const bounds: ErrorDetail[] = [];
  if (ctx.nodes > MAX_NODES) bounds.push({ param: path, message: `expression has more than ${MAX_NODES} nodes` });
  if (ctx.events > MAX_EVENT_CONDITIONS) bounds.push({ param: path, message: `expression has more than ${MAX_EVENT_CONDITIONS} event conditions` });
  return [...bounds, ...ctx.errors].slice(0, MAX_ERRORS);
}

function formNames(ctx: Ctx): string {
  return list(ctx.eventProperties ? FORMS : FORMS.filter((f) => f !== 'property'));
}

function node(value: unknown, path: string, depth: number, ctx: Ctx): void {
  if (depth > MAX_DEPTH) {
    if (!ctx.tooDeep) add(ctx, path, `expression is nested deeper than ${MAX_DEPTH} levels`);
    ctx.tooDeep = true;
    return;
  }
  ctx.nodes++;
  if (!isObject(value)) return add(ctx, path, `must be an object with one of ${formNames(ctx)}`);
  const forms = FORMS.filter((f) => f in value);
  if (forms.length === 0) return add(ctx, path, `must be an object with one of ${formNames(ctx)}`);
  if (forms.length > 1) return add(ctx, path, `must have only one of ${formNames(ctx)}: found ${forms.map((f) => `"${f}"`).join(' and ')}`);
  switch (forms[0]!) {
    case 'all':
    case 'any': {
      const key = forms[0]!;
      only(value, [key], path, ctx);
      const items = value[key];
      if (!Array.isArray(items) || items.length < 1 || items.length > MAX_GROUP_ITEMS) {
        return add(ctx, `${path}.${key}`, `must be an array of 1 to ${MAX_GROUP_ITEMS} expressions`);
      }
      items.forEach((item, i) => node(item, `${path}.${key}[${i}]`, depth + 1, ctx));
      return;
    }
    case 'not':
      only(value, ['not'], path, ctx);
      return node(value.not, `${path}.not`, depth + 1, ctx);
    case 'attribute':
      return comparison(value, 'attribute', path, ctx);
    case 'property':
      if (!ctx.eventProperties) return add(ctx, path, 'property conditions are only allowed in workflow triggers, waits and branches');
      return comparison(value, 'property', path, ctx);
    case 'event':
      return eventCondition(value, path, ctx);
    case 'topic':
      only(value, ['topic'], path, ctx);
      if (typeof value.topic !== 'string' || value.topic.length < SLUG_MIN_LENGTH || value.topic.length > SLUG_MAX_LENGTH || !SLUG.test(value.topic)) {
        add(ctx, `${path}.topic`, `must be a topic slug (${SLUG_MIN_LENGTH} to ${SLUG_MAX_LENGTH} lowercase letters and digits, single hyphens between)`);
      }
      return;
    case 'subscription':
      return subscription(value, path, ctx);
  }
}

/** Reports every key of `value` outside `allowed`. */
function only(value: Record<string, unknown>, allowed: readonly string[], path: string, ctx: Ctx): void {
  for (const key of Object.keys(value)) if (!allowed.includes(key)) add(ctx, `${path}.${key}`, 'is not an allowed field');
}

function checkName(value: unknown, param: string, what: string, ctx: Ctx): void {
  if (typeof value !== 'string' || value.length > MAX_NAME_LENGTH || !NAME.test(value)) {
    add(ctx, param, `must be ${what} like plan or address.city (letters, digits, _, $, - in dot-separated parts, at most ${MAX_NAME_LENGTH} characters)`);
  }
}

/** An attribute condition or a property filter: the name, then exactly one known operator. */
function comparison(value: Record<string, unknown>, nameKey: 'attribute' | 'property', path: string, ctx: Ctx): void {
  checkName(value[nameKey], `${path}.${nameKey}`, nameKey === 'attribute' ? 'an attribute name' : 'a property path', ctx);
  const ops: string[] = [];
  let unknown = false;
  for (const key of Object.keys(value)) {
    if (key === nameKey) continue;
    if (OPS.has(key)) ops.push(key);
    else {
      add(ctx, `${path}.${key}`, `unknown operator "${key}"`);
      unknown = true;
    }
  }
  // one problem, one detail: an unknown operator already said what is wrong with the node (probe BI)
  if (ops.length === 0) return unknown ? undefined : add(ctx, path, `must have one operator of ${list(OPERATORS)}`);
  if (ops.length > 1) return add(ctx, path, `must have only one operator: found ${ops.map((o) => `"${o}"`).join(' and ')}`);
  operand(ops[0] as Operator, value[ops[0]!], `${path}.${ops[0]}`, ctx);
}

function checkString(value: string, param: string, ctx: Ctx): boolean {
  if (value.length <= MAX_STRING_LENGTH || codePoints(value) <= MAX_STRING_LENGTH) return true;
  add(ctx, param, `must be at most ${MAX_STRING_LENGTH} characters`);
  return false;
}

function operand(op: Operator, value: unknown, param: string, ctx: Ctx): void {
  switch (op) {
    case 'eq':
    case 'ne':
    case 'contains':
      if (!isScalar(value)) return add(ctx, param, 'must be a string, number, boolean or null');
      if (typeof value === 'string') checkString(value, param, ctx);
      return;
    case 'gt':
    case 'gte':
    case 'lt':
    case 'lte':
      if (typeof value === 'string') checkString(value, param, ctx);
      else if (typeof value !== 'number' || !Number.isFinite(value)) add(ctx, param, 'must be a number or a string');
      return;
    case 'in':
    case 'nin':
      if (!Array.isArray(value) || value.length < 1 || value.length > MAX_LIST_VALUES) {
        return add(ctx, param, `must be an array of 1 to ${MAX_LIST_VALUES} strings, numbers, booleans or nulls`);
      }
      value.forEach((item, i) => {
        if (!isScalar(item)) add(ctx, `${param}[${i}]`, 'must be a string, number, boolean or null');
        else if (typeof item === 'string') checkString(item, `${param}[${i}]`, ctx);
      });
      return;
    case 'exists':
      if (typeof value !== 'boolean') add(ctx, param, 'must be true or false');
      return;
    case 'startsWith':
      if (typeof value !== 'string') add(ctx, param, 'must be a string');
      else checkString(value, param, ctx);
      return;
  }
}

function eventCondition(value: Record<string, unknown>, path: string, ctx: Ctx): void {
  ctx.events++;
  only(value, ['event', 'count', 'within', 'where'], path, ctx);
  if (typeof value.event !== 'string' || !EVENT.test(value.event)) {
    add(ctx, `${path}.event`, `must be an event name matching ${EXPRESSION_EVENT_PATTERN}`);
  } else if (isUnknownReserved(value.event)) {
    // such a condition could never match (no event carries the name): a typo of a reserved name
    add(ctx, `${path}.event`, UNKNOWN_RESERVED_MESSAGE);
  } else if (value.event === '$subscriber.deleted') {
    // a delete forgets the subscriber's counters with it, so no subscriber ever counts one (probe DE):
    // as a workflow's trigger or cancelOn, the name is refused for the same reason
    add(ctx, `${path}.event`, 'cannot be $subscriber.deleted: a delete forgets the subscriber\'s events, so no subscriber ever counts one (use a webhook on subscriber.deleted)');
  }
  if (value.count !== undefined) {
    const count = value.count;
    if (!isObject(count) || Object.keys(count).length === 0) {
      add(ctx, `${path}.count`, `must be an object of one or more of ${list(COUNT_OPERATORS)}`);
    } else {
      for (const [op, n] of Object.entries(count)) {
        if (!COUNT_OPS.has(op)) add(ctx, `${path}.count.${op}`, `unknown operator "${op}", must be one of ${list(COUNT_OPERATORS)}`);
        else if (typeof n !== 'number' || !Number.isInteger(n) || n < 0 || n > MAX_COUNT) add(ctx, `${path}.count.${op}`, `must be an integer from 0 to ${MAX_COUNT}`);
      }
    }
  }
  if (value.within !== undefined) {
    const ms = parseDuration(value.within);
    if (ms === null || ms < MIN_WINDOW_MS || ms > MAX_WINDOW_MS) add(ctx, `${path}.within`, 'must be a duration from 1m to 90d, at most 6 digits, like 30m, 24h or 7d');
  }
  if (value.where !== undefined) {
    const where = value.where;
    if (!Array.isArray(where) || where.length < 1 || where.length > MAX_WHERE_FILTERS) {
      return add(ctx, `${path}.where`, `must be an array of 1 to ${MAX_WHERE_FILTERS} property filters`);
    }
    where.forEach((filter, i) => {
      const param = `${path}.where[${i}]`;
      if (!isObject(filter) || !('property' in filter)) add(ctx, param, `must be a property filter: { "property": "<path>", "<operator>": <value> }`);
      else comparison(filter, 'property', param, ctx);
    });
  }
}

const SUBSCRIPTION_FIELDS: Record<string, readonly unknown[]> = { channel: ['push', 'email'], enabled: [true, false], platform: ['ios', 'android'] };

function subscription(value: Record<string, unknown>, path: string, ctx: Ctx): void {
  only(value, ['subscription'], path, ctx);
  const sub = value.subscription;
  if (!isObject(sub)) return add(ctx, `${path}.subscription`, 'must be an object of channel, enabled, platform (all optional)');
  for (const [key, v] of Object.entries(sub)) {
    // own keys only: `constructor` or `toString` would find Object.prototype's functions
    const allowed = Object.hasOwn(SUBSCRIPTION_FIELDS, key) ? SUBSCRIPTION_FIELDS[key] : undefined;
    if (!allowed) add(ctx, `${path}.subscription.${key}`, 'is not an allowed field');
    else if (!allowed.includes(v)) add(ctx, `${path}.subscription.${key}`, `must be one of ${allowed.map((a) => JSON.stringify(a)).join(', ')}`);
  }
}

// ---------------------------------------------------------------------------------------------
// Evaluation

export type EventLike = { name: string; data: Record<string, unknown> };

export type Subject = {
  /** the subscriber record: externalId, email, phone, locale, timezone, verified, createdAt, properties */
  subscriber: Record<string, unknown> & { properties?: Record<string, unknown> };
  /** slugs of the topics the subscriber belongs to */
  topics: ReadonlySet<string>;
  subscriptions: readonly { channel: string; enabled: boolean; platform: string | null; invalidated: boolean }[];
  /** how many of the subscriber's events match `condition` (name and where) within its window, now */
  count(condition: EventCondition): number;
  /** the event being handled (workflow trigger, wait, branch), if any */
  event?: EventLike;
};

/** Follows a dotted path through nested objects (own keys only, never into arrays); undefined when missing. */
function walk(root: unknown, path: string): unknown {
  let value = root;
  let start = 0;
  for (;;) {
    if (typeof value !== 'object' || value === null || Array.isArray(value)) return undefined;
    const dot = path.indexOf('.', start);
    const part = dot < 0 ? (start === 0 ? path : path.slice(start)) : path.slice(start, dot);
    if (!Object.hasOwn(value, part)) return undefined;
    value = (value as Record<string, unknown>)[part];
    if (dot < 0) return value;
    start = dot + 1;
  }
}

/**
 * The value an attribute name reads: a built-in field (`email`, `createdAt`, ...), `properties.<path>`,
 * or any other name as `properties.<name>` (so `plan` is `properties.plan`, and a bare `properties`
 * is `properties.properties`). Undefined when missing.
 */
export function attributeValue(subscriber: Subject['subscriber'], name: string): unknown {
  const dot = name.indexOf('.');
  const head = dot < 0 ? name : name.slice(0, dot);
  // `properties.<path>` reads into properties; a bare `properties` is a property like any other name
  if (head === 'properties' && dot >= 0) return walk(subscriber.properties, name.slice(dot + 1));
  if (BUILTINS.has(head)) return walk(subscriber, name);
  return walk(subscriber.properties, name);
}

function ordered(value: unknown, operand: unknown, test: (c: number) => boolean): boolean {
  if (typeof operand === 'number') return typeof value === 'number' && test(value < operand ? -1 : value > operand ? 1 : 0);
  if (typeof operand !== 'string' || typeof value !== 'string') return false;
  // two date-times compare as the instants they name: by their text, a stored `createdAt`
  // (`…27.787Z`) came before `…27Z` of the same second, and an offset (`+01:00`) was never applied
  // (probe EK: a subscriber created 30 minutes after `gte` a time written with +01:00 was no member)
  const at = isoTimeMs(value);
  const bound = at === null ? null : isoTimeMs(operand);
  if (at !== null && bound !== null) return test(Math.sign(at - bound));
  return test(value < operand ? -1 : value > operand ? 1 : 0);
}

/** Applies the single operator of `cond` to `value` (undefined = missing). */
function compare(value: unknown, cond: Comparison): boolean {
  if (cond.eq !== undefined) return value === cond.eq;
  if (cond.ne !== undefined) return value !== cond.ne;
  if (cond.gt !== undefined) return ordered(value, cond.gt, (c) => c > 0);
  if (cond.gte !== undefined) return ordered(value, cond.gte, (c) => c >= 0);
  if (cond.lt !== undefined) return ordered(value, cond.lt, (c) => c < 0);
  if (cond.lte !== undefined) return ordered(value, cond.lte, (c) => c <= 0);
  if (cond.in !== undefined) return value !== undefined && cond.in.includes(value as Scalar);
  if (cond.nin !== undefined) return value === undefined || !cond.nin.includes(value as Scalar);
  if (cond.exists !== undefined) return (value !== undefined && value !== null) === cond.exists;
  if (cond.contains !== undefined) {
    if (typeof value === 'string') return typeof cond.contains === 'string' && value.includes(cond.contains);
    return Array.isArray(value) && value.includes(cond.contains);
  }
  if (cond.startsWith !== undefined) return typeof value === 'string' && value.startsWith(cond.startsWith);
  return false;
}

/** True when `event` has the condition's name and satisfies all its `where` filters. */
export function matchesEvent(condition: EventCondition, event: EventLike): boolean {
  if (event.name !== condition.event) return false;
  if (condition.where) for (const f of condition.where) if (!compare(walk(event.data, f.property), f)) return false;
  return true;
}

const DEFAULT_COUNT: CountOp = { gte: 1 };

/** True when count `n` satisfies the condition's count (default `{ gte: 1 }`; every given comparison must hold). */
export function countMatches(condition: EventCondition, n: number): boolean {
  const c = condition.count ?? DEFAULT_COUNT;
  return (c.eq === undefined || n === c.eq) && (c.ne === undefined || n !== c.ne)
    && (c.gt === undefined || n > c.gt) && (c.gte === undefined || n >= c.gte)
    && (c.lt === undefined || n < c.lt) && (c.lte === undefined || n <= c.lte);
}

/** Evaluates a validated expression against one subscriber. */
export function evaluate(expr: Expression, subject: Subject): boolean {
  if ('all' in expr) {
    for (const c of expr.all) if (!evaluate(c, subject)) return false;
    return true;
  }
  if ('any' in expr) {
    for (const c of expr.any) if (evaluate(c, subject)) return true;
    return false;
  }
  if ('not' in expr) return !evaluate(expr.not, subject);
  if ('attribute' in expr) return compare(attributeValue(subject.subscriber, expr.attribute), expr);
  if ('event' in expr) return countMatches(expr, subject.count(expr));
  if ('topic' in expr) return subject.topics.has(expr.topic);
  if ('subscription' in expr) {
    const want = expr.subscription;
    return subject.subscriptions.some((s) => (want.channel === undefined || s.channel === want.channel)
      && (want.platform === undefined || s.platform === want.platform)
      && (want.enabled === undefined || (s.enabled && !s.invalidated) === want.enabled));
  }
  if ('property' in expr) return subject.event !== undefined && compare(walk(subject.event.data, expr.property), expr);
  return false;
}

// ---------------------------------------------------------------------------------------------
// Analysis

function children(expr: Expression): readonly Expression[] {
  if ('all' in expr) return expr.all;
  if ('any' in expr) return expr.any;
  if ('not' in expr) return [expr.not];
  return [];
}

/** Every event condition in the expression (depth-first order, duplicates kept). */
export function eventConditions(expr: Expression): EventCondition[] {
  const out: EventCondition[] = [];
  const visit = (e: Expression): void => {
    if ('event' in e) out.push(e);
    else for (const c of children(e)) visit(c);
  };
  visit(expr);
  return out;
}

const keys = new WeakMap<EventCondition, string>();

/**
 * A short stable key (16 hex chars of sha256) of what an event counter counts: the event name,
 * the `where` filters (canonical JSON; key order and filter order do not matter) and the bucket
 * width of the window. Conditions that differ only in `count`, or in windows of one bucket width,
 * share a key and so a counter. Memoized per condition object.
 */
export function conditionKey(condition: EventCondition): string {
  let key = keys.get(condition);
  if (key === undefined) {
    const filters = [...new Set((condition.where ?? []).map(canonicalJson))].sort();
    const width = bucketWidthMs(condition.within === undefined ? null : parseDuration(condition.within));
    key = createHash('sha256').update(JSON.stringify([condition.event, filters, width])).digest('hex').slice(0, 16);
    keys.set(condition, key);
  }
  return key;
}

export type Dependencies = { attributes: boolean; topics: boolean; subscriptions: boolean; events: string[]; eventProperties: boolean };

/** Which kinds of state an expression reads, so callers load only those (`events`: distinct event names). */
export function dependencies(expr: Expression): Dependencies {
  const deps: Dependencies = { attributes: false, topics: false, subscriptions: false, events: [], eventProperties: false };
  const events = new Set<string>();
  const visit = (e: Expression): void => {
    if ('attribute' in e) deps.attributes = true;
    else if ('event' in e) events.add(e.event);
    else if ('topic' in e) deps.topics = true;
    else if ('subscription' in e) deps.subscriptions = true;
    else if ('property' in e) deps.eventProperties = true;
    else for (const c of children(e)) visit(c);
  };
  visit(expr);
  deps.events = [...events];
  return deps;
}
