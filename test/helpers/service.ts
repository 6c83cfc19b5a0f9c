import type { Role } from '../../lib/config.js';
import { loadConfig } from '../../lib/config.js';
import { createLogger } from '../../lib/log.js';
import { startService, type Service } from '../../bin/service.js';
import { createApiKey, ensureWorkspace, createTenant, SYSTEM_WRITER, type Writer } from '../../streams/identity.js';
import { WORKER_LEASES } from '../../streams/partition-leases.js';
import type { KeyKind } from '../../lib/key-kinds.js';
import { client } from './api.js';
import { testRedisUrl, uniquePrefix } from './redis.js';
import { waitFor } from './wait.js';

export const BY_TEST: Writer = SYSTEM_WRITER;

export type TestService = Service & { url: string; env: Record<string, string> };

/** Starts the service in this process against the test Redis, under a key prefix of its own. */
export async function startTestService(name: string, overrides: Record<string, string> = {}, roles: Role[] = ['web']): Promise<TestService> {
  const env = { REDIS_URL: await testRedisUrl(), REDIS_KEY_PREFIX: uniquePrefix(name), PORT: '0', LOG_LEVEL: 'error', KEY_CACHE_TTL_SECONDS: '30', HERALD_PARTITIONS: '8', ...overrides };
  const config = loadConfig(env, {});
  const service = await startService(config, roles, createLogger(config.logLevel, { test: name }));
  return { ...service, url: service.url ?? '', env };
}

/** A service and a second web process on the same Redis and key prefix (behaviour across processes), a client for each. */
export type ServicePair = { service: TestService; peer: TestService; api: ReturnType<typeof client>; peerApi: ReturnType<typeof client> };

export async function startServicePair(name: string): Promise<ServicePair> {
  const service = await startTestService(name);
  const peer = await startTestService(`${name}-peer`, { REDIS_KEY_PREFIX: service.env.REDIS_KEY_PREFIX! });
  return { service, peer, api: client(service.url), peerApi: client(peer.url) };
}

export async function stopServicePair(pair: Partial<ServicePair>): Promise<void> {
  await pair.peer?.stop();
  await pair.service?.stop();
}

/** A workspace with its default tenant and keys of every kind holding `scopes`. */
export async function bootstrapWorkspace(service: Service, slug: string, scopes: string[] = ['*']) {
  const { workspace, tenant } = await ensureWorkspace(service.redis, service.keys, slug, BY_TEST);
  const keys: Record<KeyKind, string> = { workspace: '', tenant: '', client: '' };
  for (const kind of ['workspace', 'tenant', 'client'] as const) {
    keys[kind] = (await createApiKey(service.redis, service.keys, { workspace, tenant, kind, scopes, expiresAt: null, name: null }, BY_TEST)).key;
  }
  return { workspace, tenant, keys };
}

/** One more key in `workspace`. */
export async function makeKey(service: Service, workspaceSlug: string, kind: KeyKind, scopes: string[], options: { tenant?: string; expiresAt?: string | null } = {}) {
  const { workspace, tenant: defaultTenant } = await ensureWorkspace(service.redis, service.keys, workspaceSlug, BY_TEST);
  const tenant = options.tenant ? (await createTenant(service.redis, service.keys, workspace, options.tenant, BY_TEST)).tenant : defaultTenant;
  return createApiKey(service.redis, service.keys, { workspace, tenant: kind === 'workspace' ? null : tenant, kind, scopes, expiresAt: options.expiresAt ?? null, name: null }, BY_TEST);
}

/**
 * Holds the retention sweep's lock for `ms`: the in-process worker's minute timer then skips its sweeps,
 * and a test's own `sweepRetention` calls are the only ones (a file running past a minute, on a loaded
 * machine, had the timer's sweep do what the test's sweep then counted, under the test's shifted clock).
 */
export async function holdRetentionSweeps(service: Service, ms = 600_000): Promise<void> {
  await service.redis.set(service.keys.lock('retention-sweep'), 'test', 'PX', ms);
}

/**
 * Waits until worker processes hold every partition's lease: a workflow's sleeps and timeouts count
 * from their trigger's arrival, so a test starting a worker keeps its start (seconds under CI load)
 * out of them by sending the triggers only then.
 */
export async function workersHoldAll(service: Service, timeoutMs = 60_000): Promise<void> {
  const held = async () => {
    for (let p = 0; p < service.config.partitions; p++) if ((await service.redis.get(service.keys.lease(p, WORKER_LEASES))) === null) return false;
    return true;
  };
  await waitFor('the workers to hold every partition', held, timeoutMs, 50);
}

/**
 * Waits until no workflow send step's message is owed (streams/run-sends.ts): a step's message is
 * made after its batch's commit, by the committing worker or, once that one was killed, the sweeper.
 */
export async function runSendsMade(service: Service, timeoutMs = 30_000): Promise<void> {
  const owed = async () => {
    let n = 0;
    for (let p = 0; p < service.config.partitions; p++) n += await service.redis.hlen(service.keys.runSends(p));
    return n;
  };
  await waitFor('every workflow send step\'s message made', async () => (await owed()) === 0, timeoutMs, 100);
}
