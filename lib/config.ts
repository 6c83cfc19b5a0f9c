import { realpathSync } from 'node:fs';
import { resolve } from 'node:path';
import { parseDuration } from './durations.js';
import { PROJECT_ROOT } from './paths.js';
import { parseEncryptionKey } from './secret-box.js';
import { createAllowList } from './ssrf-guard.js';
import { MAX_ATTEMPTS } from './webhook-policy.js';

/**
 * Every setting Herald reads from the environment, validated once.
 * This is the only module that touches `process.env`; everything else receives a `Config`.
 */
export type Config = {
  /** HTTP port of the web role. `PORT`, default 3000. */
  port: number;
  /** Redis URL (`redis://` or `rediss://`). `REDIS_URL`; null selects the embedded default. */
  redisUrl: string | null;
  /**
   * Whether a `rediss://` server's certificate is verified. `REDIS_TLS_REJECT_UNAUTHORIZED`, default
   * `true`; `false` for hosted Redis whose certificate no CA vouches for (Heroku Redis). Redis only:
   * APNs and webhook connections are always verified.
   */
  redisTlsRejectUnauthorized: boolean;
  /**
   * When the embedded redis-server syncs its append-only file to disk. `EMBEDDED_REDIS_APPENDFSYNC`:
   * `everysec` (default; a machine crash or power loss can lose the last second of acknowledged
   * writes, a killed process loses nothing) or `always` (before every reply; slower).
   */
  embeddedAppendFsync: 'everysec' | 'always';
  /** Namespace prepended to every Redis key. `REDIS_KEY_PREFIX`, default `herald:`. */
  keyPrefix: string;
  /** Number of subscriber partitions, fixed per deployment. `HERALD_PARTITIONS`, default 64. */
  partitions: number;
  /** How long events stay in logs, timelines and read models. `EVENT_RETENTION_DAYS`, default 30. */
  retentionMs: number;
  /** Largest accepted request body in bytes. `HTTP_BODY_LIMIT_BYTES`, default 1 MiB. */
  bodyLimitBytes: number;
  /** How long a client may take to send one whole request (headers and body) before it is answered 400 `bad_request` and the connection closed. `HTTP_REQUEST_TIMEOUT_MS`, default 30000. */
  requestTimeoutMs: number;
  /**
   * Proxies in front of the web role whose `X-Forwarded-*` headers are believed. `TRUST_PROXY_HOPS`,
   * default 1 (a Heroku-style router): the client address is the one that many entries from the right
   * of `X-Forwarded-For` (what a caller writes further left is not believed). 0: no forwarded header
   * is believed; the address is the socket's, the host and scheme the request's own.
   */
  trustProxyHops: number;
  /** Roles `npm start` runs in one process. `HERALD_ROLES`, default all four. */
  roles: Role[];
  /** How long an authenticated key stays cached in a process. `KEY_CACHE_TTL_SECONDS`, default 30. */
  keyCacheTtlMs: number;
  /** `NODE_ENV === 'production'` turns on the https-only rule for webhook URLs. */
  production: boolean;
  /** CIDRs webhook URLs may point into. `WEBHOOK_ALLOW_PRIVATE_NETWORKS`, default none. */
  webhookAllowPrivateNetworks: string[];
  /** Delays between webhook attempts in ms. `WEBHOOK_RETRY_SCHEDULE`, default `5m,30m,2h,5h,10h,12h`. */
  webhookRetryScheduleMs: number[];
  /** How long one webhook attempt may take in all, at most the spec's 30 s. `WEBHOOK_ATTEMPT_TIMEOUT_MS`, default 30000; lower it only for tests. */
  webhookAttemptTimeoutMs: number;
  /** Most webhook requests in flight per endpoint in one dispatcher process. `WEBHOOK_ENDPOINT_CONCURRENCY`, default 20. */
  webhookEndpointConcurrency: number;
  /** Lowest level written to the log. `LOG_LEVEL`: debug, info, warn, error; default info. */
  logLevel: LogLevel;
  /** Largest partition inbox backlog before ingest answers 503. `INBOX_MAX_BACKLOG`, default 1,000,000. */
  inboxMaxBacklog: number;
  /**
   * Most unprocessed events one tenant may hold in one partition inbox before its event requests
   * answer 429 `rate_limited` (the other tenants' go on): one tenant's flood cannot push the others'
   * events far behind it. `TENANT_INBOX_MAX_BACKLOG`, default 500.
   */
  tenantInboxMaxBacklog: number;
  /**
   * Most unprocessed events one subscriber may hold before event requests naming it answer 429
   * `rate_limited`: a hot subscriber (an app looping on an event) is held back before it fills its
   * tenant's share of the partition. `SUBSCRIBER_INBOX_MAX_BACKLOG`, default 250.
   */
  subscriberInboxMaxBacklog: number;
  /**
   * Most event requests (`POST /v1/events`, `POST /v1/client/events`) of one tenant a web process
   * handles at once, counted from when a request's body is read (a slow upload holds no place);
   * another is answered 429 `rate_limited`, so one tenant's many connections cannot queue the others'
   * requests behind theirs. `TENANT_INGEST_CONCURRENCY`,
   * default 32.
   */
  tenantIngestConcurrency: number;
  /** Secret that signs events tokens (`GET /v1/events/token`). `HERALD_TOKEN_SECRET`; default: one per Redis, generated and stored at first start. */
  tokenSecret: string | null;
  /** How long a partition lease lasts unrenewed; a dead worker's partitions move after it. `PARTITION_LEASE_MS`, default 10000. */
  leaseMs: number;
  /** Subscribers per fan-out chunk (deliveries are created, sent and settled chunk by chunk). `FANOUT_CHUNK_SIZE`, default 500. */
  fanoutChunkSize: number;
  /** Subscribers per segment backfill chunk (progress and cursor are saved after each). `SEGMENT_BACKFILL_CHUNK`, default 500. */
  segmentBackfillChunk: number;
  /**
   * How long a message a dispatcher took stays its own unrefreshed: a live dispatcher keeps the
   * claims of what it works fresh, so another takes a message over only after its dispatcher died
   * or stalled this long. `DISPATCHER_CLAIM_IDLE_MS`, default 60000.
   */
  dispatcherClaimIdleMs: number;
  /** How often a worker settles audit entries left in the outboxes by a process that died mid-write (and finishes the cleanups of subscriber deletes, the member set copies of topic membership changes and the token moves left likewise, and the former members of deleted segments), and how old such an entry must be. `AUDIT_OUTBOX_SWEEP_MS`, default 10000. */
  auditOutboxSweepMs: number;
  /**
   * Directory of the embedded redis-server's data, absolute. `HERALD_DATA_DIR`, default `var`; a relative
   * one is taken from the project folder, not the working directory, so `npx herald` run from any
   * folder of the project finds the server `npm start` (which runs in the project folder) uses.
   */
  dataDir: string;
  /**
   * Whether the service stops when its parent process is gone: when it runs as this project's own
   * `npm start` (`npm_lifecycle_event` `start` and `npm_package_json` this project's, set by npm), whose
   * npm, killed with SIGKILL, forwards no signal and left it running, holding its port (probe EE). Any
   * other npm script's children inherit those variables: one starting the service in the background
   * stopped it once its shell ended, or not, as the start raced the shell's exit (probe EN).
   */
  stopWithParent: boolean;
  /** Key encrypting secrets at rest (APNs private keys): 32 bytes as 64 hex characters or base64. `HERALD_ENCRYPTION_KEY`; unset: storing such secrets is refused. */
  encryptionKey: Buffer | null;
  /** APNs host for production tokens. `APNS_HOST`, default `api.push.apple.com`. */
  apnsHost: string;
  /** APNs host for sandbox (development) tokens. `APNS_SANDBOX_HOST`, default `api.sandbox.push.apple.com`. */
  apnsSandboxHost: string;
  /** APNs port. `APNS_PORT`, default 443 (Apple also serves 2197). */
  apnsPort: number;
  /** APNs port for sandbox tokens. `APNS_SANDBOX_PORT`, default `APNS_PORT`. */
  apnsSandboxPort: number;
  /** A PEM file of extra CA certificates trusted for the APNs hosts (a local peer in tests). `APNS_CA_FILE`; unset: the system CAs only. */
  apnsCaFile: string | null;
  /** Most APNs requests in flight per tenant. `APNS_MAX_CONCURRENT_PER_TENANT`, default 1000. */
  apnsMaxConcurrentPerTenant: number;
  /** Most APNs requests started per tenant per second. `APNS_RATE_PER_TENANT_PER_SECOND`, default 20000. */
  apnsRatePerTenantPerSecond: number;
  /** Most attempts per push (429, 5xx and connection errors are retried). `APNS_MAX_ATTEMPTS`, default 5. */
  apnsMaxAttempts: number;
  /** First retry delay in ms, doubled each retry, with jitter. `APNS_RETRY_BASE_MS`, default 250. */
  apnsRetryBaseMs: number;
  /** How long one APNs request may take. `APNS_REQUEST_TIMEOUT_MS`, default 5000. */
  apnsRequestTimeoutMs: number;
  /** How often a cached APNs connection re-checks its tenant's credentials. `APNS_CREDENTIALS_CHECK_SECONDS`, default 10; 0 checks on every send. */
  apnsCredentialsCheckMs: number;
};

