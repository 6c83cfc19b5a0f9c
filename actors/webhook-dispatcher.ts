import { randomBytes } from 'node:crypto';
import { hostname } from 'node:os';
import { now } from '../lib/clock.js';
import { derivedId } from '../lib/ids.js';
import { createAllowList } from '../lib/ssrf-guard.js';
import { isDeliverable } from '../lib/webhook-events.js';
import { deliveryKeepMs, leaseMsFor, UNREAD_LEDGER_WINDOW_MS } from '../lib/webhook-policy.js';
import { signingSecrets } from '../lib/webhook-signing.js';
import { IdentityRefs, SYSTEM_WRITER, findWorkspace } from '../streams/identity.js';
import { appendAudit, LEDGER_MAX_LENGTH, type Ref } from '../streams/ledger.js';
import { connectRedis, retryWhileUnavailable } from '../streams/redis.js';
import { readRegistry } from '../streams/registry.js';
import type { RoleContext, Stop } from '../streams/role-context.js';
import { scoreAt } from '../streams/scored-index.js';
import { StreamConsumer, type StreamEntry } from '../streams/stream-consumer.js';
import {
  claimAttempts, DELIVERY_STATUSES, enqueueDeliveries, parseClaim, PURGE_BATCH, purgeDeletedEndpoint, recordAttempts, releaseAttempt, requeueOwed, REQUEUE_GRACE_MS, rescoreLegacyDeliveries,
  type AttemptResult, type ClaimedAttempt, type EnqueueEvent,
} from '../streams/webhook-deliveries.js';
import { activeFromMs, allEndpoints, findEndpoint, joinRegistry, leaveRegistryIfEmpty, publicEndpoint, wantsEvent, type WebhookEndpoint } from '../streams/webhook-endpoints.js';
import { EndpointLanes, postWebhook, type SendOptions } from './webhook-sender.js';

/** How long recording receivers' answers is retried while Redis refuses it: well within an attempt's lease (`leaseMsFor`, 90 s with the 30 s timeout). */
const RECORD_RESULTS_WITHIN_MS = 15_000;
/** The consumer group of the dispatchers on every workspace ledger. */
export const WEBHOOK_GROUP = 'webhooks';
const POLL_EVERY_MS = 100;
/** A workspace with nothing due is claimed from at least this often. */
const IDLE_CLAIM_MS = 1_000;
const REGISTRY_EVERY_MS = 500;
/** How long one XREADGROUP waits: also how soon a workspace that just joined the registry is read. */
const READ_BLOCK_MS = 250;
const SWEEP_EVERY_MS = 60_000;
const ENQUEUE_CHUNK = 100;
/** Ledger entries read at once; small enough that sends in flight are not held up by a long batch. */
const LEDGER_BATCH = 200;
const RECORD_CHUNK = 200;
const RECORD_DELAY_MS = 20;
/**
 * How long a stop lets the requests in flight finish (their answers recorded) before dropping them to
 * their leases: within the process's 8 s stop, and long enough for a receiver that answers within
 * 5 s never to get an event twice from a deploy (2 s until session 52, probe AU).
 */
const STOP_GRACE_MS = 5_000;
/** how old a note of an unannounced disabled endpoint is before the sweep appends its audit event */
const ANNOUNCE_GRACE_MS = 60_000;
/** Deliveries of deleted endpoints one sweep removes, over all workspaces; the rest wait for the next sweep. */
const PURGED_PER_SWEEP = 50_000;
/** Deleted endpoints of one workspace looked at per sweep. */
const PURGES_PER_WORKSPACE = 100;
/** Ledger entries this much older (by their stream id, Redis's clock) than every endpoint's activeSince are skipped unread. */
const CLOCK_SKEW_MS = 5 * 60_000;


const idMs = (streamId: string) => Number(streamId.slice(0, streamId.indexOf('-')));

/**
 * The webhook dispatcher (spec 3.2, 3.3, 6.2, 8), run by the `dispatcher` role; any number of
 * processes share the work.
 *
 * 1. Ledgers: every workspace with an endpoint is in a registry; the dispatchers read those
 *    workspace ledgers (audit and stream events) through one consumer group, `webhooks`
 *    (a dead process's unacked entries are claimed after a while; a lost group is recreated).
 *    Each matching event's payload is built once and stored, and one delivery per matching
 *    endpoint is created, idempotently (lua/enqueueWebhookDeliveries).
 * 2. Attempts: each endpoint has a due-time queue. A dispatcher claims due attempts up to its free
 *    capacity (lua/claimWebhookAttempts), each under a lease that outlives the request, sends them
 *    through the endpoint's lanes (bottleneck, `WEBHOOK_ENDPOINT_CONCURRENCY`), and records each
 *    result once (lua/recordWebhookAttempts), which queues the next attempt or finishes.
 * 3. Housekeeping (one process a minute): delivery indexes past the retention are pruned,
 *    deleted endpoints' deliveries are removed, workspaces without endpoints leave the registry,
 *    ledgers nobody reads are trimmed.
 */
