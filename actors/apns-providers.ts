import { createSecureContext, rootCertificates, type SecureContext } from 'node:tls';
import apn from '@parse/node-apn';
import type { Redis } from 'ioredis';
import { now } from '../lib/clock.js';
import type { Config } from '../lib/config.js';
import type { Logger } from '../lib/log.js';
import type { SecretBox } from '../lib/secret-box.js';
import { ApnsCredentialsUnreadable, apnsCredentialsVersion, getApnsCredentials } from '../streams/apns-credentials.js';
import type { Keys } from '../streams/keys.js';

export const APNS_ENVIRONMENTS = ['production', 'sandbox'] as const;
export type ApnsEnvironment = (typeof APNS_ENVIRONMENTS)[number];

/** A ready connection to APNs for one tenant app in one environment. */
export type ApnsConnection = { provider: apn.Provider; bundleId: string; host: string; port: number; version: string };

/** Why no connection can be made: nothing configured, or stored credentials this process cannot decrypt. */
export type ApnsUnavailable = { unavailable: 'apns_not_configured' | 'apns_credentials_unreadable'; detail: string };

/** `holds`: connections handed out by `get` and not yet released; `usedAt`: the last get or release. */
type Entry = { connection: ApnsConnection; checkedAt: number; usedAt: number; holds: number };

/**
 * One node-apn `Provider` (one HTTP/2 session) per tenant and environment, made on first use from
 * the tenant's stored credentials. A cached provider is trusted for `apnsCredentialsCheckMs`; after
 * that the next send re-reads the credentials' version (one HGET) and, when it changed or the
 * credentials were deleted, replaces or drops the provider. The old provider's session closes
 * gracefully: requests in flight on it still get their answers.
 *
 * Every connection `get` returns is held until the caller `release`s it: a provider is shut down
 * only once nobody holds it, so a push that got its connection and then waited in its tenant's
 * limiter never starts on a closed session. `evictIdle` closes providers nobody used for a while.
 *
 * Hosts, port and CA come from the configuration only (`APNS_HOST`, `APNS_SANDBOX_HOST`,
 * `APNS_PORT`, `APNS_SANDBOX_PORT`, `APNS_CA_FILE`): a local APNs peer is reached exactly the way
 * Apple is. node-apn's own retries are off (`connectionRetryLimit: 0`): the sender retries with
 * its own backoff.
 */
export class ApnsProviders {
  readonly #entries = new Map<string, Entry>();
  readonly #loading = new Map<string, Promise<Entry | ApnsUnavailable>>();
  /** Entries replaced or dropped while held: shut down by their last release (or by close). */
  readonly #retired = new Set<Entry>();
  readonly #entryOf = new WeakMap<ApnsConnection, Entry>();
  /**
   * With extra CA certificates, the one TLS context every provider's connections use: Node's root
   * store plus those. Passed as `ca` instead, each connection built a context of its own from the
   * ~140 root certificates (about 1 MB and a burst of CPU per tenant's session: probe D, 1,350
   * tenants opening sessions at once pinned a dispatcher for 30 s, timed out 874 pushes and left
   * 1.5 GB of RSS).
   */
  readonly #secureContext: SecureContext | null;
  #closed = false;

