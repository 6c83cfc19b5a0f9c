import { readFileSync } from 'node:fs';
import apn from '@parse/node-apn';
import Bottleneck from 'bottleneck';
import type { Redis } from 'ioredis';
import { ABORTED, pause, sharedAbortController, untilAborted } from '../lib/abortable.js';
import { buildApnsRequest, payloadSize, APNS_MAX_PAYLOAD_BYTES, type PushContent } from '../lib/apns-payload.js';
import { now } from '../lib/clock.js';
import type { Config } from '../lib/config.js';
import { createLogger, type Logger } from '../lib/log.js';
import { createSecretBox } from '../lib/secret-box.js';
import type { Keys } from '../streams/keys.js';
import { ApnsProviders, currentSession, retireSession, type ApnsConnection, type ApnsEnvironment } from './apns-providers.js';

/** One push to one device: what the dispatcher hands the sender for a delivery. */
export type PushJob = {
  tenantId: string;
  token: string;
  environment: ApnsEnvironment;
  content: PushContent;
  messageId: string;
  deliveryId: string;
};

/** One answer from APNs (or the absence of one: a connection error or timeout has no status). */
export type ApnsAnswer = { httpStatus: number | null; apnsId: string | null; reason: string | null; timestamp: number | null; at: number };

/**
 * The outcome of a push. `reason` is Apple's (`BadDeviceToken`, `Unregistered`,
 * `TooManyRequests`…) when APNs answered, else one of Herald's lowercase reasons:
 * `apns_not_configured`, `apns_credentials_unreadable`, `payload_too_large` (refused before
 * sending), `connection_error`, `request_timeout`, `sender_closed` (the sender was closed while
 * retrying: the push may be tried again later).
 */
export type PushResult = {
  outcome: 'sent' | 'failed';
  /** The last APNs answer's status; null when none came. */
  httpStatus: number | null;
  apnsId: string | null;
  reason: string | null;
  /** From a 410 answer: when APNs last knew the token valid (ms since the epoch). */
  timestamp: number | null;
  /** The token is gone for good (410, BadDeviceToken): disable the subscription. */
  tokenInvalid: boolean;
  /** Requests made to APNs (0 when refused before sending). */
  attempts: number;
  /** Every answer of every attempt, oldest first. */
  answers: ApnsAnswer[];
};

/** A device token as APNs knows them, hex (Herald keeps them lowercase, lib/apns-token.ts). */
const APNS_TOKEN = /^[0-9a-fA-F]+$/;
/** Statuses APNs may answer differently a moment later. */
const RETRY_STATUSES = new Set([408, 429, 500, 502, 503, 504]);
/** 400 reasons that mean the token itself is wrong for this app. */
/**
 * 400 reasons that say the token itself is dead. Not `DeviceTokenNotForTopic`: it also answers every
 * push of a tenant whose `bundleId` names another app of the team, and taking it as the token's
 * fault disabled every device of that tenant until each app registered again (probe H1).
 */
const INVALID_TOKEN_REASONS = new Set(['BadDeviceToken']);
/** Least time between two `apns request failed without an answer` lines of one APNs host (`#warnTransport`). */
const TRANSPORT_WARNING_EVERY_MS = 10_000;

/** Longest wait between two attempts, whatever the base and attempt number. */
const MAX_BACKOFF_MS = 30_000;
/** An attempt's whole deadline: the request timeout (node-apn's, of inactivity) and this much more. */
const ATTEMPT_DEADLINE_GRACE_MS = 1_000;
/**
 * How long a tenant's providers and limiter are kept unused before they are closed. Well over the
 * limiter's one-second reservoir refresh, so a tenant's new limiter (full reservoir) lets no more
 * through than the old one would have; and over Apple's 20 minutes between two provider tokens: a new
 * provider signs a new token, so a tenant sending every few minutes kept getting one with 5 minutes
 * (probe V), and APNs answers 429 TooManyProviderTokenUpdates to tokens refreshed more often.
 */
