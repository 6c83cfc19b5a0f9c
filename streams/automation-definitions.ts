import type { Redis } from 'ioredis';
import { conditionKey, eventConditions, type EventCondition, type Expression } from '../lib/expressions.js';
import { parseDuration } from '../lib/durations.js';
import { MAX_STEP_DURATION_MS, type WorkflowDefinition } from '../lib/workflow-definition.js';
import type { Keys } from './keys.js';
import { callScript } from './lua-scripts.js';

/**
 * A kept event condition: its counter key, the longest window any condition sharing the key counts
 * over, and `since`: the definitions version from which the tenant has kept it without a break (a
 * counter seeded before it is stale; `lua/noteKeptConditions`). 0 until the definitions are loaded.
 */
export type KeptCondition = { key: string; withinMs: number | null; condition: EventCondition; since: number };
/** A segment with the windowed conditions whose expiry can drop a member (re-checked by a timer). */
export type SegmentDef = { id: string; slug: string; where: Expression; windows: KeptCondition[] };
export type WorkflowDef = { id: string; slug: string; enabled: boolean; versionId: string; version: number; definition: WorkflowDefinition };
export type VersionDef = { id: string; workflowId: string; slug: string; version: number; definition: WorkflowDefinition };

/** What the automation step of a tenant works from, at one definitions version. */
export type Definitions = {
  version: string;
  segments: SegmentDef[];
  workflows: WorkflowDef[];
  /** event conditions whose counters the actors keep: those of segments and current workflow versions */
  kept: Map<string, KeptCondition>;
  /** the conditions of `kept`, as a list */
  keptConditions: EventCondition[];
  /** topic slugs any definition names */
  topicSlugs: string[];
  needs: { subscriptions: boolean };
  /**
   * The event names the automation step acts on (a subscriber whose batch holds none of them, and
   * no timer, is skipped without a read): names of kept conditions; subscriber and subscription
   * changes when there are segments; triggers of enabled workflows; the `wait` and `cancelOn`
   * names of every version that may still have runs, deleted workflows' included (their runs are
   * canceled by the event); `$subscriber.deleted` when there are workflows.
   */
  relevant: Set<string>;
  /**
   * Deleted workflows' `wait` and `cancelOn` names, by workflow id: an event cancels a run of a
   * deleted workflow (`workflow_deleted`) only when it is one of these of its workflow, the event
   * one of its versions waits for or is canceled on (docs/workflows.md). Names a delete recorded
   * before they were kept per workflow are under '*' (they cancel a run of any deleted workflow).
   */
  goneNames: Map<string, Set<string>>;
  /**
   * Segments whose backfill is `pending`: queued again by the worker that loads the definitions
   * (ZADD of the same member is a no-op), so a process killed between a script that made a backfill
   * pending (create, a new `where`, a topic deleted) and its queueing leaves no segment un-backfilled.
   */
  pendingBackfills: string[];
};

/** Engine events that change what segments read (attributes, topics, subscriptions, existence). */
export const STATE_EVENT_NAMES = [
  '$subscriber.created', '$subscriber.updated', '$subscriber.deleted', '$identify',
  '$subscription.registered', '$subscription.muted', '$subscription.unmuted', '$subscription.removed', '$subscription.invalidated',
] as const;

/**
 * Most versions one workflow keeps: a change of its definition beyond is 409 `conflict`. Every
 * version's `wait` and `cancelOn` names are watched, since a run keeps its version until it ends
 * (until session 44 only the newest 100 of an unbounded list were, and a run of an older one missed
 * its events: probe W). The list is read whole: a workflow changed more often by a version from
 * before this bound keeps every version it has, and its runs of the oldest still hear their events
 * (probe K, session 61: reading the newest MAX_VERSIONS, a run of version 1 of 106 missed its wait's
 * event and went the timeout's way); such a workflow takes no further change.
 */
export const MAX_VERSIONS = 100;

/**
 * A deleted workflow's `wait` and `cancelOn` names (those of all its versions)
 * stay watched this long after the delete (`keys.workflowGoneNames`, members `<workflow id>|<name>`), so the event an active run of
 * it waits for reaches the run and cancels it (`workflow_deleted`). By then every such run has met
 * its next step (a sleep or a wait's timeout lasts at most 90 days) and was canceled; a day more
 * covers a scheduler that was down. At most MAX_GONE_NAMES names are kept, the newest.
 */
export const GONE_NAMES_KEEP_MS = MAX_STEP_DURATION_MS + 86_400_000;
export const MAX_GONE_NAMES = 1_000;

/** The `wait` and `cancelOn` event names of a definition. */
export function watchedNames(def: Pick<WorkflowDefinition, 'steps' | 'cancelOn'>, into: Set<string>): void {
  if (def.cancelOn) into.add(def.cancelOn.event);
  const walk = (steps: WorkflowDefinition['steps'] | undefined) => {
    for (const step of steps ?? []) {
      if (step.type === 'wait') {
        into.add(step.event);
        walk(step.onEvent);
        walk(step.onTimeout);
      } else if (step.type === 'branch') {
        walk(step.then);
        walk(step.else);
      }
    }
  };
  walk(def.steps);
}

