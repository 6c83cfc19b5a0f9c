import type { Redis } from 'ioredis';
import { now } from '../lib/clock.js';
import { Counters } from '../lib/event-counters.js';
import { eventConditions, evaluate, matchesEvent, type EventCondition, type EventLike } from '../lib/expressions.js';
import { derivedIdAlong, newId } from '../lib/ids.js';
import type { Logger } from '../lib/log.js';
import { DefinitionsCache, needsOf, versionNumber, workflowExpressions, type Definitions, type KeptCondition, type VersionDef } from '../streams/automation-definitions.js';
import { IdentityRefs } from '../streams/identity.js';
import type { Keys } from '../streams/keys.js';
import { callScript } from '../streams/lua-scripts.js';
import { isRedisUnavailable } from '../streams/redis.js';
import { finishRunSends, runSendOp, type RunSend } from '../streams/run-sends.js';
import { runDepth } from '../streams/workflow-runs.js';
import { queueBackfills } from '../streams/segments.js';
import { indexMember } from '../streams/subscriber-list.js';
import { loadHistory, loadStates, needsHistory, subjectOf, topicIdsBySlug, type HistoryEvent, type SubjectState } from '../streams/subject-state.js';
import { LeaseLost } from '../streams/apply-events.js';
import { WORKER_LEASES } from '../streams/partition-leases.js';
import type { StreamEntry } from '../streams/stream-consumer.js';
import { ACTIVE_STATUSES, cancelRun, newRun, onEvent, onTimer, runFields, runOf, startRun, type EngineHost, type HandledEvent, type Run, type RunEvent } from './workflow-engine.js';

/** A subscriber runs at most this many workflow runs at once (of workflows that exist); further triggers are skipped (logged). */
export const MAX_ACTIVE_RUNS = 100;

/**
 * Deepest run of a chain: a run started by an engine event of another run (`$run.*`, `$send`: the
 * event carries that run's id) is one deeper than it; a run started by any other event is at depth
 * 0. A trigger that would start a run deeper than this starts nothing (logged), so workflows that
 * trigger one another (two `$send` workflows that each send) stop after a few hops instead of
 * pushing forever. Three hops leave room for follow-ups of follow-ups (`$run.completed` of one
 * workflow starting the next) while a loop costs at most four runs per workflow it goes through.
 */
export const MAX_RUN_DEPTH = 3;

/**
 * Most runs one chain starts after its first (a chain: the runs started by one another's engine
 * events, all of one subscriber). The depth alone bounds a chain's length, not its width: a run that
 * sends three times starts three runs at the next depth, each of which does the same, and two
 * workflows triggered by each other's `$send`, three sends each, made 40 runs and 121 pushes of one
 * message (probe Q; 50 sends each would make millions). Counted on the chain's first run (its record's
 * `chained`), committed with the runs it counts; every later run keeps the count it started at (its
 * own `chained`), and a chain whose first run's record has gone (ended longer ago than the retention)
 * counts on from that of the run whose event goes on with it. Kept for the
 * last 32 chains in the automation hash, the count was lost when 32 other chains came after (probe S).
 */
export const MAX_CHAIN_RUNS = 10;

/** Most timers of one run fired in a row before an event that arrived after them all (a bound; a run has finitely many steps). */
const MAX_TIMERS_CAUGHT_UP = 1_000;

/** An event's `u`: the id of the subscriber it was written for (another one than today's, once that one was deleted and its externalId reused). */
type Item = { kind: 'event'; q: number; event: HandledEvent & { ts: number; receivedMs: number; runId: string; u: string } } | { kind: 'timer'; member: string };
type Op = [string, string, string | number, string | number];
type Commit = { tenantId: string; workspaceId: string; externalId: string; expected: number; events: RunEvent[]; ops: Op[]; sends: RunSend[] };

/**
 * The ref of a segment timer a backfill queues to re-check a subscriber now: a member of its own, beside
 * the window timer (ref `-`), which a worker's commit re-arms at its due time (ZADD) or removes; on one
 * member, a commit made with definitions from before the segment overwrote the backfill's re-check and
 * the subscriber was never evaluated for it (probe FD).
 */
export const SEGMENT_RECHECK_REF = 'recheck';

/** The timer member of a kind for a subscriber: `<kind>|<workspaceId>|<tenantId>|<ref>|<externalId>` (lua/fireTimers parses it). */
export function timerMember(kind: 'run' | 'seg', workspaceId: string, tenantId: string, ref: string, externalId: string): string {
  return `${kind}|${workspaceId}|${tenantId}|${ref}|${externalId}`;
}

