/** Waits that an AbortSignal cuts short (a stopping consumer, a fan-out taken over, a closed sender). */
import { setMaxListeners } from 'node:events';

/**
 * A controller whose signal many waits listen on at once (a fan-out's pushes, a sender's retries):
 * each wait here adds a listener and removes it when it ends, so more than ten at a time is no leak
 * and must not print Node's MaxListenersExceededWarning (probe BE).
 */
export function sharedAbortController(): AbortController {
  const controller = new AbortController();
  setMaxListeners(0, controller.signal);
  return controller;
}

/** Resolves after `ms`, or at once when one of `signals` aborts (already aborted: at once). */
export function pause(ms: number, ...signals: (AbortSignal | undefined)[]): Promise<void> {
  const live = signals.filter((s): s is AbortSignal => s !== undefined);
  return new Promise((done) => {
    if (live.some((s) => s.aborted)) return done();
    const timer = setTimeout(finish, ms);
    function finish() {
      clearTimeout(timer);
      for (const s of live) s.removeEventListener('abort', finish);
      done();
    }
    for (const s of live) s.addEventListener('abort', finish, { once: true });
  });
}

export const ABORTED = Symbol('aborted');

/** `work`'s result, or ABORTED as soon as `signal` aborts (at once when it already has); `work` goes on either way. */
export function untilAborted<T>(work: Promise<T>, signal?: AbortSignal): Promise<T | typeof ABORTED> {
  if (!signal) return work;
  if (signal.aborted) return Promise.resolve(ABORTED);
  return new Promise((resolve, reject) => {
    const aborted = () => resolve(ABORTED);
    signal.addEventListener('abort', aborted, { once: true });
    work.then((value) => {
      signal.removeEventListener('abort', aborted);
      resolve(value);
    }, (err: unknown) => {
      signal.removeEventListener('abort', aborted);
      reject(err);
    });
  });
}
