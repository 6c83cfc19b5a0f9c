import { Agent as HttpAgent, request as httpRequest, type IncomingMessage } from 'node:http';
import { Agent as HttpsAgent, request as httpsRequest } from 'node:https';
import type { LookupFunction } from 'node:net';
import Bottleneck from 'bottleneck';
import { isoNow, now } from '../lib/clock.js';
import { checkWebhookUrl, guardedLookup, PRIVATE_ADDRESS_ERROR_CODE, type AllowList, type PrivateAddressError } from '../lib/ssrf-guard.js';
import { VERSION } from '../lib/version.js';
import { RESPONSE_EXCERPT_BYTES, WEBHOOK_USER_AGENT_PRODUCT } from '../lib/webhook-policy.js';
import { utf8Prefix } from '../lib/code-points.js';
import { webhookLookup } from '../lib/webhook-resolver.js';
import { webhookHeaders } from '../lib/webhook-signing.js';
import type { AttemptRecord } from '../streams/webhook-deliveries.js';

/** `refused`: told the address a host name resolved to when the connection was refused for it (for the server's log only). */
export type SendOptions = { timeoutMs: number; production: boolean; allow: AllowList; refused?: (err: PrivateAddressError) => void };

/**
 * How much of a receiver's answer headers is read: a 2xx with large headers (a long
 * Content-Security-Policy, many cookies) is a success. Node's default (16 KB) failed it as a parse
 * error, and it was retried to exhaustion (probe D, session 62).
 */
export const MAX_ANSWER_HEADER_BYTES = 256 * 1024;
const USER_AGENT = `${WEBHOOK_USER_AGENT_PRODUCT}/${VERSION}`;
/**
 * A request on a kept-alive connection failing before any answer within this long of its send is
 * sent once more on a new connection (`postWebhook`): a connection the receiver closed while idle
 * fails at once (a round trip), one it dropped after reading and working on the request later.
 */
const KEPT_CONNECTION_RESEND_MS = 250;
/** Linger of an idle lane before it ends (bottleneck starts lanes slowly; a steady flow keeps them). */
const LANE_LINGER_MS = 50;

const lookups = new WeakMap<AllowList, LookupFunction>();
/** The connect-time address check (one per allow list). */
function lookupFor(allow: AllowList): LookupFunction {
  let lookup = lookups.get(allow);
  if (!lookup) lookups.set(allow, (lookup = guardedLookup(allow, webhookLookup)));
  return lookup;
}

type Prepared = { ok: true; url: URL; https: boolean } | { ok: false; reason: string };
const prepared = new Map<string, Prepared>();

/**
 * `checkWebhookUrl` of a URL, remembered (it depends only on the text and this process's settings):
 * classifying an IP literal runs a dozen BlockList checks, too slow to repeat on every request.
 */
function prepare(url: string, o: SendOptions): Prepared {
  let p = prepared.get(url);
  if (!p) {
    const check = checkWebhookUrl(url, { production: o.production, allow: o.allow });
    p = check.ok ? { ok: true, url: check.url, https: check.url.protocol === 'https:' } : { ok: false, reason: check.reason };
    if (prepared.size >= 10_000) prepared.clear();
    prepared.set(url, p);
  }
  return p;
}

/**
 * An attempt's error as recorded. A connection refused for the address a name resolved to says
 * neither the address nor its kind, as the save-time refusal does not (docs/webhooks.md, URL safety):
 * anyone holding `webhooks:read` reads attempts, and the text mapped the service's own network
 * (probe BZ: `refusing to connect to 127.0.0.1 (loopback) for vm`). The server's log has it (`refused`).
 */
function describe(err: Error & { code?: string }, o: SendOptions): string {
  if (err.code === PRIVATE_ADDRESS_ERROR_CODE) {
    const refused = err as PrivateAddressError;
    o.refused?.(refused);
    return `refused: ${refused.hostname} does not resolve to a public address only`;
  }
  return err.code && !err.message.includes(err.code) ? `${err.code}: ${err.message}` : err.message;
}