export const ROLES = ['web', 'worker', 'dispatcher', 'scheduler'] as const;
export type Role = (typeof ROLES)[number];
export const LOG_LEVELS = ['debug', 'info', 'warn', 'error'] as const;
export type LogLevel = (typeof LOG_LEVELS)[number];

/** Thrown for a setting that cannot be used; the message names the variable. */
export class ConfigError extends Error {}

type Env = Record<string, string | undefined>;

function integer(env: Env, name: string, fallback: number, min: number, max: number): number {
  const raw = env[name];
  if (raw === undefined || raw === '') return fallback;
  const value = /^[0-9]{1,10}$/.test(raw) ? Number(raw) : NaN; // decimal digits only: not 1e1, 0x1e, 30.0 or " 30"
  if (!Number.isInteger(value) || value < min || value > max) {
    throw new ConfigError(`${name} must be an integer from ${min} to ${max}, got "${raw}"`);
  }
  return value;
}

function oneOf<T extends string>(env: Env, name: string, values: readonly T[]): T {
  const raw = (env[name] ?? '').trim();
  if (raw === '') return values[0]!;
  if (!(values as readonly string[]).includes(raw)) throw new ConfigError(`${name} must be one of ${values.join(', ')}, got "${raw}"`);
  return raw as T;
}

