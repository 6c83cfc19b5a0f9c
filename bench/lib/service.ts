import { spawnNode, stopChild, waitForHttp } from './child.js';
import { startWorker } from './worker.js';
import { freePort } from '../../test/helpers/port.js';

export type ServiceOptions = {
  redisUrl: string;
  keyPrefix: string;
  /** the script to run, default `bin/web.ts` (the Procfile's web process type) */
  script?: string;
  /** roles for `bin/start.ts` (HERALD_ROLES), when that script is used */
  roles?: string[];
  /** more environment, e.g. KEY_CACHE_TTL_SECONDS */
  env?: Record<string, string>;
};

/**
 * The per-tenant (and per-subscriber) limits of event ingest off (docs/events.md, Fairness between tenants), unless the
 * shell or the bench sets them: every bench but `fairness` measures one tenant's peak, which those
 * limits would cut short with 429s by design (a backlog, or more connections than
 * TENANT_INGEST_CONCURRENCY). `fairness` sets them itself.
 */
const UNLIMITED_TENANT: Record<string, string> = Object.fromEntries(
  Object.entries({ TENANT_INBOX_MAX_BACKLOG: '1000000000', SUBSCRIBER_INBOX_MAX_BACKLOG: '1000000000', TENANT_INGEST_CONCURRENCY: '1000000' }).filter(([name]) => process.env[name] === undefined),
);

/**
 * Starts Herald in a child process (`node --import tsx bin/web.ts`) on a free port against
 * `redisUrl`, and resolves once `GET /v1/health` answers 200.
 */
export async function startService(options: ServiceOptions): Promise<{ url: string; stop: () => Promise<void> }> {
  const port = await freePort();
  const env: Record<string, string> = {
    ...UNLIMITED_TENANT,
    REDIS_URL: options.redisUrl,
    REDIS_KEY_PREFIX: options.keyPrefix,
    PORT: String(port),
    LOG_LEVEL: 'error',
    ...(options.roles ? { HERALD_ROLES: options.roles.join(',') } : {}),
    ...options.env,
  };
  const child = spawnNode(options.script ?? 'bin/web.ts', [], env);
  const url = `http://127.0.0.1:${port}`;
  try {
    await waitForHttp(`${url}/v1/health`, child, 200, 30_000);
  } catch (err) {
    child.process.kill('SIGKILL');
    throw err;
  }
  return { url, stop: () => stopChild(child.process) };
}

/**
 * The web and worker roles against `redisUrl`: `separate`, each its own process as the Procfile
 * runs them; `combined`, both in one process (`bin/start.ts`). Their stops are pushed on `stops`;
 * resolves with the web role's URL.
 */
export async function startEventRoles(
  mode: 'separate' | 'combined',
  options: { redisUrl: string; keyPrefix: string; env: Record<string, string> },
  stops: Array<() => Promise<void>>,
): Promise<string> {
  if (mode === 'combined') {
    const both = await startService({ ...options, script: 'bin/start.ts', roles: ['web', 'worker'] });
    stops.push(both.stop);
    return both.url;
  }
  const web = await startService(options);
  stops.push(web.stop);
  const worker = await startWorker(options);
  stops.push(worker.stop);
  return web.url;
}
