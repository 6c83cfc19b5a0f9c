import Koa from 'koa';
import type { AppDeps } from './deps.js';
import { crossOrigin } from './middleware/cross-origin.js';
import { envelopeErrors } from './middleware/errors.js';
import { redisGate } from './middleware/redis-gate.js';
import { RoutesBySegment } from './routes-by-segment.js';
import { registerApps } from './routes/apps.js';
import { registerClient } from './routes/client.js';
import { registerEvents } from './routes/events.js';
import { registerHealth } from './routes/health.js';
import { registerMessages } from './routes/messages.js';
import { registerKeys } from './routes/keys.js';
import { registerOpenApi } from './routes/openapi.js';
import { registerSegments } from './routes/segments.js';
import { registerSources } from './routes/sources.js';
import { registerSubscribers } from './routes/subscribers.js';
import { registerTopics } from './routes/topics.js';
import { registerWebhooks } from './routes/webhooks.js';
import { registerWhoami } from './routes/whoami.js';
import { registerWorkflows } from './routes/workflows.js';

/** The Koa application of the web role. */
export function createApp(deps: AppDeps): Koa {
  // X-Forwarded-For is read from the right, as far as the trusted proxies go: a caller can prepend anything
  const hops = deps.config.trustProxyHops;
  const app = new Koa({ proxy: hops > 0, maxIpsCount: hops });
  const router = new RoutesBySegment();
  registerHealth(router, deps);
  registerOpenApi(router);
  registerKeys(router, deps);
  registerWhoami(router, deps);
  registerEvents(router, deps);
  registerSubscribers(router, deps);
  registerTopics(router, deps);
  registerSegments(router, deps);
  registerWorkflows(router, deps);
  registerSources(router, deps);
  registerApps(router, deps);
  registerClient(router, deps);
  registerWebhooks(router, deps);
  registerMessages(router, deps);

  app.use(envelopeErrors(deps.log));
  app.use(crossOrigin());
  app.use(redisGate(deps.redis));
  app.use(router.middleware());
  return app;
}