class WebhookDispatcher {
  private readonly owner = `dispatcher:${hostname()}:${process.pid}:${randomBytes(4).toString('hex')}`;
  private readonly timeoutMs: number;
  private readonly leaseMs: number;
  private readonly perEndpoint: number;
  private readonly refillAt: number;
  private readonly send: SendOptions;
  private workspaces: string[] = [];
  private readonly workspaceOfLedger = new Map<string, string>();
  private readonly endpointCache = new Map<string, { version: string | null; endpoints: WebhookEndpoint[] }>();
  /** per workspace, the check of its endpoints running for attempts about to start, and the one queued behind it (`currentEndpoints`) */
  private readonly endpointChecks = new Map<string, { running: Promise<WebhookEndpoint[]> | null; queued: Promise<WebhookEndpoint[]> | null }>();
  private readonly lanes = new Map<string, { workspaceId: string; lanes: EndpointLanes }>();
  private readonly backlog = new Map<string, number>();
  /**
   * The last claim of each workspace's attempts (`enqueueDeliveries` of new events, `claimAttempts`
   * of due ones): a claim starts after the one before it queued what it took, so the room it offers
   * is what is free then. Run at once, two claims both took the same free room and a process held
   * more than `perEndpoint`; attempts beyond it waited so long that their lease ran short (probe AE).
   */
  private readonly claimTurns = new Map<string, Promise<void>>();
  /** when each workspace next needs a claim (ms); absent or 0: at the next round */
  private readonly claimAt = new Map<string, number>();
  /** workspace and tenant slugs of stream payloads (slugs never change) */
  private readonly refs: IdentityRefs;
  private results = new Map<string, AttemptResult[]>();
  private pendingResults = 0;
  private flushTimer: NodeJS.Timeout | null = null;
  private flushing: Promise<void> = Promise.resolve();
  private pollScheduled = false;
  private polling = false;
  private pollAgain = false;
  private claimCount = 0;
  private stopping = false;
  private aborted = false;
  private readonly timers: NodeJS.Timeout[] = [];
  private consumer: StreamConsumer | null = null;

  constructor(private readonly ctx: RoleContext) {
    const { config } = ctx;
    this.timeoutMs = config.webhookAttemptTimeoutMs;
    this.leaseMs = leaseMsFor(this.timeoutMs);
    // an endpoint's attempts taken by this process: its lanes plus as many waiting, so lanes never starve
    this.perEndpoint = 2 * config.webhookEndpointConcurrency;
    this.refillAt = Math.floor(this.perEndpoint * 0.75);
    this.send = {
      timeoutMs: this.timeoutMs, production: config.production, allow: createAllowList(config.webhookAllowPrivateNetworks),
      refused: (err) => ctx.log.warn('webhook attempt refused: its host resolved to an address that is not public', { host: err.hostname, address: err.address, reason: err.reason }),
    };
    this.refs = new IdentityRefs(ctx.redis, ctx.keys);
  }

  async start(): Promise<void> {
    const { redis, keys, log } = this.ctx;
    await this.refreshRegistry();
    const blocking = connectRedis(this.ctx.target, { maxRetriesPerRequest: null });
    blocking.on('error', () => undefined);
    this.consumer = new StreamConsumer({
      redis, blocking, log, group: WEBHOOK_GROUP, consumer: this.owner, blockMs: READ_BLOCK_MS, batchSize: LEDGER_BATCH,
      source: { mode: 'shared', claimIdleMs: Math.min(this.leaseMs, 30_000), streams: () => this.workspaces.map((ws) => keys.ledger(ws)) },
      handle: (stream, entries) => this.handle(stream, entries),
    });
    this.consumer.start();
    const every = (ms: number, fn: () => Promise<unknown>, what: string) => {
      const timer = setInterval(() => void fn().catch((err: Error) => log.warn(`webhook ${what} failed`, { err: err.message })), ms);
      timer.unref();
      this.timers.push(timer);
    };
    every(REGISTRY_EVERY_MS, () => this.refreshRegistry(), 'registry refresh');
    every(POLL_EVERY_MS, async () => this.kick(), 'poll');
    every(SWEEP_EVERY_MS, () => this.sweep(), 'sweep');
    // once at start too, so delivery indexes from before they were scored are scored at once
    void this.sweep().catch((err: Error) => log.warn('webhook sweep failed', { err: err.message }));
    log.info('webhook dispatcher started', { owner: this.owner });
  }

