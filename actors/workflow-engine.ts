import { isoNow } from '../lib/clock.js';
import { parseDuration } from '../lib/durations.js';
import type { EventLike, Expression } from '../lib/expressions.js';
import type { SendContent, Step, WorkflowDefinition } from '../lib/workflow-definition.js';
import { runDepth, type RunHistoryItem, type RunStatus } from '../streams/workflow-runs.js';

/**
 * The workflow run state machine (docs/workflows.md has the transition table). Pure apart from
 * what the host does: evaluate expressions against the subscriber, create a message (idempotent
 * per run and step), arm and disarm timers, emit the run's engine events. The subscriber actor
 * hosts it and commits the resulting state atomically.
 */
export const ACTIVE_STATUSES: readonly RunStatus[] = ['running', 'sleeping', 'waiting'];
type HistoryItem = RunHistoryItem;
export type Run = {
  id: string; workflowId: string; workflow: string; versionId: string; version: number; externalId: string; status: RunStatus;
  step: string; triggerEventId: string; reason: string; wakeAt: number | null; timer: string;
  startedAt: string; updatedAt: string; completedAt: string; history: HistoryItem[];
  /** 0, or one more than the run whose engine event (`$run.*`, `$send`) started this one */
  depth: number;
  /** the first run of the chain this one is in ('' for a run at depth 0: itself) */
  root: string;
  /** on a chain's first run, the runs its chain started after it; on a later run, that count as it started (actors/automation.ts MAX_CHAIN_RUNS) */
  chained: number;
};
export type RunEvent = { name: string; data: Record<string, unknown>; runId: string; messageId: string; step: string };
export type HandledEvent = EventLike & { id: string };

export type EngineHost = {
  now: number;
  evaluate(expr: Expression, event?: EventLike): boolean;
  /** creates the step's message (the same one again when retried) and returns its id */
  send(run: Run, step: string, content: SendContent): Promise<string>;
  /**
   * True for an error of `send` that says nothing about the message (Redis unreachable): it is
   * thrown on, so the batch is retried and the step with it, instead of failing the run.
   */
  transient(err: unknown): boolean;
  /** arms a timer for the run's current step at `dueMs`, returning its member */
  armTimer(run: Run, dueMs: number): string;
  disarmTimer(member: string): void;
  emit(event: RunEvent): void;
};

/** At most this many steps run in one go (a definition has at most 50; this bounds the loop regardless). */
const MAX_STEPS_PER_ADVANCE = 64;

type Part = { list: string; index: number };
const PART = /(\w+)\[(\d+)\]/g;

export function parsePath(path: string): Part[] {
  return [...path.matchAll(PART)].map((m) => ({ list: m[1]!, index: Number(m[2]) }));
}
export function formatPath(parts: Part[]): string {
  return parts.map((p) => `${p.list}[${p.index}]`).join('.');
}

function listAt(def: WorkflowDefinition, parts: Part[], list: string): Step[] | undefined {
  if (parts.length === 0) return list === 'steps' ? def.steps : undefined;
  const parent = stepAt(def, parts) as Record<string, unknown> | null;
  return parent ? (parent[list] as Step[] | undefined) : undefined;
}

/** The step at a path, or null when the path leads nowhere in this definition. */
export function stepAt(def: WorkflowDefinition, parts: Part[]): Step | null {
  let list: Step[] | undefined = def.steps;
  let step: Step | null = null;
  for (let i = 0; i < parts.length; i++) {
    const part = parts[i]!;
    if (i > 0) list = (step as Record<string, unknown> | null)?.[part.list] as Step[] | undefined;
    else if (part.list !== 'steps') return null;
    step = list?.[part.index] ?? null;
    if (!step) return null;
  }
  return step;
}

/** The path of the step after the one at `parts` (leaving finished nested lists), or null at the end. */
export function nextPath(def: WorkflowDefinition, parts: Part[]): Part[] | null {
  const path = parts.map((p) => ({ ...p }));
  while (path.length) {
    const last = path[path.length - 1]!;
    const list = listAt(def, path.slice(0, -1), last.list);
    if (list && last.index + 1 < list.length) {
      last.index++;
      return path;
    }
    path.pop();
  }
  return null;
}

/** The first step of a nested list of the step at `parts`, or the step after it when the list is empty. */
function enter(def: WorkflowDefinition, parts: Part[], list: string): Part[] | null {
  const nested = listAt(def, parts, list);
  return nested?.length ? [...parts, { list, index: 0 }] : nextPath(def, parts);
}

