import { readFileSync, statSync, unlinkSync, writeFileSync } from 'node:fs';

// Pid files and the start lock of the embedded redis-server (streams/embedded-redis.ts).

/** True while a process with this pid exists. */
export function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'EPERM';
  }
}

/** The pid written in `file`, or null. */
export function ownerOf(file: string): number | null {
  try {
    const pid = Number(readFileSync(file, 'utf8').trim());
    return Number.isInteger(pid) && pid > 0 ? pid : null;
  } catch {
    return null;
  }
}

/** The longest a process may hold the start lock (starting redis-server waits up to 10 s for its first answer; the load of its data is waited for after the lock is released); an older lock is stale. */
const START_LOCK_STALE_MS = 20_000;

/**
 * Runs `fn` holding the lock file `lock` (created exclusively, holding this pid); waits while
 * another live process holds it, for at most START_LOCK_STALE_MS plus a margin. A lock whose
 * holder is gone (SIGKILLed while starting) or older than START_LOCK_STALE_MS is removed.
 */
export async function withStartLock<T>(lock: string, fn: () => Promise<T>): Promise<T> {
  const deadline = Date.now() + START_LOCK_STALE_MS + 5_000;
  for (;;) {
    if (Date.now() > deadline) throw new Error(`the embedded redis-server's start lock ${lock} was not released within ${(START_LOCK_STALE_MS + 5_000) / 1000} s`);
    try {
      writeFileSync(lock, `${process.pid}\n`, { flag: 'wx' });
      break;
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
    }
    const holder = ownerOf(lock);
    let age = 0;
    try {
      age = Date.now() - statSync(lock).mtimeMs;
    } catch {
      continue; // released meanwhile
    }
    // a holder that is gone, or a lock too old (an empty one: its writer died between creating and writing it)
    if ((holder !== null && !alive(holder)) || age > START_LOCK_STALE_MS || (holder === null && age > 1_000)) {
      // only while it still names that holder: another waiter may have removed it and taken the lock since
      if (ownerOf(lock) === holder) {
        try {
          unlinkSync(lock);
        } catch {
          // removed by another waiter
        }
      }
      continue;
    }
    await new Promise((r) => setTimeout(r, 50));
  }
  try {
    return await fn();
  } finally {
    try {
      unlinkSync(lock);
    } catch {
      // nothing to release
    }
  }
}