  async stop(): Promise<void> {
    this.stopping = true;
    for (const timer of this.timers) clearInterval(timer);
    await this.consumer?.stop();
    // claims on their way queue what they took first (capacity is 0 from now on)
    await Promise.all([...this.claimTurns.values()]);
    // Attempts queued and not started are given back at once, for another dispatcher to send (left
    // to their leases, they waited up to three timeouts: probe AE). Requests in flight may finish for
    // a moment; then they are dropped unrecorded and their leases expire, so another dispatcher
    // sends them again (receivers dedupe on webhook-id).
    await Promise.all([...this.lanes.values()].map(({ lanes }) => lanes.dropQueued()));
    const deadline = performance.now() + STOP_GRACE_MS;
    while ([...this.lanes.values()].some((l) => !l.lanes.idle()) && performance.now() < deadline) await new Promise((r) => setTimeout(r, 20));
    this.aborted = true;
    for (const { lanes } of this.lanes.values()) lanes.close();
    if (this.flushTimer) clearTimeout(this.flushTimer);
    await this.flushing;
    await this.flush();
    await this.flushing;
  }

  private async refreshRegistry(): Promise<void> {
    const { redis, keys } = this.ctx;
    this.workspaces = await readRegistry(redis, keys.webhookWorkspaces);
    for (const ws of this.workspaces) this.workspaceOfLedger.set(keys.ledger(ws), ws);
  }

  // --- 1. ledger entries to deliveries ---

  /** The workspace's endpoints, reloaded when their version counter moved. */
  private async endpointsOf(workspaceId: string): Promise<WebhookEndpoint[]> {
    const { redis, keys } = this.ctx;
    const version = await redis.get(keys.webhookVersion(workspaceId));
    const cached = this.endpointCache.get(workspaceId);
    if (cached && cached.version === version) return cached.endpoints;
    const endpoints = await allEndpoints(redis, keys, workspaceId);
    this.endpointCache.set(workspaceId, { version, endpoints });
    return endpoints;
  }

  /**
   * The delivered form of a ledger entry (spec 2.6), built once: an audit entry is stored in that
   * form already (its exact bytes are sent); a stream entry gets the workspace and tenant slugs.
   */
  private async body(workspaceId: string, kind: string, raw: string, payload: Record<string, any>): Promise<string | null> {
    if (kind !== 'stream') return raw;
    const [workspace, tenant] = await Promise.all([this.refs.workspace(workspaceId), this.refs.tenant(workspaceId, payload.tenant.id)]);
    if (!workspace || !tenant) return null;
    const updated = payload.changes === undefined ? {} : { changes: payload.changes, previousAttributes: payload.previousAttributes };
    return JSON.stringify({ id: payload.id, type: payload.type, apiVersion: payload.apiVersion, createdAt: payload.createdAt, workspace, tenant, data: payload.data, ...updated });
  }

  private async handle(stream: string, entries: StreamEntry[]): Promise<void> {
    const workspaceId = this.workspaceOfLedger.get(stream);
    if (!workspaceId) return;
    // a disabled endpoint still gets the events from before its disable (their deliveries wait), and
    // an edited or re-enabled one those of the windows the change ended, as it was then
    const endpoints = (await this.endpointsOf(workspaceId)).filter((e) => e.enabled || (e.activeUntilMs ?? 0) > e.activeSinceMs || e.pastWindows.length > 0);
    if (endpoints.length === 0) return;
    const floor = Math.min(...endpoints.map(activeFromMs)) - CLOCK_SKEW_MS;
    const events: EnqueueEvent[] = [];
    for (const entry of entries) {
      if (idMs(entry.id) < floor) continue;
      const kind = entry.fields.kind === 'stream' ? 'stream' : 'audit';
      const raw = entry.fields.payload ?? '';
      let payload: Record<string, any>;
      try {
        payload = JSON.parse(raw);
      } catch {
        this.ctx.log.warn('webhook dispatcher: unreadable ledger entry', { stream, id: entry.id });
        continue;
      }
      const eventMs = Date.parse(payload.createdAt);
      const tenantId: string | null = payload.tenant?.id ?? null;
      const targets = endpoints.filter((e) => wantsEvent(e, eventMs, tenantId, (patterns) => isDeliverable(kind, payload.type, patterns)));
      if (targets.length === 0) continue;
      const body = await this.body(workspaceId, kind, raw, payload);
      if (body === null) continue;
      events.push({
        eventId: payload.id, eventMs, eventType: payload.type, body,
        targets: targets.map((e) => ({ endpointId: e.id, deliveryId: derivedId('webhookDelivery', eventMs, `${payload.id}|${e.id}`) })),
      });
    }
    const byId = new Map(endpoints.map((e) => [e.id, e]));
    for (let i = 0; i < events.length; i += ENQUEUE_CHUNK) {
      if (i > 0) await new Promise((r) => setImmediate(r)); // let answers of requests in flight be handled
      const chunk = events.slice(i, i + ENQUEUE_CHUNK);
      await this.inTurn([workspaceId], async () => {
        // the lease from when the claim is made, not from before it waited for its turn
        const lease = { atMs: now(), leaseMs: this.leaseMs, token: `${this.owner}:${++this.claimCount}`, retentionMs: deliveryKeepMs(this.ctx.config.retentionMs, this.ctx.config.webhookRetryScheduleMs) };
        const { claimed, stored } = await enqueueDeliveries(this.ctx.redis, this.ctx.keys, workspaceId, chunk, this.capacity(workspaceId, endpoints), lease);
        const bodies = new Map(chunk.map((e) => [e.eventId, e.body]));
        const targets = new Map<string, number>();
        for (const e of chunk) for (const t of e.targets) if (byId.get(t.endpointId)!.enabled) targets.set(t.endpointId, (targets.get(t.endpointId) ?? 0) + 1);
        for (const attempt of claimed) targets.set(attempt.endpointId, targets.get(attempt.endpointId)! - 1);
        for (const [endpointId, queued] of targets) {
          if (queued <= 0) continue;
          this.backlog.set(endpointId, (this.backlog.get(endpointId) ?? 0) + queued);
          this.claimAt.set(workspaceId, 0);
        }
        for (const attempt of claimed) {
          const body = stored.get(attempt.eventId) ?? bodies.get(attempt.eventId)!;
          this.enqueueSend(workspaceId, attempt.endpointId, { ...attempt, body });
        }
      });
    }
    if (events.length) this.refill();
  }