function flag(env: Env, name: string, fallback: boolean): boolean {
  const raw = (env[name] ?? '').trim();
  if (raw === '') return fallback;
  if (raw === 'true' || raw === '1') return true;
  if (raw === 'false' || raw === '0') return false;
  throw new ConfigError(`${name} must be true or false, got "${raw}"`);
}

function list(raw: string | undefined): string[] {
  return (raw ?? '').split(',').map((s) => s.trim()).filter(Boolean);
}

/** Longest delay WEBHOOK_RETRY_SCHEDULE may name: the default's 12 h is the longest a receiver waits. */
const MAX_RETRY_DELAY_MS = 7 * 24 * 3_600_000;

/**
 * WEBHOOK_RETRY_SCHEDULE: the delays after attempts 1, 2, …, the last repeating. Ten attempts make
 * nine delays at most: a longer list (its tail never used), an empty entry (`5m,,30m`) or a delay
 * over 7 days is refused rather than read some other way (probe V).
 */
function retrySchedule(raw: string | undefined): number[] {
  // empty (or blank) is unset, as for every setting (probe AP: it was refused)
  const items = (raw?.trim() || '5m,30m,2h,5h,10h,12h').split(',').map((s) => s.trim());
  if (items.length > MAX_ATTEMPTS - 1) {
    throw new ConfigError(`WEBHOOK_RETRY_SCHEDULE lists ${items.length} delays; at most ${MAX_ATTEMPTS - 1} are used (${MAX_ATTEMPTS} attempts in all, the last delay repeating)`);
  }
  return items.map((item) => {
    const ms = parseDuration(item);
    // a zero (`0s`) is a duration the pattern refuses: said as what it is (probe BG)
    if (ms === null && /^0+[smhd]$/.test(item)) throw new ConfigError(`WEBHOOK_RETRY_SCHEDULE: "${item}" is no delay; each is at least 1s`);
    if (ms === null) throw new ConfigError(`WEBHOOK_RETRY_SCHEDULE: "${item}" is not a duration like 30s, 5m, 2h or 1d`);
    if (ms > MAX_RETRY_DELAY_MS) throw new ConfigError(`WEBHOOK_RETRY_SCHEDULE: "${item}" is longer than 7d`);
    return ms;
  });
}

/** WEBHOOK_ALLOW_PRIVATE_NETWORKS, checked here so every role refuses a bad one at start, naming the variable. */
function allowedNetworks(raw: string | undefined): string[] {
  const cidrs = list(raw);
  try {
    createAllowList(cidrs);
  } catch (err) {
    throw new ConfigError(`WEBHOOK_ALLOW_PRIVATE_NETWORKS: ${(err as Error).message}`);
  }
  return cidrs;
}

/**
 * Whether two paths name the same file, through symbolic links: npm gives `npm_package_json` as the
 * operator typed the folder (`npm --prefix /srv/current start`, `current` a link), the project's own
 * path is the real one (probe EW: the parent watch was off under a linked prefix).
 */