const IDLE_MS = 30 * 60_000;
const SWEEP_EVERY_MS = 60_000;
/** Limiters, and providers, closed at most per sweep: a dispatcher that served thousands of tenants in a burst closes them over a few minutes. */
const SWEEP_MAX = 1_000;

export type PushSenderOptions = {
  redis: Redis; keys: Keys; config: Config; log?: Logger;
  /** How long an unused provider or limiter is kept (default 30 minutes; tests shorten it). */
  idleMs?: number;
};

/** What a push skipped after an abort "answers" inside the limiter job (never recorded). */
const NOT_SENT: ApnsAnswer = Object.freeze({ httpStatus: null, apnsId: null, reason: 'not_sent', timestamp: null, at: 0 });

/** Pushes of one tenant gathered for one limiter job. */
type Coalesced = { tasks: (() => Promise<ApnsAnswer>)[]; resolve: (answers: ApnsAnswer[]) => void; reject: (err: unknown) => void };

/**
 * Sends pushes through APNs for every tenant of the deployment. One provider per tenant and
 * environment (see ApnsProviders); per tenant, a `bottleneck` limiter caps requests in flight
 * (`APNS_MAX_CONCURRENT_PER_TENANT`) and started per second (`APNS_RATE_PER_TENANT_PER_SECOND`).
 * 429, 5xx, an expired provider token and connection errors are retried up to `APNS_MAX_ATTEMPTS`
 * in all, after `APNS_RETRY_BASE_MS` doubled each time with ±25% jitter; the wait holds no limiter
 * slot. Every attempt carries the same `apns-id` (derived from the delivery id). A tenant's
 * providers and limiter unused for 30 minutes (`idleMs`), with nothing waiting or in flight, are
 * closed by a sweep once a minute and made again by the tenant's next push.
 *
 * `send` resolves for every APNs outcome; it rejects only when Redis cannot be read.
 */

export class PushSender {
  readonly #config: Config;
  readonly #log: Logger;
  readonly #providers: ApnsProviders;
  readonly #limiters = new Map<string, { limiter: Bottleneck; usedAt: number }>();
  readonly #coalescing = new Map<string, Coalesced[]>();
  /** Aborted by `close`: pushes waiting to retry stop waiting. */
  readonly #closing = sharedAbortController();
  readonly #idleMs: number;
  readonly #sweeper: NodeJS.Timeout;
  /** per APNs host and port: when its last transport warning was logged, and how many were left out since */
  readonly #transportWarnings = new Map<string, { at: number; repeats: number }>();
  #closed = false;

  constructor(options: PushSenderOptions) {
    const { redis, keys, config } = options;
    this.#config = config;
    this.#log = options.log ?? createLogger(config.logLevel, { component: 'push-sender' });
    const box = config.encryptionKey ? createSecretBox(config.encryptionKey) : null;
    this.#providers = new ApnsProviders(redis, keys, config, box, this.#log, readCaFile(config.apnsCaFile));
    this.#idleMs = options.idleMs ?? IDLE_MS;
    // at most half the idle period apart, so nothing stays open much past it
    this.#sweeper = setInterval(() => this.#sweep(), Math.min(SWEEP_EVERY_MS, this.#idleMs / 2));
    this.#sweeper.unref();
  }