function runData(run: Run, extra: Record<string, unknown> = {}): Record<string, unknown> {
  return { workflowId: run.workflowId, workflow: run.workflow, versionId: run.versionId, version: run.version, ...extra };
}

/**
 * Records a step done in the run's history and writes its `$run.step` event, which carries what the
 * history item does (a wait ended by an event names it, `eventId`: probe BI, webhook consumers could
 * not tell which event resumed the run).
 */
function note(run: Run, host: EngineHost, item: Omit<HistoryItem, 'at' | 'name'>, step: Step | null): void {
  const at = isoNow(host.now);
  const { step: path, ...rest } = item;
  run.history.push({ step: path, ...(step?.name ? { name: step.name } : {}), ...rest, at });
  run.updatedAt = at;
  host.emit({
    name: '$run.step', runId: run.id, messageId: item.messageId ?? '', step: item.step,
    data: runData(run, { step: item.step, ...(step?.name ? { name: step.name } : {}), type: item.type, outcome: item.outcome, ...(item.branch ? { branch: item.branch } : {}), ...(item.messageId ? { messageId: item.messageId } : {}), ...(item.eventId ? { eventId: item.eventId } : {}) }),
  });
}

function end(run: Run, host: EngineHost, status: 'completed' | 'canceled' | 'failed', reason: string): void {
  if (run.timer) host.disarmTimer(run.timer);
  run.timer = '';
  run.wakeAt = null;
  run.status = status;
  run.reason = reason;
  run.completedAt = isoNow(host.now);
  run.updatedAt = run.completedAt;
  host.emit({ name: `$run.${status}`, runId: run.id, messageId: '', step: run.step, data: runData(run, reason ? { reason } : {}) });
}

/** A new run of a workflow version, started by `trigger`, at `depth` in the chain of runs that began with `root` ('' for depth 0). */
export function newRun(id: string, workflow: { id: string; slug: string }, version: { id: string; version: number }, externalId: string, trigger: HandledEvent, nowMs: number, depth: number, root = ''): Run {
  const at = isoNow(nowMs);
  return {
    id, workflowId: workflow.id, workflow: workflow.slug, versionId: version.id, version: version.version, externalId, status: 'running',
    step: 'steps[0]', triggerEventId: trigger.id, reason: '', wakeAt: null, timer: '', startedAt: at, updatedAt: at, completedAt: '', history: [], depth, root, chained: 0,
  };
}

/** Starts a new run: `$run.started`, then its steps until it sleeps, waits or ends. */
export async function startRun(run: Run, def: WorkflowDefinition, host: EngineHost, trigger: HandledEvent): Promise<void> {
  host.emit({ name: '$run.started', runId: run.id, messageId: '', step: '', data: runData(run, { triggerEventId: trigger.id, trigger: trigger.name }) });
  await advance(run, def, host, parsePath(run.step), trigger);
}

/** Runs steps from `parts` until the run sleeps, waits or ends. */
async function advance(run: Run, def: WorkflowDefinition, host: EngineHost, from: Part[] | null, event?: HandledEvent): Promise<void> {
  let parts = from;
  run.status = 'running';
  run.wakeAt = null;
  for (let n = 0; n < MAX_STEPS_PER_ADVANCE; n++) {
    if (!parts) {
      end(run, host, 'completed', '');
      return;
    }
    const step = stepAt(def, parts);
    const path = formatPath(parts);
    run.step = path;
    if (!step) {
      end(run, host, 'failed', 'step_not_found');
      return;
    }
    switch (step.type) {
      case 'sleep': {
        run.status = 'sleeping';
        run.wakeAt = host.now + (parseDuration(step.duration) ?? 0);
        run.timer = host.armTimer(run, run.wakeAt);
        note(run, host, { step: path, type: 'sleep', outcome: 'sleeping' }, step);
        return;
      }
      case 'wait': {
        run.status = 'waiting';
        run.wakeAt = host.now + (parseDuration(step.timeout) ?? 0);
        run.timer = host.armTimer(run, run.wakeAt);
        note(run, host, { step: path, type: 'wait', outcome: 'waiting' }, step);
        return;
      }
      case 'branch': {
        const taken = host.evaluate(step.if, event) ? 'then' : 'else';
        note(run, host, { step: path, type: 'branch', outcome: taken, branch: taken }, step);
        parts = enter(def, parts, taken);
        break;
      }
      case 'send': {
        let messageId: string;
        try {
          messageId = await host.send(run, path, step.message);
        } catch (err) {
          if (host.transient(err)) throw err;
          // the failed step is a step done: its `$run.step` (outcome failed) comes before `$run.failed`
          note(run, host, { step: path, type: 'send', outcome: 'failed' }, step);
          end(run, host, 'failed', 'send_failed');
          return;
        }
        note(run, host, { step: path, type: 'send', outcome: 'sent', messageId }, step);
        parts = nextPath(def, parts);
        break;
      }
      case 'exit': {
        note(run, host, { step: path, type: 'exit', outcome: 'exit' }, step);
        end(run, host, 'completed', '');
        return;
      }
    }
  }
  end(run, host, 'failed', 'too_many_steps');
}

