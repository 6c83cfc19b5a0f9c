/**
 * The numbers of outbound webhook delivery (spec 3.2, 3.3, 8), and how a delivery of one is known (its user agent), in one place.
 */

/** Scheduled attempts of one delivery before it is `exhausted` (spec 8: ten attempts in all). */
export const MAX_ATTEMPTS = 10;
/** Longest endpoint URL, as sent and once normalised (non-ASCII characters percent-encoded). */
export const MAX_URL_LENGTH = 2048;
/**
 * Replays of one delivery: each is one more attempt the delivery keeps (with up to 4 KB of its answer)
 * and its detail lists, so without a bound one key grew with every call (probe EU: 1,000 replays,
 * a 5 MB record and a 4 MB answer).
 */
export const MAX_REPLAYS = 100;
/** Webhook endpoints per workspace (spec 8). */
export const MAX_ENDPOINTS_PER_WORKSPACE = 50;
/** Bytes of each response kept with its attempt (spec 8: the first 4 KB). */
export const RESPONSE_EXCERPT_BYTES = 4096;
/** An endpoint failing continuously this long is disabled (spec 3.3, 8: three days). */
export const DISABLE_AFTER_MS = 3 * 86_400_000;
/** The attempt timeout of spec 8; `WEBHOOK_ATTEMPT_TIMEOUT_MS` may only lower it (tests). */
export const ATTEMPT_TIMEOUT_MS = 30_000;
/** How far back a ledger nobody reads is kept: no endpoint can want an event from before it existed. */
export const UNREAD_LEDGER_WINDOW_MS = 3_600_000;

/**
 * The delay before the next scheduled attempt once `failedAttempts` attempts have failed:
 * `schedule[0]` after the first, `schedule[1]` after the second, …, the last delay repeating.
 * With the default `5m,30m,2h,5h,10h,12h` the ten attempts span 65 h 35 min.
 */
export function retryDelayMs(schedule: readonly number[], failedAttempts: number): number {
  if (schedule.length === 0) throw new Error('the retry schedule is empty');
  const index = Math.min(Math.max(failedAttempts, 1), schedule.length) - 1;
  return schedule[index]!;
}

/** From a delivery's first attempt to its last scheduled one (65 h 35 min with the default schedule). */
export function retrySpanMs(schedule: readonly number[]): number {
  let span = 0;
  for (let failed = 1; failed < MAX_ATTEMPTS; failed++) span += retryDelayMs(schedule, failed);
  return span;
}

/**
 * How long a webhook delivery (its record, its payload, its index entries) is kept from its
 * creation: the retention after the last attempt its schedule can make, so a delivery still
 * retrying is never removed under it (with EVENT_RETENTION_DAYS 1, records kept a retention from
 * their creation lost attempts 7 to 10 and vanished instead of ending `exhausted`: probe R). A
 * replay is an extra attempt and keeps nothing longer.
 */
export function deliveryKeepMs(retentionMs: number, schedule: readonly number[]): number {
  return retentionMs + retrySpanMs(schedule);
}

/**
 * How long a claimed attempt belongs to the dispatcher that claimed it: three attempt timeouts
 * (90 s by default). An attempt waits at most one timeout in its endpoint's queue and a sender
 * only starts one with more than a timeout (plus a second) of lease left, so the lease always
 * outlives the request and no two dispatchers ever send the same attempt.
 */
export function leaseMsFor(attemptTimeoutMs: number): number {
  return 3 * attemptTimeoutMs;
}

/** The `User-Agent` of every outbound webhook request (`Herald-Webhooks/<version>`). */
export const WEBHOOK_USER_AGENT_PRODUCT = 'Herald-Webhooks';

/**
 * Whether an inbound delivery of a Herald webhook event would feed a loop: one of the source's own
 * workspace's outbound webhooks coming back (a source of `workspaceId` given as an endpoint's URL),
 * or anything a Herald made itself: a stream event a source stored (`data.object.source`
 * `webhook`) or the engine wrote (`system`: `$subscriber.created` of a subscriber a forwarded event
 * created, `$run.*`, `$send`), or a control-plane event of the system (`actor.type` `system`: a
 * workflow's `message.created`). Forwarded again, such an event could go round two workspaces'
 * endpoints and sources for ever, each hop a new `whe_` id and, with an externalId mapped from ids,
 * a new subscriber (probes AG, AK). So one Herald takes from another only what apps, backends and
 * people did, and a forwarded event goes one hop. A Herald event is known by its sender (the user
 * agent) or by its shape (spec 2.6: a `whe_` id, `apiVersion` `v1`, a `workspace.id`), whoever
 * passes it on: a relay that changed only the user agent looped for ever (probe V2: 25 hops in 2 s).
 */
export function isHeraldLoop(userAgent: string | undefined, payload: Record<string, unknown>, workspaceId: string): boolean {
  const field = (value: unknown, key: string): unknown => (typeof value === 'object' && value !== null ? (value as Record<string, unknown>)[key] : undefined);
  const heraldShaped = typeof payload.id === 'string' && payload.id.startsWith('whe_') && payload.apiVersion === 'v1' && typeof field(payload.workspace, 'id') === 'string';
  if (!heraldShaped && !(userAgent ?? '').startsWith(`${WEBHOOK_USER_AGENT_PRODUCT}/`)) return false;
  if (field(payload.workspace, 'id') === workspaceId) return true;
  const source = field(field(payload.data, 'object'), 'source');
  return source === 'webhook' || source === 'system' || field(payload.actor, 'type') === 'system';
}