function itemOf(fields: Record<string, string>): Item {
  if (fields.k === 'timer') return { kind: 'timer', member: fields.tm! };
  const raw = fields.d || '{}';
  let data: Record<string, unknown> | undefined;
  return {
    kind: 'event', q: Number(fields.q),
    // the data is parsed only when read: most entries of a batch are never looked into
    event: { id: fields.id!, name: fields.n!, get data() { return (data ??= JSON.parse(raw) as Record<string, unknown>); }, ts: Number(fields.ts), receivedMs: Number(fields.r), runId: fields.ru ?? '', u: fields.u ?? '' },
  };
}

/**
 * The automation step of the subscriber actors, after the read models of a batch are applied:
 * per subscriber, in sequence order, it keeps the event counters of the tenant's kept conditions,
 * advances and starts workflow runs, handles fired timers, then re-evaluates segment membership,
 * and commits all of it with the run events in one compare-and-set script per partition batch
 * (lua/commitAutomation). The subscriber's automation cursor `seq` makes a redelivered event a no-op;
 * messages of `send` steps are recorded by that commit and created after it (streams/run-sends.ts),
 * each once under an idempotency key per run and step: a batch computed again after a crash sends
 * only what its own commit records.
 */
export class Automation {
  private readonly definitions: DefinitionsCache;
  /** definitions whose pending backfills this process queued again (once per loaded version) */
  private readonly requeued = new WeakSet<Definitions>();
  /** workspace and tenant slugs for the audit entries of sends (slugs never change: read once per process) */
  private readonly refs: IdentityRefs;

  /**
   * `owner`: the worker's lease owner id; a commit of a partition it does not hold any more throws `LeaseLost`.
   * `hooks.beforeCommit` (tests) runs between a batch's computation, from the definitions it loaded, and its commit;
   * `hooks.afterCommit` (tests) between the commit and the creation of the messages it recorded.
   */
  constructor(
    private readonly redis: Redis, private readonly keys: Keys, private readonly log: Logger, private readonly owner: string,
    private readonly hooks: { beforeCommit?: (p: number) => Promise<void>; afterCommit?: (p: number) => Promise<void> } = {},
  ) {
    this.definitions = new DefinitionsCache(redis, keys);
    this.refs = new IdentityRefs(redis, keys);
  }

  async handle(p: number, entries: StreamEntry[]): Promise<void> {
    // first the tenants and whether they have automation at all: most tenants' batches stop here,
    // before any item is built
    const tenantIds = [...new Set(entries.map(({ fields }) => fields.t).filter((t): t is string => Boolean(t)))];
    if (tenantIds.length === 0) return;
    // one GET per tenant, sent together: each tenant's key is in its own hash slot (an MGET across
    // tenants is the one multi-key read the key layout would refuse on Redis Cluster, probe DB)
    const versions = await Promise.all(tenantIds.map((t) => this.redis.get(this.keys.automationVersion(t))));
    const automated = new Set(tenantIds.filter((_, i) => versions[i])); // the others never defined a segment or workflow
    if (automated.size === 0) return;
    const byTenant = new Map<string, { workspaceId: string; subscribers: Map<string, Item[]> }>();
    for (const { fields } of entries) {
      if (!fields.t || fields.x === undefined || !automated.has(fields.t)) continue;
      let tenant = byTenant.get(fields.t);
      if (!tenant) byTenant.set(fields.t, (tenant = { workspaceId: fields.w ?? '', subscribers: new Map() }));
      let items = tenant.subscribers.get(fields.x);
      if (!items) tenant.subscribers.set(fields.x, (items = []));
      items.push(itemOf(fields));
    }
    const commits: Commit[] = [];
    await Promise.all(tenantIds.map(async (tenantId, i) => {
      const version = versions[i];
      if (!version) return;
      const tenant = byTenant.get(tenantId);
      if (!tenant) return; // its entries lacked an externalId
      try {
        const defs = await this.definitions.get(tenantId, version);
        if (defs.pendingBackfills.length && !this.requeued.has(defs)) {
          this.requeued.add(defs);
          const queued = await queueBackfills(this.redis, this.keys, { workspace: { id: tenant.workspaceId }, tenant: { id: tenantId } }, defs.pendingBackfills);
          if (!queued) this.requeued.delete(defs); // tried again at the tenant's next batch
        }
        commits.push(...(await this.handleTenant(p, tenantId, tenant.workspaceId, defs, tenant.subscribers)));
      } catch (err) {
        this.skipUnlessUnavailable(err, { partition: p, tenantId });
      }
    }));
    if (commits.length) {
      try {
        await this.commit(p, commits);
      } catch (err) {
        this.skipUnlessUnavailable(err, { partition: p });
      }
    }
  }

  /**
   * Redis being unreachable fails the batch (it is read again and retried), and so does a lost lease; any other error is a
   * fault that would fail every retry the same way and stall the partition, so it is logged and the
   * automation of those entries is skipped (the read models and webhooks still get them).
   */
  private skipUnlessUnavailable(err: unknown, where: Record<string, unknown>): void {
    // a lost lease fails the batch too: the partition's new holder handles it
    if (isRedisUnavailable(err) || err instanceof LeaseLost) throw err;
    this.log.error('automation step failed; entries skipped', { ...where, err: (err as Error)?.message ?? String(err) });
  }

