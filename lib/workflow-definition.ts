import { apnsContentProblems, reservedDataProblems, type PushContent } from './apns-payload.js';
import { parseDuration } from './durations.js';
import { ApiError, type ErrorDetail } from './errors.js';
import { isUnknownReserved, UNKNOWN_RESERVED_MESSAGE } from './event-names.js';
import { EXPRESSION_EVENT_PATTERN, validateExpression, type Expression } from './expressions.js';
import { checkBody } from './validator.js';
import { MAX_DEFINITION_BYTES, MAX_NESTING, MAX_STEPS, STEP_NAME_PATTERN, STEP_TYPES } from './workflow-limits.js';

/**
 * The workflow definition language (docs/workflows.md): a trigger, a tree of steps, and an
 * optional cancel event. Steps form a tree (branches and waits hold nested step lists, nothing
 * jumps back), so a definition cannot loop. `validateWorkflowDefinition` checks one as a caller
 * sent it; the runtime (actors/workflow-engine.ts) runs validated ones.
 */

/** A `send` step's message: exactly the content `POST /v1/messages` accepts (schema `SendContent`). */
export type SendContent = PushContent;

export type Step =
  | { type: 'sleep'; name?: string; duration: string }
  | { type: 'wait'; name?: string; event: string; where?: Expression; timeout: string; onEvent?: Step[]; onTimeout?: Step[] }
  | { type: 'branch'; name?: string; if: Expression; then?: Step[]; else?: Step[] }
  | { type: 'send'; name?: string; message: SendContent }
  | { type: 'exit'; name?: string };

export type WorkflowDefinition = { trigger: { event: string; where?: Expression }; steps: Step[]; cancelOn?: { event: string; where?: Expression } };

export const MIN_STEP_DURATION_MS = 1_000;
export const MAX_STEP_DURATION_MS = 90 * 86_400_000;

/** The fields each step type takes besides `type` and `name`, and those it requires. */
const FIELDS: Record<Step['type'], readonly string[]> = {
  sleep: ['duration'],
  wait: ['event', 'where', 'timeout', 'onEvent', 'onTimeout'],
  branch: ['if', 'then', 'else'],
  send: ['message'],
  exit: [],
};
const REQUIRED: Record<Step['type'], readonly string[]> = { sleep: ['duration'], wait: ['event', 'timeout'], branch: ['if'], send: ['message'], exit: [] };

const EVENT = new RegExp(EXPRESSION_EVENT_PATTERN);
const STEP_NAME = new RegExp(STEP_NAME_PATTERN);

type Ctx = { details: ErrorDetail[]; steps: number; names: Map<string, string> };

const isObject = (v: unknown): v is Record<string, unknown> => typeof v === 'object' && v !== null && !Array.isArray(v);
const join = (base: string, key: string) => (base ? `${base}.${key}` : key);

/**
 * Checks a workflow definition `{ trigger, steps, cancelOn? }`: every problem as one detail whose
 * `param` is its path under `base` (`steps[2].then[0].duration`, `trigger.where.all[1].eq`).
 * Empty when the definition is valid. With `partial` (a PATCH), `trigger` and `steps` may be absent.
 */
export function validateWorkflowDefinition(def: unknown, base = '', options: { partial?: boolean } = {}): ErrorDetail[] {
  if (!isObject(def)) return [{ param: base || 'body', message: 'must be an object with trigger and steps' }];
  const ctx: Ctx = { details: [], steps: 0, names: new Map() };
  for (const key of Object.keys(def)) if (!['trigger', 'steps', 'cancelOn'].includes(key)) ctx.details.push({ param: join(base, key), message: 'is not an allowed field' });
  if (def.trigger !== undefined || !options.partial) eventSpec(def.trigger, join(base, 'trigger'), 'trigger', ctx);
  if (def.cancelOn !== undefined) eventSpec(def.cancelOn, join(base, 'cancelOn'), 'cancelOn', ctx);
  const steps = join(base, 'steps');
  if (def.steps !== undefined) stepList(def.steps, steps, 1, ctx);
  else if (!options.partial) ctx.details.push({ param: steps, message: 'is required' });
  if (ctx.steps > MAX_STEPS) ctx.details.unshift({ param: steps, message: `holds ${ctx.steps} steps counting nested ones; at most ${MAX_STEPS}` });
  return ctx.details;
}

