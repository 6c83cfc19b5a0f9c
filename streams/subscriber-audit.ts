import type { Redis } from 'ioredis';
import type { Logger } from '../lib/log.js';
import { auditIntent, settleAudit, settleAuditLater, type AuditDraft, type AuditIntent, type AuditOp, type AuditScope } from './audit-outbox.js';
import type { Keys } from './keys.js';

/**
 * The audit entries of subscriber writes (streams/audit-outbox.ts). A write that carries a
 * `WriteAudit` records its intent in its partition's outbox in the same lua/writeSubscriber call,
 * then the request's `AuditTrail` settles it with the operation's pure `AuditOp`.
 */

/**
 * lua/writeSubscriber's reply to a write with an audit intent: `{ 1, subscriberId, createdSequence,
 * newVersion, record, absorbed }` when applied (record: the subscriber's record after the write as
 * a flat field/value list; absorbed: 1 when it took in the held intent it named), `{ ≤0, … }` when not.
 */
export type WriteReply = [number, string?, number?, number?, string[]?, number?];

/**
 * The audit of one subscriber write: the operation by the name the sweeper knows it
 * (streams/audit-ops.ts) and the function, what it needs besides the reply (`input`, JSON), and,
 * with `absorbs` (a subscriber's externalId), the subject under which a held intent of the same
 * request and kind is taken in (see `AuditTrail.holding`). `needsRecord`: the operation reads the
 * subscriber's record after the write from the reply (the script reads it only then: registrations
 * and other drafted entries do not pay for it). `entries`: how many entries the operation makes at
 * most (default 1; the intent fixes one id for each).
 */
export type WriteAudit = { trail: AuditTrail; op: string; make: AuditOp<any, WriteReply>; input: unknown; absorbs?: string; needsRecord?: boolean; entries?: number };

/**
 * The operation of a write whose entries are decided with the change: under the compare-and-set
 * (or the guards) the write applies exactly the state they describe, or nothing.
 */
export const drafted: AuditOp<AuditDraft[], WriteReply> = (drafts, reply) => (reply[0] === 1 ? drafts : []);

/** A `WriteAudit` of entries decided with the change (`drafted`), appended in the order given. */
export const draftedAudit = (trail: AuditTrail, op: string, drafts: AuditDraft[]): WriteAudit => ({ trail, op, make: drafted, input: drafts, entries: Math.max(1, drafts.length) });

/** An intent made for a write, with the held one it absorbs. */
export type MadeIntent = { intent: AuditIntent; absorbs: Held | undefined };
type Held = { subject: string | undefined; intent: AuditIntent; drafts: AuditDraft[] };

/**
 * Where a request's subscriber writes settle their audit entries: right after each write (off the
 * request's path), or, in `holding`, all together at its end (awaited), in the order of the writes.
 * Identify and a merge hold theirs: the attribute writes of one subscriber in one request make one
 * `subscriber.updated` (the later write absorbs the held intent: its script deletes it from the
 * outbox as it records its own, whose input carries the held entries), and what a merge deletes is
 * audited after what it fills in.
 * A held intent the sweeper settled meanwhile (a request held longer than AUDIT_OUTBOX_SWEEP_MS)
 * is not absorbed (the script answers it was gone) and its entries are not repeated.
 */
export class AuditTrail {
  #held: Held[] | null = null;

  constructor(private readonly redis: Redis, private readonly keys: Keys, readonly scope: AuditScope, private readonly log: Pick<Logger, 'warn'>) {}

  /** The intent of a write recorded in `outbox` (its partition's), taking in the held intent it absorbs. */
  intent(outbox: string, audit: WriteAudit): MadeIntent {
    const absorbs = audit.absorbs === undefined ? undefined : this.#held?.find((h) => h.subject === audit.absorbs && h.intent.key === outbox);
    const input = absorbs ? { ...(audit.input as object), carried: absorbs.drafts } : audit.input;
    return { intent: auditIntent(outbox, audit.op, this.scope, input, (audit.entries ?? 1) + (absorbs?.drafts.length ?? 0)), absorbs };
  }

  /**
   * After the write applied (`reply`): its entries, settled off the writer's path
   * (`settleAuditLater`: the request is answered without waiting for the ledger), or held.
   */
  written(made: MadeIntent, audit: WriteAudit, reply: WriteReply): void {
    const drafts = audit.make(made.intent.record.input as never, reply);
    if (!this.#held) {
      settleAuditLater(this.redis, this.keys, made.intent, drafts, (err) => {
        this.log.warn('audit entries not appended yet; the audit outbox sweeper will', { op: audit.op, err });
      });
      return;
    }
    // absorbed, or settled by the sweeper already: either way not to be settled again
    if (made.absorbs) this.#held.splice(this.#held.indexOf(made.absorbs), 1);
    this.#held.push({ subject: audit.absorbs, intent: made.intent, drafts });
  }

  /** Runs `fn` holding the intents of its writes, then settles them in order (also when `fn` throws). */
  async holding<T>(fn: () => Promise<T>): Promise<T> {
    if (this.#held) return fn();
    this.#held = [];
    try {
      return await fn();
    } finally {
      const held = this.#held;
      this.#held = null;
      for (const h of held) await settleAudit(this.redis, this.keys, h.intent, h.drafts);
    }
  }
}