  private async handleTenant(p: number, tenantId: string, workspaceId: string, defs: Definitions, subscribers: Map<string, Item[]>): Promise<Commit[]> {
    const { redis, keys } = this;
    // only subscribers with a timer or an event the definitions act on are read and handled
    const externalIds = [...subscribers.keys()].filter((x) => subscribers.get(x)!.some((item) => item.kind === 'timer' || defs.relevant.has(item.event.name)));
    if (externalIds.length === 0) return [];
    // the ids of the topics the definitions name first: only those are looked up in each subscriber's topic set
    const topicIdBySlug = await topicIdsBySlug(redis, keys, tenantId, defs.topicSlugs);
    const states = await loadStates(redis, keys, p, tenantId, externalIds, { topicIds: [...topicIdBySlug.values()], subscriptions: defs.needs.subscriptions, automation: true });
    // the active runs of these subscribers
    const runIds = new Map<string, string[]>();
    const pipeline = redis.pipeline();
    for (const [x, state] of states) {
      const ids = state.automation.runs ? (JSON.parse(state.automation.runs) as string[]) : [];
      runIds.set(x, ids);
      for (const id of ids) pipeline.hgetall(keys.run(p, tenantId, id));
    }
    const runReplies = [...runIds.values()].some((ids) => ids.length) ? ((await pipeline.exec()) ?? []) : [];
    let r = 0;
    const out: Commit[] = [];
    await Promise.all(externalIds.map(async (x) => {
      const runs: Run[] = [];
      for (const _ of runIds.get(x)!) {
        const h = runReplies[r++]?.[1] as Record<string, string> | undefined;
        if (h?.id) runs.push(runOf(h));
      }
      const commit = await this.handleSubscriber(p, tenantId, workspaceId, defs, states.get(x)!, subscribers.get(x)!, runs, topicIdBySlug);
      if (commit) out.push(commit);
    }));
    return out;
  }