  /** How long closing a provider waits for its requests in flight. */
  get #graceMs(): number {
    return this.config.apnsRequestTimeoutMs + 1000;
  }

  constructor(
    private readonly redis: Redis,
    private readonly keys: Keys,
    private readonly config: Config,
    private readonly box: SecretBox | null,
    private readonly log: Logger,
    /** Extra trusted CA certificates (PEM), added to Node's root store; null: the root store alone. */
    extraCa: string | null,
  ) {
    this.#secureContext = extraCa ? createSecureContext({ ca: [...rootCertificates, extraCa] }) : null;
  }

  /** The host and port an environment's requests go to. */
  endpoint(environment: ApnsEnvironment): { host: string; port: number } {
    return environment === 'production'
      ? { host: this.config.apnsHost, port: this.config.apnsPort }
      : { host: this.config.apnsSandboxHost, port: this.config.apnsSandboxPort };
  }

  /** Providers open (one per tenant and environment used lately). */
  get size(): number {
    return this.#entries.size;
  }

  /**
   * For each of `environments`, the connection to the tenant's app, or why there is none. Every
   * connection returned is held until it is `release`d. When Redis cannot be read this rejects,
   * after releasing what it got.
   */
  async get(tenantId: string, environments: ApnsEnvironment[]): Promise<(ApnsConnection | ApnsUnavailable)[]> {
    const got = await Promise.allSettled(environments.map((environment) => this.#get(tenantId, environment)));
    const connections = got.flatMap((g) => (g.status === 'fulfilled' ? [g.value] : []));
    const failed = got.find((g): g is PromiseRejectedResult => g.status === 'rejected');
    if (!failed) return connections;
    this.release(connections);
    throw failed.reason;
  }

  /**
   * Whether the credentials `connection` was made from were replaced or deleted since (one HGET);
   * if so, the tenant's cached providers are checked again on their next `get`. A push APNs refused
   * with 403 `InvalidProviderToken` is tried again when they were (push-sender): a key replaced
   * because Apple revoked the old one serves the next attempt, not only after the check interval.
   */
  async replaced(tenantId: string, connection: ApnsConnection): Promise<boolean> {
    if ((await apnsCredentialsVersion(this.redis, this.keys, tenantId)) === connection.version) return false;
    for (const environment of APNS_ENVIRONMENTS) {
      const entry = this.#entries.get(`${tenantId}|${environment}`);
      if (entry) entry.checkedAt = 0;
    }
    return true;
  }

  async #get(tenantId: string, environment: ApnsEnvironment): Promise<ApnsConnection | ApnsUnavailable> {
    if (this.#closed) return { unavailable: 'apns_not_configured', detail: 'the push sender is closed' };
    const key = `${tenantId}|${environment}`;
    const entry = this.#entries.get(key);
    if (entry && now() - entry.checkedAt < this.config.apnsCredentialsCheckMs) return this.#hold(entry);
    // Many sends arrive at once for a tenant: one of them checks, the others wait for it.
    let loading = this.#loading.get(key);
    if (!loading) {
      loading = this.#refresh(key, tenantId, environment).finally(() => this.#loading.delete(key));
      this.#loading.set(key, loading);
    }
    // Held as soon as the load ends (a microtask later): no sweep, a timer callback, runs in between.
    const result = await loading;
    return 'unavailable' in result ? result : this.#hold(result);
  }

  #hold(entry: Entry): ApnsConnection {
    entry.holds++;
    entry.usedAt = now();
    return entry.connection;
  }

  /** Gives back what `get` returned, once its requests are answered or will never be made. */
  release(connections: (ApnsConnection | ApnsUnavailable)[]): void {
    for (const connection of connections) {
      const entry = 'unavailable' in connection ? undefined : this.#entryOf.get(connection);
      if (!entry || entry.holds === 0) continue;
      entry.holds--;
      entry.usedAt = now();
      if (entry.holds === 0 && this.#retired.delete(entry)) void shutdown(entry.connection.provider, this.#graceMs);
    }
  }

  /**
   * Shuts down providers that nobody holds and that were last used before `usedBefore` (ms), at
   * most `max` of them; returns how many. The next `get` of such a tenant makes a new provider.
   */
  evictIdle(usedBefore: number, max: number): number {
    let evicted = 0;
    for (const [key, entry] of this.#entries) {
      if (evicted >= max) break;
      // A key being refreshed is about to be handed out by the `get`s waiting on it.
      if (entry.holds > 0 || entry.usedAt >= usedBefore || this.#loading.has(key)) continue;
      this.#drop(key);
      evicted++;
    }
    return evicted;
  }

  async #refresh(key: string, tenantId: string, environment: ApnsEnvironment): Promise<Entry | ApnsUnavailable> {
    const current = this.#entries.get(key);
    if (current) {
      const version = await apnsCredentialsVersion(this.redis, this.keys, tenantId);
      if (version === current.connection.version) {
        current.checkedAt = now();
        return current;
      }
    }
    let credentials;
    try {
      credentials = await getApnsCredentials(this.redis, this.keys, this.box, tenantId);
    } catch (err) {
      if (!(err instanceof ApnsCredentialsUnreadable)) throw err;
      this.#drop(key);
      this.log.error('apns credentials unreadable', { tenantId, err: err.message });
      return { unavailable: 'apns_credentials_unreadable', detail: err.message };
    }
    if (!credentials) {
      this.#drop(key);
      return { unavailable: 'apns_not_configured', detail: 'no APNs credentials are configured for this tenant' };
    }
    const { host, port } = this.endpoint(environment);
    const options: apn.ProviderOptions = {
      token: { key: credentials.privateKey, keyId: credentials.keyId, teamId: credentials.teamId },
      production: environment === 'production',
      address: host,
      port,
      connectionRetryLimit: 0,
      requestTimeout: this.config.apnsRequestTimeoutMs,
    };
    // node-apn hands its options to http2.connect, and so to tls.connect, which uses a given context
    if (this.#secureContext) Object.assign(options, { secureContext: this.#secureContext });
    let provider: apn.Provider;
    try {
      provider = new apn.Provider(options);
      keepStreamsWhileClosing(provider, this.#graceMs);
      answerWithoutRetry(provider);
      awaitPeerSettings(provider, this.config.apnsRequestTimeoutMs);
      throttleTokenRenewal(provider);
    } catch (err) {
      this.#drop(key);
      this.log.error('apns provider could not be made', { tenantId, err: (err as Error).message });
      return { unavailable: 'apns_credentials_unreadable', detail: (err as Error).message };
    }
    this.#drop(key);
    if (this.#closed) {
      // close() ran while the credentials were read: do not leave a session open.
      void shutdown(provider, this.#graceMs);
      return { unavailable: 'apns_not_configured', detail: 'the push sender is closed' };
    }
    const entry: Entry = { connection: { provider, bundleId: credentials.bundleId, host, port, version: credentials.version }, checkedAt: now(), usedAt: now(), holds: 0 };
    this.#entries.set(key, entry);
    this.#entryOf.set(entry.connection, entry);
    this.log.info('apns provider ready', { tenantId, environment, host, port, keyId: credentials.keyId, bundleId: credentials.bundleId });
    return entry;
  }

  /** Forgets a key's provider; shuts it down now, or at its last release while it is held. */
  #drop(key: string): void {
    const entry = this.#entries.get(key);
    if (!entry) return;
    this.#entries.delete(key);
    if (entry.holds > 0) this.#retired.add(entry);
    else void shutdown(entry.connection.provider, this.#graceMs);
  }

  /**
   * Shuts every provider down, held ones too (the sender stops its limiters first, so no request
   * is about to start); in-flight requests finish first. Later `get`s find nothing.
   */
  async close(): Promise<void> {
    this.#closed = true;
    await Promise.allSettled([...this.#loading.values()]);
    const providers = [...this.#entries.values(), ...this.#retired].map((e) => e.connection.provider);
    this.#entries.clear();
    this.#retired.clear();
    await Promise.all(providers.map((p) => shutdown(p, this.#graceMs)));
  }
}

/**
 * APNs's own answer of a push node-apn would retry (429, 5xx, ExpiredProviderToken), as it came:
 * Herald retries it itself (`connectionRetryLimit: 0`), but node-apn's `retryRequest` first checks
 * its session, and on one closing (another push's 500 closes it) it threw "client session is either
 * closed or destroyed" in place of the answer, so the last attempt of a push answered 429 or 500 was
 * recorded `connection_error` with no status or reason (probe DJ: 195 deliveries, every one answered).
 */
function answerWithoutRetry(provider: apn.Provider): void {
  const client = (provider as unknown as { client?: { retryRequest?: (error: unknown) => Promise<unknown> } }).client;
  if (!client || typeof client.retryRequest !== 'function') return;
  client.retryRequest = async (error: unknown) => {
    throw error;
  };
}

/**
 * node-apn closes its session gracefully after an answer 500 (a new one serves later pushes), but
 * the GOAWAY the server sends back makes it destroy that closing session at once, and every push in
 * flight on it ends without its answer: APNs accepted it, Herald records a connection error and
 * sends it again (probe I: a token answering 500 three times made another device's push fail three
 * times, each time accepted). A session already closing is now left to finish its streams (Node
 * destroys it once they are done), for at most `graceMs`, before node-apn's own close runs.
 */
function keepStreamsWhileClosing(provider: apn.Provider, graceMs: number): void {
  type Session = { closed: boolean; destroyed: boolean; once(event: 'close', listener: () => void): void };
  const client = (provider as unknown as { client?: { closeAndDestroySession?: (session: Session | null) => Promise<void> } }).client;
  const closeAndDestroy = client?.closeAndDestroySession;
  if (!client || typeof closeAndDestroy !== 'function') return;
  // one wait per closing session, however many pushes on it got a 500: a listener each added more
  // than ten 'close' listeners to one session and printed MaxListenersExceededWarning (probe BB)
  const closing = new WeakMap<Session, Promise<void>>();
  const closed = (session: Session) => {
    let wait = closing.get(session);
    if (!wait) {
      wait = new Promise<void>((done) => {
        const timer = setTimeout(done, graceMs);
        timer.unref();
        session.once('close', () => {
          clearTimeout(timer);
          done();
        });
      });
      closing.set(session, wait);
    }
    return wait;
  };
  client.closeAndDestroySession = async (session) => {
    if (session && session.closed && !session.destroyed) await closed(session);
    return closeAndDestroy.call(client, session);
  };
}

/**
 * A new connection's pushes go out once the peer's SETTINGS arrived (at most `timeoutMs` later; a
 * peer that never sends them meets the pushes' own timeout): node-apn sent them as soon as it had
 * asked for the connection, before the peer's SETTINGS_MAX_CONCURRENT_STREAMS was known, so every
 * stream beyond the limit was refused (REFUSED_STREAM), retried, and on a slow peer timed out and
 * reopened the connection to be refused again (probe CH: a peer allowing 10 streams, 90 of 400
 * pushes failed after 5 attempts without reaching it). Node queues the streams beyond the limit once
 * it is known. node-apn's `request` (every push and retry goes through it, on the session it names)
 * waits for its session's SETTINGS; the session itself stays node-apn's current one (emptied while
 * waiting, node-apn's retry of an answer arriving meanwhile read a null session and recorded a
 * connection error, and a timeout closed the newer connection: probe CE).
 */
function awaitPeerSettings(provider: apn.Provider, timeoutMs: number): void {
  type Session = { closed: boolean; destroyed: boolean; once(event: string, listener: () => void): void; off(event: string, listener: () => void): void };
  type Client = { session?: Session | null; connect?: () => Promise<void>; request?: (session: Session, ...rest: unknown[]) => Promise<unknown> };
  const client = (provider as unknown as { client?: Client }).client;
  const connect = client?.connect;
  const request = client?.request;
  if (!client || typeof connect !== 'function' || typeof request !== 'function') return;
  const settling = new WeakMap<Session, Promise<void>>();
  /** why a session ended before its SETTINGS (told in the push's failure, as node-apn told it) */
  const ended = new WeakMap<Session, Error>();
  client.connect = async () => {
    await connect.call(client);
    const session = client.session;
    if (!session || session.closed || session.destroyed || settling.has(session)) return;
    settling.set(session, new Promise<void>((done) => {
      const events = ['remoteSettings', 'close', 'error'] as const;
      const finish = (err?: unknown) => {
        clearTimeout(timer);
        for (const event of events) session.off(event, finish);
        settling.delete(session);
        if (err instanceof Error) ended.set(session, err);
        done();
      };
      const timer = setTimeout(finish, timeoutMs).unref();
      for (const event of events) session.once(event, finish);
    }));
  };
  client.request = async (session: Session, ...rest: unknown[]) => {
    const wait = session ? settling.get(session) : undefined;
    if (wait) {
      await wait;
      if (session.closed || session.destroyed) throw { error: new Error(`apn write failed: ${ended.get(session)?.message ?? 'the connection closed before the peer\'s SETTINGS'}`) };
    }
    return request.call(client, session, ...rest);
  };
}

/** Apple's least interval between two provider tokens: a refresh sooner is answered 429 TooManyProviderTokenUpdates. */
const PROVIDER_TOKEN_MIN_AGE_S = 20 * 60;

/**
 * node-apn signs a new provider token on every `403 ExpiredProviderToken`; a token younger than 20
 * minutes is kept instead (Apple refreshes no more often, and answers 429 TooManyProviderTokenUpdates
 * otherwise): a device or a clock skew answering it on every attempt made a new token per attempt,
 * 15 in 7 s, for every push of the tenant (probe CH). node-apn still renews a token before its hour.
 */
function throttleTokenRenewal(provider: apn.Provider): void {
  type Token = { regenerate?: (generation: number) => void; isExpired?: (validSeconds: number) => boolean };
  const token = (provider as unknown as { client?: { config?: { token?: Token } } }).client?.config?.token;
  const regenerate = token?.regenerate;
  if (!token || typeof regenerate !== 'function' || typeof token.isExpired !== 'function') return;
  token.regenerate = (generation: number) => {
    if (token.isExpired!(PROVIDER_TOKEN_MIN_AGE_S)) regenerate.call(token, generation);
  };
}

type ClientSession = { closed: boolean; destroyed: boolean; connecting: boolean; close(): void; destroy(): void };
const clientOf = (provider: apn.Provider) => (provider as unknown as { client?: { session?: ClientSession | null } }).client;

/** The provider's current HTTP/2 session (node-apn's client holds one at a time), or null: none, or one closed or destroyed (the next push opens another). */
export function currentSession(provider: apn.Provider): object | null {
  const session = clientOf(provider)?.session;
  return session && !session.closed && !session.destroyed ? session : null;
}

/**
 * Closes the provider's session gracefully after a push on it got no answer in time, when it is
 * still the one the push went out on (`before`, null when the push opened it): its streams in flight
 * finish or time out, and the next push opens a new connection with the same provider token. A
 * connection gone silent (a NAT or load balancer dropping it without a reset) was otherwise kept for
 * every later push of the tenant, each failing `request_timeout` (probe V). A session still
 * connecting (a TLS handshake that never ends: the peer took the TCP connection and says nothing) is
 * destroyed at once, and a closing one that has not ended after `graceMs` is destroyed then: close()
 * waits for a handshake or streams that may never end, and each such session kept its socket for
 * good (probe AS: 16 sockets after 6 messages to a silent host).
 */
export function retireSession(provider: apn.Provider, before: object | null, graceMs: number): void {
  const session = clientOf(provider)?.session;
  if (!session || session.closed || session.destroyed || (before !== null && session !== before)) return;
  try {
    if (session.connecting) return session.destroy();
    session.close();
    setTimeout(() => {
      if (!session.destroyed) session.destroy();
    }, graceMs).unref();
  } catch {
    // already going: nothing to do
  }
}

/**
 * node-apn's shutdown closes the session once its streams are done and then calls back; but after
 * a connection error its session is already destroyed and Node never calls `close`'s callback. So
 * wait at most `graceMs` (enough for requests in flight to time out).
 */
function shutdown(provider: apn.Provider, graceMs: number): Promise<void> {
  // A peek at node-apn's client: a destroyed session has nothing left to wait for.
  const session = (provider as unknown as { client?: { session?: { destroyed?: boolean } | null } }).client?.session;
  if (session?.destroyed) graceMs = 0;
  return new Promise<void>((done) => {
    const timer = setTimeout(done, graceMs);
    timer.unref();
    try {
      provider.shutdown(() => {
        clearTimeout(timer);
        done();
      });
    } catch {
      clearTimeout(timer);
      done();
    }
  });
}