  /**
   * The workspace's endpoints as they are now, for an attempt about to start (it may have waited in
   * its endpoint's lanes since its claim, up to a timeout): read by a check begun after this call
   * (`endpointsOf`, one GET of the version counter unless something changed). Checks are shared: while
   * one runs, the attempts asking meanwhile share the next, so a workspace costs at most one check
   * per round trip however many attempts start.
   */
  private currentEndpoints(workspaceId: string): Promise<WebhookEndpoint[]> {
    let checks = this.endpointChecks.get(workspaceId);
    if (!checks) this.endpointChecks.set(workspaceId, (checks = { running: null, queued: null }));
    const c = checks;
    const run = (): Promise<WebhookEndpoint[]> => {
      const check = this.endpointsOf(workspaceId);
      c.running = check;
      const done = () => {
        if (c.running === check) c.running = null;
      };
      check.then(done, done);
      return check;
    };
    if (!c.running) return run();
    c.queued ??= c.running.then(() => undefined, () => undefined).then(() => {
      c.queued = null;
      return run();
    });
    return c.queued;
  }

  // --- 2. attempts: claim, send, record ---

  private lanesOf(workspaceId: string, endpointId: string): EndpointLanes {
    let entry = this.lanes.get(endpointId);
    if (!entry) {
      const lanes = new EndpointLanes(this.ctx.config.webhookEndpointConcurrency, (err) => this.ctx.log.warn('webhook send failed', { err: err.message }));
      this.lanes.set(endpointId, (entry = { workspaceId, lanes }));
    }
    return entry.lanes;
  }

  /**
   * Attempts each endpoint of the workspace with lanes here may still take (`also`: endpoints
   * without lanes, `perEndpoint`). Read in the workspace's turn (`inTurn`).
   */
  private capacity(workspaceId: string, also: readonly WebhookEndpoint[] = []): Map<string, number> {
    const out = new Map<string, number>();
    for (const e of also) out.set(e.id, this.stopping ? 0 : this.perEndpoint);
    for (const [endpointId, entry] of this.lanes) if (entry.workspaceId === workspaceId) out.set(endpointId, this.stopping ? 0 : Math.max(0, this.perEndpoint - entry.lanes.load));
    return out;
  }

  /** Runs `claim` (a claim and the queueing of what it took) after the claims before it of these workspaces. */
  private inTurn<T>(workspaceIds: readonly string[], claim: () => Promise<T>): Promise<T> {
    const before = workspaceIds.map((ws) => this.claimTurns.get(ws)).filter((p) => p !== undefined);
    const run = (before.length ? Promise.all(before).then(claim) : claim());
    const done = run.then(() => undefined, () => undefined);
    for (const ws of workspaceIds) this.claimTurns.set(ws, done);
    void done.then(() => {
      for (const ws of workspaceIds) if (this.claimTurns.get(ws) === done) this.claimTurns.delete(ws);
    });
    return run;
  }