function samePath(a: string, b: string): boolean {
  if (a === b) return true;
  try {
    return realpathSync(a) === realpathSync(b);
  } catch {
    return false;
  }
}

function roles(raw: string | undefined): Role[] {
  if ((raw ?? '').trim() === '') return [...ROLES];
  // an empty entry is a slip (`${ROLE},` with ROLE unset), not "every role": `,` started all four (probe G)
  if (raw!.split(',').some((s) => s.trim() === '')) throw new ConfigError(`HERALD_ROLES: an entry is empty in "${raw}" (leave the variable unset or empty for every role)`);
  const items = list(raw);
  for (const [i, item] of items.entries()) {
    if (!(ROLES as readonly string[]).includes(item)) {
      throw new ConfigError(`HERALD_ROLES: unknown role "${item}" (known: ${ROLES.join(', ')})`);
    }
    // twice would start that role's consumers twice in one process (probe V)
    if (items.indexOf(item) !== i) throw new ConfigError(`HERALD_ROLES: "${item}" is named twice`);
  }
  return items as Role[];
}

function encryptionKey(raw: string | undefined): Buffer | null {
  if (raw === undefined || raw.trim() === '') return null;
  const key = parseEncryptionKey(raw);
  if (!key) throw new ConfigError('HERALD_ENCRYPTION_KEY must be 32 bytes written as 64 hex characters or as base64 (make one with: openssl rand -hex 32)');
  return key;
}

function hostName(env: Env, name: string, fallback: string): string {
  const raw = (env[name] ?? '').trim();
  if (raw === '') return fallback;
  if (!/^[A-Za-z0-9.-]+$|^\[[0-9A-Fa-f:.]+\]$/.test(raw)) throw new ConfigError(`${name} must be a host name or IP address without scheme or port, got "${raw}"`);
  return raw;
}

/** The events tokens' HMAC key: at least 32 characters (a one-character key was taken, probe BG). */
function tokenSecret(raw: string | undefined): string | null {
  if (!raw) return null;
  if (raw.length < 32) throw new ConfigError(`HERALD_TOKEN_SECRET must be at least 32 characters (it signs events tokens; make one with: openssl rand -hex 32), got ${raw.length}`);
  return raw;
}