/** A fired timer: wakes a sleeping run or times a wait out; a timer the run no longer waits for changes nothing. */
export async function onTimer(run: Run, def: WorkflowDefinition, host: EngineHost, member: string): Promise<boolean> {
  if (run.timer !== member || (run.status !== 'sleeping' && run.status !== 'waiting')) return false;
  run.timer = '';
  const parts = parsePath(run.step);
  const step = stepAt(def, parts);
  if (run.status === 'sleeping') {
    note(run, host, { step: run.step, type: 'sleep', outcome: 'woke' }, step);
    await advance(run, def, host, nextPath(def, parts));
  } else {
    note(run, host, { step: run.step, type: 'wait', outcome: 'timeout' }, step);
    await advance(run, def, host, step ? enter(def, parts, 'onTimeout') : null);
  }
  return true;
}

/**
 * An event of the run's subscriber: cancels the run on `cancelOn`, or resumes a wait for it.
 * Events of this run itself never cancel or resume it. Returns whether the run changed.
 */
export async function onEvent(run: Run, def: WorkflowDefinition, host: EngineHost, event: HandledEvent, runIdOfEvent: string): Promise<boolean> {
  if (!ACTIVE_STATUSES.includes(run.status) || runIdOfEvent === run.id) return false;
  if (def.cancelOn && def.cancelOn.event === event.name && (!def.cancelOn.where || host.evaluate(def.cancelOn.where, event))) {
    end(run, host, 'canceled', 'canceled_by_event');
    return true;
  }
  if (run.status !== 'waiting') return false;
  const parts = parsePath(run.step);
  const step = stepAt(def, parts);
  if (step?.type !== 'wait' || step.event !== event.name || (step.where && !host.evaluate(step.where, event))) return false;
  if (run.timer) host.disarmTimer(run.timer);
  run.timer = '';
  note(run, host, { step: run.step, type: 'wait', outcome: 'event', eventId: event.id }, step);
  await advance(run, def, host, enter(def, parts, 'onEvent'), event);
  return true;
}

/** Ends an active run from outside its definition (subscriber deleted, workflow deleted). */
export function cancelRun(run: Run, host: EngineHost, reason: string): void {
  if (ACTIVE_STATUSES.includes(run.status)) end(run, host, 'canceled', reason);
}

/** The run hash fields (streams/workflow-runs.ts reads them for the API). */
export function runFields(run: Run): Record<string, string> {
  return {
    id: run.id, workflowId: run.workflowId, workflow: run.workflow, versionId: run.versionId, version: String(run.version), externalId: run.externalId,
    status: run.status, step: run.step, triggerEventId: run.triggerEventId, reason: run.reason, wakeAt: run.wakeAt === null ? '' : String(run.wakeAt),
    timer: run.timer, startedAt: run.startedAt, updatedAt: run.updatedAt, completedAt: run.completedAt, history: JSON.stringify(run.history), depth: String(run.depth),
    ...(run.root ? { root: run.root } : {}),
    ...(run.chained ? { chained: String(run.chained) } : {}),
  };
}

export function runOf(h: Record<string, string>): Run {
  return {
    id: h.id!, workflowId: h.workflowId!, workflow: h.workflow ?? '', versionId: h.versionId!, version: Number(h.version), externalId: h.externalId!,
    status: h.status as RunStatus, step: h.step ?? '', triggerEventId: h.triggerEventId ?? '', reason: h.reason ?? '', wakeAt: h.wakeAt ? Number(h.wakeAt) : null,
    timer: h.timer ?? '', startedAt: h.startedAt!, updatedAt: h.updatedAt!, completedAt: h.completedAt ?? '', history: h.history ? JSON.parse(h.history) : [],
    depth: runDepth(h), root: h.root ?? '', chained: Number(h.chained) || 0,
  };
}
