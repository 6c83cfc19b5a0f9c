import { format } from 'node:util';
import { ConfigError, loadConfig, type Role } from '../lib/config.js';
import { createLogger } from '../lib/log.js';
import { startService, type Service } from './service.js';

/**
 * Runs `roles` (default: the configured ones) until SIGTERM, SIGINT or SIGHUP (or, run by npm,
 * until npm is gone), then stops gracefully; an embedded Redis lost for good stops it with one line and exit 1.
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
  // a library's own console warnings are log lines too, JSON on stderr as every other (probe I:
  // ioredis's "[WARN] … does not require a password" came as plain text, twice)
  console.warn = (...args: unknown[]) => log.warn('library warning', { message: format(...args) });
  // Every signal is handled, from the start on and not only the first: Ctrl-C in a terminal reaches
  // `npm start` and this process together, and npm forwards its own copy, so a second SIGINT arrives
  // at once; left to Node's default it would end the process mid-stop, cutting the requests in
  // flight. One arriving while the service starts (Redis still being waited for) stops it once the
  // start ends, with exit 0: it ended the process silently with the signal's own status (probe V).
  let service: Service | null = null;
  let stopping = false;
  let exitCode = 0;
  const starting = new AbortController(); // ends a wait for the embedded Redis loading its data
  const shutdown = async (signal: string) => {
    if (stopping) return void log.info('already stopping', { signal });
    stopping = true;
    starting.abort();
    log.info('stopping', { signal });
    const force = setTimeout(() => process.exit(1), 15_000);
    force.unref();
    if (service === null) return; // still starting: stopped as the start ends (below)
    await service.stop();
    process.exit(exitCode);
  };
  process.on('SIGTERM', () => void shutdown('SIGTERM'));
  process.on('SIGINT', () => void shutdown('SIGINT'));
  // a terminal closed (an ssh session dropped) under `npm start`: Node's default ended the process
  // at once, no graceful stop, its claims and in-flight work not given back (probe EJ)
  process.on('SIGHUP', () => void shutdown('SIGHUP'));
  if (config.stopWithParent) watchParent(() => void shutdown('parent gone'));
  let started: Service;
  try {
    started = await startService(config, active, log, starting.signal);
  } catch (err) {
    if (stopping) process.exit(0); // asked to stop: nothing is left running
    process.stderr.write(`herald: ${err instanceof ConfigError ? err.message : `cannot start: ${(err as Error).message}`}\n`);
    process.exit(1);
  }
  service = started;
  if (stopping) {
    await service.stop();
    process.exit(0);
  }
  // the embedded Redis died and could not be started again: one line, and exit 1 for a supervisor to act on
  void service.lost.then((err) => {
    if (stopping) return;
    process.stderr.write(`herald: ${err.message}\n`);
    exitCode = 1;
    void shutdown('redis lost');
  });
}

/** How often a process run by npm checks that npm still runs. */
const PARENT_CHECK_MS = 200;

/**
 * Calls `gone` once the parent process is gone (this process re-parented): `npm start` killed with
 * SIGKILL forwards no signal, and the service went on, holding its port and the embedded Redis, so the
 * next `npm start` on that port failed (probe EE). The stop then closes the port first (bin/service.ts).
 */
function watchParent(gone: () => void): void {
  const parent = process.ppid;
  const timer = setInterval(() => {
    if (process.ppid === parent) return;
    clearInterval(timer);
    gone();
  }, PARENT_CHECK_MS);
  timer.unref();
}