  private enqueueSend(workspaceId: string, endpointId: string, attempt: ClaimedAttempt & { body: string }): void {
    const lanes = this.lanesOf(workspaceId, endpointId);
    // An attempt not sent is given back at once: the next claim (this process's or another's) puts
    // it back in its endpoint's queue. Left to its lease, it waited up to three timeouts (probe AE).
    const giveBack = () => releaseAttempt(this.ctx.redis, this.ctx.keys, workspaceId, attempt.member, attempt.token, now())
      .then(() => undefined, (err: Error) => this.ctx.log.warn('could not give back a webhook attempt; its lease will expire', { err: err.message }));
    lanes.push({
      dropped: giveBack,
      run: async () => {
        if (this.stopping) return giveBack();
        // The endpoint as it is now, not as it was at the claim: one disabled or deleted meanwhile
        // gets nothing more, its attempt waiting in the endpoint's queue for a re-enable (which sends
        // it at once), or going with the endpoint. Left to its lease, a re-enable within it skipped the
        // attempt as in flight, and it went out ~90 s later (probe A1). A new URL or secret is used.
        const target = (await this.currentEndpoints(workspaceId)).find((e) => e.id === endpointId);
        if (!target?.enabled) return giveBack();
        // An attempt starts only with more than a timeout of lease left, so the lease outlives it.
        if (this.stopping || now() + this.timeoutMs + 1_000 > attempt.leaseUntil) return giveBack();
        // the one place secrets are chosen: first sends, retries and replays all pass here
        const secrets = signingSecrets(target.secret, target.retiredSecrets, now());
        const protocol = target.url.startsWith('https:') ? 'https:' : 'http:';
        const result = await postWebhook(target.url, attempt.eventId, Buffer.from(attempt.body), secrets, lanes.agent(protocol), this.send);
        if (this.aborted) return;
        this.addResult(workspaceId, { member: attempt.member, token: attempt.token, record: { trigger: attempt.attempt === 0 ? 'replay' : 'schedule', ...result } });
        // refill early, so work is still queued while the claim is on its way (this attempt counts in `load` until it returns)
        if ((this.backlog.get(endpointId) ?? 0) > 0 && lanes.load - 1 <= this.refillAt) this.kick();
      },
    });
  }

  /** Schedules a claim round soon (coalesced): after new deliveries, freed capacity, or the timer. */
  private kick(): void {
    if (this.pollScheduled || this.stopping) return;
    this.pollScheduled = true;
    setImmediate(() => void this.poll().catch((err: Error) => this.ctx.log.warn('webhook claim failed', { err: err.message })));
  }

  private async poll(): Promise<void> {
    this.pollScheduled = false;
    if (this.polling) {
      this.pollAgain = true;
      return;
    }
    this.polling = true;
    try {
      const atMs = now();
      // a workspace is claimed from when something of it is due, and at least every IDLE_CLAIM_MS
      // (replays and re-queues come from the web role, queued attempts from other dispatchers)
      const workspaces = this.workspaces.filter((ws) => (this.claimAt.get(ws) ?? 0) <= atMs);
      if (workspaces.length === 0) return;
      await this.inTurn(workspaces, async () => {
        const lease = { atMs: now(), leaseMs: this.leaseMs, token: `${this.owner}:${++this.claimCount}` };
        const pipeline = this.ctx.redis.pipeline();
        for (const ws of workspaces) claimAttempts(pipeline, this.ctx.keys, ws, this.capacity(ws), this.perEndpoint, lease);
        const replies = (await pipeline.exec()) ?? [];
        replies.forEach(([err, reply], i) => {
          const ws = workspaces[i]!;
          if (err) return this.ctx.log.warn('webhook claim failed', { workspace: ws, err: err.message });
          const { nextDueMs, endpoints } = parseClaim(reply, lease);
          let waiting = false;
          for (const claimed of endpoints) {
            this.backlog.set(claimed.endpointId, claimed.dueLeft);
            if (claimed.dueLeft > 0) waiting = true;
            for (const attempt of claimed.attempts) this.enqueueSend(ws, claimed.endpointId, attempt);
          }
          this.claimAt.set(ws, waiting ? 0 : Math.min(nextDueMs ?? Infinity, atMs + IDLE_CLAIM_MS));
        });
      });
    } finally {
      this.polling = false;
      if (this.pollAgain) {
        this.pollAgain = false;
        this.kick();
      }
    }
  }

  private addResult(workspaceId: string, result: AttemptResult): void {
    let list = this.results.get(workspaceId);
    if (!list) this.results.set(workspaceId, (list = []));
    list.push(result);
    this.pendingResults++;
    // Results are recorded in batches: at once when a batch is full, else within RECORD_DELAY_MS.
    if (this.pendingResults >= RECORD_CHUNK) this.scheduleFlush(0);
    else this.scheduleFlush(RECORD_DELAY_MS);
  }

  private scheduleFlush(delayMs: number): void {
    if (this.flushTimer && delayMs > 0) return;
    if (this.flushTimer) clearTimeout(this.flushTimer);
    this.flushTimer = setTimeout(() => {
      this.flushTimer = null;
      this.flushing = this.flushing.then(() => this.flush());
    }, delayMs);
  }

