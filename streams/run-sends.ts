import type { Redis } from 'ioredis';
import type { Logger } from '../lib/log.js';
import type { SendContent } from '../lib/workflow-definition.js';
import { writeScope } from './audit-outbox.js';
import { sweepAgedEntries } from './hash-sweep.js';
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
  workspaceId: string;
  tenantId: string;
  externalId: string;
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
      to: { externalId: send.externalId }, content: send.content, sendAt: null, run: send.run, id: send.messageId,
    }, { key: runStepIdempotencyKey(send.run.runId, send.run.step), request: { run: send.run.runId, step: send.run.step } }, writeScope(scope, SYSTEM_WRITER), log);
  } else {
    log.error('workflow send dropped: its workspace or tenant is gone', { runId: send.run.runId, step: send.run.step, tenantId: send.tenantId });
  }
  await redis.hdel(keys.runSends(partition), fieldOf(send));
}

const PER_PARTITION = 1_000;

/** Creates the messages of run sends older than `minAgeMs` that their worker, killed after its commit, left (`finishRunSend`). */
export async function sweepRunSends(redis: Redis, keys: Keys, partitions: number, refs: IdentityRefs, minAgeMs: number, log: Logger): Promise<{ finished: number; kept: number }> {
  const hashes = Array.from({ length: partitions }, (_, p) => keys.runSends(p));
  return sweepAgedEntries<RunSend>(redis, hashes, PER_PARTITION, minAgeMs, log, 'workflow send', (send, key) => finishRunSend(redis, keys, hashes.indexOf(key), refs, send, log));
}
