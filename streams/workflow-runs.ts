import type { Redis } from 'ioredis';
import { isId } from '../lib/ids.js';
import type { Keys } from './keys.js';

/**
 * The read side of workflow runs. The workers write a run as a hash in its subscriber's partition,
 * `keys.run(p, tenant, runId)`, with the fields
 *
 *   id, workflowId, workflow (slug), versionId, version, externalId, status, step (path of the
 *   current step, `steps[1].then[0]`, '' when none), triggerEventId, reason ('' or
 *   canceled_by_event, subscriber_deleted, workflow_deleted, send_failed...), wakeAt (ms, '' when
 *   none), startedAt, updatedAt, completedAt ('' while active) (ISO), history (JSON array of
 *   `{ step, type, outcome, at, messageId?, branch?, eventId? }`), depth (0, or one more than the
 *   run whose engine event started it; absent on records written before, read as 0), root (the first
 *   run of its chain, on runs at depth 1 or more), chained (on a chain's first run: the runs its
 *   chain started after it; on a later run: that count as the run started, MAX_CHAIN_RUNS of
 *   actors/automation.ts)
 *
 * and lists it in the partition's `keys.workflowRuns(p, tenant, workflowId)` and
 * `keys.workflowRuns(p, tenant, workflowId, status)` (score 0, member the run id).
 */

export const RUN_STATUSES = ['running', 'sleeping', 'waiting', 'completed', 'canceled', 'failed'] as const;
export type RunStatus = (typeof RUN_STATUSES)[number];

/** A stored run's depth in a chain of runs (0 for records written before runs had one). */
export function runDepth(h: Record<string, string>): number {
  return Number(h.depth) || 0;
}

export type RunHistoryItem = { step: string; name?: string; type: string; outcome: string; at: string; messageId?: string; branch?: 'then' | 'else'; eventId?: string };

/** A run as the API answers it. */
export type Run = {
  id: string;
  workflowId: string;
  workflow: string;
  versionId: string;
  version: number;
  externalId: string;
  status: RunStatus;
  step: string | null;
  triggerEventId: string;
  reason: string | null;
  wakeAt: string | null;
  startedAt: string;
  updatedAt: string;
  completedAt: string | null;
  history: RunHistoryItem[];
  depth: number;
};

/** The public view of a stored run hash. */
export function toRun(h: Record<string, string>): Run {
  return {
    id: h.id!,
    workflowId: h.workflowId!,
    workflow: h.workflow ?? '',
    versionId: h.versionId!,
    version: Number(h.version),
    externalId: h.externalId!,
    status: h.status as RunStatus,
    step: h.step || null,
    triggerEventId: h.triggerEventId ?? '',
    reason: h.reason || null,
    wakeAt: h.wakeAt ? new Date(Number(h.wakeAt)).toISOString() : null,
    startedAt: h.startedAt!,
    updatedAt: h.updatedAt!,
    completedAt: h.completedAt || null,
    history: h.history ? (JSON.parse(h.history) as RunHistoryItem[]) : [],
    depth: runDepth(h),
  };
}

export type RunScope = { tenantId: string; partitions: number };

/**
 * One page of a workflow's runs (of all its versions), newest first by run id, merged across
 * partitions: each partition's run list (or its list of runs in `status`) is read below `after`
 * (`limit + 1` ids), merged and cut. `total` is the sum of the lists' sizes; `next` the last run id
 * of the page when there are more.
 */
export async function runPage(
  redis: Redis, keys: Keys, scope: RunScope, workflowId: string, options: { status?: RunStatus; limit: number; after: string | null },
): Promise<{ items: Run[]; next: string | null; total: number }> {
  const { tenantId, partitions } = scope;
  const max = options.after === null ? '+' : `(${options.after}`;
  const list = (p: number) => keys.workflowRuns(p, tenantId, workflowId, options.status);
  const pipeline = redis.pipeline();
  for (let p = 0; p < partitions; p++) pipeline.zrange(list(p), max, '-', 'BYLEX', 'REV', 'LIMIT', 0, options.limit + 1).zcard(list(p));
  const replies = (await pipeline.exec()) ?? [];
  const candidates: { id: string; p: number }[] = [];
  let total = 0;
  for (let p = 0; p < partitions; p++) {
    const [err, ids] = replies[2 * p]!;
    if (err) throw err;
    for (const id of ids as string[]) candidates.push({ id, p });
    total += Number(replies[2 * p + 1]![1]);
  }
  candidates.sort((a, b) => (a.id < b.id ? 1 : a.id > b.id ? -1 : 0)); // run ids are ASCII: code-unit order is byte order
  const page = candidates.slice(0, options.limit);
  const load = redis.pipeline();
  for (const { id, p } of page) load.hgetall(keys.run(p, tenantId, id));
  const items = ((await load.exec()) ?? []).flatMap(([err, h]) => {
    if (err) throw err;
    return (h as Record<string, string>).id ? [toRun(h as Record<string, string>)] : [];
  });
  return { items, next: candidates.length > options.limit ? page[page.length - 1]!.id : null, total };
}

/**
 * One run of a workflow, or null (a malformed id, another kind's id, another workflow's run).
 * A run id does not tell its partition, so every partition is asked in one pipeline.
 */
export async function findRun(redis: Redis, keys: Keys, scope: RunScope, workflowId: string, runId: string): Promise<Run | null> {
  if (!isId('run', runId)) return null;
  const pipeline = redis.pipeline();
  for (let p = 0; p < scope.partitions; p++) pipeline.hgetall(keys.run(p, scope.tenantId, runId));
  for (const [err, h] of (await pipeline.exec()) ?? []) {
    if (err) throw err;
    const hash = h as Record<string, string>;
    if (hash.id && hash.workflowId === workflowId) return toRun(hash);
  }
  return null;
}
