import type { RoutesBySegment as Router } from '../routes-by-segment.js';
import type { Context } from 'koa';
import { checkBody } from '../../lib/validator.js';
import { isId } from '../../lib/ids.js';
import { deleteSubscriber, getSubscriber, upsertSubscriber, type Attributes } from '../../streams/subscribers.js';
import { isSubscriberPosition, listSubscribers } from '../../streams/subscriber-list.js';
import { getPreferences, updatePreferences, type PreferencesUpdate } from '../../streams/preferences.js';
import { listSubscriptions, removeSubscription, setSubscriptionEnabled, getSubscription } from '../../streams/subscriptions.js';
import { AuditTrail } from '../../streams/subscriber-audit.js';
import { subscriberTopicPage } from '../../streams/topic-members.js';
import { loadTopics, type Topic } from '../../streams/topics.js';
import type { TenantScope } from '../../streams/subscriber-writes.js';
import { auditScopeOf } from '../audit.js';
import type { AppDeps } from '../deps.js';
import { externalIdParam } from '../params.js';
import { respond } from '../envelope.js';
import { badCursor, encodeCursor, pageList, pageRequest } from '../list.js';
import { authorize, type AuthState } from '../middleware/auth.js';

/** The tenant scope of subscriber writes for the current request. */
export function scopeOf(ctx: Context, deps: AppDeps): TenantScope {
  const { workspace, tenant } = ctx.state.auth as AuthState;
  return { workspaceId: workspace.id, tenantId: tenant!.id, partitions: deps.config.partitions, maxInboxBacklog: deps.config.inboxMaxBacklog };
}

/** Where the current request's subscriber writes settle their audit entries (each write records its own). */
export function auditTrailOf(ctx: Context, deps: AppDeps): AuditTrail {
  return new AuditTrail(deps.redis, deps.keys, auditScopeOf(ctx), deps.log);
}