  private async handleSubscriber(
    p: number, tenantId: string, workspaceId: string, defs: Definitions, state: SubjectState, items: Item[], runs: Run[], topicIdBySlug: Map<string, string>,
  ): Promise<Commit | null> {
    const { redis, keys } = this;
    const x = state.externalId;
    const cursor = Number(state.automation.seq ?? 0);
    const todo = items.filter((item) => item.kind === 'timer' || item.q > cursor);
    if (todo.length === 0) return null;
    const nowMs = now();
    const ops: Op[] = [];
    const events: RunEvent[] = [];
    const sends: RunSend[] = [];
    const autoKey = keys.automation(p, tenantId, x);
    const countersKey = autoKey; // counters are the `<key>|…` fields of the automation hash
    const kept = defs.kept;

    // the versions of the active runs, and whether any condition needs the subscriber's history
    const versionOf = new Map<string, Awaited<ReturnType<DefinitionsCache['version']>>>();
    for (const run of runs) if (!versionOf.has(run.versionId)) versionOf.set(run.versionId, await this.definitions.version(tenantId, run.versionId));
    let conditions: readonly EventCondition[] = defs.keptConditions;
    if (versionOf.size) {
      conditions = [...conditions];
      for (const v of versionOf.values()) if (v) (conditions as EventCondition[]).push(...readsOf(v).conditions);
    }
    if (versionOf.size) topicIdBySlug = await this.loadForOldVersions(p, tenantId, defs, state, versionOf.values(), topicIdBySlug);
    const firstEvent = todo.find((i) => i.kind === 'event');
    if (needsHistory(state, conditions, kept)) {
      state.history = await loadHistory(redis, keys, p, tenantId, x, firstEvent && firstEvent.kind === 'event' ? firstEvent.q - 1 : null);
      seedCounters(state, kept, versionNumber(defs.version), ops, countersKey);
    }

    let reevaluate = false;
    let windowTimerFired = false;
    let deleted = false;
    const changed = new Set<Run>();
    const statusBefore = new Map(runs.map((run) => [run, run.status]));
    const fieldsBefore = new Map(runs.map((run) => [run, runFields(run)]));
    const armed: Op[] = [];
    let currentEvent: EventLike | undefined;
    // the subscriber the items handled so far were written for, whose runs' sends go to it only: the
    // record read now is a newer one's when the externalId was deleted and created again after them
    // (probe EV2: a deleted subscriber's run pushed to the new one's device)
    // (a batch of timers alone: the one the events handled before were for, kept in the automation
    // hash's `u`; the record read now may be a newer one's, its delete not yet handled: probe FG)
    // (`u` counts only when written with the cursor `seq` it stands at, `us`: a worker of an earlier
    // version handled later items without writing it, and the id it kept named a subscriber deleted
    // since, whose successor's run then took the gone one's branch and sent to nobody; probe K)
    const keptU = state.automation.u && state.automation.us === state.automation.seq ? state.automation.u : undefined;
    let subscriberId = (firstEvent?.kind === 'event' && firstEvent.event.u) || keptU || state.record.id;
    // the state conditions see: when the record read now is a newer subscriber's than the one the
    // items were written for, that one is gone, as it is when no other was created (no attributes,
    // topics or devices; its counters are its own until its delete is handled) (probe FA: a deleted
    // subscriber's run branched on the attributes of the one created again under its externalId)
    const subjectState = (): SubjectState => (!subscriberId || !state.record.id || subscriberId === state.record.id
      ? state : { ...state, record: {}, topicIds: new Set(), subscriptions: [] });
    const host: EngineHost = {
      now: nowMs,
      evaluate: (expr, event) => evaluate(expr, subjectOf(subjectState(), topicIdBySlug, kept, nowMs, event ?? currentEvent)),
      send: async (run, step, content) => {
        // the message is recorded by this batch's commit and created after it (streams/run-sends.ts),
        // announced by message.created like a caller's message, with the engine (`system`) as actor
        if (!(await this.refs.scope(workspaceId, tenantId))) throw new Error(`workspace ${workspaceId} or its tenant ${tenantId} not found`);
        const send: RunSend = {
          at: nowMs, n: sends.length, workspaceId, tenantId, externalId: x, subscriberId, messageId: newId('message', nowMs), content,
          run: { runId: run.id, step, workflowId: run.workflowId, workflow: run.workflow, versionId: run.versionId },
        };
        sends.push(send);
        return send.messageId;
      },
      transient: isRedisUnavailable,
      armTimer: (run, dueMs) => {
        const member = timerMember('run', workspaceId, tenantId, `${run.id}~${run.history.length}`, x);
        armed.push(['zadd', keys.timers(p), dueMs, member]);
        return member;
      },
      disarmTimer: (member) => armed.push(['zrem', keys.timers(p), member, '-']),
      emit: (event) => events.push(event),
    };
    let lastSeq = cursor;
    // the depth and chain of a run whose engine event may start others: an active one is at hand, an
    // ended one is read from its record (same partition, and neither ever changes, so a retry reads the same)
    const chainsOf = new Map<string, { depth: number; root: string }>();
    const chainOf = async (runId: string): Promise<{ depth: number; root: string }> => {
      const active = runs.find((run) => run.id === runId);
      if (active) return { depth: active.depth, root: active.root || active.id };
      let chain = chainsOf.get(runId);
      if (chain === undefined) {
        const [depth, root] = await redis.hmget(keys.run(p, tenantId, runId), 'depth', 'root');
        chainsOf.set(runId, (chain = { depth: runDepth({ depth: depth ?? '' }), root: root || runId }));
      }
      return chain;
    };
    // the runs each chain started after its first (MAX_CHAIN_RUNS): at hand when that run is one of this
    // batch's, else read from its record (null: gone) and written back by the commit when it grows
    const chainCounts = new Map<string, { count: number; run: Run | null; dirty: boolean } | null>();
    const chainCount = async (root: string) => {
      if (!chainCounts.has(root)) {
        const active = runs.find((run) => run.id === root);
        if (active) chainCounts.set(root, { count: active.chained, run: active, dirty: false });
        else {
          const [id, count] = await redis.hmget(keys.run(p, tenantId, root), 'id', 'chained');
          chainCounts.set(root, id === null ? null : { count: Number(count) || 0, run: null, dirty: false });
        }
      }
      return chainCounts.get(root)!;
    };

    // the engine as of `ms`: a step's time is when its cause happened (an event's arrival, a timer's due time)
    const hostAt = (ms: number): EngineHost => (ms === nowMs ? host : { ...host, now: ms });
    for (const item of todo) {
      if (item.kind === 'timer') {
        const kind = item.member.slice(0, item.member.indexOf('|'));
        if (kind === 'seg') {
          reevaluate = true;
          // the window timer (ref `-`), not a backfill's re-check (SEGMENT_RECHECK_REF), which is its own member
          if (item.member.split('|')[3] === '-') windowTimerFired = true;
          continue;
        }
        const runId = item.member.split('|')[3]!.split('~')[0];
        const run = runs.find((candidate) => candidate.id === runId);
        if (!run) continue;
        const version = versionOf.get(run.versionId);
        currentEvent = undefined;
        if (!version) {
          cancelRun(run, host, 'workflow_deleted');
          changed.add(run);
          continue;
        }
        // a fired timer acts at its due time, as one fired first by a later event's arrival does (below):
        // the steps after it count from then, whichever path fired it and however late (until session 51
        // this path ran them at the worker's now, and runs started at their trigger's arrival made timers
        // armed already due a race between the two paths). Never before what the run last did, nor after now.
        const due = run.timer === item.member && run.wakeAt !== null ? Math.max(Math.min(run.wakeAt, nowMs), Date.parse(run.updatedAt) || 0) : nowMs;
        if (await onTimer(run, version.definition, hostAt(due), item.member)) changed.add(run);
        continue;
      }
      const { event } = item;
      // What the event does to runs happens when it arrived, not when this worker got to it: a run it
      // starts starts then (its sleep or wait counts from then), a wait it ends ends then (probe AO: with
      // the partition's worker dead, runs started at the restart, ~12 s late with the default lease, and a
      // reply received after the wait's timeout, by arrival, took the wait). An arrival stamped after
      // this worker's now (the web process's clock ahead) is now; a run's step never comes before what
      // the run last did (clocks differ a little).
      const arrived = Number.isFinite(event.receivedMs) ? Math.min(event.receivedMs, nowMs) : nowMs;
      const runHost = (run: Run): EngineHost => hostAt(Math.max(arrived, Date.parse(run.updatedAt) || 0));
      // A run's timer due before this event arrived fires first (with the state from before it), as
      // it would have had the scheduler and this worker kept up: a wait's timeout or a sleep's end
      // comes before a reply or a cancel received after it, whichever process was down or behind.
      // (The reverse, a timer fired while events received before it still wait, is actors/timer-order.ts.)
      // The timer's own entry, when it comes, is one the run no longer waits for. The steps after it
      // run at its due time, so the sleep or wait that follows starts then, and fires too when it was
      // also due before the event (probe AA: it started at the worker's now, so a reply or cancel
      // received after the logical timeout found a fresh wait and decided the run). Bounded: each
      // firing moves the run past one sleep or wait of its (finite) steps.
      for (const run of runs) {
        for (let fired = 0; fired < MAX_TIMERS_CAUGHT_UP && run.timer && run.wakeAt !== null && run.wakeAt <= arrived; fired++) {
          const version = versionOf.get(run.versionId);
          if (!version) break;
          const member = run.timer;
          currentEvent = undefined;
          if (!(await onTimer(run, version.definition, hostAt(run.wakeAt), member))) break;
          host.disarmTimer(member);
          changed.add(run);
        }
      }
      lastSeq = Math.max(lastSeq, item.q);
      reevaluate = true;
      currentEvent = event;
      if (event.u) subscriberId = event.u;
      // counters of the kept conditions (and the in-memory history for conditions that are not kept)
      for (const k of kept.values()) {
        if (!matchesEvent(k.condition, event)) continue;
        ops.push(['hincrby', countersKey, state.counters.increment(k.key, k.withinMs, event.ts), 1]);
      }
      state.history?.unshift({ name: event.name, data: event.data, ts: event.ts, sequence: item.q });
      if (event.name === '$subscriber.deleted') {
        deleted = true;
        state.exists = false;
        // a subscriber created again later starts with no events: the counters restart from zero,
        // seeded (nothing before the deletion counts; loadHistory stops at it too)
        for (const key of state.counters.keys()) for (const field of state.counters.fieldsOf(key)) ops.push(['hdel', countersKey, field, '-']);
        state.counters = new Counters();
        for (const k of kept.values()) ops.push(['hset', countersKey, ...state.counters.setInit(k.key, k.withinMs, versionNumber(defs.version))]);
        if (state.history) state.history = [];
        // the subscriber's stream ends with `$subscriber.deleted`: what its runs emitted earlier in
        // this batch, and their cancels, would be appended after it, where commitAutomation drops
        // them while the subscriber is gone, but onto the new subscriber's stream when one of the
        // same externalId was created meanwhile (probe H3: `$run.canceled` of the deleted
        // subscriber's run under the new one's id). So none is written; their sends are made, as their
        // records say (the fan-out skips a subscriber deleted since, probe EV)
        events.length = 0;
        for (const run of runs) {
          cancelRun(run, { ...runHost(run), emit: () => undefined }, 'subscriber_deleted');
          changed.add(run);
        }
        continue;
      }
      if (event.name === '$subscriber.created') {
        deleted = false;
        state.exists = true;
      }
      // active runs: cancelOn, or the event a wait is for; a run of a deleted workflow is canceled at
      // its next step: an event one of its versions waited for or was canceled on (not any event)
      for (const run of runs) {
        const version = versionOf.get(run.versionId);
        if (!version) {
          if (!ACTIVE_STATUSES.includes(run.status) || !(defs.goneNames.get(run.workflowId)?.has(event.name) || defs.goneNames.get('*')?.has(event.name))) continue;
          cancelRun(run, runHost(run), 'workflow_deleted');
          changed.add(run);
        } else if (await onEvent(run, version.definition, runHost(run), event, event.runId)) changed.add(run);
      }
      // triggers: one run per workflow and trigger event; a run's own events never start its workflow
      // again, and a chain of runs started by one another's events stops at MAX_RUN_DEPTH. None for a
      // subscriber that is gone by now (an event handled after its delete, such as the delete's own
      // `$subscription.removed`): the run could only send to nobody before its cancel.
      let depth: number | undefined;
      let chain: { depth: number; root: string } | null | undefined;
      for (const wf of state.exists ? defs.workflows : []) {
        // an event of a run (it carries the run's id; the workflow's is in its data) never starts that run's workflow;
        // a caller's own event is no run's, whatever its free-form data holds
        if (!wf.enabled || wf.definition.trigger.event !== event.name || (event.runId && event.data.workflowId === wf.id)) continue;
        if (wf.definition.trigger.where && !host.evaluate(wf.definition.trigger.where, event)) continue;
        if (chain === undefined && event.runId) {
          chain = await chainOf(event.runId);
          // the chain's first run gone (ended longer ago than the retention): it counts on from this
          // event's run (from the count that run started at, its `chained`), or, that one gone too (a
          // worker behind by more than the retention), from the run this event starts (root ''),
          // uncounted until then: the trigger is not dropped (probe P2)
          if ((await chainCount(chain.root)) === null) chain = { depth: chain.depth, root: (await chainCount(event.runId)) === null ? '' : event.runId };
        }
        chain ??= null;
        depth ??= chain ? chain.depth + 1 : 0;
        if (depth > MAX_RUN_DEPTH) {
          this.log.warn('workflow run not started: chain of runs too deep', { tenantId, externalId: x, workflow: wf.slug, event: event.name, eventId: event.id, byRunId: event.runId, depth });
          continue;
        }
        const counted = chain?.root ? await chainCount(chain.root) : null;
        if (counted && counted.count >= MAX_CHAIN_RUNS) {
          this.log.warn('workflow run not started: chain of runs too wide', { tenantId, externalId: x, workflow: wf.slug, event: event.name, eventId: event.id, byRunId: event.runId, root: chain?.root, runs: MAX_CHAIN_RUNS });
          continue;
        }
        // a run of a deleted workflow (canceled at its next step, maybe a long sleep away) holds no place (probe AX)
        if (runs.filter((run) => ACTIVE_STATUSES.includes(run.status) && versionOf.get(run.versionId)).length >= MAX_ACTIVE_RUNS) {
          this.log.warn('workflow run not started: too many active runs', { tenantId, externalId: x, workflow: wf.slug });
          continue;
        }
        // the id's time is when the trigger arrived (not its own timestamp, which an offline batch
        // may set days back), so runs list newest started first; the same entry always makes the same id
        const run = newRun(derivedIdAlong('run', event.receivedMs, 'event', event.id, wf.id), wf, { id: wf.versionId, version: wf.version }, x, event, arrived, depth, chain?.root ?? '');
        if (runs.some((existing) => existing.id === run.id)) continue;
        if (counted) {
          counted.count++;
          if (counted.run) {
            counted.run.chained = counted.count;
            changed.add(counted.run);
          } else counted.dirty = true;
          // the run keeps the chain's count as it starts: should the chain's first run go with the
          // retention, the chain counts on from there, not from 0 for each run left (probe P3: ten
          // runs of a capped chain each started ten more)
          run.chained = counted.count;
        }
        runs.push(run);
        versionOf.set(wf.versionId, { id: wf.versionId, workflowId: wf.id, slug: wf.slug, version: wf.version, definition: wf.definition });
        statusBefore.set(run, 'new' as Run['status']);
        ops.push(['zadd', keys.workflowRuns(p, tenantId, wf.id), 0, run.id]);
        await startRun(run, wf.definition, hostAt(arrived), event);
        changed.add(run);
      }
    }
    currentEvent = undefined;

    // runs: records, status indexes, the subscriber's active list
    for (const run of changed) {
      const before = statusBefore.get(run);
      const written = fieldsBefore.get(run) ?? {};
      for (const [field, value] of Object.entries(runFields(run))) if (written[field] !== value) ops.push(['hset', keys.run(p, tenantId, run.id), field, value]);
      if (before !== run.status) {
        if (before && (before as string) !== 'new') ops.push(['zrem', keys.workflowRuns(p, tenantId, run.workflowId, before), run.id, '-']);
        ops.push(['zadd', keys.workflowRuns(p, tenantId, run.workflowId, run.status), 0, run.id]);
        // an ended run is kept for the retention, then expired by the sweep (lua/expireRuns)
        if (!ACTIVE_STATUSES.includes(run.status)) ops.push(['zadd', keys.runsEnded(p), nowMs, `${tenantId}|${run.id}`]);
      }
    }
    ops.push(...armed);
    const active = JSON.stringify(runs.filter((run) => ACTIVE_STATUSES.includes(run.status)).map((run) => run.id));
    if (active !== (state.automation.runs ?? '[]')) ops.push(['hset', autoKey, 'runs', active]);

    // segment membership, re-evaluated after the subscriber's items, and its window timer
    if (reevaluate) this.segments(p, tenantId, workspaceId, defs, state, topicIdBySlug, nowMs, windowTimerFired, ops);
    // counters that fell out of every window, and those of conditions no longer kept (seeded again if kept again)
    for (const k of kept.values()) {
      for (const field of state.counters.expiredFields(k.key, k.withinMs, nowMs)) ops.push(['hdel', countersKey, field, '-']);
      // pruned to this window: a longer one that shared the counter and is no longer kept is seeded again if kept again
      const init = state.counters.initOf(k.key);
      if (init && k.withinMs !== null && init.withinMs !== null && init.withinMs > k.withinMs) ops.push(['hset', countersKey, ...state.counters.setInit(k.key, k.withinMs, init.seededVersion)]);
    }
    for (const key of state.counters.keys()) if (deleted || !kept.has(key)) for (const field of state.counters.fieldsOf(key)) ops.push(['hdel', countersKey, field, '-']);
    if (lastSeq > cursor) ops.push(['hset', autoKey, 'seq', lastSeq]);
    for (const [root, counted] of chainCounts) if (counted?.dirty) ops.push(['hsetx', keys.run(p, tenantId, root), 'chained', counted.count]);
    if (lastSeq > cursor && subscriberId) {
      if (subscriberId !== state.automation.u) ops.push(['hset', autoKey, 'u', subscriberId]);
      ops.push(['hset', autoKey, 'us', lastSeq]);
    }
    for (const send of sends) ops.push(runSendOp(keys, p, send));
    return { tenantId, workspaceId, externalId: x, expected: Number(state.automation.v ?? 0), events, ops, sends };
  }

