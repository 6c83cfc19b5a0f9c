import { now } from '../lib/clock.js';
import { appendDrafts, parseOutboxField, type AuditScope } from '../streams/audit-outbox.js';
import { AUDIT_OPS } from '../streams/audit-ops.js';
import { sweepHashes } from '../streams/hash-sweep.js';
import { BACKFILL_AUDIT_OPS, DELETE_AUDIT_OPS, deletedSegmentOf, dropSegmentMembers, queuePendingBackfills, sweepDeletedSegments } from '../streams/segments.js';
import { IdentityRefs } from '../streams/identity.js';
import { sweepRunSends } from '../streams/run-sends.js';
import { sweepSubscriberCleanups } from '../streams/subscriber-cleanup.js';
import { sweepTokenMoves, sweepTokenReleases } from '../streams/subscriptions.js';
import { sweepDeletedTopics, sweepTopicMirrors } from '../streams/topic-members.js';
import type { RoleContext, Stop } from '../streams/role-context.js';

/** Most intents settled per outbox and sweep; the rest wait for the next sweep. */
const PER_OUTBOX = 1_000;
const TENANT_PAGE = 10_000;

/** Every workspace of the deployment, and every tenant with its workspace (read a page at a time). */
async function workspacesAndTenants(ctx: RoleContext): Promise<{ workspaces: string[]; tenants: { workspaceId: string; tenantId: string }[] }> {
  const { redis, keys } = ctx;
  const workspaces = await redis.hvals(keys.workspaceSlugs);
  const tenants: { workspaceId: string; tenantId: string }[] = [];
  for (const ws of workspaces) {
    for (let start = 0; ; start += TENANT_PAGE) {
      const page = await redis.zrange(keys.tenantIndex(ws), start, start + TENANT_PAGE - 1);
      tenants.push(...page.map((tenantId) => ({ workspaceId: ws, tenantId })));
      if (page.length < TENANT_PAGE) break;
    }
  }
  return { workspaces, tenants };
}

/** Every outbox of the deployment: each workspace's, each of its tenants', each partition's. */
function outboxes(ctx: RoleContext, { workspaces, tenants }: Awaited<ReturnType<typeof workspacesAndTenants>>): string[] {
  const { keys, config } = ctx;
  return [
    ...workspaces.map((ws) => keys.workspaceOutbox(ws)),
    ...tenants.map((t) => keys.tenantOutbox(t.tenantId)),
    ...Array.from({ length: config.partitions }, (_, p) => keys.partitionOutbox(p)),
  ];
}

/**
 * Settles the audit intents that their writers left behind (killed between the write and the
 * ledger append; streams/audit-outbox.ts): those older than `minAgeMs`, which a live writer has
 * long settled itself. An intent of an operation this version does not know, or whose reply it
 * cannot read, is kept and reported. An intent of a write that makes backfills pending
 * (BACKFILL_AUDIT_OPS) first has its tenant's pending backfills queued: its writer settles it only
 * after queueing them, so one left behind may not have; an intent of a segment delete
 * (DELETE_AUDIT_OPS) first has the delete's partition half made (`dropSegmentMembers`), for the same reason.
 */
export async function sweepAuditOutboxes(ctx: RoleContext, minAgeMs: number, known?: Awaited<ReturnType<typeof workspacesAndTenants>>): Promise<{ settled: number; kept: number }> {
  const { redis, keys, log } = ctx;
  let settled = 0;
  let kept = 0;
  await sweepHashes(redis, outboxes(ctx, known ?? (await workspacesAndTenants(ctx))), PER_OUTBOX, async (key, flat) => {
    const pipeline = redis.pipeline();
    const tokens: string[] = [];
    const backfilling = new Map<string, AuditScope>();
    const dropping: { tenantId: string; segmentId: string }[] = [];
    for (let f = 0; f + 1 < flat.length; f += 2) {
      const token = flat[f]!;
      try {
        const { record, reply } = parseOutboxField(flat[f + 1]!);
        if (now() - record.at < minAgeMs) continue;
        const op = AUDIT_OPS[record.op];
        if (!op) throw new Error(`unknown audit op ${record.op}`);
        appendDrafts(pipeline, keys, record, op(record.input as never, reply));
        tokens.push(token);
        if (BACKFILL_AUDIT_OPS.has(record.op) && record.scope.tenant) backfilling.set(record.scope.tenant.id, record.scope);
        const segmentId = DELETE_AUDIT_OPS.has(record.op) ? deletedSegmentOf(reply) : null;
        if (segmentId && record.scope.tenant) dropping.push({ tenantId: record.scope.tenant.id, segmentId });
      } catch (err) {
        kept++;
        log.warn('audit intent kept in its outbox', { key, token, err: (err as Error).message });
      }
    }
    if (tokens.length === 0) return;
    // the intents go only once every append is in (a failed one leaves them all to the next sweep)
    const replies = (await pipeline.exec()) ?? [];
    for (const [err] of replies) if (err) throw err;
    // the write's backfills may not have been queued (its writer stopped, or Redis refused the queueing)
    for (const scope of backfilling.values()) {
      if (!(await queuePendingBackfills(redis, keys, { workspace: scope.workspace, tenant: scope.tenant! }))) throw new Error('pending backfills not queued');
    }
    // the delete's member sets may still be in the partitions (its writer stopped before them)
    for (const { tenantId, segmentId } of dropping) await dropSegmentMembers(redis, keys, tenantId, segmentId, ctx.config.partitions);
    await redis.hdel(key, ...tokens);
    settled += tokens.length;
  });
  return { settled, kept };
}