export function registerSubscribers(router: Router, deps: AppDeps): void {
  const { redis, keys } = deps;

  /**
   * @openapi
   * /v1/subscribers:
   *   post:
   *     operationId: upsertSubscriber
   *     summary: Create or update a subscriber
   *     description: Scope `subscribers:write`. Creates the subscriber `externalId` (201, `$subscriber.created` on its stream)
   *       or updates its attributes (200, `$subscriber.updated` with the changed fields, only when something changed).
   *       `properties` merge key by key; a null value removes an attribute or a property. The merged `properties` must stay
   *       within 8 KB serialized (400 `validation` on `properties` otherwise, nothing stored); `$subscriber.updated` carries only
   *       the changed property keys.
   *     tags: [Subscribers]
   *     parameters: [{ $ref: '#/components/parameters/serviceTenant' }]
   *     requestBody: { required: true, content: { application/json: { schema: { $ref: '#/components/schemas/SubscriberUpsert' } } } }
   *     responses:
   *       '200': { description: Updated (or unchanged), content: { application/json: { schema: { $ref: '#/components/schemas/SubscriberResponse' } } } }
   *       '201': { description: Created, content: { application/json: { schema: { $ref: '#/components/schemas/SubscriberResponse' } } } }
   *       '409': { $ref: '#/components/responses/Error' }
   *       '429': { $ref: '#/components/responses/LockTimeout' }
   *       default: { $ref: '#/components/responses/Error' }
   *   get:
   *     operationId: listSubscribers
   *     x-query: SubscribersQuery
   *     summary: List subscribers
   *     description: Scope `subscribers:read`. Newest first, with `total` under the same filter.
   *     tags: [Subscribers]
   *     parameters:
   *       - $ref: '#/components/parameters/serviceTenant'
   *       - { name: email, in: query, description: Exact email (case-insensitive) }
   *     responses:
   *       '200': { description: A page, content: { application/json: { schema: { $ref: '#/components/schemas/SubscriberListResponse' } } } }
   *       default: { $ref: '#/components/responses/Error' }
   */
  router.post('/v1/subscribers', authorize(deps, 'tenant', 'subscribers:write'), async (ctx) => {
    const { externalId, ...attributes } = checkBody<Attributes & { externalId: string }>('SubscriberUpsert', ctx.request.body);
    const { subscriber, created } = await upsertSubscriber(redis, keys, scopeOf(ctx, deps), externalId, attributes, { create: true, audit: auditTrailOf(ctx, deps) });
    respond(ctx, created ? 201 : 200, subscriber);
  });

  router.get('/v1/subscribers', authorize(deps, 'tenant', 'subscribers:read'), async (ctx) => {
    const { limit, after, query } = pageRequest<{ email?: string }>(ctx, 'SubscribersQuery');
    // the position is an index member, `<sub_ id>|<externalId>`: anything else is another list's cursor (or forged)
    if (after !== null && !isSubscriberPosition(after)) throw badCursor();
    const page = await listSubscribers(redis, keys, scopeOf(ctx, deps), limit, after, { email: query.email });
    respond(ctx, 200, { items: page.items, hasMore: page.next !== null, nextCursor: page.next ? encodeCursor(page.next) : null, total: page.total });
  });

  /**
   * @openapi
   * /v1/subscribers/{externalId}:
   *   parameters:
   *     - $ref: '#/components/parameters/serviceTenant'
   *     - { name: externalId, in: path, required: true, description: "URL-encoded; a longer one is a malformed id: 404 not_found", schema: { type: string, minLength: 1, maxLength: 256 } }
   *   get:
   *     operationId: getSubscriber
   *     summary: One subscriber
   *     description: Scope `subscribers:read`.
   *     tags: [Subscribers]
   *     responses:
   *       '200': { description: The subscriber, content: { application/json: { schema: { $ref: '#/components/schemas/SubscriberResponse' } } } }
   *       default: { $ref: '#/components/responses/Error' }
   *   patch:
   *     operationId: updateSubscriber
   *     summary: Update a subscriber's attributes
   *     description: Scope `subscribers:write`. Writes `$subscriber.updated` with the changed fields (of `properties`, the changed
   *       keys) only when something changed. The merged `properties` must stay within 8 KB serialized (400 `validation` on
   *       `properties` otherwise, nothing stored).
   *     tags: [Subscribers]
   *     requestBody: { required: true, content: { application/json: { schema: { $ref: '#/components/schemas/SubscriberUpdate' } } } }
   *     responses:
   *       '200': { description: The subscriber, content: { application/json: { schema: { $ref: '#/components/schemas/SubscriberResponse' } } } }
   *       '409': { $ref: '#/components/responses/Error' }
   *       '429': { $ref: '#/components/responses/LockTimeout' }
   *       default: { $ref: '#/components/responses/Error' }
   *   delete:
   *     operationId: deleteSubscriber
   *     summary: Delete a subscriber
   *     description: Scope `subscribers:write`. Writes `$subscription.removed` (reason `subscriber_deleted`) for each subscription it held, then `$subscriber.deleted`; removes its attributes, preferences, subscriptions,
   *       topic memberships and widgets; its events age out with the retention. A later event for the externalId creates a new subscriber.
   *       Audited as one `subscription.deleted` for each subscription it held, then `subscriber.deleted`.
   *     tags: [Subscribers]
   *     responses:
   *       '200': { description: The deleted subscriber, content: { application/json: { schema: { $ref: '#/components/schemas/SubscriberResponse' } } } }
   *       '409': { $ref: '#/components/responses/Error' }
   *       '429': { $ref: '#/components/responses/LockTimeout' }
   *       default: { $ref: '#/components/responses/Error' }
   */
  router.get('/v1/subscribers/:externalId', authorize(deps, 'tenant', 'subscribers:read'), async (ctx) => {
    respond(ctx, 200, await getSubscriber(redis, keys, scopeOf(ctx, deps), externalIdParam(ctx)));
  });

  router.patch('/v1/subscribers/:externalId', authorize(deps, 'tenant', 'subscribers:write'), async (ctx) => {
    // the body first, as on every PATCH (probe DL: a malformed path was 404 here, 400 on the others)
    const attributes = checkBody<Attributes>('SubscriberUpdate', ctx.request.body);
    const externalId = externalIdParam(ctx);
    const { subscriber } = await upsertSubscriber(redis, keys, scopeOf(ctx, deps), externalId, attributes, { create: false, audit: auditTrailOf(ctx, deps) });
    respond(ctx, 200, subscriber);
  });

  router.delete('/v1/subscribers/:externalId', authorize(deps, 'tenant', 'subscribers:write'), async (ctx) => {
    const subscriber = await deleteSubscriber(redis, keys, scopeOf(ctx, deps), externalIdParam(ctx), { audit: auditTrailOf(ctx, deps) });
    respond(ctx, 200, subscriber);
  });

  /**
   * @openapi
   * /v1/subscribers/{externalId}/subscriptions:
   *   get:
   *     operationId: listSubscriberSubscriptions
   *     x-query: ListQuery
   *     summary: A subscriber's devices and addresses
   *     description: Scope `subscriptions:read`. A subscriber holds at most 50; newest first, paginated, with `total`.
   *     tags: [Subscriptions]
   *     parameters:
   *       - $ref: '#/components/parameters/serviceTenant'
   *       - { name: externalId, in: path, required: true, description: "URL-encoded; a longer one is a malformed id: 404 not_found", schema: { type: string, minLength: 1, maxLength: 256 } }
   *     responses:
   *       '200': { description: The subscriptions, content: { application/json: { schema: { $ref: '#/components/schemas/SubscriptionListResponse' } } } }
   *       default: { $ref: '#/components/responses/Error' }
   */
  router.get('/v1/subscribers/:externalId/subscriptions', authorize(deps, 'tenant', 'subscriptions:read'), async (ctx) => {
    const scope = scopeOf(ctx, deps);
    const externalId = externalIdParam(ctx);
    const subscriber = await getSubscriber(redis, keys, scope, externalId); // 404 first, whatever the query holds (spec 2.3)
    // a cursor of a subscriber deleted since, the same externalId made anew, is another list's
    const page = pageRequest(ctx, 'ListQuery', () => subscriber.id);
    respond(ctx, 200, pageList(await listSubscriptions(redis, keys, scope, externalId), page, (id) => isId('subscription', id)));
  });

  /**
   * @openapi
   * /v1/subscribers/{externalId}/topics:
   *   get:
   *     operationId: listSubscriberTopics
   *     x-query: ListQuery
   *     summary: The topics a subscriber belongs to
   *     description: |
   *       Scope `topics:read`. The subscriber's topics, newest topic first (the order of `GET /v1/topics`), paginated,
   *       with `total`. An unknown subscriber is 404. A subscriber's topics are not limited, so a page is found by
   *       reading the tenant's topics from the cursor, at most 2,000 a call; in a tenant of more topics than that, a
   *       page may hold fewer than `limit` (even none) with `hasMore` true: follow `nextCursor` until `hasMore` is false.
   *     tags: [Topics]
   *     parameters:
   *       - $ref: '#/components/parameters/serviceTenant'
   *       - { name: externalId, in: path, required: true, description: "URL-encoded; a longer one is a malformed id: 404 not_found", schema: { type: string, minLength: 1, maxLength: 256 } }
   *     responses:
   *       '200': { description: The subscriber's topics, content: { application/json: { schema: { $ref: '#/components/schemas/TopicListResponse' } } } }
   *       '404': { $ref: '#/components/responses/Error' }
   *       default: { $ref: '#/components/responses/Error' }
   */
  router.get('/v1/subscribers/:externalId/topics', authorize(deps, 'tenant', 'topics:read'), async (ctx) => {
    const scope = scopeOf(ctx, deps);
    const externalId = externalIdParam(ctx);
    const subscriber = await getSubscriber(redis, keys, scope, externalId); // 404 first, whatever the query holds (spec 2.3)
    // a cursor of a subscriber deleted since, the same externalId made anew, is another list's
    const page = pageRequest(ctx, 'ListQuery', () => subscriber.id);
    if (page.after !== null && !isId('topic', page.after)) throw badCursor();
    const { ids, next, total } = await subscriberTopicPage(redis, keys, scope, externalId, page.limit, page.after);
    const items = (await loadTopics(redis, keys, scope.tenantId, ids)).filter((t): t is Topic => t !== null);
    respond(ctx, 200, { items, hasMore: next !== null, nextCursor: next === null ? null : encodeCursor(next), total });
  });

  /**
   * @openapi
   * /v1/subscribers/{externalId}/subscriptions/{id}:
   *   parameters:
   *     - $ref: '#/components/parameters/serviceTenant'
   *     - { name: externalId, in: path, required: true, description: "URL-encoded; a longer one is a malformed id: 404 not_found", schema: { type: string, minLength: 1, maxLength: 256 } }
   *     - { name: id, in: path, required: true, schema: { type: string } }
   *   get:
   *     operationId: getSubscriberSubscription
   *     summary: One subscription
   *     description: Scope `subscriptions:read`.
   *     tags: [Subscriptions]
   *     responses:
   *       '200': { description: The subscription, content: { application/json: { schema: { $ref: '#/components/schemas/SubscriptionResponse' } } } }
   *       default: { $ref: '#/components/responses/Error' }
   *   patch:
   *     operationId: setSubscriberSubscriptionEnabled
   *     summary: Enable or disable a subscription
   *     description: Scope `subscriptions:write`. `$subscription.muted` / `$subscription.unmuted` are written only when `enabled` really changes. A device whose token the push provider invalidated (`invalidatedAt`) stays `enabled` false, and the value asked is applied when the app registers the token again.
   *       A mute of a device APNs invalidated (`enabled` false already) changes nothing visible and writes no event, but holds when the app registers its token again.
   *     tags: [Subscriptions]
   *     requestBody: { required: true, content: { application/json: { schema: { $ref: '#/components/schemas/SubscriptionEnabled' } } } }
   *     responses:
   *       '200': { description: The subscription, content: { application/json: { schema: { $ref: '#/components/schemas/SubscriptionResponse' } } } }
   *       '409': { $ref: '#/components/responses/Error' }
   *       '429': { $ref: '#/components/responses/LockTimeout' }
   *       default: { $ref: '#/components/responses/Error' }
   *   delete:
   *     operationId: removeSubscriberSubscription
   *     summary: Remove a subscription
   *     description: Scope `subscriptions:write`. Writes `$subscription.removed`.
   *     tags: [Subscriptions]
   *     responses:
   *       '200': { description: The removed subscription, content: { application/json: { schema: { $ref: '#/components/schemas/SubscriptionResponse' } } } }
   *       '409': { $ref: '#/components/responses/Error' }
   *       '429': { $ref: '#/components/responses/LockTimeout' }
   *       default: { $ref: '#/components/responses/Error' }
   */
  router.get('/v1/subscribers/:externalId/subscriptions/:id', authorize(deps, 'tenant', 'subscriptions:read'), async (ctx) => {
    respond(ctx, 200, await getSubscription(redis, keys, scopeOf(ctx, deps), externalIdParam(ctx), ctx.params.id!));
  });

  router.patch('/v1/subscribers/:externalId/subscriptions/:id', authorize(deps, 'tenant', 'subscriptions:write'), async (ctx) => {
    const { enabled } = checkBody<{ enabled: boolean }>('SubscriptionEnabled', ctx.request.body);
    const scope = scopeOf(ctx, deps);
    const externalId = externalIdParam(ctx);
    const { subscription } = await setSubscriptionEnabled(redis, keys, scope, externalId, ctx.params.id!, enabled, auditTrailOf(ctx, deps));
    respond(ctx, 200, subscription);
  });

  router.delete('/v1/subscribers/:externalId/subscriptions/:id', authorize(deps, 'tenant', 'subscriptions:write'), async (ctx) => {
    const removed = await removeSubscription(redis, keys, scopeOf(ctx, deps), externalIdParam(ctx), ctx.params.id!, auditTrailOf(ctx, deps));
    respond(ctx, 200, removed);
  });

  /**
   * @openapi
   * /v1/subscribers/{externalId}/preferences:
   *   parameters:
   *     - $ref: '#/components/parameters/serviceTenant'
   *     - { name: externalId, in: path, required: true, description: "URL-encoded; a longer one is a malformed id: 404 not_found", schema: { type: string, minLength: 1, maxLength: 256 } }
   *   get:
   *     operationId: getSubscriberPreferences
   *     summary: A subscriber's preferences
   *     description: Scope `preferences:read`. Per channel and per category; every channel is on until turned off.
   *     tags: [Preferences]
   *     responses:
   *       '200': { description: The preferences, content: { application/json: { schema: { $ref: '#/components/schemas/PreferencesResponse' } } } }
   *       default: { $ref: '#/components/responses/Error' }
   *   patch:
   *     operationId: updateSubscriberPreferences
   *     summary: Change a subscriber's preferences
   *     description: Scope `preferences:write`. Merges channels and categories (a category set to null follows the channels again);
   *       writes `$preferences.updated` only when a value really changes. At most 100 categories are stored (400 `bad_request`
   *       on `categories` for an update that would store more; nothing stored).
   *     tags: [Preferences]
   *     requestBody: { required: true, content: { application/json: { schema: { $ref: '#/components/schemas/PreferencesUpdate' } } } }
   *     responses:
   *       '200': { description: The preferences, content: { application/json: { schema: { $ref: '#/components/schemas/PreferencesResponse' } } } }
   *       '409': { $ref: '#/components/responses/Error' }
   *       '429': { $ref: '#/components/responses/LockTimeout' }
   *       default: { $ref: '#/components/responses/Error' }
   */
  router.get('/v1/subscribers/:externalId/preferences', authorize(deps, 'tenant', 'preferences:read'), async (ctx) => {
    respond(ctx, 200, await getPreferences(redis, keys, scopeOf(ctx, deps), externalIdParam(ctx)));
  });

  router.patch('/v1/subscribers/:externalId/preferences', authorize(deps, 'tenant', 'preferences:write'), async (ctx) => {
    const update = checkBody<PreferencesUpdate>('PreferencesUpdate', ctx.request.body);
    const scope = scopeOf(ctx, deps);
    const externalId = externalIdParam(ctx);
    // the previous preferences in the entry are the ones this change replaced (read in its compare-and-set), not a read before it
    const { preferences } = await updatePreferences(redis, keys, scope, externalId, update, { audit: auditTrailOf(ctx, deps) });
    respond(ctx, 200, preferences);
  });
}
