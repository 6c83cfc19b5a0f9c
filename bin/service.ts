import type { IncomingMessage, Server, ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import type { Redis } from 'ioredis';
import { ConfigError, type Config, type Role } from '../lib/config.js';
import { createLogger, type Logger } from '../lib/log.js';
import { createApp } from '../http/app.js';
import { answerUnparsedRequest } from '../http/middleware/errors.js';
import { resolveRedis, type ResolvedRedis } from '../streams/embedded-redis.js';
import { startHeartbeat } from '../streams/heartbeat.js';
import { checkPartitionCount } from '../streams/partition-leases.js';
import { KeyCache } from '../streams/key-cache.js';
import { createKeys, type Keys } from '../streams/keys.js';
import { checkDatabase, connectRedis, describeTarget } from '../streams/redis.js';
import { auditsSettled } from '../streams/messages.js';
import { eventsTokenSecret } from '../streams/secrets.js';
import { ROLE_ACTORS } from './role-actors.js';
import type { RoleContext, Stop } from '../streams/role-context.js';

/** How long a stopping process waits for the ledger appends of the messages it answered (streams/messages.ts auditsSettled). */
const AUDITS_GRACE_MS = 2_000;
/** How long a stopping web role waits for the requests in flight before cutting their connections. */
const SHUTDOWN_GRACE_MS = 5_000;

export type Service = { url: string | null; redis: Redis; keys: Keys; config: Config; stop: () => Promise<void> };

/**
 * Starts `roles` in this process: one Redis client for commands, the web server when `web` is
 * among them, and the long-running actors of the other roles. `stop` ends them in reverse order.
 */
export async function startService(config: Config, roles: Role[], log: Logger = createLogger(config.logLevel, { roles })): Promise<Service> {
  const resolved: ResolvedRedis = await resolveRedis(config);
  const redis = connectRedis(resolved.target);
  redis.on('error', (err: Error) => log.warn('redis connection error', { err: err.message }));
  const keys = createKeys(config.keyPrefix);
  try {
    await redis.ping();
    await checkDatabase(redis, resolved.target);
    await checkPartitionCount(redis, keys, config.partitions);
  } catch (err) {
    redis.disconnect();
    await resolved.stop();
    throw err;
  }
  log.info('redis ready', { redis: describeTarget(resolved.target), embedded: resolved.embedded });
  const stops: Stop[] = [];
  let url: string | null = null;

  const context: RoleContext = { config, redis, keys, log, target: resolved.target };
  for (const role of roles) {
    if (role === 'web') continue;
    for (const start of ROLE_ACTORS[role]) stops.push(await start(context));
  }

  if (roles.includes('web')) {
    const keyCache = new KeyCache(redis, keys, config.keyCacheTtlMs, log);
    await keyCache.start();
    stops.push(() => keyCache.stop());
    const tokenSecret = await eventsTokenSecret(redis, keys, config);
    const app = createApp({ config, redis, keys, keyCache, log, tokenSecret });
    const server: Server = await new Promise<Server>((done, fail) => {
      const s = app.listen(config.port, () => {
        s.off('error', fail);
        done(s);
      });
      s.once('error', fail);
    }).catch(async (err: NodeJS.ErrnoException) => {
      // what started already (the other roles, Redis, an embedded server) stops before the error is told
      for (const stop of stops.reverse()) await stop().catch(() => undefined);
      await redis.quit().catch(() => redis.disconnect());
      await resolved.stop();
      if (err.code === 'EADDRINUSE') throw new ConfigError(`PORT ${config.port} is already in use: stop what listens on it, or set PORT to a free port`);
      if (err.code === 'EACCES') throw new ConfigError(`PORT ${config.port} needs privileges this process lacks: set PORT to 1024 or above`);
      throw err;
    });
    server.keepAliveTimeout = 65_000;
    server.on('clientError', answerUnparsedRequest);
    const { port } = server.address() as AddressInfo;
    url = `http://127.0.0.1:${port}`;
    log.info('web listening', { port });
    // Stopping answers the requests in flight (each with `Connection: close`) and closes idle
    // keep-alive connections; only what is still open after SHUTDOWN_GRACE_MS is cut. Cutting a
    // request the service had taken (events stored, a message created) would lose its answer.
    const inFlight = new Set<ServerResponse>();
    let closing = false;
    server.on('request', (_req: IncomingMessage, res: ServerResponse) => {
      if (closing) return void res.setHeader('Connection', 'close');
      inFlight.add(res);
      res.once('close', () => inFlight.delete(res));
    });
    stops.push(() => new Promise<void>((done) => {
      closing = true;
      for (const res of inFlight) if (!res.headersSent) res.setHeader('Connection', 'close');
      const force = setTimeout(() => server.closeAllConnections(), SHUTDOWN_GRACE_MS);
      server.close(() => {
        clearTimeout(force);
        done();
      });
      server.closeIdleConnections();
    }));
  }
  stops.push(startHeartbeat(redis, keys, roles));

  let stopped = false;
  return {
    url, redis, keys, config,
    stop: async () => {
      if (stopped) return;
      stopped = true;
      for (const stop of stops.reverse()) await stop().catch((err: Error) => log.warn('stop failed', { err: err.message }));
      // the ledger appends of messages answered before the stop (web, and a worker's workflow sends)
      await auditsSettled(AUDITS_GRACE_MS);
      await redis.quit().catch(() => redis.disconnect());
      await resolved.stop();
    },
  };
}
