import type { RoutesBySegment as Router } from '../routes-by-segment.js';
import type { Context, Middleware } from 'koa';
import { now } from '../../lib/clock.js';
import { ApiError, notFound } from '../../lib/errors.js';
import { MAX_REPLAYS } from '../../lib/webhook-policy.js';
import { asOfEndpoint, findDelivery, loadDeliveries, replayDelivery, unscoredCursorScore, type DeliveryStatus } from '../../streams/webhook-deliveries.js';
import type { WebhookEndpoint } from '../../streams/webhook-endpoints.js';
import type { AppDeps } from '../deps.js';
import { respond } from '../envelope.js';
import { pageRecords, pageRequest } from '../list.js';
import type { AuthState } from '../middleware/auth.js';

type Helpers = { read: Middleware; write: Middleware; endpointOr404: (ctx: Context) => Promise<WebhookEndpoint> };

/** Deliveries of an endpoint: list, one with its attempts, replay. Registered by `registerWebhooks`. */
export function registerWebhookDeliveries(router: Router, deps: AppDeps, { read, write, endpointOr404 }: Helpers): void {
  const { redis, keys } = deps;
  const workspaceIdOf = (ctx: Context) => (ctx.state.auth as AuthState).workspace.id;

  /**
   * @openapi
   * /v1/workspaces/{workspaceSlug}/webhooks/{id}/deliveries:
   *   get:
   *     operationId: listWebhookDeliveries
   *     x-query: WebhookDeliveriesQuery
   *     summary: An endpoint's deliveries
   *     description: Scope `webhooks:read`. One delivery per event sent to the endpoint, newest first by `createdAt`
   *       (when the delivery was made; deliveries made in the same millisecond, the later made first), with `total`;
   *       `status` filters on `pending`, `success`, `failed` or `exhausted`.
   *     tags: [Webhooks]
   *     parameters:
   *       - $ref: '#/components/parameters/workspaceSlug'
   *       - { name: id, in: path, required: true, schema: { type: string } }
   *     responses:
   *       '200':
   *         description: A page of deliveries
   *         content: { application/json: { schema: { $ref: '#/components/schemas/WebhookDeliveryListResponse' } } }
   *       default: { $ref: '#/components/responses/Error' }
   */
  router.get('/v1/workspaces/:workspaceSlug/webhooks/:id/deliveries', read, async (ctx) => {
    // the endpoint first: a malformed or unknown id is 404 whatever the query holds (spec 2.3)
    const endpoint = await endpointOr404(ctx);
    const page = pageRequest<{ status?: DeliveryStatus }>(ctx, 'WebhookDeliveriesQuery');
    const workspaceId = workspaceIdOf(ctx);
    const index = keys.webhookDeliveries(workspaceId, endpoint.id, page.query.status);
    const load = async (ids: string[]) => (await loadDeliveries(redis, keys, workspaceId, ids)).map((d) => d && asOfEndpoint(d, endpoint));
    respond(ctx, 200, await pageRecords(redis, index, page, 'webhookDelivery', load, {
      unscored: (id) => unscoredCursorScore(redis, keys, workspaceId, endpoint.id, id),
    }));
  });

  /**
   * @openapi
   * /v1/workspaces/{workspaceSlug}/webhooks/{id}/deliveries/{deliveryId}:
   *   get:
   *     operationId: getWebhookDelivery
   *     summary: One delivery with every attempt and its event
   *     description: Scope `webhooks:read`. Each attempt keeps its trigger (a scheduled attempt or a replay),
   *       start time, status code, error, duration and the first 4 KB of the response.
   *     tags: [Webhooks]
   *     parameters:
   *       - $ref: '#/components/parameters/workspaceSlug'
   *       - { name: id, in: path, required: true, schema: { type: string } }
   *       - { name: deliveryId, in: path, required: true, schema: { type: string } }
   *     responses:
   *       '200':
   *         description: The delivery
   *         content: { application/json: { schema: { $ref: '#/components/schemas/WebhookDeliveryDetailResponse' } } }
   *       default: { $ref: '#/components/responses/Error' }
   */
  router.get('/v1/workspaces/:workspaceSlug/webhooks/:id/deliveries/:deliveryId', read, async (ctx) => {
    const endpoint = await endpointOr404(ctx);
    const delivery = await findDelivery(redis, keys, workspaceIdOf(ctx), endpoint.id, ctx.params.deliveryId!);
    if (!delivery) throw notFound('Webhook delivery');
    respond(ctx, 200, asOfEndpoint(delivery, endpoint));
  });

  /**
   * @openapi
   * /v1/workspaces/{workspaceSlug}/webhooks/{id}/deliveries/{deliveryId}/replay:
   *   post:
   *     operationId: replayWebhookDelivery
   *     summary: Send a delivery's stored payload once more
   *     description: |
   *       Scope `webhooks:write`. Answers 202 at once; the stored payload goes out as one extra attempt (fresh
   *       `webhook-timestamp` and signature, same `webhook-id` and bytes), whatever the delivery's status. It
   *       does not count toward the ten attempts. A 2xx answer marks a `pending` or `failed` delivery `success`
   *       and cancels its queued retry; an `exhausted` delivery stays `exhausted` (spec 3.2), and a failed
   *       replay leaves any status as it was.
   *       A disabled endpoint is `400 endpoint_disabled`. A delivery is replayed at most 100 times (each replay is
   *       an attempt its detail keeps and lists): the 101st is `409 conflict`.
   *     tags: [Webhooks]
   *     parameters:
   *       - $ref: '#/components/parameters/workspaceSlug'
   *       - { name: id, in: path, required: true, schema: { type: string } }
   *       - { name: deliveryId, in: path, required: true, schema: { type: string } }
   *     responses:
   *       '202':
   *         description: The replay is queued; the delivery as it is now
   *         content: { application/json: { schema: { $ref: '#/components/schemas/WebhookDeliveryResponse' } } }
   *       '400': { $ref: '#/components/responses/Error' }
   *       '404': { $ref: '#/components/responses/Error' }
   *       '409': { $ref: '#/components/responses/Error' }
   *       default: { $ref: '#/components/responses/Error' }
   */
  router.post('/v1/workspaces/:workspaceSlug/webhooks/:id/deliveries/:deliveryId/replay', write, async (ctx) => {
    const endpoint = await endpointOr404(ctx);
    const workspaceId = workspaceIdOf(ctx);
    const outcome = await replayDelivery(redis, keys, workspaceId, endpoint.id, ctx.params.deliveryId!, now());
    if (outcome === 'not_found') throw notFound('Webhook delivery');
    if (outcome === 'disabled') throw new ApiError(400, 'endpoint_disabled', 'The endpoint is disabled; enable it (PATCH enabled: true) before replaying');
    if (outcome === 'exhausted') throw new ApiError(409, 'conflict', `This delivery was replayed ${MAX_REPLAYS} times already, the most a delivery can be`);
    const [delivery] = await loadDeliveries(redis, keys, workspaceId, [ctx.params.deliveryId!]);
    if (!delivery) throw notFound('Webhook delivery');
    respond(ctx, 202, delivery);
  });
}
