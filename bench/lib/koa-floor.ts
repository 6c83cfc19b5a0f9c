import { fileURLToPath, pathToFileURL } from 'node:url';
import Koa from 'koa';
import { respond } from '../../http/envelope.js';
import { envelopeErrors } from '../../http/middleware/errors.js';
import { RoutesBySegment } from '../../http/routes-by-segment.js';
import { createLogger } from '../../lib/log.js';
import { listenUntilStopped, startServingChild } from './koa-hello.js';

/**
 * The stack floor of the auth bench: Herald's own request-id/error middleware, router and envelope
 * (the pieces every route goes through), with no authentication and no Redis, answering
 * `GET /v1/whoami` the body the service answers (a constant). What the service costs above this is
 * authentication and the route itself; what this costs above the Koa hello-world is the stack.
 * It runs in a child process started like the service (`node --import tsx`).
 */
export async function startKoaFloor(): Promise<{ url: string; stop: () => Promise<void> }> {
  return startServingChild(fileURLToPath(import.meta.url), '/v1/whoami');
}

const WHOAMI = {
  kind: 'tenant', keyId: 'key_01m85tazena0dqvre022vdzbtt', scopes: ['*'],
  workspace: { id: 'ws_01m85tazdy7xh61javpk1dqmk2', slug: 'bench-auth' }, tenant: { id: 'tnt_01m85tazefgy9ps8q0kvawnwnq', slug: 'default' }, expiresAt: null,
};

/** The child's side: `node --import tsx bench/lib/koa-floor.ts --serve` with PORT set. */
function serve(): void {
  const app = new Koa({ proxy: true });
  const router = new RoutesBySegment();
  router.get('/v1/whoami', (ctx) => respond(ctx, 200, { ...WHOAMI }));
  app.use(envelopeErrors(createLogger('error')));
  app.use(router.middleware());
  listenUntilStopped(app);
}

if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href && process.argv[2] === '--serve') serve();