  /**
   * What the versions of a subscriber's active runs read that the current definitions do not (a
   * version changed while a run slept in the old one): the subscriber's subscriptions, and its
   * membership of topics no current definition names. Loaded for this subscriber only, so an old
   * version's branch, wait or cancelOn sees them as its own version did. Returns the slug map to
   * evaluate with.
   */
  private async loadForOldVersions(
    p: number, tenantId: string, defs: Definitions, state: SubjectState, versions: Iterable<VersionDef | null>, topicIdBySlug: Map<string, string>,
  ): Promise<Map<string, string>> {
    let subscriptions = false;
    const slugs = new Set<string>();
    for (const v of versions) {
      if (!v) continue;
      const needs = readsOf(v);
      subscriptions ||= needs.needs.subscriptions && !defs.needs.subscriptions;
      for (const slug of needs.topicSlugs) if (!topicIdBySlug.has(slug)) slugs.add(slug);
    }
    const added = await topicIdsBySlug(this.redis, this.keys, tenantId, [...slugs]);
    if (added.size || subscriptions) {
      const loaded = (await loadStates(this.redis, this.keys, p, tenantId, [state.externalId], { topicIds: [...added.values()], subscriptions, automation: false })).get(state.externalId)!;
      for (const id of loaded.topicIds) state.topicIds.add(id);
      if (subscriptions) state.subscriptions = loaded.subscriptions;
    }
    return added.size ? new Map([...topicIdBySlug, ...added]) : topicIdBySlug;
  }