/**
 * Runs the sweep every `AUDIT_OUTBOX_SWEEP_MS` in one worker at a time (a short lock), and with it
 * the sweeps of the subscriber cleanups that deletes left behind (streams/subscriber-cleanup.ts)
 * and of the topic membership changes whose member set copy was left unwritten
 * (streams/topic-members.ts), the messages of workflow send steps whose worker died after its commit
 * (streams/run-sends.ts), the token releases a removal owed when it died, and the token moves
 * whose mover wrote its copy and died before removing the previous one (streams/subscriptions.ts), under the same rule: older than the
 * interval, their writer died; and the members of deleted topics, whose own topic sets still name
 * them (`sweepDeletedTopics`), and of deleted segments, whose `segs` still name them (`sweepDeletedSegments`).
 */
export async function startAuditOutboxSweeper(ctx: RoleContext): Promise<Stop> {
  const every = ctx.config.auditOutboxSweepMs;
  const lockKey = ctx.keys.lock('audit-outbox-sweep');
  const refs = new IdentityRefs(ctx.redis, ctx.keys);
  // each step on its own: one that fails (Redis refusing a write, a record it cannot read) no longer
  // skips the steps after it until it stops failing (probe BE)
  let stopped = false;
  const step = async (name: string, run: () => Promise<void>) => {
    if (stopped) return; // a stop waits for the step in flight, not for the steps after it (probe BL)
    try {
      await run();
    } catch (err) {
      ctx.log.warn('audit outbox sweep failed', { step: name, err: (err as Error).message });
    }
  };
  const sweep = async () => {
    if ((await ctx.redis.set(lockKey, String(process.pid), 'PX', Math.max(50, every - 50), 'NX')) !== 'OK') return;
    const known = await workspacesAndTenants(ctx);
    await step('audit outboxes', async () => {
      const { settled } = await sweepAuditOutboxes(ctx, every, known);
      if (settled) ctx.log.info('audit intents settled by the sweeper', { settled });
    });
    await step('subscriber cleanups', async () => {
      const { finished } = await sweepSubscriberCleanups(ctx.redis, ctx.keys, ctx.config.partitions, every, ctx.log);
      if (finished) ctx.log.info('subscriber cleanups finished by the sweeper', { finished });
    });
    await step('topic mirrors', async () => {
      const { mirrored } = await sweepTopicMirrors(ctx.redis, ctx.keys, ctx.config.partitions, every, ctx.log);
      if (mirrored) ctx.log.info('topic memberships mirrored by the sweeper', { mirrored });
    });
    await step('workflow sends', async () => {
      const sends = await sweepRunSends(ctx.redis, ctx.keys, ctx.config.partitions, refs, every, ctx.log);
      if (sends.finished) ctx.log.info('workflow sends made by the sweeper', { finished: sends.finished });
    });
    await step('token releases', async () => {
      const releases = await sweepTokenReleases(ctx.redis, ctx.keys, ctx.config.partitions, every, ctx.log);
      if (releases.finished) ctx.log.info('token releases finished by the sweeper', { finished: releases.finished });
    });
    await step('token moves', async () => {
      const moves = await sweepTokenMoves(ctx.redis, ctx.keys, ctx.config.partitions, known.tenants, every, ctx.log);
      if (moves.finished) ctx.log.info('token moves finished by the sweeper', { finished: moves.finished });
    });
    await step('deleted topics', async () => {
      const topics = await sweepDeletedTopics(ctx.redis, ctx.keys, known.tenants, ctx.config.partitions);
      if (topics.visited) ctx.log.info('deleted topics taken out of their members\' topic sets', topics);
    });
    await step('deleted segments', async () => {
      const segments = await sweepDeletedSegments(ctx.redis, ctx.keys, ctx.config.partitions);
      if (segments.visited) ctx.log.info('deleted segments taken out of their members\' segments', segments);
    });
  };
  // one sweep at a time in this process: a tick while the last still runs (a long deleted-topic walk
  // outlives the lock) is skipped, not run beside it; the stop waits for the one in flight
  let running: Promise<void> | null = null;
  const timer = setInterval(() => {
    if (running) return;
    running = sweep()
      .catch((err: Error) => ctx.log.warn('audit outbox sweep failed', { err: err.message }))
      .finally(() => (running = null));
  }, every);
  timer.unref();
  return async () => {
    stopped = true;
    clearInterval(timer);
    await running;
  };
}
