import type { AuditOp } from './audit-outbox.js';
import { TOPIC_AUDITS } from './topics.js';

/**
 * Every operation whose audit entries go through an outbox, by the name its intent carries: the
 * outbox sweeper settles an intent left behind with the same function its writer used.
 */
export const AUDIT_OPS: Record<string, AuditOp<any, any>> = {
  ...TOPIC_AUDITS,
};