  /** Records the collected results, one script call per workspace and chunk; retried a few times on errors. */
  private async flush(): Promise<void> {
    const batches = this.results;
    this.results = new Map();
    this.pendingResults = 0;
    const { redis, keys, config, log } = this.ctx;
    for (const [workspaceId, results] of batches) {
      for (let i = 0; i < results.length; i += RECORD_CHUNK) {
        const chunk = results.slice(i, i + RECORD_CHUNK);
        try {
          // the receivers' answers: a brief refusal is waited out rather than the attempts run again
          const atMs = now();
          const outcomes = await retryWhileUnavailable(() => recordAttempts(redis, keys, workspaceId, chunk, { atMs, retryScheduleMs: config.webhookRetryScheduleMs }), RECORD_RESULTS_WITHIN_MS);
          this.claimAt.set(workspaceId, 0); // a retry may have been queued: learn when it is due
          for (const o of outcomes) if (o.disabledEndpointId) await this.announceDisabled(workspaceId, o.disabledEndpointId);
        } catch (err) {
          log.warn('webhook results not recorded; their leases will expire and the attempts run again', { workspace: workspaceId, count: chunk.length, err: (err as Error).message });
        }
      }
    }
    if (batches.size) this.refill();
  }

  /** Claims more when an endpoint with due attempts has room for a quarter of what this process may hold. */
  private refill(): void {
    for (const [endpointId, due] of this.backlog) {
      if (due <= 0) continue;
      const entry = this.lanes.get(endpointId);
      if (!entry || entry.lanes.load <= this.refillAt) return this.kick();
    }
  }

  /** The private audit event of an endpoint the failure streak disabled (spec 3.3). */
  private async announceDisabled(workspaceId: string, endpointId: string): Promise<void> {
    const workspace = await this.refs.workspace(workspaceId);
    if (workspace) await announceDisabled(this.ctx, workspace, endpointId);
  }

  // --- 3. housekeeping ---

  private async sweep(): Promise<void> {
    // this process's lanes (and their connections) of endpoints idle for a while
    for (const [endpointId, entry] of this.lanes) if (entry.lanes.idle() && now() - entry.lanes.lastUsed > SWEEP_EVERY_MS) {
      entry.lanes.close();
      this.lanes.delete(endpointId);
      this.backlog.delete(endpointId);
    }
    const { redis, keys } = this.ctx;
    if ((await redis.set(keys.lock('webhook-sweep'), this.owner, 'PX', SWEEP_EVERY_MS - 1_000, 'NX')) !== 'OK') return;
    const { joined, purged } = await sweepWebhooks(this.ctx);
    if (joined) this.ctx.log.warn('workspaces with endpoints left out of the dispatchers\' registry joined it', { joined });
    if (purged.records || purged.payloads) this.ctx.log.info('deliveries of deleted webhook endpoints removed', purged);
  }
}

/**
 * The dispatchers' housekeeping, run by one of them a minute (and once at start): delivery indexes
 * lose ids past the retention (records and payloads expire by themselves), and endpoint queues the
 * attempts due before it (`dropped`: a disabled endpoint's, which no claim reads), workspaces without
 * endpoints leave the registry, ledgers nobody reads are trimmed to the last
 * `UNREAD_LEDGER_WINDOW_MS`, and endpoints disabled by a dispatcher that stopped before appending
 * their `webhook.disabled` audit event get it (`announceDisabled`), re-enables whose request died
 * before its re-queue was done get it finished (`requeueOwed`), and workspaces with endpoints
 * left out of the registry join it (`joinLeftOut`), and deleted endpoints' delivery records and
 * payloads are removed (`purgeDeleted`). Deliveries indexed before the
 * indexes were scored by createdAt get their score first (`rescoreLegacyDeliveries`; nothing to do
 * once that is done).
 */