/** Bounds on what one tenant defines (the worker loads all of it on every definitions change). */
export const MAX_SEGMENTS = 100;
export const MAX_WORKFLOWS = 100;

/** The counter key and window of an event condition. */
export function keptCondition(condition: EventCondition): KeptCondition {
  return { key: conditionKey(condition), withinMs: condition.within ? parseDuration(condition.within) : null, condition, since: 0 };
}

/** Every expression of a workflow definition (trigger, cancelOn, waits and branches). */
export function workflowExpressions(def: WorkflowDefinition): Expression[] {
  const out: Expression[] = [];
  if (def.trigger.where) out.push(def.trigger.where);
  if (def.cancelOn?.where) out.push(def.cancelOn.where);
  const walk = (steps: WorkflowDefinition['steps'] | undefined) => {
    for (const step of steps ?? []) {
      if (step.type === 'branch') {
        out.push(step.if);
        walk(step.then);
        walk(step.else);
      } else if (step.type === 'wait') {
        if (step.where) out.push(step.where);
        walk(step.onEvent);
        walk(step.onTimeout);
      }
    }
  };
  walk(def.steps);
  return out;
}

/** Walks an expression for topic and subscription conditions. */
function scan(expr: Expression, found: { topics: Set<string>; subscriptions: boolean }): void {
  const e = expr as Record<string, unknown>;
  if (Array.isArray(e.all)) for (const c of e.all as Expression[]) scan(c, found);
  else if (Array.isArray(e.any)) for (const c of e.any as Expression[]) scan(c, found);
  else if (e.not) scan(e.not as Expression, found);
  else if (typeof e.topic === 'string') found.topics.add(e.topic);
  else if (e.subscription) found.subscriptions = true;
}

/** What a set of expressions needs loaded: kept conditions, topic slugs, subscriptions. */
export function needsOf(expressions: Expression[]): Pick<Definitions, 'kept' | 'topicSlugs' | 'needs'> {
  const kept = new Map<string, KeptCondition>();
  const found = { topics: new Set<string>(), subscriptions: false };
  for (const expr of expressions) {
    for (const c of eventConditions(expr)) {
      // conditions sharing a key (same name, filters and bucket width) share the counter: keep the
      // longest window, so expiry never drops a bucket a longer window still counts
      const k = keptCondition(c);
      const current = kept.get(k.key);
      if (!current || (current.withinMs !== null && (k.withinMs === null || k.withinMs > current.withinMs))) kept.set(k.key, k);
    }
    scan(expr, found);
  }
  return { kept, topicSlugs: [...found.topics], needs: { subscriptions: found.subscriptions } };
}

/** A definitions version (the automationVersion counter) as a number; 0 before the tenant's first definition. */
export function versionNumber(version: string): number {
  return Number(version) || 0;
}

/**
 * Caches each tenant's definitions by `automationVersion` (bumped on every segment or workflow
 * change) and the workflow versions by id. A version is immutable but goes when its workflow is
 * deleted (which bumps `automationVersion`): each reload of a tenant's definitions drops the cached
 * versions of that tenant whose workflow is no longer listed, so the runs of a deleted workflow find
 * their version missing at their next step and are canceled (`workflow_deleted`).
 */
export class DefinitionsCache {
  private readonly tenants = new Map<string, Definitions>();
  private readonly versions = new Map<string, { tenantId: string; def: VersionDef }>();
  /** per tenant, bumped by each reload: a version read that straddled one is not cached */
  private readonly generations = new Map<string, number>();

  constructor(private readonly redis: Redis, private readonly keys: Keys) {}

  /** The tenant's definitions at `version` (the value of its automationVersion key). */
  async get(tenantId: string, version: string): Promise<Definitions> {
    const cached = this.tenants.get(tenantId);
    if (cached && cached.version === version) return cached;
    this.generations.set(tenantId, (this.generations.get(tenantId) ?? 0) + 1);
    const defs = await this.load(tenantId, version);
    this.tenants.set(tenantId, defs);
    return defs;
  }

