import Router from '@koa/router';
import type { Middleware } from 'koa';

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
      router = new Router();
      this.routers.set(segment, router);
    }
    return router;
  }

  private add(method: Method, path: string, handlers: Handler[]): this {
    (this.routerFor(path)[method] as (path: string, ...h: Handler[]) => unknown)(path, ...handlers);
    return this;
  }

  get(path: string, ...handlers: Handler[]): this { return this.add('get', path, handlers); }
  post(path: string, ...handlers: Handler[]): this { return this.add('post', path, handlers); }
  put(path: string, ...handlers: Handler[]): this { return this.add('put', path, handlers); }
  patch(path: string, ...handlers: Handler[]): this { return this.add('patch', path, handlers); }
  delete(path: string, ...handlers: Handler[]): this { return this.add('delete', path, handlers); }

  /** The middleware: the segment's routes, then its 405 answers; other paths fall through (404). */
  middleware(): Middleware {
    const chains = new Map([...this.routers].map(([segment, router]) => {
      const routes = router.routes();
      const allowed = router.allowedMethods({ throw: true });
      return [segment, { routes, allowed }] as const;
    }));
    return (ctx, next) => {
      const chain = chains.get(ctx.path.split('/')[2] ?? '');
      if (!chain) return next();
      return chain.routes(ctx as never, () => chain.allowed(ctx as never, next));
    };
  }
}