export async function sweepWebhooks(ctx: RoleContext): Promise<{
  rescored: number; pruned: number; dropped: number; unregistered: number; trimmed: number; announced: number; requeued: number; joined: number; purged: PurgedTotals; behind: LedgerLag[];
}> {
  const { redis, keys, config } = ctx;
  let rescored = 0;
  let announced = 0;
  let requeued = 0;
  const behind: LedgerLag[] = [];
  let pruned = 0;
  let unregistered = 0;
  let trimmed = 0;
  let dropped = 0;
  // delivery indexes are scored by createdAt, as records expire: everything below this is past the retention
  const keepMs = deliveryKeepMs(config.retentionMs, config.webhookRetryScheduleMs);
  const floor = `(${scoreAt(now() - keepMs)}`;
  const registered = new Set(await readRegistry(redis, keys.webhookWorkspaces));
  const joined = await joinLeftOut(ctx, registered);
  for (const ws of registered) {
    const endpoints = await redis.zrange(keys.webhookEndpoints(ws), 0, -1);
    if (endpoints.length === 0) {
      if (await leaveRegistryIfEmpty(redis, keys, ws)) {
        registered.delete(ws);
        unregistered++;
      }
      continue;
    }
    rescored += await rescoreLegacyDeliveries(redis, keys, ws, endpoints);
    const lagging = await ledgerLag(redis, keys, ws);
    if (lagging) {
      behind.push(lagging);
      if (lagging.lost > 0) ctx.log.error('webhook ledger entries were trimmed before the dispatchers read them: their events get no delivery', lagging);
      else ctx.log.warn('webhook dispatchers are far behind a workspace ledger: past its cap, the oldest unread entries are trimmed', lagging);
    }
    // endpoints disabled by a dispatcher that stopped before appending their audit event (at most 50
    // a workspace); a note younger than a minute is left to the dispatcher that wrote it, which is at it
    const notes = Object.entries(await redis.hgetall(keys.webhookUnannounced(ws))).filter(([, at]) => !(now() - Date.parse(at) < ANNOUNCE_GRACE_MS));
    const ref = notes.length ? await findWorkspace(redis, keys, ws) : null;
    if (ref) for (const [endpointId] of notes) {
      await announceDisabled(ctx, { id: ref.id, slug: ref.slug }, endpointId);
      announced++;
    }
    // re-enables whose re-queue the request that made them did not finish (killed, Redis lost meanwhile)
    for (const [endpointId, at] of Object.entries(await redis.hgetall(keys.webhookRequeues(ws)))) {
      if (now() - Number(at) < REQUEUE_GRACE_MS) continue; // young: its request is at it
      await requeueOwed(redis, keys, ws, endpointId, Number(at));
      requeued++;
    }
    const pipeline = redis.pipeline();
    for (const e of endpoints) for (const status of [undefined, ...DELIVERY_STATUSES]) pipeline.zremrangebyscore(keys.webhookDeliveries(ws, e, status), '-inf', floor);
    for (const [, removed] of (await pipeline.exec()) ?? []) pruned += Number(removed ?? 0);
    // queued attempts due before the retention began are of deliveries made before it (an attempt is
    // never due before its delivery was made), whose records have expired: a disabled endpoint's
    // queue, which no claim reads, would otherwise keep them for as long as it stays disabled
    const queues = redis.pipeline();
    for (const e of endpoints) queues.zremrangebyscore(keys.webhookDue(ws, e), '-inf', `(${now() - keepMs}`);
    for (const [, removed] of (await queues.exec()) ?? []) dropped += Number(removed ?? 0);
  }
  // ledgers of workspaces without endpoints: no endpoint can ever want what is older than the window
  const minId = String(now() - UNREAD_LEDGER_WINDOW_MS);
  let cursor = '0';
  do {
    const [next, flat] = await redis.hscan(keys.workspaceSlugs, cursor, 'COUNT', 500);
    cursor = next;
    const pipeline = redis.pipeline();
    for (let i = 1; i < flat.length; i += 2) if (!registered.has(flat[i]!)) pipeline.xtrim(keys.ledger(flat[i]!), 'MINID', minId);
    for (const [, removed] of (await pipeline.exec()) ?? []) trimmed += Number(removed ?? 0);
  } while (cursor !== '0');
  // last, the longest step: a failure in it (it throws) skips nothing else
  const purged = await purgeDeleted(ctx, floor, PURGED_PER_SWEEP);
  return { rescored, pruned, dropped, unregistered, trimmed, announced, requeued, joined, purged, behind };
}

type PurgedTotals = { endpoints: number; records: number; payloads: number };

/** A ledger the dispatchers are far behind on: `unread` entries not yet read by the group, `lost` of them trimmed before it read them. */
export type LedgerLag = { workspaceId: string; unread: number; lost: number };

/**
 * How far the dispatchers' group is behind a workspace ledger, when it is more than half the cap
 * (LEDGER_MAX_LENGTH: every append trims the ledger to it, read or not) or entries were trimmed
 * unread; null otherwise. Redis counts the group's lag from the entries added and read, trimmed ones
 * included, so a lag beyond the ledger's length is what the trim took unread.
 */
async function ledgerLag(redis: RoleContext['redis'], keys: RoleContext['keys'], workspaceId: string): Promise<LedgerLag | null> {
  const ledger = keys.ledger(workspaceId);
  const [groups, length] = await Promise.all([
    (redis.xinfo('GROUPS', ledger) as Promise<unknown[][]>).catch(() => [] as unknown[][]),
    redis.xlen(ledger),
  ]);
  const field = (list: unknown[], name: string) => list[list.indexOf(name) + 1];
  const group = groups.find((g) => field(g, 'name') === WEBHOOK_GROUP);
  const lag = group ? field(group, 'lag') : null;
  if (typeof lag !== 'number') return null; // no group yet, or a lag Redis cannot tell (entries deleted inside its range)
  const lost = Math.max(0, lag - length);
  return lost > 0 || lag > LEDGER_MAX_LENGTH / 2 ? { workspaceId, unread: lag, lost } : null;
}

/**
 * Removes the delivery records and payloads of deleted endpoints (`purgeDeletedEndpoint`, in batches),
 * at most `budget` deliveries a sweep. Looked for in every workspace that ever had an endpoint
 * (`webhookForwarding`, 500 at a time): deleting its last one takes a workspace out of the registry.
 * Each deleted endpoint found gets an equal share of the budget (at least one batch), in a random
 * order: one with millions of deliveries no longer held back every other workspace's purge for the
 * sweeps it took (probe EI). Until probe EG they stayed until their keep: ~7,200 records and
 * payloads (~15 MB) per 30 s of endpoint churn.
 */