  /** Segment membership of one subscriber, and the timer that re-checks it when a window can expire it. */
  private segments(p: number, tenantId: string, workspaceId: string, defs: Definitions, state: SubjectState, topicIdBySlug: Map<string, string>, nowMs: number, timerFired: boolean, ops: Op[]): void {
    const { keys } = this;
    const x = state.externalId;
    const autoKey = keys.automation(p, tenantId, x);
    const before = new Set<string>(state.automation.segs ? JSON.parse(state.automation.segs) : []);
    const subject = subjectOf(state, topicIdBySlug, defs.kept, nowMs);
    const after = new Set<string>();
    if (state.exists) for (const segment of defs.segments) if (evaluate(segment.where, subject)) after.add(segment.id);
    // A member is `<sub_ id>|<externalId>` (`indexMember`: listed newest first, like the subscriber index); the
    // id it was added under is kept in `sid`, so a subscriber deleted and created again (a new id)
    // leaves its old members under the old id and joins under the new one.
    const held = indexMember(state.automation.sid, x);
    const current = state.exists ? indexMember(state.record.id, x) : held;
    for (const id of before) if (!after.has(id) || current !== held) ops.push(['zrem', keys.segmentMembers(p, tenantId, id), held, '-']);
    // `segjoin` and `segs`, not zadd and hset: the commit leaves out a segment deleted since `defs`
    // were loaded (lua/commitAutomation; probe EF: such joins outlived the delete's cleanup)
    for (const id of after) if (!before.has(id) || current !== held) ops.push(['segjoin', keys.segmentMembers(p, tenantId, id), id, current]);
    if (after.size > 0 && current !== held) ops.push(['hset', autoKey, 'sid', state.record.id!]);
    if (before.size !== after.size || [...after].some((id) => !before.has(id))) ops.push(['segs', autoKey, JSON.stringify([...after]), '-']);
    // the earliest moment a counted event of a windowed segment condition leaves its window
    let due: number | null = null;
    if (state.exists) {
      for (const segment of defs.segments) {
        for (const k of segment.windows) {
          const next = state.counters.nextExpiry(k.key, k.withinMs, nowMs);
          if (next !== null && (due === null || next < due)) due = next;
        }
      }
    }
    const member = timerMember('seg', workspaceId, tenantId, '-', x);
    const armed = timerFired ? '' : (state.automation.win ?? '');
    const wanted = due === null ? '' : String(due);
    if (armed !== wanted) {
      if (due === null) ops.push(['zrem', keys.timers(p), member, '-']);
      else ops.push(['zadd', keys.timers(p), due, member]);
      ops.push(['hset', autoKey, 'win', wanted]);
    }
  }

