import type { RoutesBySegment as Router } from '../routes-by-segment.js';
import type { Context } from 'koa';
import { codePoints } from '../../lib/code-points.js';
import { notFound } from '../../lib/errors.js';
import { checkBody } from '../../lib/validator.js';
import { addTopicMembers, removeTopicMembers, topicMemberPage } from '../../streams/topic-members.js';
import { createTopic, deleteTopic, findTopic, loadTopics, updateTopic, type Topic, type TopicInput, type TopicPatch } from '../../streams/topics.js';
import type { AppDeps } from '../deps.js';
import { respond } from '../envelope.js';
import { readBody } from '../read-body.js';
import { badCursor, encodeCursor, pageRecords, pageRequest, scoredCursor } from '../list.js';
import { authorize, refsOf, tenantOf, writerOf, type AuthState } from '../middleware/auth.js';


export function registerTopics(router: Router, deps: AppDeps): void {
  const { redis, keys, config } = deps;
  const read = authorize(deps, 'tenant', 'topics:read');
  const write = authorize(deps, 'tenant', 'topics:write');

  /** Where membership writes go: the subscribers' partitions of the tenant. */
  const tenantScope = (ctx: Context) => ({ workspaceId: (ctx.state.auth as AuthState).workspace.id, tenantId: tenantOf(ctx).id, partitions: config.partitions, maxInboxBacklog: config.inboxMaxBacklog });
  /** The topic the path names, or 404 (a malformed slug too). */
  const topicOf = async (ctx: Context): Promise<Topic> => {
    const topic = await findTopic(redis, keys, tenantOf(ctx).id, ctx.params.topicSlug ?? '');
    if (!topic) throw notFound('Topic');
    return topic;
  };

  /**
   * @openapi
   * /v1/topics:
   *   post:
   *     operationId: createTopic
   *     summary: Create a topic
   *     description: |
   *       Scope `topics:write`. `slug` is 3 to 48 characters matching `^[a-z0-9]+(?:-[a-z0-9]+)*$`, unique in the
   *       tenant (a taken slug is 409 `conflict`) and immutable; it is the topic's address in paths. `name`
   *       (at most 128 characters) and `description` (at most 1,024) are optional. Audited as `topic.created`.
   *     tags: [Topics]
   *     parameters: [{ $ref: '#/components/parameters/serviceTenant' }]
   *     requestBody:
   *       required: true
   *       content: { application/json: { schema: { $ref: '#/components/schemas/TopicCreate' } } }
   *     responses:
   *       '201':
   *         description: The new topic
   *         content: { application/json: { schema: { $ref: '#/components/schemas/TopicResponse' } } }
   *       '400': { $ref: '#/components/responses/Error' }
   *       '401': { $ref: '#/components/responses/Unauthorized' }
   *       '403': { $ref: '#/components/responses/Error' }
   *       '409': { $ref: '#/components/responses/Error' }
   *       default: { $ref: '#/components/responses/Error' }
   *   get:
   *     operationId: listTopics
   *     x-query: ListQuery
   *     summary: List topics
   *     description: Scope `topics:read`. The tenant's topics, newest first, keyset pagination, with `total`.
   *     tags: [Topics]
   *     parameters:
   *       - $ref: '#/components/parameters/serviceTenant'
   *     responses:
   *       '200':
   *         description: A page of topics
   *         content: { application/json: { schema: { $ref: '#/components/schemas/TopicListResponse' } } }
   *       default: { $ref: '#/components/responses/Error' }
   */
  router.post('/v1/topics', write, async (ctx) => {
    const input = checkBody<TopicInput>('TopicCreate', ctx.request.body);
    respond(ctx, 201, await createTopic(redis, keys, refsOf(ctx), input, writerOf(ctx)));
  });

  router.get('/v1/topics', read, async (ctx) => {
    const tenantId = tenantOf(ctx).id;
    const page = pageRequest(ctx);
    respond(ctx, 200, await pageRecords(redis, keys.topicIndex(tenantId), page, 'topic', (ids) => loadTopics(redis, keys, tenantId, ids)));
  });

  /**
   * @openapi
   * /v1/topics/{topicSlug}:
   *   get:
   *     operationId: getTopic
   *     summary: One topic
   *     description: Scope `topics:read`. An unknown or malformed slug, or another tenant's topic, is 404.
   *     tags: [Topics]
   *     parameters:
   *       - $ref: '#/components/parameters/serviceTenant'
   *       - $ref: '#/components/parameters/topicSlug'
   *     responses:
   *       '200':
   *         description: The topic
   *         content: { application/json: { schema: { $ref: '#/components/schemas/TopicResponse' } } }
   *       '404': { $ref: '#/components/responses/Error' }
   *       default: { $ref: '#/components/responses/Error' }
   *   patch:
   *     operationId: updateTopic
   *     summary: Rename or describe a topic
   *     description: Scope `topics:write`. Changes `name` and `description` (null clears one). The slug is
   *       immutable; sending it is a `validation` error naming `slug`. Audited as `topic.updated` with `changes`
   *       and `previousAttributes` when a value actually changes (`updatedAt` moves only then).
   *     tags: [Topics]
   *     parameters:
   *       - $ref: '#/components/parameters/serviceTenant'
   *       - $ref: '#/components/parameters/topicSlug'
   *     requestBody:
   *       required: true
   *       content: { application/json: { schema: { $ref: '#/components/schemas/TopicUpdate' } } }
   *     responses:
   *       '200':
   *         description: The topic after the change
   *         content: { application/json: { schema: { $ref: '#/components/schemas/TopicResponse' } } }
   *       '400': { $ref: '#/components/responses/Error' }
   *       '404': { $ref: '#/components/responses/Error' }
   *       default: { $ref: '#/components/responses/Error' }
   *   delete:
   *     operationId: deleteTopic
   *     summary: Delete a topic
   *     description: Scope `topics:write`. Removes the topic, its slug (free for a new topic) and its member list;
   *       members get no stream event. Segments whose rule names the slug are evaluated again (their backfill
   *       restarts), so the former members leave them. Answers the topic as it was. Audited as `topic.deleted`.
   *     tags: [Topics]
   *     parameters:
   *       - $ref: '#/components/parameters/serviceTenant'
   *       - $ref: '#/components/parameters/topicSlug'
   *     responses:
   *       '200':
   *         description: The deleted topic
   *         content: { application/json: { schema: { $ref: '#/components/schemas/TopicResponse' } } }
   *       '404': { $ref: '#/components/responses/Error' }
   *       default: { $ref: '#/components/responses/Error' }
   */
  router.get('/v1/topics/:topicSlug', read, async (ctx) => {
    respond(ctx, 200, await topicOf(ctx));
  });

  router.patch('/v1/topics/:topicSlug', write, async (ctx) => {
    const patch = readBody<TopicPatch>('TopicUpdate', ctx.request.body, undefined, { slug: 'cannot be changed; create a topic with the new slug and move the members' });
    respond(ctx, 200, await updateTopic(redis, keys, refsOf(ctx), ctx.params.topicSlug ?? '', patch, writerOf(ctx)));
  });

  router.delete('/v1/topics/:topicSlug', write, async (ctx) => {
    respond(ctx, 200, await deleteTopic(redis, keys, refsOf(ctx), ctx.params.topicSlug ?? '', writerOf(ctx)));
  });

  /**
   * @openapi
   * /v1/topics/{topicSlug}/subscribers:
   *   post:
   *     operationId: addTopicSubscribers
   *     summary: Add subscribers to a topic
   *     description: |
   *       Scope `topics:write`. Body `{ externalIds }`, 1 to 1,000 strings of 1 to 256 characters; a repeated id
   *       counts once. An unknown externalId creates the subscriber (`$subscriber.created`). Each subscriber
   *       that was not a member gets `$subscriber.updated` with `data.changes.topics.added: [topicSlug]` on its
   *       stream; one that was keeps its first join time and gets nothing. Retrying a failed call completes it.
   *     tags: [Topics]
   *     parameters:
   *       - $ref: '#/components/parameters/serviceTenant'
   *       - $ref: '#/components/parameters/topicSlug'
   *     requestBody:
   *       required: true
   *       content: { application/json: { schema: { $ref: '#/components/schemas/TopicMembersRequest' } } }
   *     responses:
   *       '200':
   *         description: What the call changed
   *         content: { application/json: { schema: { $ref: '#/components/schemas/TopicMembersAddedResponse' } } }
   *       '400': { $ref: '#/components/responses/Error' }
   *       '404': { $ref: '#/components/responses/Error' }
   *       '409': { $ref: '#/components/responses/Error' }
   *       '429': { $ref: '#/components/responses/LockTimeout' }
   *       default: { $ref: '#/components/responses/Error' }
   *   get:
   *     operationId: listTopicSubscribers
   *     x-query: ListQuery
   *     summary: A topic's members
   *     description: Scope `topics:read`. Newest joined first, keyset pagination, with `total` (the member count).
   *     tags: [Topics]
   *     parameters:
   *       - $ref: '#/components/parameters/serviceTenant'
   *       - $ref: '#/components/parameters/topicSlug'
   *     responses:
   *       '200':
   *         description: A page of members
   *         content: { application/json: { schema: { $ref: '#/components/schemas/TopicMemberListResponse' } } }
   *       '404': { $ref: '#/components/responses/Error' }
   *       default: { $ref: '#/components/responses/Error' }
   */
  router.post('/v1/topics/:topicSlug/subscribers', write, async (ctx) => {
    const { externalIds } = checkBody<{ externalIds: string[] }>('TopicMembersRequest', ctx.request.body);
    const topic = await topicOf(ctx);
    respond(ctx, 200, await addTopicMembers(redis, keys, tenantScope(ctx), topic, externalIds));
  });

  router.get('/v1/topics/:topicSlug/subscribers', read, async (ctx) => {
    const topic = await topicOf(ctx); // 404 first, whatever the query holds (spec 2.3)
    // a cursor of the members of a topic deleted since, the same slug made anew, is another list's
    const { limit, after } = pageRequest(ctx, 'ListQuery', () => topic.id);
    const position = after === null ? null : memberCursor(after);
    const page = await topicMemberPage(redis, keys, tenantOf(ctx).id, topic.id, limit, position);
    respond(ctx, 200, { items: page.items, hasMore: page.next !== null, nextCursor: page.next ? encodeCursor(`${page.next.score}|${page.next.member}`) : null, total: page.total });
  });

  /**
   * @openapi
   * /v1/topics/{topicSlug}/subscribers/remove:
   *   post:
   *     operationId: removeTopicSubscribers
   *     summary: Remove subscribers from a topic
   *     description: |
   *       Scope `topics:write`. Same body as adding (a POST, not a DELETE with a body, which OpenAPI 3.0 clients
   *       drop). Each subscriber that was a member gets `$subscriber.updated` with
   *       `data.changes.topics.removed: [topicSlug]`; others, unknown subscribers included, are counted in
   *       `notMembers` and nothing is written for them (no subscriber is created).
   *     tags: [Topics]
   *     parameters:
   *       - $ref: '#/components/parameters/serviceTenant'
   *       - $ref: '#/components/parameters/topicSlug'
   *     requestBody:
   *       required: true
   *       content: { application/json: { schema: { $ref: '#/components/schemas/TopicMembersRequest' } } }
   *     responses:
   *       '200':
   *         description: What the call changed
   *         content: { application/json: { schema: { $ref: '#/components/schemas/TopicMembersRemovedResponse' } } }
   *       '400': { $ref: '#/components/responses/Error' }
   *       '404': { $ref: '#/components/responses/Error' }
   *       '409': { $ref: '#/components/responses/Error' }
   *       '429': { $ref: '#/components/responses/LockTimeout' }
   *       default: { $ref: '#/components/responses/Error' }
   */
  router.post('/v1/topics/:topicSlug/subscribers/remove', write, async (ctx) => {
    const { externalIds } = checkBody<{ externalIds: string[] }>('TopicMembersRequest', ctx.request.body);
    const topic = await topicOf(ctx);
    respond(ctx, 200, await removeTopicMembers(redis, keys, tenantScope(ctx), topic, externalIds));
  });
}

/** How far ahead of now a member's join time may be in a cursor (clocks of several processes). */
const CURSOR_CLOCK_SLACK_MS = 86_400_000;

/**
 * A members cursor: a join score (microseconds, never far ahead of now) and an externalId (1 to 256
 * characters). Another is no cursor this service issued, 400 like every list's (probe W3: an empty
 * member ended the walk at once, a score from the future started it again from the top).
 */
function memberCursor(after: string): { score: string; member: string } {
  const position = scoredCursor(after);
  const length = codePoints(position.member);
  if (length < 1 || length > 256 || Number(position.score) > (Date.now() + CURSOR_CLOCK_SLACK_MS) * 1000) throw badCursor();
  return position;
}