  /** Providers and limiters kept now (for tests and diagnostics). */
  cached(): { providers: number; limiters: number } {
    return { providers: this.#providers.size, limiters: this.#limiters.size };
  }

  /** Sends one push, retrying what may succeed later; never sends after `close`. */
  async send(job: PushJob): Promise<PushResult> {
    return (await this.sendAll([job]))[0]!; // no signal: every push gets its result
  }

  /**
   * Sends many pushes (a fan-out chunk). The first attempts pass the limiter once per group of up to
   * `APNS_MAX_CONCURRENT_PER_TENANT` pushes (one weighted bottleneck job: per-job scheduling costs
   * a timer hop and caps a limiter near 400 jobs/s); a push whose answer may succeed later waits its
   * own backoff from that answer and goes again (with the other retries of that moment), up to
   * `APNS_MAX_ATTEMPTS`: it does not wait for the slowest push beside it (one timing out held every
   * retry of its chunk that long, probe CH). Results are in the order of `jobs`; `onResult` hears
   * each one as soon as it is final (its push answered for good), before the others are, so a
   * caller can record it at once. Once `signal` aborts (the fan-out was taken over by another
   * dispatcher, or this one stops), no push not yet sent is sent: those waiting in the limiter or for
   * a retry get no result (undefined), and their deliveries stay pending for the new owner; sendAll
   * returns once the pushes already out are answered, without waiting for the limiter.
   */
  async sendAll(jobs: PushJob[], onResult?: (index: number, result: PushResult) => void, signal?: AbortSignal): Promise<(PushResult | undefined)[]> {
    const results: (PushResult | undefined)[] = jobs.map(() => undefined);
    const finish = (i: number, result: PushResult) => {
      results[i] = result;
      onResult?.(i, result);
    };
    const answers: ApnsAnswer[][] = jobs.map(() => []);
    /** pushes out to APNs now (a stop waits for their answers, not for those still in the limiter) */
    const started = new Set<Promise<ApnsAnswer>>();
    const requests = jobs.map((job) => buildApnsRequest(job.content, { messageId: job.messageId, deliveryId: job.deliveryId }));
    const first: number[] = [];
    requests.forEach((request, i) => {
      if (payloadSize(request.payload) > APNS_MAX_PAYLOAD_BYTES) finish(i, refused('payload_too_large'));
      // a token that is not hex is no APNs device's (APNs answers BadDeviceToken), and sent as it is it
      // would be the request's path: spaces or control characters reset the stream on every attempt,
      // `/`, `?` or `..` named another path of the host (probe AS)
      else if (!APNS_TOKEN.test(jobs[i]!.token)) finish(i, { ...refused('malformed_token'), tokenInvalid: true });
      else first.push(i);
    });
    const batch = limiterBatch(this.#config.apnsMaxConcurrentPerTenant, this.#config.apnsRatePerTenantPerSecond);
    // the retries' waits listen on one signal of this call's own (hundreds of them on the caller's printed MaxListenersExceededWarning)
    const stopping = sharedAbortController();
    const abort = () => stopping.abort();
    signal?.addEventListener('abort', abort, { once: true });
    if (signal?.aborted) abort();
    /** pushes waiting out their backoff (a stopped limiter's refusal leaves them to their own wait's end) */
    const retrying = new Set<number>();
    /** every retry's wait of this call, in the order made (a failure waits for them all to stop) */
    const waits: Promise<void>[] = [];
    const retryLater = (tenantId: string, i: number, attempt: number) => {
      retrying.add(i);
      const wait = (async () => {
        await pause(backoffMs(this.#config.apnsRetryBaseMs, attempt), stopping.signal, this.#closing.signal);
        retrying.delete(i);
        if (stopping.signal.aborted) return; // no result: pending for the new owner
        if (this.#closed) return finish(i, { ...refused('sender_closed'), attempts: attempt, answers: answers[i]! });
        await send(tenantId, [i], attempt + 1);
      })();
      // awaited below, maybe only after it failed: not an unhandled rejection meanwhile (which ends the process)
      wait.catch(() => undefined);
      waits.push(wait);
    };
    const send = async (tenantId: string, indexes: number[], attempt: number): Promise<void> => {
      for (let from = 0; from < indexes.length && !stopping.signal.aborted; from += batch) {
        const group = indexes.slice(from, from + batch);
        if (this.#closed) {
          for (const i of group) finish(i, { ...refused('sender_closed'), attempts: attempt - 1, answers: answers[i]! });
          continue;
        }
        // Held until their pushes are answered, however long these wait in the limiter: the idle sweep leaves them open.
        const connections = await this.#providers.get(tenantId, group.map((i) => jobs[i]!.environment));
        const sendable = group.filter((i, k) => {
          const connection = connections[k]!;
          if ('unavailable' in connection) finish(i, { ...refused(connection.unavailable), attempts: attempt - 1, answers: answers[i]! });
          return !('unavailable' in connection);
        });
        if (sendable.length === 0) continue; // none available, so none held
        const attemptOf = async (i: number): Promise<ApnsAnswer> => {
          const connection = connections[group.indexOf(i)] as ApnsConnection;
          const answer = await this.#attempt(connection, requests[i]!, jobs[i]!.token);
          answers[i]!.push(answer);
          this.#log.debug('apns answer', { tenantId, deliveryId: jobs[i]!.deliveryId, attempt, status: answer.httpStatus, apnsId: answer.apnsId, reason: answer.reason });
          // a key APNs refuses is tried again only when the tenant's credentials changed since this connection was made
          const again = retryable(answer) || (answer.httpStatus === 403 && answer.reason === 'InvalidProviderToken' && await this.#providers.replaced(tenantId, connection).catch(() => false));
          if (!again || attempt >= this.#config.apnsMaxAttempts) finish(i, resultOf(answer, attempt, answers[i]!));
          else if (this.#closed) finish(i, { ...refused('sender_closed'), attempts: attempt, answers: answers[i]! });
          else retryLater(tenantId, i, attempt);
          return answer;
        };
        try {
          // each answer is taken as it comes: a final one is told at once, not when the group is done
          const scheduled = this.#schedule(tenantId, batch, sendable.map((i) => async () => {
            if (stopping.signal.aborted) return NOT_SENT;
            const sending = attemptOf(i);
            started.add(sending);
            try {
              return await sending;
            } finally {
              started.delete(sending);
            }
          }));
          // Once `signal` aborts, a group still waiting for the limiter is not waited for (its pushes,
          // when their turn comes, are not sent; waiting drained them at the tenant's rate, ~8 s for 400 at
          // 50/s, review of session 52), but the pushes already out are: their answers are recorded.
          if ((await untilAborted(scheduled, stopping.signal)) === ABORTED) {
            scheduled.catch(() => undefined);
            await Promise.allSettled([...started]);
          }
        } catch (err) {
          // Only a stopped limiter rejects: close() dropped these waiting pushes.
          if (!this.#closed) throw err;
          for (const i of sendable) if (!results[i] && !retrying.has(i)) finish(i, { ...refused('sender_closed'), attempts: attempt - 1, answers: answers[i]! });
          continue;
        } finally {
          this.#providers.release(connections);
        }
      }
    };
    try {
      const byTenant = new Map<string, number[]>();
      for (const i of first) {
        const indexes = byTenant.get(jobs[i]!.tenantId);
        if (indexes) indexes.push(i);
        else byTenant.set(jobs[i]!.tenantId, [i]);
      }
      await Promise.all([...byTenant].map(([tenantId, indexes]) => send(tenantId, indexes, 1)));
      // each retry may add another: until every one made is done
      for (let done = 0; done < waits.length;) {
        const next = waits.slice(done);
        done = waits.length;
        await Promise.all(next);
      }
    } catch (err) {
      // a failure (Redis refusing a provider's read) ends the call: the retries still waiting stop
      // too, and the pushes out are answered, before the caller hears of it; else they went on
      // sending after it gave up, beside its own retry of the chunk (review of session 56)
      stopping.abort();
      await Promise.allSettled([...waits, ...started]);
      throw err;
    } finally {
      signal?.removeEventListener('abort', abort);
    }
    return results;
  }

  async #attempt(connection: ApnsConnection, request: ReturnType<typeof buildApnsRequest>, token: string): Promise<ApnsAnswer> {
    const note = new apn.Notification();
    note.rawPayload = request.payload;
    note.topic = connection.bundleId;
    note.pushType = request.headers.pushType;
    note.priority = request.headers.priority;
    note.id = request.headers.apnsId;
    if (request.headers.expiration !== undefined) note.expiry = request.headers.expiration;
    if (request.headers.collapseId !== undefined) note.collapseId = request.headers.collapseId;
    // node-apn's timeout is one of inactivity (any byte of the answer resets it), so a peer that
    // trickles its answer held the push, and the tenant's queue behind it, for ever (probe V): each
    // attempt has a deadline of its own too
    const before = currentSession(connection.provider);
    const timedOut = (): ApnsAnswer => {
      retireSession(connection.provider, before, this.#config.apnsRequestTimeoutMs + ATTEMPT_DEADLINE_GRACE_MS);
      return { httpStatus: null, apnsId: null, reason: 'request_timeout', timestamp: null, at: now() };
    };
    let result;
    let deadline: NodeJS.Timeout | undefined;
    try {
      const late = new Promise<null>((resolve) => (deadline = setTimeout(() => resolve(null), this.#config.apnsRequestTimeoutMs + ATTEMPT_DEADLINE_GRACE_MS)));
      const sending = connection.provider.send(note, token);
      // past the deadline nobody awaits it: a late rejection must not be an unhandled one
      sending.catch(() => undefined);
      result = await Promise.race([sending, late]);
    } catch (err) {
      if (transportReason(err) === 'request_timeout') return timedOut();
      return { httpStatus: null, apnsId: null, reason: transportReason(err), timestamp: null, at: now() };
    } finally {
      clearTimeout(deadline);
    }
    if (result === null) return timedOut();
    const sent = result.sent[0] as (apn.ResponseSent & { 'apns-id'?: string }) | undefined;
    if (sent) return { httpStatus: 200, apnsId: sent['apns-id'] ?? null, reason: null, timestamp: null, at: now() };
    const failed = (result.failed[0] ?? {}) as apn.ResponseFailure & { 'apns-id'?: string; response?: { reason?: string; timestamp?: string | number } };
    const status = typeof failed.status === 'number' ? failed.status : null;
    let reason = failed.response?.reason ?? null;
    if (reason === null && status !== null) {
      // node-apn turns `500 InternalServerError` and `403 ExpiredProviderToken` into errors.
      reason = status === 500 ? 'InternalServerError' : failed.error?.message ?? null;
    }
    if (status === null) {
      reason = transportReason(failed.error);
      this.#warnTransport(connection.host, connection.port, failed.error?.message ?? 'unknown');
      if (reason === 'request_timeout') return timedOut();
    }
    const stamp = failed.response?.timestamp;
    const timestamp = stamp === undefined || stamp === null || Number.isNaN(Number(stamp)) ? null : Number(stamp);
    return { httpStatus: status, apnsId: failed['apns-id'] ?? null, reason, timestamp, at: now() };
  }

  /**
   * `apns request failed without an answer`, at most one line per APNs host and port every
   * TRANSPORT_WARNING_EVERY_MS, with the number of such failures left out since the last line
   * (`repeats`): an unreachable APNs failed every attempt of every push, one line each (probe DW:
   * 11,236 lines in 90 s for one message to 1,950 devices). Each delivery records its own answer.
   */
  #warnTransport(host: string, port: number, err: string): void {
    const key = `${host}:${port}`;
    const last = this.#transportWarnings.get(key);
    const at = now();
    if (last && at - last.at < TRANSPORT_WARNING_EVERY_MS) {
      last.repeats++;
      return;
    }
    this.#log.warn('apns request failed without an answer', { host, port, err, repeats: last?.repeats ?? 0 });
    if (this.#transportWarnings.size > 1_000) this.#transportWarnings.clear();
    this.#transportWarnings.set(key, { at, repeats: 0 });
  }

  /**
   * Runs pushes through the tenant's limiter. Calls made in the same tick (many small fan-outs at
   * once: one message per user) are merged into weighted jobs of at most `batch` pushes, because
   * bottleneck's per-job scheduling costs a timer hop and would cap a tenant near 400 jobs/s.
   */
  #schedule(tenantId: string, batch: number, tasks: (() => Promise<ApnsAnswer>)[]): Promise<ApnsAnswer[]> {
    return new Promise((resolve, reject) => {
      let parts = this.#coalescing.get(tenantId);
      if (!parts) {
        parts = [];
        this.#coalescing.set(tenantId, parts);
        setImmediate(() => this.#flush(tenantId, batch));
      }
      parts.push({ tasks, resolve, reject });
    });
  }

  #flush(tenantId: string, batch: number): void {
    const parts = this.#coalescing.get(tenantId) ?? [];
    this.#coalescing.delete(tenantId);
    // close() ran since these were queued: a new limiter now would never be stopped
    if (this.#closed) return parts.forEach((part) => part.reject(new Error('the push sender is closed')));
    const limiter = this.#limiter(tenantId);
    const run = (job: Coalesced[], weight: number) => {
      limiter.schedule({ weight }, () => Promise.all(job.map((part) => Promise.all(part.tasks.map((task) => task())))))
        // a job that waited in the limiter longer than the idle period was a use until it ended: the
        // sweep must not close the limiter between it and the sender's next group (CI of session 52)
        .finally(() => this.#touch(tenantId, limiter))
        .then((answers) => job.forEach((part, k) => part.resolve(answers[k]!)), (err) => job.forEach((part) => part.reject(err)));
    };
    let job: Coalesced[] = [];
    let weight = 0;
    for (const part of parts) {
      if (job.length && weight + part.tasks.length > batch) {
        run(job, weight);
        job = [];
        weight = 0;
      }
      job.push(part);
      weight += part.tasks.length;
    }
    if (job.length) run(job, weight);
  }

  /** The tenant's limiter, made on first use; every call is a use (a job is about to be scheduled on it). */
  #limiter(tenantId: string): Bottleneck {
    let entry = this.#limiters.get(tenantId);
    if (!entry) {
      const rate = this.#config.apnsRatePerTenantPerSecond;
      const limiter = new Bottleneck({ maxConcurrent: this.#config.apnsMaxConcurrentPerTenant, reservoir: rate, reservoirRefreshAmount: rate, reservoirRefreshInterval: 1000 });
      limiter.on('error', (err: Error) => this.#log.warn('apns limiter error', { tenantId, err: err.message }));
      entry = { limiter, usedAt: now() };
      this.#limiters.set(tenantId, entry);
    }
    entry.usedAt = now();
    return entry.limiter;
  }

  #touch(tenantId: string, limiter: Bottleneck): void {
    const entry = this.#limiters.get(tenantId);
    if (entry?.limiter === limiter) entry.usedAt = now();
  }

  /**
   * Closes what tenants stopped using: limiters idle for `idleMs` with no job (received, queued or
   * running), and providers idle as long that nobody holds. At most `SWEEP_MAX` of each per run.
   */
  #sweep(): void {
    const usedBefore = now() - this.#idleMs;
    let limiters = 0;
    for (const [tenantId, entry] of this.#limiters) {
      if (limiters >= SWEEP_MAX) break;
      if (entry.usedAt >= usedBefore || busy(entry.limiter)) continue;
      this.#limiters.delete(tenantId);
      endLimiter(entry.limiter).catch((err: Error) => this.#log.warn('apns limiter did not stop', { tenantId, err: err.message }));
      limiters++;
    }
    const providers = this.#providers.evictIdle(usedBefore, SWEEP_MAX);
    if (limiters + providers > 0) this.#log.debug('idle apns limiters and providers closed', { limiters, providers });
  }

  /**
   * Stops sending: waiting and backing-off pushes resolve `failed` with `sender_closed`, requests
   * in flight get their answers, then every APNs connection is closed.
   */
  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    clearInterval(this.#sweeper);
    this.#closing.abort();
    await Promise.allSettled([...this.#limiters.values()].map((e) => endLimiter(e.limiter)));
    this.#limiters.clear();
    await this.#providers.close();
  }
}

/** The extra CA PEM of `APNS_CA_FILE`, read once at start; a clear error when it cannot be used. */
function readCaFile(path: string | null): string | null {
  if (!path) return null;
  let pem: string;
  try {
    pem = readFileSync(path, 'utf8');
  } catch (err) {
    throw new Error(`APNS_CA_FILE "${path}" cannot be read: ${(err as Error).message}`);
  }
  if (!pem.includes('-----BEGIN CERTIFICATE-----')) throw new Error(`APNS_CA_FILE "${path}" holds no PEM certificate`);
  return pem;
}

/** Whether a limiter has a job received, queued, waiting for its turn or running. */
function busy(limiter: Bottleneck): boolean {
  const counts = limiter.counts();
  return counts.RECEIVED + counts.QUEUED + counts.RUNNING + counts.EXECUTING > 0;
}

/** Stops a limiter (waiting jobs are dropped, running ones finish) and ends its reservoir timer, which `stop` leaves running. */
async function endLimiter(limiter: Bottleneck): Promise<void> {
  try {
    await limiter.stop({ dropWaitingJobs: true });
  } finally {
    await limiter.disconnect();
  }
}

function refused(reason: string): PushResult {
  return { outcome: 'failed', httpStatus: null, apnsId: null, reason, timestamp: null, tokenInvalid: false, attempts: 0, answers: [] };
}

function retryable(answer: ApnsAnswer): boolean {
  if (answer.httpStatus === null) return true;
  // the provider token is refreshed too often: the same answer comes until enough time has passed (probe AS)
  if (answer.httpStatus === 429 && answer.reason === 'TooManyProviderTokenUpdates') return false;
  if (RETRY_STATUSES.has(answer.httpStatus)) return true;
  return answer.httpStatus === 403 && answer.reason === 'ExpiredProviderToken';
}

function resultOf(answer: ApnsAnswer, attempts: number, answers: ApnsAnswer[]): PushResult {
  const status = answer.httpStatus;
  const tokenInvalid = status === 410 || (status === 400 && answer.reason !== null && INVALID_TOKEN_REASONS.has(answer.reason));
  return {
    outcome: status === 200 ? 'sent' : 'failed',
    httpStatus: status,
    apnsId: answer.apnsId,
    reason: answer.reason,
    timestamp: status === 410 ? answer.timestamp : null,
    tokenInvalid,
    attempts,
    answers,
  };
}

/**
 * The most pushes one job of a tenant's limiter carries (its weight), which is also the size of the
 * groups `sendAll` sends one after another: at most the concurrency, and the rate (a job heavier
 * than the limiter's reservoir would never start). Where the rate binds (below 20 times the
 * concurrency), a divisor of the rate down to half that, so whole jobs use the reservoir up each
 * second: groups of 20 at 30 per second sent 20 per second, the 10 left unable to start a job of 20
 * (probe J); groups of 15 send 30. Never smaller than half: a group is answered before the next
 * goes, and groups of one or two (a prime rate) sent one push per round trip (probe P).
 */
export function limiterBatch(concurrency: number, rate: number): number {
  const cap = Math.max(1, Math.min(concurrency, rate));
  if (rate >= 20 * cap) return cap;
  for (let weight = cap; weight >= Math.ceil(cap / 2); weight--) if (rate % weight === 0) return weight;
  return cap;
}

/** The wait before attempt `attempt + 1`: base × 2^(attempt−1), ±25% jitter, then at most 30 s (the cap after the jitter: probe V). */
export function backoffMs(baseMs: number, attempt: number): number {
  return Math.min(MAX_BACKOFF_MS, Math.round(baseMs * 2 ** (attempt - 1) * (0.75 + Math.random() * 0.5)));
}

function transportReason(err: unknown): string {
  const message = err instanceof Error ? err.message : '';
  return /timeout/i.test(message) ? 'request_timeout' : 'connection_error';
}