function redisUrl(raw: string | undefined): string | null {
  if (!raw) return null;
  if (!/^rediss?:\/\//.test(raw)) throw new ConfigError('REDIS_URL must start with redis:// or rediss://');
  if (!URL.canParse(raw)) throw new ConfigError('REDIS_URL is not a valid URL (percent-encode @, :, / and # in a password)');
  // ioredis reads the path as the database number itself: `/abc` crashed the start with SELECT NaN,
  // `/1x` was database 1 (probe BG)
  const url = new URL(raw);
  // an unencoded # in a password ends the URL there: the rest was read as its host (probe BG)
  if (url.hash || raw.includes('#')) throw new ConfigError('REDIS_URL holds a "#": percent-encode it in a password (%23)');
  const path = url.pathname;
  if (!/^\/?(?:\d+)?$/.test(path)) throw new ConfigError(`REDIS_URL's path must be a database number (redis://host:6379/0), got "${path}"`);
  // ioredis takes every query parameter as a connection option (`?db=abc` crashed as `/abc` did, and
  // `?db=3` chose a database the logs never showed, probe BL): the database goes in the path
  if (url.search) throw new ConfigError('REDIS_URL takes no query parameters: give the database as its path (redis://host:6379/2)');
  return raw;
}

/** Reads and validates the configuration; `overrides` win over the environment (tests use them). */
export function loadConfig(overrides: Env = {}, env: Env = process.env): Config {
  const e: Env = { ...env, ...overrides };
  const logLevel = (e.LOG_LEVEL?.trim() || 'info') as LogLevel; // empty is unset, as for every setting
  if (!LOG_LEVELS.includes(logLevel)) throw new ConfigError(`LOG_LEVEL must be one of ${LOG_LEVELS.join(', ')}, got "${logLevel}"`);
  return {
    port: integer(e, 'PORT', 3000, 0, 65535),
    redisUrl: redisUrl(e.REDIS_URL),
    redisTlsRejectUnauthorized: flag(e, 'REDIS_TLS_REJECT_UNAUTHORIZED', true),
    embeddedAppendFsync: oneOf(e, 'EMBEDDED_REDIS_APPENDFSYNC', ['everysec', 'always'] as const),
    // empty is unset (probe AP: an empty prefix wrote Herald's keys unprefixed among the others of a shared Redis)
    keyPrefix: e.REDIS_KEY_PREFIX || 'herald:',
    partitions: integer(e, 'HERALD_PARTITIONS', 64, 1, 4096),
    retentionMs: integer(e, 'EVENT_RETENTION_DAYS', 30, 1, 3650) * 86_400_000,
    bodyLimitBytes: integer(e, 'HTTP_BODY_LIMIT_BYTES', 1_048_576, 1024, 64 * 1_048_576),
    requestTimeoutMs: integer(e, 'HTTP_REQUEST_TIMEOUT_MS', 30_000, 1000, 300_000),
    trustProxyHops: integer(e, 'TRUST_PROXY_HOPS', 1, 0, 10),
    roles: roles(e.HERALD_ROLES),
    keyCacheTtlMs: integer(e, 'KEY_CACHE_TTL_SECONDS', 30, 0, 3600) * 1000,
    // read as the other settings are, trimmed, and in any case (probe I: ` production` left the https rule off)
    production: (e.NODE_ENV ?? '').trim().toLowerCase() === 'production',
    webhookAllowPrivateNetworks: allowedNetworks(e.WEBHOOK_ALLOW_PRIVATE_NETWORKS),
    webhookRetryScheduleMs: retrySchedule(e.WEBHOOK_RETRY_SCHEDULE),
    webhookAttemptTimeoutMs: integer(e, 'WEBHOOK_ATTEMPT_TIMEOUT_MS', 30_000, 100, 30_000),
    webhookEndpointConcurrency: integer(e, 'WEBHOOK_ENDPOINT_CONCURRENCY', 20, 1, 1000),
    logLevel,
    dataDir: resolve(PROJECT_ROOT, e.HERALD_DATA_DIR || 'var'),
    stopWithParent: e.npm_lifecycle_event === 'start' && e.npm_package_json !== undefined && samePath(e.npm_package_json, resolve(PROJECT_ROOT, 'package.json')),
    inboxMaxBacklog: integer(e, 'INBOX_MAX_BACKLOG', 1_000_000, 100, 1_000_000_000),
    tenantInboxMaxBacklog: integer(e, 'TENANT_INBOX_MAX_BACKLOG', 500, 1, 1_000_000_000),
    subscriberInboxMaxBacklog: integer(e, 'SUBSCRIBER_INBOX_MAX_BACKLOG', 250, 1, 1_000_000_000),
    tenantIngestConcurrency: integer(e, 'TENANT_INGEST_CONCURRENCY', 32, 1, 1_000_000),
    tokenSecret: tokenSecret(e.HERALD_TOKEN_SECRET),
    leaseMs: integer(e, 'PARTITION_LEASE_MS', 10_000, 500, 600_000),
    fanoutChunkSize: integer(e, 'FANOUT_CHUNK_SIZE', 500, 1, 10_000),
    segmentBackfillChunk: integer(e, 'SEGMENT_BACKFILL_CHUNK', 500, 1, 10_000),
    dispatcherClaimIdleMs: integer(e, 'DISPATCHER_CLAIM_IDLE_MS', 60_000, 500, 3_600_000),
    auditOutboxSweepMs: integer(e, 'AUDIT_OUTBOX_SWEEP_MS', 10_000, 100, 3_600_000),
    encryptionKey: encryptionKey(e.HERALD_ENCRYPTION_KEY),
    apnsHost: hostName(e, 'APNS_HOST', 'api.push.apple.com'),
    apnsSandboxHost: hostName(e, 'APNS_SANDBOX_HOST', 'api.sandbox.push.apple.com'),
    apnsPort: integer(e, 'APNS_PORT', 443, 1, 65535),
    apnsSandboxPort: integer(e, 'APNS_SANDBOX_PORT', integer(e, 'APNS_PORT', 443, 1, 65535), 1, 65535),
    apnsCaFile: e.APNS_CA_FILE?.trim() || null,
    apnsMaxConcurrentPerTenant: integer(e, 'APNS_MAX_CONCURRENT_PER_TENANT', 1000, 1, 100_000),
    apnsRatePerTenantPerSecond: integer(e, 'APNS_RATE_PER_TENANT_PER_SECOND', 20_000, 1, 1_000_000),
    apnsMaxAttempts: integer(e, 'APNS_MAX_ATTEMPTS', 5, 1, 20),
    apnsRetryBaseMs: integer(e, 'APNS_RETRY_BASE_MS', 250, 0, 60_000),
    apnsRequestTimeoutMs: integer(e, 'APNS_REQUEST_TIMEOUT_MS', 5000, 100, 120_000),
    apnsCredentialsCheckMs: integer(e, 'APNS_CREDENTIALS_CHECK_SECONDS', 10, 0, 3600) * 1000,
  };
}