/**
 * The problem of a whole definition (`{ trigger, steps, cancelOn }`, as stored: a PATCH's parts
 * merged with the current version's) over MAX_DEFINITION_BYTES serialized, or null.
 */
export function definitionSizeProblem(def: unknown): ErrorDetail | null {
  const bytes = Buffer.byteLength(JSON.stringify(def), 'utf8');
  if (bytes <= MAX_DEFINITION_BYTES) return null;
  return { param: 'body', message: `trigger, steps and cancelOn together are ${bytes} bytes serialized; at most ${MAX_DEFINITION_BYTES}` };
}

function eventName(value: unknown, param: string, ctx: Ctx): void {
  if (typeof value !== 'string' || !EVENT.test(value)) {
    ctx.details.push({ param, message: value === undefined ? 'is required' : `must be an event name matching ${EXPRESSION_EVENT_PATTERN}` });
  } else if (isUnknownReserved(value)) {
    ctx.details.push({ param, message: UNKNOWN_RESERVED_MESSAGE });
  }
}

function where(value: unknown, param: string, ctx: Ctx): void {
  ctx.details.push(...validateExpression(value, param, { eventProperties: true }));
}

/**
 * A deleted subscriber runs nothing: its runs are canceled with it (reason `subscriber_deleted`)
 * before its `$subscriber.deleted` could start, resume or cancel one, so naming that event as a
 * trigger, a wait or a cancelOn could never take effect.
 */
function neverDeleted(event: unknown, param: string, what: string, ctx: Ctx): void {
  if (event !== '$subscriber.deleted') return;
  const why = what === 'trigger' ? 'a deleted subscriber runs no workflow (use a webhook on subscriber.deleted)' : 'deleting the subscriber already cancels its runs (reason subscriber_deleted)';
  ctx.details.push({ param, message: `cannot be $subscriber.deleted: ${why}` });
}

/** `trigger` and `cancelOn`: `{ event, where? }`. */
function eventSpec(value: unknown, path: string, what: string, ctx: Ctx): void {
  if (value === undefined) {
    ctx.details.push({ param: path, message: 'is required' });
    return;
  }
  if (!isObject(value)) {
    ctx.details.push({ param: path, message: `must be an object { event, where? }${what === 'cancelOn' ? ' or null' : ''}` });
    return;
  }
  for (const key of Object.keys(value)) if (key !== 'event' && key !== 'where') ctx.details.push({ param: `${path}.${key}`, message: 'is not an allowed field' });
  eventName(value.event, `${path}.event`, ctx);
  neverDeleted(value.event, `${path}.event`, what, ctx);
  if (value.where !== undefined) where(value.where, `${path}.where`, ctx);
}

function duration(value: unknown, param: string, ctx: Ctx): void {
  const ms = parseDuration(value);
  if (ms === null || ms < MIN_STEP_DURATION_MS || ms > MAX_STEP_DURATION_MS) {
    ctx.details.push({ param, message: value === undefined ? 'is required' : 'must be a duration from 1s to 90d, at most 6 digits, like 30s, 15m, 24h or 7d' });
  }
}

function stepList(value: unknown, path: string, depth: number, ctx: Ctx): void {
  if (!Array.isArray(value)) {
    ctx.details.push({ param: path, message: 'must be an array of steps' });
    return;
  }
  if (value.length === 0) {
    ctx.details.push({ param: path, message: depth === 1 ? 'must hold at least one step' : 'is empty: a step list references nothing; leave it out instead' });
    return;
  }
  // a list longer than a definition may be is refused for that alone: its steps are not read (probe
  // K2: 40,000 of them each with its own detail)
  if (value.length > MAX_STEPS) {
    ctx.details.push({ param: path, message: `holds ${value.length} steps; at most ${MAX_STEPS} counting nested ones` });
    return;
  }
  // said once, at the first list too deep; its steps are still checked and counted, so every problem
  // comes at once (a body nests 64 levels at most, docs/architecture.md, which bounds this recursion)
  if (depth === MAX_NESTING + 1) ctx.details.push({ param: path, message: `nests steps deeper than ${MAX_NESTING} levels` });
  let exitAt: string | null = null;
  let unreachable = false;
  value.forEach((step, i) => {
    const p = `${path}[${i}]`;
    ctx.steps++;
    // the first step after an exit is reported; the ones after it are unreachable for the same reason
    if (exitAt !== null && !unreachable) {
      ctx.details.push({ param: p, message: `is unreachable: it follows the exit step ${exitAt} in the same list` });
      unreachable = true;
    }
    if (isObject(step) && step.type === 'exit') exitAt ??= p;
    stepOf(step, p, depth, ctx);
  });
}