/**
 * One attempt: POSTs `body` with the Standard Webhooks headers signed now (a fresh
 * `webhook-timestamp` and signature every time, over the same bytes), and resolves with what
 * happened; it never rejects. The URL is checked again (IP literals do not go through `lookup`)
 * and every address a host name resolves to is checked on connect (`guardedLookup`), so a DNS
 * answer that moved to a private address fails the attempt. Redirects are not followed (a 3xx is
 * a failure). The timeout covers the whole attempt, connect to the last byte read; at most the
 * first 4 KB of the response is read, then the connection is dropped.
 */
export function postWebhook(url: string, eventId: string, body: Buffer, secrets: string[], agent: HttpAgent | undefined, o: SendOptions): Promise<Omit<AttemptRecord, 'trigger'>> {
  return new Promise((resolve) => {
    const startedAt = isoNow();
    const t0 = performance.now();
    let statusCode: number | null = null;
    let settled = false;
    let timer: NodeJS.Timeout | undefined;
    const chunks: Buffer[] = [];
    let size = 0;
    const excerpt = () => (statusCode === null ? null : utf8Prefix(Buffer.concat(chunks), RESPONSE_EXCERPT_BYTES));
    const finish = (error: string | null) => {
      if (settled) return;
      settled = true;
      if (timer) clearTimeout(timer);
      const ok = error === null && statusCode !== null && statusCode >= 200 && statusCode < 300;
      resolve({ startedAt, statusCode, success: ok, error, durationMs: Math.round(performance.now() - t0), response: excerpt() });
    };

    const target = prepare(url, o);
    if (!target.ok) return finish(`refused: the URL ${target.reason}`);
    const headers: Record<string, string | number> = {
      ...webhookHeaders(secrets, eventId, body, Math.floor(now() / 1000)),
      'content-type': 'application/json',
      'content-length': body.length,
      'user-agent': USER_AGENT,
    };
    const send = target.https ? httpsRequest : httpRequest;
    let req: ReturnType<typeof send>;
    const start = (via: HttpAgent | false | undefined, again: boolean) => {
      const sentAt = performance.now();
      req = send(target.url, { method: 'POST', headers, agent: via, lookup: lookupFor(o.allow), maxHeaderSize: MAX_ANSWER_HEADER_BYTES });
      req.on('response', answered);
      req.on('error', (err: Error & { code?: string }) => {
        // a kept-alive connection the receiver closed while idle, telling it only by the close (no
        // `Keep-Alive: timeout`), fails the request reusing it at once, before any answer: sent once
        // more on a new connection. A failed attempt there waited out the retry schedule, and the
        // receiver got it twice when it had read it (probe EP: 2 to 3 of 60 attempts to a receiver
        // closing idle connections after a second). It carries the same webhook-id, which receivers
        // dedupe on. A connection dropped later, after the receiver worked on the request, is a
        // failed attempt as any (probe EW: resent at once, the second copy hid the first)
        const atOnce = performance.now() - sentAt < KEPT_CONNECTION_RESEND_MS;
        if (!again && !settled && atOnce && statusCode === null && req.reusedSocket && (err.code === 'ECONNRESET' || err.code === 'EPIPE')) return start(false, true);
        finish(describe(err, o));
      });
      req.end(body);
    };
    timer = setTimeout(() => {
      finish(`timeout: no complete answer within ${o.timeoutMs} ms`);
      req.destroy();
    }, o.timeoutMs);
    const answered = (res: IncomingMessage) => {
      statusCode = res.statusCode ?? null;
      const redirect = statusCode !== null && statusCode >= 300 && statusCode < 400
        ? `redirect not followed (${statusCode}${res.headers.location ? ` to ${res.headers.location}` : ''})` : null;
      res.on('data', (chunk: Buffer) => {
        if (size < RESPONSE_EXCERPT_BYTES) chunks.push(chunk);
        size += chunk.length;
        if (size >= RESPONSE_EXCERPT_BYTES) {
          finish(redirect);
          res.destroy();
        }
      });
      res.on('end', () => finish(redirect));
      res.on('error', (err) => finish(redirect ?? describe(err, o)));
      res.on('aborted', () => finish(redirect ?? 'connection closed before the whole answer was read'));
    };
    start(agent, false);
  });
}