export async function purgeDeleted(ctx: RoleContext, floor: string, budget: number): Promise<PurgedTotals> {
  const { redis, keys } = ctx;
  const totals: PurgedTotals = { endpoints: 0, records: 0, payloads: 0 };
  const pending: { ws: string; endpointId: string }[] = [];
  let cursor = '0';
  do {
    const [next, workspaces] = await redis.sscan(keys.webhookForwarding, cursor, 'COUNT', 500);
    cursor = next;
    const listed = redis.pipeline();
    for (const ws of workspaces) listed.srandmember(keys.webhookPurges(ws), PURGES_PER_WORKSPACE);
    const replies = (await listed.exec()) ?? [];
    for (const [k, ws] of workspaces.entries()) {
      const [err, endpointIds] = replies[k] ?? [];
      if (err) throw err;
      for (const endpointId of (endpointIds as string[] | undefined) ?? []) pending.push({ ws, endpointId });
    }
  } while (cursor !== '0');
  const share = Math.max(PURGE_BATCH, Math.ceil(budget / Math.max(1, pending.length)));
  for (const { ws, endpointId } of shuffled(pending)) {
    if (budget <= 0) break;
    const done = await purgeDeletedEndpoint(redis, keys, ws, endpointId, floor, Math.min(share, budget));
    budget -= done.walked;
    totals.records += done.records;
    totals.payloads += done.payloads;
    if (done.finished) totals.endpoints++;
  }
  return totals;
}

/** `items` in a random order (Fisher–Yates), in place. */
function shuffled<T>(items: T[]): T[] {
  for (let i = items.length - 1; i > 0; i--) {
    const j = Math.floor(Math.random() * (i + 1));
    [items[i], items[j]] = [items[j]!, items[i]!];
  }
  return items;
}

/**
 * Workspaces with endpoints left out of the registry, which the dispatchers read: a writer stopped
 * between an endpoint's script and `joinRegistry` (killed, or Redis out of memory: probe O), and until
 * this sweep its endpoints were never sent anything. Looked for among the workspaces that ever made
 * an endpoint (`webhookForwarding`, joined before the script), 500 at a time; each found joins
 * `registered` too. Returns how many joined.
 */
async function joinLeftOut(ctx: RoleContext, registered: Set<string>): Promise<number> {
  const { redis, keys } = ctx;
  let joined = 0;
  let cursor = '0';
  do {
    const [next, members] = await redis.sscan(keys.webhookForwarding, cursor, 'COUNT', 500);
    cursor = next;
    const out = members.filter((ws) => !registered.has(ws));
    if (out.length === 0) continue;
    const counts = redis.pipeline();
    for (const ws of out) counts.zcard(keys.webhookEndpoints(ws));
    const replies = (await counts.exec()) ?? [];
    for (const [k, ws] of out.entries()) {
      if (!(Number(replies[k]?.[1] ?? 0) > 0)) continue;
      await joinRegistry(redis, keys, ws);
      registered.add(ws);
      joined++;
    }
  } while (cursor !== '0');
  return joined;
}

/**
 * Appends the private `webhook.disabled` audit event of an endpoint lua/recordWebhookAttempts
 * disabled (noted in `webhookUnannounced`), then clears the note. The event id is derived from the
 * endpoint and its disabledAt, so a crash after the append and before the clear makes the sweep
 * append the same event again, never a second one.
 */
async function announceDisabled(ctx: RoleContext, workspace: Ref, endpointId: string): Promise<void> {
  const { redis, keys, log } = ctx;
  const note = keys.webhookUnannounced(workspace.id);
  const [disabledAt, endpoint] = await Promise.all([redis.hget(note, endpointId), findEndpoint(redis, keys, workspace.id, endpointId)]);
  if (disabledAt === null) return;
  if (endpoint) {
    log.warn('webhook endpoint disabled after three days of failures', { workspace: workspace.id, endpoint: endpointId });
    await appendAudit(redis, keys, {
      id: derivedId('webhookEvent', Date.parse(disabledAt), `webhook.disabled|${endpointId}|${disabledAt}`),
      type: 'webhook.disabled', workspace, tenant: endpoint.tenantId ? { id: endpoint.tenantId, slug: endpoint.tenantSlug! } : null,
      ...SYSTEM_WRITER, target: { type: 'webhook_endpoint', id: endpointId },
      object: { ...publicEndpoint(endpoint) }, changes: { enabled: false, disabledAt }, previousAttributes: { enabled: true, disabledAt: null },
    });
  }
  await redis.hdel(note, endpointId);
}

/** Starts the webhook dispatcher of this process (role `dispatcher`). */
export async function startWebhookDispatcher(ctx: RoleContext): Promise<Stop> {
  const dispatcher = new WebhookDispatcher(ctx);
  await dispatcher.start();
  return () => dispatcher.stop();
}
