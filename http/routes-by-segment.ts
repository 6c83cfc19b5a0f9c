import Router from '@koa/router';
import compose from 'koa-compose';
import type { Context, Middleware, Next } from 'koa';
import { ApiError } from '../lib/errors.js';
import { respond } from './envelope.js';

type Method = 'get' | 'post' | 'put' | 'patch' | 'delete';
// eslint-style any: route handlers keep @koa/router's context typing (params, state)
type Handler = Router.Middleware<any, any>;

/**
 * Where route modules register their routes: one @koa/router per first path segment after `/v1/`
 * (`events`, `subscribers`, `client`…), so a request is matched against the dozen routes of its
 * resource instead of all of them (router matching is linear in the number of routes).
 */
export class RoutesBySegment {
  private readonly routers = new Map<string, Router>();

  private routerFor(path: string): Router {
    const segment = path.split('/')[2] ?? '';
    let router = this.routers.get(segment);
    if (!router) {
      // paths are case-sensitive (RFC 3986 6.2.2.1): `/V1/events` is not `/v1/events` (probe D1: the
      // `/V1` prefix matched, since @koa/router ignores case by default, while `/v1/Events` did not)
      router = new Router({ sensitive: true });
      this.routers.set(segment, router);
    }
    return router;
  }

  private add(method: Method, path: string, handlers: Handler[]): this {
    const router = this.routerFor(path);
    // a path parameter that is not valid percent-encoding is refused once the caller is authenticated
    // and authorized (or at once on a route without credentials)
    const at = handlers.reduce((last, handler, i) => (authenticating.has(handler) ? i + 1 : last), 0);
    const chain = path.includes('/:') ? [...handlers.slice(0, at), refuseMalformedParams, ...handlers.slice(at)] : handlers;
    (router[method] as (path: string, ...h: Handler[]) => unknown)(path, ...chain);
    const layer = router.stack[router.stack.length - 1] as unknown as ParamLayer;
    layer.params = (_path, captures, params = {}) => pathParams(layer.paramNames, captures, params);
    return this;
  }

  get(path: string, ...handlers: Handler[]): this { return this.add('get', path, handlers); }
  post(path: string, ...handlers: Handler[]): this { return this.add('post', path, handlers); }
  put(path: string, ...handlers: Handler[]): this { return this.add('put', path, handlers); }
  patch(path: string, ...handlers: Handler[]): this { return this.add('patch', path, handlers); }
  delete(path: string, ...handlers: Handler[]): this { return this.add('delete', path, handlers); }

  /**
   * The middleware: the segment's routes; other paths fall through (404).
   * A request that matches exactly one route (every request the API answers) runs that route's
   * handlers composed once, at start-up, after @koa/router's own match and params: its generic
   * dispatch composes a new chain on every request, which cost a quarter of a cheap route's
   * throughput (docs/architecture.md). A path whose routes take other methods answers 405
   * `method_not_allowed` with an `Allow` header, and OPTIONS with `Allow` in the envelope.
   */
  middleware(): Middleware {
    const chains = new Map([...this.routers].map(([segment, router]) => {
      const composed = new Map(router.stack.map((layer) => [layer, compose(layer.stack as Middleware[])]));
      return [segment, { router, composed, dispatch: router.routes() }] as const;
    }));
    return (ctx, next) => {
      const path = ctx.path ?? ''; // null for a CONNECT's authority form (`host:port`)
      const chain = chains.get(path.split('/')[2] ?? '');
      if (!chain) return next();
      const matched = chain.router.match(path, ctx.method);
      // a path that a route names outright is that route's, not also a `:param` route's
      // (`webhooks/catalog`, not the endpoint `catalog`: PATCH there was 404 for an endpoint, and its
      // Allow listed PATCH and DELETE; probe DC), as OpenAPI matches a fixed path first
      const routes = mostLiteral(matched.path as unknown as PathLayer[]);
      const taking = routes.length === matched.path.length ? matched.pathAndMethod : matched.pathAndMethod.filter((layer) => routes.includes(layer as unknown as PathLayer));
      if (taking.length === 0) return otherMethod(ctx, next, routes);
      const only = taking.length === 1 ? taking[0]! : undefined;
      const run = only && chain.composed.get(only);
      if (!only || !run) return chain.dispatch(ctx as never, next);
      (ctx as { params?: Record<string, string | undefined> }).params = only.params(path, only.captures(path), {});
      return run(ctx, next);
    };
  }
}