  /**
   * One workflow version, or null when it is gone: its workflow was deleted (the version record may
   * outlive the workflow record by a moment, or for good after a crash: the workflow record decides).
   */
  async version(tenantId: string, versionId: string): Promise<VersionDef | null> {
    const cached = this.versions.get(versionId);
    if (cached && cached.tenantId === tenantId) return cached.def;
    const generation = this.generations.get(tenantId) ?? 0;
    const h = await this.redis.hgetall(this.keys.workflowVersion(tenantId, versionId));
    if (!h.id) return null;
    // read after the version: a delete between the two reads answers null, never a stale version
    const wf = await this.redis.hget(this.keys.workflow(tenantId, h.workflowId!), 'slug');
    if (wf === null) return null;
    const def: VersionDef = { id: h.id, workflowId: h.workflowId!, slug: wf, version: Number(h.version), definition: JSON.parse(h.definition!) };
    // a reload that began meanwhile may have dropped this version already: keep it out of the cache
    if (generation !== (this.generations.get(tenantId) ?? 0)) return def;
    if (this.versions.size > 10_000) this.versions.clear();
    this.versions.set(versionId, { tenantId, def });
    return def;
  }

  /** Drops the cached versions of a tenant whose workflow is not in `workflowIds` (deleted). */
  private dropVersions(tenantId: string, workflowIds: ReadonlySet<string>): void {
    for (const [versionId, { tenantId: owner, def }] of this.versions) {
      if (owner === tenantId && !workflowIds.has(def.workflowId)) this.versions.delete(versionId);
    }
  }

  private async load(tenantId: string, version: string): Promise<Definitions> {
    const { redis, keys } = this;
    const [segmentIds, workflowIds, goneNames] = await Promise.all([
      redis.zrange(keys.segmentIndex(tenantId), 0, MAX_SEGMENTS - 1),
      redis.zrange(keys.workflowIndex(tenantId), 0, MAX_WORKFLOWS - 1),
      redis.zrange(keys.workflowGoneNames(tenantId), 0, MAX_GONE_NAMES - 1),
    ]);
    this.dropVersions(tenantId, new Set(workflowIds));
    const pipeline = redis.pipeline();
    for (const id of segmentIds) pipeline.hgetall(keys.segment(tenantId, id));
    for (const id of workflowIds) pipeline.hgetall(keys.workflow(tenantId, id));
    const replies = ((await pipeline.exec()) ?? []).map(([, h]) => h as Record<string, string>);
    const segments: SegmentDef[] = [];
    const pendingBackfills: string[] = [];
    replies.slice(0, segmentIds.length).forEach((h) => {
      if (!h?.id || !h.where) return;
      const where = JSON.parse(h.where) as Expression;
      segments.push({ id: h.id, slug: h.slug!, where, windows: eventConditions(where).filter((c) => c.within !== undefined).map(keptCondition) });
      if (!h.backfill || (JSON.parse(h.backfill) as { status?: string }).status === 'pending') pendingBackfills.push(h.id);
    });
    const workflowRecords = replies.slice(segmentIds.length).filter((h) => h?.id && h.versionId);
    const versions = await Promise.all(workflowRecords.map((h) => this.version(tenantId, h.versionId!)));
    const workflows: WorkflowDef[] = [];
    workflowRecords.forEach((h, i) => {
      const v = versions[i];
      if (v) workflows.push({ id: h.id!, slug: h.slug!, enabled: h.enabled !== '0', versionId: v.id, version: v.version, definition: v.definition });
    });
    const needs = needsOf([...segments.map((s) => s.where), ...workflows.flatMap((w) => workflowExpressions(w.definition))]);
    const since = JSON.parse(await callScript<string>(redis, 'noteKeptConditions', [keys.keptConditions(tenantId)], [versionNumber(version), JSON.stringify([...needs.kept.keys()])])) as Record<string, number>;
    for (const k of needs.kept.values()) k.since = since[k.key] ?? versionNumber(version);
    const relevant = new Set<string>([...needs.kept.values()].map((k) => k.condition.event));
    if (segments.length) for (const name of STATE_EVENT_NAMES) relevant.add(name);
    if (workflowRecords.length || goneNames.length) relevant.add('$subscriber.deleted');
    for (const wf of workflows) if (wf.enabled) relevant.add(wf.definition.trigger.event);
    // every version that may still have runs: their waits and cancelOn
    const listed = await Promise.all(workflowRecords.map((h) => redis.zrevrange(keys.workflowVersions(tenantId, h.id!), 0, -1)));
    const all = await Promise.all(listed.flat().map((versionId) => this.version(tenantId, versionId)));
    for (const v of all) if (v) watchedNames(v.definition, relevant);
    // deleted workflows' waits and cancelOn (members `<workflow id>|<name>`): the event reaches their runs, which it cancels
    const goneByWorkflow = new Map<string, Set<string>>();
    for (const member of goneNames) {
      const bar = member.indexOf('|');
      const [workflowId, name] = bar < 0 ? ['*', member] : [member.slice(0, bar), member.slice(bar + 1)];
      relevant.add(name);
      const names = goneByWorkflow.get(workflowId);
      if (names) names.add(name);
      else goneByWorkflow.set(workflowId, new Set([name]));
    }
    return { version, segments, workflows, ...needs, keptConditions: [...needs.kept.values()].map((k) => k.condition), relevant, goneNames: goneByWorkflow, pendingBackfills };
  }
}
