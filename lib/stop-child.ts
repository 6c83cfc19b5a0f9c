import type { ChildProcess } from 'node:child_process';

/**
 * Stops a child process: SIGTERM (a redis-server flushes its append-only file), then SIGKILL after
 * `graceMs`; resolves once it has exited. One already gone resolves at once: exited, or killed by a
 * signal (the OOM killer, kill -9), which leaves exitCode null and signalCode set; its 'exit' has
 * fired, so waiting for it hung the stop (probe V).
 */
export function stopChild(child: ChildProcess, graceMs = 5_000): Promise<void> {
  return new Promise<void>((done) => {
    if (child.exitCode !== null || child.signalCode !== null) return done();
    const timer = setTimeout(() => child.kill('SIGKILL'), graceMs);
    child.once('exit', () => {
      clearTimeout(timer);
      done();
    });
    child.kill('SIGTERM');
  });
}
