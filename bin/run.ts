import { ConfigError, loadConfig, type Role } from '../lib/config.js';
import { createLogger } from '../lib/log.js';
import { startService } from './service.js';

/**
 * Runs `roles` (default: the configured ones) until SIGTERM or SIGINT, then stops gracefully.
 * A configuration problem, such as no Redis to be had, is one line on stderr and exit code 1.
 */
export async function run(roles?: Role[]): Promise<void> {
  let config;
  try {
    config = loadConfig();
  } catch (err) {
    process.stderr.write(`herald: ${(err as Error).message}\n`);
    process.exit(1);
  }
  const active = roles ?? config.roles;
  const log = createLogger(config.logLevel, { roles: active, pid: process.pid });
  let service;
  try {
    service = await startService(config, active, log);
  } catch (err) {
    process.stderr.write(`herald: ${err instanceof ConfigError ? err.message : `cannot start: ${(err as Error).message}`}\n`);
    process.exit(1);
  }
  const shutdown = async (signal: string) => {
    log.info('stopping', { signal });
    const force = setTimeout(() => process.exit(1), 15_000);
    force.unref();
    await service.stop();
    process.exit(0);
  };
  process.once('SIGTERM', () => void shutdown('SIGTERM'));
  process.once('SIGINT', () => void shutdown('SIGINT'));
}
