import { fileURLToPath, pathToFileURL } from 'node:url';
import Koa from 'koa';
import { spawnNode, stopChild, waitForHttp } from './child.js';
import { freePort } from '../../test/helpers/port.js';

/**
 * The HTTP baseline: a Koa hello-world answering every request `{"hello":"world"}` (JSON, as
 * the service answers). It runs in a child process started exactly like the service under
 * test (`node --import tsx`), so both sides pay the same process and loader costs.
 */
export async function startKoaHello(): Promise<{ url: string; stop: () => Promise<void> }> {
  return startServingChild(fileURLToPath(import.meta.url), '/');
}

/**
 * Starts `script --serve` (a module that calls `listenUntilStopped`) in a child process like the
 * service's, on a free port, and resolves once `probePath` answers.
 */
export async function startServingChild(script: string, probePath: string): Promise<{ url: string; stop: () => Promise<void> }> {
  const port = await freePort();
  const child = spawnNode(script, ['--serve'], { PORT: String(port) });
  const url = `http://127.0.0.1:${port}`;
  try {
    await waitForHttp(`${url}${probePath}`, child);
  } catch (err) {
    child.process.kill('SIGKILL');
    throw err;
  }
  return { url, stop: () => stopChild(child.process) };
}

/** The child's side of `startServingChild`: listens on PORT (keep-alive as the service's) until SIGTERM or SIGINT. */
export function listenUntilStopped(app: Koa): void {
  const server = app.listen(Number(process.env.PORT), '127.0.0.1');
  server.keepAliveTimeout = 65_000; // as the service's
  const stop = () => server.close(() => process.exit(0));
  process.once('SIGTERM', stop);
  process.once('SIGINT', stop);
}

/** The child's side: `node --import tsx bench/lib/koa-hello.ts --serve` with PORT set. */
function serve(): void {
  const app = new Koa();
  app.use((ctx) => {
    ctx.body = { hello: 'world' };
  });
  listenUntilStopped(app);
}

if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href && process.argv[2] === '--serve') serve();
