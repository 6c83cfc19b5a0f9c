import { fork, type ChildProcess } from 'node:child_process';
import { ROOT, stopChild } from './child.js';

/**
 * A bench helper process that talks to the bench over Node's IPC channel (`process.send`): the
 * APNs peer and the bare HTTP/2 client run this way, each on its own process (and so its own core
 * when the scheduler has one) instead of in the bench's event loop. Its stdout is discarded (it
 * could otherwise follow the JSON line), the tail of its stderr is kept for error messages, and it
 * is killed when the bench process exits, like the children of `child.ts`.
 */
export type IpcMessage = { type: string; [key: string]: unknown };

export type IpcChild = {
  process: ChildProcess;
  stderr: () => string;
  /** the next message of `type` (or one already received and not yet taken) */
  next: <T extends IpcMessage>(type: string, timeoutMs?: number) => Promise<T>;
  send: (message: IpcMessage) => void;
  /** sends `message` and resolves with the next message of `replyType` */
  request: <T extends IpcMessage>(message: IpcMessage, replyType: string, timeoutMs?: number) => Promise<T>;
  stop: () => Promise<void>;
};

const live = new Set<ChildProcess>();
let hooked = false;

export function forkIpc(script: string, args: string[] = [], env: Record<string, string> = {}): IpcChild {
  const child = fork(script, args, {
    cwd: ROOT,
    execArgv: ['--import', 'tsx'],
    env: { ...process.env, ...env },
    stdio: ['ignore', 'ignore', 'pipe', 'ipc'],
  });
  live.add(child);
  child.once('exit', () => live.delete(child));
  if (!hooked) {
    hooked = true;
    process.once('exit', () => {
      for (const c of live) c.kill('SIGKILL');
    });
  }
  let tail = '';
  child.stderr!.on('data', (chunk: Buffer) => {
    tail = (tail + chunk.toString()).slice(-4000);
  });
  const inbox: IpcMessage[] = [];
  const waiters: { type: string; done: (m: IpcMessage) => void }[] = [];
  child.on('message', (raw) => {
    const message = raw as IpcMessage;
    const i = waiters.findIndex((w) => w.type === message.type);
    if (i >= 0) waiters.splice(i, 1)[0]!.done(message);
    else inbox.push(message);
  });
  let exited: string | null = null;
  const failures = new Set<(err: Error) => void>();
  child.once('exit', (code, signal) => {
    exited = String(code ?? signal);
    for (const fail of failures) fail(new Error(`${script} exited (${exited}):\n${tail.trim()}`));
  });

  const next = <T extends IpcMessage>(type: string, timeoutMs = 30_000): Promise<T> => {
    const i = inbox.findIndex((m) => m.type === type);
    if (i >= 0) return Promise.resolve(inbox.splice(i, 1)[0] as T);
    if (exited !== null) return Promise.reject(new Error(`${script} exited (${exited}):\n${tail.trim()}`));
    return new Promise<T>((done, fail) => {
      const waiter = {
        type,
        done: (m: IpcMessage) => {
          clearTimeout(timer);
          failures.delete(onExit);
          done(m as T);
        },
      };
      const onExit = (err: Error) => {
        clearTimeout(timer);
        fail(err);
      };
      const timer = setTimeout(() => {
        const at = waiters.indexOf(waiter);
        if (at >= 0) waiters.splice(at, 1);
        failures.delete(onExit);
        fail(new Error(`${script}: no "${type}" message within ${timeoutMs} ms:\n${tail.trim()}`));
      }, timeoutMs);
      waiters.push(waiter);
      failures.add(onExit);
    });
  };
  const send = (message: IpcMessage) => {
    if (child.connected) child.send(message);
  };
  return {
    process: child,
    stderr: () => tail.trim(),
    next,
    send,
    request: <T extends IpcMessage>(message: IpcMessage, replyType: string, timeoutMs?: number) => {
      const reply = next<T>(replyType, timeoutMs);
      send(message);
      return reply;
    },
    stop: () => stopChild(child),
  };
}

/** In the child: answers the parent's messages; the child exits when the parent goes away. */
export function serveParent(handler: (message: IpcMessage) => unknown | Promise<unknown>, onExit: () => Promise<void> | void = () => undefined): void {
  let stopping = false;
  const stop = async () => {
    if (stopping) return;
    stopping = true;
    try {
      await onExit();
    } finally {
      process.exit(0);
    }
  };
  process.on('message', (raw) => {
    Promise.resolve(handler(raw as IpcMessage)).catch((err: Error) => {
      process.stderr.write(`${err.stack ?? err.message}\n`);
      process.exit(1);
    });
  });
  process.once('disconnect', () => void stop());
  process.once('SIGTERM', () => void stop());
  process.once('SIGINT', () => void stop());
}

/** In the child: one message to the parent. */
export function tellParent(message: IpcMessage): void {
  process.send?.(message);
}
