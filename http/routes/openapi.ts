import type { RoutesBySegment as Router } from '../routes-by-segment.js';
import { buildOpenApi } from '../openapi.js';

export function registerOpenApi(router: Router): void {
  const document = buildOpenApi();
  const body = JSON.stringify(document);
  /**
   * @openapi
   * /v1/openapi.json:
   *   get:
   *     operationId: getOpenApi
   *     summary: This OpenAPI document
   *     description: No credential. The bare OpenAPI 3.0 document (not wrapped in the envelope), generated at start-up from the running code.
   *     tags: [Health]
   *     security: []
   *     responses:
   *       '200':
   *         description: The document
   *         content: { application/json: { schema: { type: object } } }
   */
  router.get('/v1/openapi.json', (ctx) => {
    ctx.type = 'application/json';
    ctx.body = body;
  });
}
