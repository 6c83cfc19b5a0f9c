import type { Role } from '../lib/config.js';
import type { StartActor } from '../streams/role-context.js';
import { startSubscriberActors } from '../actors/subscriber-actor.js';
import { startRetentionSweeper } from '../actors/retention-sweeper.js';
import { startAuditOutboxSweeper } from '../actors/audit-outbox-sweeper.js';
import { startMessageDispatcher } from '../actors/message-dispatcher.js';
import { PushSender } from '../actors/push-sender.js';
import { startWebhookDispatcher } from '../actors/webhook-dispatcher.js';
import { startTimerScheduler } from '../actors/timer-scheduler.js';
import { startSegmentBackfills } from '../actors/segment-backfill.js';
import { startScheduledMessages } from '../actors/scheduled-messages.js';

/** The long-running actors each non-web role runs. The only place roles are wired to actors. */
export const ROLE_ACTORS: Record<Exclude<Role, 'web'>, StartActor[]> = {
  worker: [startSubscriberActors, startRetentionSweeper, startAuditOutboxSweeper],
  dispatcher: [(ctx) => startMessageDispatcher(ctx, (c) => new PushSender({ redis: c.redis, keys: c.keys, config: c.config, log: c.log })), startWebhookDispatcher],
  scheduler: [startTimerScheduler, startSegmentBackfills, startScheduledMessages],
};
