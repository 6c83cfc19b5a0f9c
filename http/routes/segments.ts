import type { RoutesBySegment as Router } from '../routes-by-segment.js';
import type { Context } from 'koa';
import { notFound, type ErrorDetail } from '../../lib/errors.js';
import { validateExpression } from '../../lib/expressions.js';
import {
  createSegment, deleteSegment, findSegment, loadSegments, segmentMemberPage, updateSegment, type Segment, type SegmentInput, type SegmentPatch, type SegmentScope,
} from '../../streams/segments.js';
import type { AppDeps } from '../deps.js';
import { respond } from '../envelope.js';
import { readBody } from '../read-body.js';
import { badCursor, encodeCursor, pageRecords, pageRequest } from '../list.js';
import { isSubscriberPosition } from '../../streams/subscriber-list.js';
import { authorize, refsOf, tenantOf, writerOf } from '../middleware/auth.js';

/** The rule of a segment body, when it has one. */
const whereProblems = (body: Record<string, unknown>): ErrorDetail[] => (body.where === undefined ? [] : validateExpression(body.where, 'where'));

export function registerSegments(router: Router, deps: AppDeps): void {
  const { redis, keys, config } = deps;
  const read = authorize(deps, 'tenant', 'segments:read');
  const write = authorize(deps, 'tenant', 'segments:write');

  const scopeOf = (ctx: Context): SegmentScope => ({ ...refsOf(ctx), partitions: config.partitions });
  /** The segment the path names, or 404 (a malformed slug too). */
  const segmentOf = async (ctx: Context): Promise<Segment> => {
    const segment = await findSegment(redis, keys, tenantOf(ctx).id, config.partitions, ctx.params.segmentSlug ?? '');
    if (!segment) throw notFound('Segment');
    return segment;
  };

  /**
   * @openapi
   * /v1/segments:
   *   post:
   *     operationId: createSegment
   *     summary: Create a segment
   *     description: |
   *       Scope `segments:write`. `slug` is 3 to 48 characters matching `^[a-z0-9]+(?:-[a-z0-9]+)*$`, unique in the
   *       tenant (a taken slug is 409 `conflict`) and immutable. A tenant has at most 100 segments (400 `bad_request`). `where` is the membership rule, an expression
   *       (docs/expressions.md); each problem in it is a `validation` detail naming its path (`where.all[2].count`).
   *       Membership of the existing subscribers is computed by a backfill (`backfill.status` `pending`, then
   *       `running`, then `completed`); the workers keep it current afterwards. Audited as `segment.created`.
   *     tags: [Segments]
   *     parameters: [{ $ref: '#/components/parameters/serviceTenant' }]
   *     requestBody:
   *       required: true
   *       content: { application/json: { schema: { $ref: '#/components/schemas/SegmentCreate' } } }
   *     responses:
   *       '201':
   *         description: The new segment
   *         content: { application/json: { schema: { $ref: '#/components/schemas/SegmentResponse' } } }
   *       '400': { $ref: '#/components/responses/Error' }
   *       '401': { $ref: '#/components/responses/Unauthorized' }
   *       '403': { $ref: '#/components/responses/Error' }
   *       '409': { $ref: '#/components/responses/Error' }
   *       default: { $ref: '#/components/responses/Error' }
   *   get:
   *     operationId: listSegments
   *     x-query: ListQuery
   *     summary: List segments
   *     description: Scope `segments:read`. The tenant's segments, newest first, keyset pagination, with `total`.
   *     tags: [Segments]
   *     parameters:
   *       - $ref: '#/components/parameters/serviceTenant'
   *     responses:
   *       '200':
   *         description: A page of segments
   *         content: { application/json: { schema: { $ref: '#/components/schemas/SegmentListResponse' } } }
   *       default: { $ref: '#/components/responses/Error' }
   */
  router.post('/v1/segments', write, async (ctx) => {
    const input = readBody<SegmentInput>('SegmentCreate', ctx.request.body, whereProblems);
    respond(ctx, 201, await createSegment(redis, keys, scopeOf(ctx), input, writerOf(ctx)));
  });

  router.get('/v1/segments', read, async (ctx) => {
    const tenantId = tenantOf(ctx).id;
    const page = pageRequest(ctx);
    respond(ctx, 200, await pageRecords(redis, keys.segmentIndex(tenantId), page, 'segment', (ids) => loadSegments(redis, keys, tenantId, config.partitions, ids)));
  });

  /**
   * @openapi
   * /v1/segments/{segmentSlug}:
   *   get:
   *     operationId: getSegment
   *     summary: One segment
   *     description: |
   *       Scope `segments:read`. With its member count and backfill progress. An unknown or malformed slug,
   *       or another tenant's segment, is 404.
   *     tags: [Segments]
   *     parameters:
   *       - $ref: '#/components/parameters/serviceTenant'
   *       - $ref: '#/components/parameters/segmentSlug'
   *     responses:
   *       '200':
   *         description: The segment
   *         content: { application/json: { schema: { $ref: '#/components/schemas/SegmentResponse' } } }
   *       '404': { $ref: '#/components/responses/Error' }
   *       default: { $ref: '#/components/responses/Error' }
   *   patch:
   *     operationId: updateSegment
   *     summary: Change a segment
   *     description: |
   *       Scope `segments:write`. Changes `name`, `description` (null clears one) and `where`. A new `where`
   *       restarts the backfill (`pending`); members stay as they were until it re-evaluates them. The slug is
   *       immutable; sending it is a `validation` error naming `slug`. Audited as `segment.updated` with `changes`
   *       and `previousAttributes` when a value actually changes (`updatedAt` moves only then).
   *     tags: [Segments]
   *     parameters:
   *       - $ref: '#/components/parameters/serviceTenant'
   *       - $ref: '#/components/parameters/segmentSlug'
   *     requestBody:
   *       required: true
   *       content: { application/json: { schema: { $ref: '#/components/schemas/SegmentUpdate' } } }
   *     responses:
   *       '200':
   *         description: The segment after the change
   *         content: { application/json: { schema: { $ref: '#/components/schemas/SegmentResponse' } } }
   *       '400': { $ref: '#/components/responses/Error' }
   *       '404': { $ref: '#/components/responses/Error' }
   *       default: { $ref: '#/components/responses/Error' }
   *   delete:
   *     operationId: deleteSegment
   *     summary: Delete a segment
   *     description: |
   *       Scope `segments:write`. Removes the segment, its slug (free for a new segment), its members and
   *       its backfill; members get no stream event. Answers the segment as it was. Audited as `segment.deleted`.
   *     tags: [Segments]
   *     parameters:
   *       - $ref: '#/components/parameters/serviceTenant'
   *       - $ref: '#/components/parameters/segmentSlug'
   *     responses:
   *       '200':
   *         description: The deleted segment
   *         content: { application/json: { schema: { $ref: '#/components/schemas/SegmentResponse' } } }
   *       '404': { $ref: '#/components/responses/Error' }
   *       default: { $ref: '#/components/responses/Error' }
   */
  router.get('/v1/segments/:segmentSlug', read, async (ctx) => {
    respond(ctx, 200, await segmentOf(ctx));
  });

  router.patch('/v1/segments/:segmentSlug', write, async (ctx) => {
    const patch = readBody<SegmentPatch>('SegmentUpdate', ctx.request.body, whereProblems, { slug: 'cannot be changed; create a segment with the new slug' });
    respond(ctx, 200, await updateSegment(redis, keys, scopeOf(ctx), ctx.params.segmentSlug ?? '', patch, writerOf(ctx)));
  });

  router.delete('/v1/segments/:segmentSlug', write, async (ctx) => {
    respond(ctx, 200, await deleteSegment(redis, keys, scopeOf(ctx), ctx.params.segmentSlug ?? '', writerOf(ctx)));
  });

  /**
   * @openapi
   * /v1/segments/{segmentSlug}/members:
   *   get:
   *     operationId: listSegmentMembers
   *     x-query: ListQuery
   *     summary: A segment's members
   *     description: |
   *       Scope `segments:read`. The subscribers in the segment now, newest subscriber first (by when the
   *       subscriber was created, as `GET /v1/subscribers` lists them), keyset pagination, with `total` (the member count). Membership is kept by the workers: it follows
   *       events within moments, and the backfill must be `completed` for subscribers that existed before the rule.
   *     tags: [Segments]
   *     parameters:
   *       - $ref: '#/components/parameters/serviceTenant'
   *       - $ref: '#/components/parameters/segmentSlug'
   *     responses:
   *       '200':
   *         description: A page of members
   *         content: { application/json: { schema: { $ref: '#/components/schemas/SubscriberListResponse' } } }
   *       '404': { $ref: '#/components/responses/Error' }
   *       default: { $ref: '#/components/responses/Error' }
   */
  router.get('/v1/segments/:segmentSlug/members', read, async (ctx) => {
    const segment = await segmentOf(ctx); // 404 first, whatever the query holds (spec 2.3)
    // a cursor of a segment deleted since, the same slug made anew, is another list's
    const { limit, after } = pageRequest(ctx, 'ListQuery', () => segment.id);
    // the position is a member, `<sub_ id>|<externalId>`: anything else is another list's cursor (or forged)
    if (after !== null && !isSubscriberPosition(after)) throw badCursor();
    const page = await segmentMemberPage(redis, keys, scopeOf(ctx), segment.id, limit, after);
    respond(ctx, 200, { items: page.items, hasMore: page.next !== null, nextCursor: page.next === null ? null : encodeCursor(page.next), total: page.total });
  });
}
