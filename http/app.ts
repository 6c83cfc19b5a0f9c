import Koa from 'koa';
import { HttpMethodEnum, koaBody } from 'koa-body';
import type { Context, Next } from 'koa';
import { ApiError } from '../lib/errors.js';
import type { AppDeps } from './deps.js';
import { envelopeErrors } from './middleware/errors.js';
import { RoutesBySegment } from './routes-by-segment.js';
import { registerApps } from './routes/apps.js';
import { registerClient } from './routes/client.js';
import { registerEvents } from './routes/events.js';
import { registerHealth } from './routes/health.js';
import { registerMessages } from './routes/messages.js';
import { registerKeys } from './routes/keys.js';
import { registerOpenApi } from './routes/openapi.js';
import { registerSegments } from './routes/segments.js';
import { registerSubscribers } from './routes/subscribers.js';
import { registerTopics } from './routes/topics.js';
import { registerWebhooks } from './routes/webhooks.js';
import { registerWhoami } from './routes/whoami.js';
import { registerWorkflows } from './routes/workflows.js';

/**
 * Request bodies: none read for GET and HEAD (one step, no parsing); otherwise JSON only (anything
 * else with a body is 415), parsed by koa-body within the size limit.
 */
function jsonBodies(deps: AppDeps) {
  const parse = koaBody({ json: true, urlencoded: false, text: false, multipart: false, jsonLimit: deps.config.bodyLimitBytes, jsonStrict: true, parsedMethods: [HttpMethodEnum.POST, HttpMethodEnum.PUT, HttpMethodEnum.PATCH, HttpMethodEnum.DELETE] });
  return function bodies(ctx: Context, next: Next): Promise<void> {
    if (ctx.method === 'GET' || ctx.method === 'HEAD') return next();
    const hasBody = Number(ctx.get('Content-Length') || 0) > 0 || Boolean(ctx.get('Transfer-Encoding'));
    if (hasBody && ['POST', 'PUT', 'PATCH', 'DELETE'].includes(ctx.method) && !ctx.is('application/json', '+json')) {
      throw new ApiError(415, 'unsupported_media_type', 'Send the request body as application/json');
    }
    return parse(ctx, next) as Promise<void>;
  };
}

/** The Koa application of the web role. */
export function createApp(deps: AppDeps): Koa {
  const app = new Koa({ proxy: true });
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
  registerApps(router, deps);
  registerClient(router, deps);
  registerWebhooks(router, deps);
  registerMessages(router, deps);

  app.use(envelopeErrors(deps.log));
  app.use(jsonBodies(deps));
  app.use(router.middleware());
  return app;
}