  private async commit(p: number, commits: Commit[]): Promise<void> {
    const { keys } = this;
    const at = now();
    const encoded = JSON.stringify(commits.map((c) => {
      const autoKey = keys.automation(p, c.tenantId, c.externalId);
      return [
        c.tenantId, c.workspaceId, c.externalId, autoKey, c.expected,
        c.events.map((e) => [newId('event', at), e.name, JSON.stringify(e.data), e.runId ?? '', e.messageId ?? '', e.step ?? '']),
        // the subscriber's own automation key travels once, as '' in its operations
        c.ops.map(([op, key, a, b]) => [op, key === autoKey ? '' : key, String(a), String(b)]),
      ];
    }));
    await this.hooks.beforeCommit?.(p);
    const reply = await callScript<number[] | number>(this.redis, 'commitAutomation', [keys.inbox(p), keys.sequences(p), keys.subscribers(p), keys.lease(p, WORKER_LEASES), keys.deletedSegments(p)], [at, encoded, this.owner]);
    if (reply === -1) throw new LeaseLost(p);
    // the sends of the commits applied (a commit skipped for its version wrote none), with those a
    // worker killed after its commit left in the partition before them: a run's steps go out in order
    // (probe EV: a step left to the sweeper went out after the next one). One left here (Redis
    // refusing, this process killed) is the sweeper's (`sweepRunSends`)
    const sends = commits.flatMap((c, i) => ((reply as number[])[i] === 1 ? c.sends : []));
    if (sends.length === 0) return;
    await this.hooks.afterCommit?.(p);
    await finishRunSends(this.redis, keys, p, this.refs, sends, this.log);
  }
}