type ParamLayer = {
  paramNames: { name: string }[];
  params: (path: string, captures: string[], params?: Record<string, string>) => Record<string, string>;
};

/**
 * The middlewares that authenticate and authorize a request (http/middleware/auth.ts `authorize`):
 * a route's handlers after them see its path parameters checked (`refuseMalformedParams`).
 */
export const authenticating = new WeakSet<object>();

/** Where `pathParams` names a parameter that is not valid percent-encoding (the params object's own, hidden). */
const MALFORMED = Symbol('malformed path parameter');

/**
 * A route's path parameters, percent-decoded as a URL path is (RFC 3986): `+` stays `+`.
 * @koa/router decodes them as a form-encoded query, `+` as a space, so `/v1/subscribers/jane+doe`
 * addressed the subscriber `jane doe`. A capture that is not valid percent-encoding is a malformed
 * id: 404 (spec 2.3). It was kept as it is, as @koa/router does, which reached the subscriber whose
 * externalId is that raw text (any text can be one): `/v1/subscribers/50%off` deleted `50%off`,
 * whose path is `/v1/subscribers/50%25off` (probe BM). The 404 comes after the credential's checks
 * (`refuseMalformedParams`), as for any other id that names nothing: answered while routing, a
 * request without a credential got 404, not 401 (probe M); until then the parameter reads empty.
 */
function pathParams(names: { name: string }[], captures: string[], params: Record<string, string> = {}): Record<string, string> {
  for (let i = 0; i < captures.length; i++) {
    const name = names[i]?.name;
    const raw = captures[i];
    if (name === undefined || !raw) continue;
    try {
      params[name] = decodeURIComponent(raw);
    } catch {
      params[name] = '';
      (params as Record<symbol, string>)[MALFORMED] ??= name;
    }
  }
  return params;
}

/** 404 for a path parameter `pathParams` could not decode. */
function refuseMalformedParams(ctx: Context, next: Next): Promise<void> {
  const name = (ctx.params as Record<symbol, string> | undefined)?.[MALFORMED];
  if (name !== undefined) throw new ApiError(404, 'not_found', `No resource at this path: its ${name} is not valid percent-encoding`, { param: name });
  return next();
}

type PathLayer = { path: string; methods: string[] };

/** The routes among `layers` (all matching one path) with the most literal segments (fewest `:param`s). */
function mostLiteral(layers: PathLayer[]): PathLayer[] {
  if (layers.length < 2) return layers;
  const params = layers.map((layer) => layer.path.split('/').filter((segment) => segment.startsWith(':')).length);
  const fewest = Math.min(...params);
  return layers.filter((_, i) => params[i] === fewest);
}

/** No route takes this method on this path: 404 when none has the path, else OPTIONS or 405 with `Allow`. */
function otherMethod(ctx: Context, next: Next, layers: { methods: string[] }[]): Promise<void> {
  if (layers.length === 0) return next();
  const allow = [...new Set(layers.flatMap((layer) => layer.methods)), 'OPTIONS'];
  ctx.set('Allow', allow.join(', '));
  if (ctx.method === 'OPTIONS') {
    respond(ctx, 200, { allow });
    return Promise.resolve();
  }
  throw new ApiError(405, 'method_not_allowed', `${ctx.method} is not allowed on this path; it takes ${allow.join(', ')}`);
}