/** A queued attempt: `run` sends it; `dropped`, when it is taken out of the queue unstarted (`dropQueued`). */
export type Job = { run: () => Promise<void>; dropped?: () => Promise<void> };

/**
 * An endpoint's sending lanes in this process: at most `concurrency` requests in flight, through a
 * `bottleneck` limiter with that `maxConcurrent`. Bottleneck starts about 400 jobs a second per
 * limiter (each job passes several `setTimeout(0)` yields), too few to schedule one job per
 * request, so a limiter job is a lane that takes queued attempts one after another until the
 * queue is empty: the limiter still bounds the endpoint's concurrency, and a slow endpoint fills
 * only its own lanes.
 */
export class EndpointLanes {
  private readonly limiter: Bottleneck;
  private readonly queue: Job[] = [];
  private lanes = 0;
  /** lanes with nothing to do, waiting a moment for work before they end */
  private readonly waiting: ((work: boolean) => void)[] = [];
  private closed = false;
  /** lanes scheduled on the limiter that have not started draining yet */
  private starting = 0;
  /** attempts taken and not finished (queued or sending) */
  load = 0;
  lastUsed = now();
  private agents = new Map<string, HttpAgent>();

  constructor(private readonly concurrency: number, private readonly onError: (err: Error) => void) {
    this.limiter = new Bottleneck({ maxConcurrent: concurrency });
  }

  /** Keep-alive connections of this endpoint, per protocol. */
  agent(protocol: string): HttpAgent {
    let agent = this.agents.get(protocol);
    if (!agent) {
      const options = { keepAlive: true, maxSockets: this.concurrency, timeout: 4_000, scheduling: 'lifo' as const };
      agent = protocol === 'https:' ? new HttpsAgent(options) : new HttpAgent(options);
      this.agents.set(protocol, agent);
    }
    return agent;
  }

  push(job: Job): void {
    this.queue.push(job);
    this.load++;
    this.lastUsed = now();
    const wake = this.waiting.shift();
    if (wake) wake(true);
    else this.startLanes();
  }

  /** Starts lanes while queued attempts outnumber the lanes about to take one, up to `concurrency`. */
  private startLanes(): void {
    while (this.lanes < this.concurrency && this.starting + this.waiting.length < this.queue.length) {
      this.lanes++;
      this.starting++;
      this.limiter.schedule(() => this.drain()).catch(this.onError).finally(() => {
        this.lanes--;
        this.startLanes();
      });
    }
  }

  /** Resolves true when work is pushed within `ms`, false otherwise (the lane then ends). */
  private waitForWork(ms: number): Promise<boolean> {
    return new Promise((resolve) => {
      const wake = (work: boolean) => {
        clearTimeout(timer);
        resolve(work);
      };
      const timer = setTimeout(() => {
        const i = this.waiting.indexOf(wake);
        if (i >= 0) this.waiting.splice(i, 1);
        resolve(false);
      }, ms);
      this.waiting.push(wake);
    });
  }

  private async drain(): Promise<void> {
    this.starting--;
    for (;;) {
      const job = this.queue.shift();
      if (!job) {
        if (this.closed || !(await this.waitForWork(LANE_LINGER_MS))) return;
        continue;
      }
      try {
        await job.run();
      } catch (err) {
        this.onError(err as Error);
      } finally {
        this.load--;
        this.lastUsed = now();
      }
    }
  }

  idle(): boolean {
    return this.load === 0;
  }

  /** Takes the queued attempts out unstarted, each told so (`dropped`); those sending go on. */
  async dropQueued(): Promise<void> {
    const jobs = this.queue.splice(0);
    this.load -= jobs.length;
    await Promise.all(jobs.map((job) => job.dropped?.()));
  }

  /** Drops queued attempts (their leases expire and another dispatcher takes them) and closes connections. */
  close(): void {
    this.closed = true;
    for (const wake of this.waiting.splice(0)) wake(false);
    this.load -= this.queue.length;
    this.queue.length = 0;
    for (const agent of this.agents.values()) agent.destroy();
    this.agents.clear();
  }
}