type VersionReads = ReturnType<typeof needsOf> & { conditions: EventCondition[] };
const versionReads = new WeakMap<object, VersionReads>();
/**
 * What a workflow version's expressions read, computed once per version: every event condition (each
 * with its own window), and the kept conditions, topic slugs and state they need loaded (`needsOf`).
 */
function readsOf(version: VersionDef): VersionReads {
  let out = versionReads.get(version);
  if (!out) {
    const expressions = workflowExpressions(version.definition);
    versionReads.set(version, (out = { ...needsOf(expressions), conditions: expressions.flatMap((e) => eventConditions(e)) }));
  }
  return out;
}

/**
 * Seeds from its loaded history each counter of a kept condition that this subscriber has not seeded
 * yet, or that was pruned to a shorter window than the condition now kept (its buckets are counted again).
 */
function seedCounters(state: SubjectState, kept: ReadonlyMap<string, KeptCondition>, version: number, ops: Op[], countersKey: string): void {
  const history: HistoryEvent[] = state.history ?? [];
  for (const k of kept.values()) {
    if (state.counters.covers(k.key, k.withinMs, k.since)) continue;
    for (const field of state.counters.countFields(k.key)) {
      ops.push(['hdel', countersKey, field, '-']);
      state.counters.remove(field);
    }
    const counts = new Map<string, number>();
    for (const e of history) {
      if (!matchesEvent(k.condition, e)) continue;
      const field = state.counters.increment(k.key, k.withinMs, e.ts);
      counts.set(field, (counts.get(field) ?? 0) + 1);
    }
    for (const [field, n] of counts) ops.push(['hincrby', countersKey, field, n]);
    ops.push(['hset', countersKey, ...state.counters.setInit(k.key, k.withinMs, version)]);
  }
}