function stepOf(step: unknown, path: string, depth: number, ctx: Ctx): void {
  if (!isObject(step)) {
    ctx.details.push({ param: path, message: `must be a step object with a type of ${STEP_TYPES.join(', ')}` });
    return;
  }
  const type = step.type;
  if (typeof type !== 'string' || !(STEP_TYPES as readonly string[]).includes(type)) {
    ctx.details.push({ param: `${path}.type`, message: type === undefined ? `is required: one of ${STEP_TYPES.join(', ')}` : `must be one of ${STEP_TYPES.join(', ')}` });
    return;
  }
  const kind = type as Step['type'];
  if (step.name !== undefined) {
    if (typeof step.name !== 'string' || !STEP_NAME.test(step.name)) {
      ctx.details.push({ param: `${path}.name`, message: `must match ${STEP_NAME_PATTERN}` });
    } else {
      const first = ctx.names.get(step.name);
      if (first) ctx.details.push({ param: `${path}.name`, message: `is already the name of ${first}; step names are unique within a workflow` });
      else ctx.names.set(step.name, path);
    }
  }
  for (const key of Object.keys(step)) {
    if (key !== 'type' && key !== 'name' && !FIELDS[kind].includes(key)) ctx.details.push({ param: `${path}.${key}`, message: `is not a field of ${kind === 'exit' ? 'an' : 'a'} ${kind} step` });
  }
  for (const key of REQUIRED[kind]) if (step[key] === undefined) ctx.details.push({ param: `${path}.${key}`, message: 'is required' });
  switch (kind) {
    case 'sleep':
      if (step.duration !== undefined) duration(step.duration, `${path}.duration`, ctx);
      return;
    case 'wait':
      if (step.event !== undefined) eventName(step.event, `${path}.event`, ctx);
      neverDeleted(step.event, `${path}.event`, 'wait', ctx);
      if (step.where !== undefined) where(step.where, `${path}.where`, ctx);
      if (step.timeout !== undefined) duration(step.timeout, `${path}.timeout`, ctx);
      if (step.onEvent !== undefined) stepList(step.onEvent, `${path}.onEvent`, depth + 1, ctx);
      if (step.onTimeout !== undefined) stepList(step.onTimeout, `${path}.onTimeout`, depth + 1, ctx);
      return;
    case 'branch':
      if (step.if !== undefined) where(step.if, `${path}.if`, ctx);
      if (step.then === undefined && step.else === undefined) ctx.details.push({ param: path, message: 'a branch needs a non-empty then or else' });
      if (step.then !== undefined) stepList(step.then, `${path}.then`, depth + 1, ctx);
      if (step.else !== undefined) stepList(step.else, `${path}.else`, depth + 1, ctx);
      return;
    case 'send':
      if (step.message !== undefined) ctx.details.push(...sendContentProblems(step.message, `${path}.message`));
      return;
    case 'exit':
      return;
  }
}

/**
 * The problems of a `send` step's message, checked as `POST /v1/messages` checks its content:
 * schema `SendContent` (the message schema's content fields), then the APNs limits.
 */
export function sendContentProblems(value: unknown, path: string): ErrorDetail[] {
  if (!isObject(value)) return [{ param: path, message: 'must be an object with title and body, as POST /v1/messages takes them' }];
  const at = (details: ErrorDetail[]) => details.map((d) => ({ param: `${path}.${d.param}`, message: d.message }));
  try {
    checkBody<SendContent>('SendContent', value);
  } catch (err) {
    if (!(err instanceof ApiError) || !err.details) throw err;
    // reserved data keys are named beside the schema's problems, as POST /v1/messages names them (probe K)
    return [...at(err.details), ...at(reservedDataProblems(value.data))];
  }
  return at(apnsContentProblems(value as SendContent));
}
