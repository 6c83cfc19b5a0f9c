import { APNS_AUDITS } from './apns-credentials.js';
import type { AuditOp } from './audit-outbox.js';
import { PREFERENCE_AUDITS } from './preferences.js';
import { SUBSCRIBER_AUDITS } from './subscribers.js';
import { SUBSCRIPTION_AUDITS } from './subscriptions.js';
import { TENANT_AUDITS } from './identity.js';
import { MESSAGE_AUDITS } from './messages.js';
import { SEGMENT_AUDITS } from './segments.js';
import { SOURCE_AUDITS } from './sources.js';
import { TOPIC_AUDITS } from './topics.js';
import { WORKFLOW_AUDITS } from './workflows.js';

/**
 * Every operation whose audit entries go through an outbox, by the name its intent carries: the
 * outbox sweeper settles an intent left behind with the same function its writer used.
 */
export const AUDIT_OPS: Record<string, AuditOp<any, any>> = {
  ...TOPIC_AUDITS,
  ...SUBSCRIBER_AUDITS,
  ...SUBSCRIPTION_AUDITS,
  ...PREFERENCE_AUDITS,
  ...MESSAGE_AUDITS,
  ...APNS_AUDITS,
  ...TENANT_AUDITS,
  ...SEGMENT_AUDITS,
  ...WORKFLOW_AUDITS,
  ...SOURCE_AUDITS,
};
