import type { Redis } from 'ioredis';
import type { Logger } from '../lib/log.js';
import type { SendContent } from '../lib/workflow-definition.js';
import { writeScope } from './audit-outbox.js';
import { now } from '../lib/clock.js';
import { sweepHashes } from './hash-sweep.js';
import { SYSTEM_WRITER, type IdentityRefs } from './identity.js';
import type { Keys } from './keys.js';
import { createMessage, runStepIdempotencyKey, type RunRef } from './messages.js';

/**
 * The message a workflow run's `send` step owes, recorded in the partition (`{pN}:run-sends`, field
 * `<tenant>|<runId>|<step>`) by the same commit (lua/commitAutomation) that records the step as sent,
 * and created only after it. Created while the step was computed, before the commit, a message
 * outlived a worker killed in between: the partition's next owner computed the batch again from
 * what it read by then (an attribute changed, the workflow disabled or given a new version) and took
 * another path, or started no run, and the first attempt's pushes still went (probe ER: 67 pushes of
 * branches no run took; a disabled workflow with no run and 76 pushes). Now a step is sent exactly
 * when it is committed: the committing worker creates its messages, and the sweeper those of one
 * killed after its commit (`sweepRunSends`), each once under the run step's idempotency key.
 */
export type RunSend = {
  /** when the step was computed (ms): the sweep leaves younger ones to their worker */
  at: number;
  /** its place among the sends its subscriber's batch computed: with `at`, the order of a run's steps */
  n: number;
  workspaceId: string;
  tenantId: string;
  externalId: string;
  /**
   * the subscriber's id as the worker read it (absent when it was made in the same batch): the
   * message goes to that subscriber only, not to one created again under the externalId before it
   * fans out (probe EV: a send left by a killed worker reached the new subscriber's device)
   */
  subscriberId?: string;
  /** the message's id, made with the step (the run's `$run.step` names it) */
  messageId: string;
  content: SendContent;
  run: RunRef;
};

const fieldOf = (send: Pick<RunSend, 'tenantId' | 'run'>) => `${send.tenantId}|${send.run.runId}|${send.run.step}`;

/** The commit operation recording `send` (an `hset` of lua/commitAutomation). */
export function runSendOp(keys: Keys, partition: number, send: RunSend): [string, string, string, string] {
  return ['hset', keys.runSends(partition), fieldOf(send), JSON.stringify(send)];
}

/**
 * Creates the message `send` owes (the one already made, when another process did: its idempotency
 * key is the run step's), then forgets the entry. A tenant that no longer exists gets none: the entry
 * is dropped and logged.
 */
export async function finishRunSend(redis: Redis, keys: Keys, partition: number, refs: IdentityRefs, send: RunSend, log: Pick<Logger, 'warn' | 'error'>): Promise<void> {
  const scope = await refs.scope(send.workspaceId, send.tenantId);
  if (scope) {
    await createMessage(redis, keys, { workspaceId: send.workspaceId, tenantId: send.tenantId }, {
      to: { externalId: send.externalId }, content: send.content, sendAt: null, run: send.run, id: send.messageId, subscriberId: send.subscriberId,
    }, { key: runStepIdempotencyKey(send.run.runId, send.run.step), request: { run: send.run.runId, step: send.run.step } }, writeScope(scope, SYSTEM_WRITER), log);
  } else {
    log.error('workflow send dropped: its workspace or tenant is gone', { runId: send.run.runId, step: send.run.step, tenantId: send.tenantId });
  }
  await redis.hdel(keys.runSends(partition), fieldOf(send));
}

const PER_PARTITION = 1_000;

/** A stored send, or none when it cannot be read (the sweep reports it and keeps it). */
function readSend(json: string): RunSend[] {
  try {
    return [JSON.parse(json) as RunSend];
  } catch {
    return [];
  }
}

/** In the order their steps were computed (a run's steps in order), whatever order a hash gave them in. */
const inOrder = (a: RunSend, b: RunSend) => a.at - b.at || (a.n ?? 0) - (b.n ?? 0);

/**
 * Creates the messages of `sends`, which a commit of partition `p` just recorded, after those the
 * partition still owes from before (a worker killed after its commit, read when the partition holds
 * more than these): each run's in step order, runs side by side. One that fails is logged and left
 * to the sweeper.
 */
export async function finishRunSends(redis: Redis, keys: Keys, p: number, refs: IdentityRefs, sends: RunSend[], log: Pick<Logger, 'warn' | 'error'>): Promise<void> {
  let all = sends;
  if ((await redis.hlen(keys.runSends(p))) > sends.length) {
    const mine = new Set(sends.map(fieldOf));
    const left = Object.entries(await redis.hgetall(keys.runSends(p))).filter(([field]) => !mine.has(field)).flatMap(([, json]) => readSend(json));
    all = [...left, ...sends];
  }
  const byRun = new Map<string, RunSend[]>();
  for (const send of all) {
    const list = byRun.get(send.run.runId);
    if (list) list.push(send);
    else byRun.set(send.run.runId, [send]);
  }
  await Promise.all([...byRun.values()].map(async (list) => {
    for (const send of list.sort(inOrder)) {
      try {
        await finishRunSend(redis, keys, p, refs, send, log);
      } catch (err) {
        // the run's later steps wait with it: they go out after it, by the sweeper
        log.warn('workflow send not made yet; the sweeper will', { runId: send.run.runId, step: send.run.step, err: (err as Error).message });
        return;
      }
    }
  }));
}

/**
 * Creates the messages of run sends older than `minAgeMs` that their worker, killed after its commit,
 * left (`finishRunSend`), a partition's page at a time in step order.
 */
export async function sweepRunSends(redis: Redis, keys: Keys, partitions: number, refs: IdentityRefs, minAgeMs: number, log: Logger): Promise<{ finished: number; kept: number }> {
  let finished = 0;
  let kept = 0;
  for (let p = 0; p < partitions; p++) {
    const owed: RunSend[] = [];
    await sweepHashes(redis, [keys.runSends(p)], PER_PARTITION, async (_key, flat) => {
      for (let f = 1; f < flat.length; f += 2) {
        try {
          owed.push(JSON.parse(flat[f]!) as RunSend);
        } catch {
          kept++;
          log.warn('workflow send unreadable; kept', { partition: p, field: flat[f - 1] });
        }
      }
    });
    const due = owed.filter((send) => now() - send.at >= minAgeMs).sort(inOrder);
    const stopped = new Set<string>();
    for (const send of due) {
      if (stopped.has(send.run.runId)) continue;
      try {
        await finishRunSend(redis, keys, p, refs, send, log);
        finished++;
      } catch (err) {
        // the run's later steps wait with it, so they never go out before it
        stopped.add(send.run.runId);
        kept++;
        log.warn('workflow send kept for the next sweep', { partition: p, runId: send.run.runId, step: send.run.step, err: (err as Error).message });
      }
    }
  }
  return { finished, kept };
}
