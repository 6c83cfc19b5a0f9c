import type { RoutesBySegment as Router } from '../routes-by-segment.js';
import type { Context } from 'koa';
import { setTimeout as sleep } from 'node:timers/promises';
import { ApiError, notFound, validationError } from '../../lib/errors.js';
import { bodyProblems, checkBody, checkQuery, queryProblems } from '../../lib/validator.js';
import { ingestEvents } from '../../streams/ingest.js';
import { now } from '../../lib/clock.js';
import { getPreferences, updatePreferences, type PreferencesUpdate } from '../../streams/preferences.js';
import { getSubscriber, upsertSubscriber, type Attributes } from '../../streams/subscribers.js';
import { mergeSubscriber, planMerge, type MergePlan } from '../../streams/subscriber-merge.js';
import { checkRegistration, ownerOf, readRegistration, registerSubscription, removeSubscription, setSubscriptionEnabled, type RegisterInput, type RegistrationBody } from '../../streams/subscriptions.js';
import { deleteWidget, loadWidgets, registerWidget, widgetOwner, type WidgetInput } from '../../streams/widgets.js';
import { markVerified, unknownHolder, verifyClient, verifyExisting, verifyMerge } from '../client-identity.js';
import type { AppDeps } from '../deps.js';
import { respond } from '../envelope.js';
import { pageRecords, pageRequest } from '../list.js';
import { authorize, tenantOf } from '../middleware/auth.js';
import { auditTrailOf, scopeOf } from './subscribers.js';

type Identified = { externalId: string; identityHash?: string };
/** The optional merge of an anonymous subscriber that identify and registration take. */
type Merging = { anonymousId?: string; anonymousIdentityHash?: string };

/** How many times a call by subscription id reads the id's holder again when the holder read has no copy (a device moving between users). */
const HOLDER_MOVE_RETRIES = 5;

export function registerClient(router: Router, deps: AppDeps): void {
  const { redis, keys } = deps;
  const client = authorize(deps, 'client', 'client');

  /**
   * The externalId a client call on a subscription or widget id acts for: its owner (`lookup`, null
   * for an id the tenant never held), checked against a presented identity; `externalId` in the
   * query is optional.
   */
  async function ownerActedFor(ctx: Context, lookup: (tenantId: string, id: string) => Promise<string | null>, what: string): Promise<string> {
    const query = checkQuery<Partial<Identified>>('ClientOwnerQuery', ctx.querystring);
    const tenantId = tenantOf(ctx).id;
    if (query.externalId !== undefined) {
      // the caller proves its own externalId before the lookup: an id that is not its own is then
      // 404, whoever holds it
      await verifyExisting(deps, ctx, query.externalId, query.identityHash);
      if ((await lookup(tenantId, ctx.params.id!)) !== query.externalId) throw notFound(what);
      return query.externalId;
    }
    const owner = await lookup(tenantId, ctx.params.id!);
    if (!owner) return unknownHolder(deps, ctx, query.identityHash, notFound(what));
    await verifyExisting(deps, ctx, owner, query.identityHash);
    return owner;
  }
  async function subscriptionOwner(ctx: Context): Promise<string> {
    return ownerActedFor(ctx, (tenantId, id) => ownerOf(redis, keys, tenantId, id), 'Subscription');
  }
  async function widgetOwnerActedFor(ctx: Context): Promise<string> {
    return ownerActedFor(ctx, (tenantId, id) => widgetOwner(redis, keys, tenantId, id), 'Widget');
  }

  /**
   * Before any write: whether the caller may merge `anonymousId` into `externalId` (verifyMerge) and
   * whether the result fits the limits (planMerge, 409 otherwise). Null when there is nothing to merge.
   */
  async function mergePlan(ctx: Context, body: { externalId: string; anonymousId?: string; anonymousIdentityHash?: string }, registering?: RegisterInput): Promise<MergePlan | null> {
    if (body.anonymousId === undefined || body.anonymousId === body.externalId) return null;
    await verifyMerge(deps, ctx, body.anonymousId, body.anonymousIdentityHash);
    return planMerge(redis, keys, scopeOf(ctx, deps), body.anonymousId, body.externalId, registering);
  }

  /**
   * @openapi
   * /v1/client/identify:
   *   post:
   *     operationId: clientIdentify
   *     summary: Identify the app's user
   *     description: Client key only (scope `client`). Creates or updates the subscriber `externalId` with `attributes`, writes `$identify`, and,
   *       with `anonymousId`, merges the anonymous subscriber into it (its subscriptions, widgets, topics and missing attributes
   *       move, the user's own values winning; the anonymous subscriber is then deleted). A valid `identityHash` marks the
   *       subscriber verified; a missing or wrong one leaves the call unverified, unless the tenant requires verification
   *       (403 `forbidden` on `identityHash`). A merge needs a valid `anonymousIdentityHash`; without one, a tenant that
   *       requires verification answers 403 `forbidden` on `anonymousIdentityHash` and an optional one merges only a
   *       subscriber never verified (403 `forbidden` on `anonymousId` otherwise). A merge that would leave the subscriber more
   *       than 50 subscriptions or 50 widgets is 409 `conflict`. `attributes.properties` merged with the stored ones must stay
   *       within 8 KB serialized (400 `validation` on `attributes.properties`). Every refusal comes before any write.
   *       503 `unavailable` when event processing is behind (`INBOX_MAX_BACKLOG`); the attributes and a merge may be
   *       stored already, `$identify` is not, and retrying the same request finishes it.
   *     tags: [Client]
   *     requestBody: { required: true, content: { application/json: { schema: { $ref: '#/components/schemas/Identify' } } } }
   *     responses:
   *       '200': { description: The subscriber (without its segments), content: { application/json: { schema: { $ref: '#/components/schemas/ClientSubscriberResponse' } } } }
   *       '409': { $ref: '#/components/responses/Error' }
   *       '429': { $ref: '#/components/responses/LockTimeout' }
   *       '503': { $ref: '#/components/responses/Unavailable' }
   *       default: { $ref: '#/components/responses/Error' }
   */
  router.post('/v1/client/identify', client, async (ctx) => {
    const body = checkBody<Identified & Merging & { source: 'ios' | 'android' | 'web'; attributes?: Attributes }>('Identify', ctx.request.body);
    const verified = await verifyClient(deps, ctx, body.externalId, body.identityHash);
    const scope = scopeOf(ctx, deps);
    // every refusal (identity, limits, the size of properties) comes before the first write
    const plan = await mergePlan(ctx, body);
    // Each write records its entries; they are settled together before $identify is appended (a 503
    // there leaves the writes and their entries done, and a retry changes nothing more): one
    // subscriber.updated for what this call changed, its own attributes then what the merge filled in
    // (subscriber.created instead when it created the subscriber), a subscription.updated per device the merge
    // moved (the owner change), then the merged subscriber's subscriber.deleted.
    const trail = auditTrailOf(ctx, deps);
    const { written, merged } = await trail.holding(async () => {
      // the upsert's own record is the answer's fallback: read again, a delete racing the call made it 404 (probe X)
      const { subscriber } = await upsertSubscriber(redis, keys, scope, body.externalId, body.attributes ?? {}, { create: true, verified, base: 'attributes.', audit: trail });
      // `merged`: this call deleted the anonymous subscriber (of calls racing on one, only the one that did);
      // into the subscriber the upsert wrote only (a delete racing the call stops the merge)
      const merged = plan ? await mergeSubscriber(redis, keys, scope, plan, trail, subscriber.id) : false;
      // after a merge, what it filled in too (read again; the upsert's record when that read fails: a delete
      // came in between, or Redis refuses the read after the writes were made, which are answered as made)
      return { written: plan ? await getSubscriber(redis, keys, scope, body.externalId).catch(() => subscriber) : subscriber, merged };
    });
    await ingestEvents(redis, keys, { ...scope, maxBacklog: deps.config.inboxMaxBacklog }, [{
      externalId: body.externalId, name: '$identify', source: body.source, timestampMs: now(), callerId: null, provider: null, runId: null, messageId: null, step: null,
      data: JSON.stringify({ anonymousId: body.anonymousId ?? null, merged, verified }),
    }]);
    // appending $identify leaves the record as it was written: the answer is that record
    const { segments: _segments, ...own } = written;
    respond(ctx, 200, own);
  });

  /**
   * @openapi
   * /v1/client/subscriptions:
   *   post:
   *     operationId: clientRegisterSubscription
   *     summary: Register a device token or an email address
   *     description: Client key only (scope `client`). Creates the subscriber when unknown (`$subscriber.created`) and the subscription
   *       (`$subscription.registered`, 201). `channel` may be left out when the body has exactly one of `token` (then `push`)
   *       and `address` (then `email`); otherwise it is required (400 `validation`). Registering a token this externalId holds updates it (200; the fields given
   *       replace the stored ones, and platform, environment, authorizationStatus and device left out keep theirs); a token another
   *       subscriber holds moves to this externalId (201, same subscription id, `$subscription.removed` on the previous one); an email
   *       address never moves (it is one per subscriber, another subscriber's stays theirs and this one gets its own). `environment` is the APNs environment of
   *       the token; `device` strings are at most 128 characters. A subscriber holds at most 50 subscriptions; at the limit the one
   *       APNs declared gone longest ago (`invalidatedAt`), if any, is removed to make room, else the answer is 409 `conflict`
   *       and nothing changes (a device another subscriber holds stays with it). With `anonymousId`,
   *       that subscriber is first merged into this one, with the proof and limits of `POST /v1/client/identify` (the device
   *       registered here counts towards the 50), all checked before any write. Registrations of one token run one at a
   *       time across processes (a registration waits for another of the same token at most 5 s, then 429 `lock_timeout`);
   *       one overtaken by another app user's registration of the device before its write (it stalled over 2 s) writes
   *       nothing and answers 200 with the fields it sent (the device is the other user's).
   *     tags: [Client]
   *     requestBody: { required: true, content: { application/json: { schema: { $ref: '#/components/schemas/SubscriptionRegister' } } } }
   *     responses:
   *       '200': { description: Updated, content: { application/json: { schema: { $ref: '#/components/schemas/SubscriptionResponse' } } } }
   *       '201': { description: Registered, content: { application/json: { schema: { $ref: '#/components/schemas/SubscriptionResponse' } } } }
   *       '409': { $ref: '#/components/responses/Error' }
   *       '429': { $ref: '#/components/responses/LockTimeout' }
   *       default: { $ref: '#/components/responses/Error' }
   */
  router.post('/v1/client/subscriptions', client, async (ctx) => {
    const { externalId, identityHash, anonymousId, anonymousIdentityHash, ...given } = checkBody<Identified & Merging & RegistrationBody>('SubscriptionRegister', ctx.request.body);
    const input = readRegistration(given);
    checkRegistration(input);
    const verified = await verifyClient(deps, ctx, externalId, identityHash);
    const scope = scopeOf(ctx, deps);
    const plan = await mergePlan(ctx, { externalId, anonymousId, anonymousIdentityHash }, input);
    const trail = auditTrailOf(ctx, deps);
    // the merge's entries (devices moved, what it filled in, the merged subscriber deleted) are settled together, before the registration's
    if (plan) await trail.holding(() => mergeSubscriber(redis, keys, scope, plan, trail));
    // registering what is stored (every launch does) changes nothing and audits nothing
    const { subscription, created } = await registerSubscription(redis, keys, scope, externalId, input, { audit: trail });
    await markVerified(deps, ctx, externalId, verified);
    respond(ctx, created ? 201 : 200, subscription);
  });

  /**
   * @openapi
   * /v1/client/subscriptions/{id}:
   *   parameters:
   *     - { name: id, in: path, required: true, schema: { type: string } }
   *     - { name: externalId, in: query, description: "When given, must be the subscription's subscriber" }
   *     - { name: identityHash, in: query, description: "Required when the tenant requires identity verification. In such a tenant an id no subscriber holds is answered as an unproven call is (403 `forbidden`), so the answers never tell which ids exist; with `externalId` and its valid hash, an id not that subscriber's is 404" }
   *   patch:
   *     operationId: clientSetSubscriptionEnabled
   *     x-query: ClientOwnerQuery
   *     summary: Enable or disable this device
   *     description: Client key only (scope `client`). Body `{ enabled }`. `$subscription.muted` / `$subscription.unmuted` only on a real change. A device whose token the push provider invalidated (`invalidatedAt`) stays `enabled` false, and the value asked is applied when the app registers the token again.
   *       A mute of a device APNs invalidated (`enabled` false already) changes nothing visible and writes no event, but holds when the app registers its token again.
   *       429 `lock_timeout` when the subscriber is changing too fast (retry), as on every subscriber write.
   *       The subscription id (returned at registration) is the device's handle on its subscription.
   *     tags: [Client]
   *     requestBody: { required: true, content: { application/json: { schema: { $ref: '#/components/schemas/SubscriptionEnabled' } } } }
   *     responses:
   *       '200': { description: The subscription, content: { application/json: { schema: { $ref: '#/components/schemas/SubscriptionResponse' } } } }
   *       '409': { $ref: '#/components/responses/Error' }
   *       '429': { $ref: '#/components/responses/LockTimeout' }
   *       default: { $ref: '#/components/responses/Error' }
   *   delete:
   *     operationId: clientRemoveSubscription
   *     x-query: ClientOwnerQuery
   *     summary: Remove this device
   *     description: Client key only (scope `client`). Writes `$subscription.removed`.
   *     tags: [Client]
   *     responses:
   *       '200': { description: The removed subscription, content: { application/json: { schema: { $ref: '#/components/schemas/SubscriptionResponse' } } } }
   *       '409': { $ref: '#/components/responses/Error' }
   *       '429': { $ref: '#/components/responses/LockTimeout' }
   *       default: { $ref: '#/components/responses/Error' }
   */
  router.patch('/v1/client/subscriptions/:id', client, async (ctx) => {
    // the body's problems and the query's are told together (Part 7: details list each failing field; probe BP)
    const problems = [...bodyProblems('SubscriptionEnabled', ctx.request.body), ...queryProblems('ClientOwnerQuery', ctx.querystring)];
    if (problems.length) throw validationError(problems);
    const { enabled } = ctx.request.body as { enabled: boolean };
    const scope = scopeOf(ctx, deps);
    for (let attempt = 0; ; attempt++) {
      const owner = await subscriptionOwner(ctx);
      try {
        const { subscription } = await setSubscriptionEnabled(redis, keys, scope, owner, ctx.params.id!, enabled, auditTrailOf(ctx, deps));
        return respond(ctx, 200, subscription);
      } catch (err) {
        // Without `externalId` the call acts for the id's holder. A device moving to another user's
        // registration is named that user's in the owner index a moment before that user's copy is
        // written, and the holder read then has no copy yet: its owner is read again, a few times
        // over about 1.5 s (probe Y1: 40 of 50 such calls were 404, and the mute was lost).
        if (!(err instanceof ApiError && err.status === 404) || ctx.query.externalId !== undefined || attempt >= HOLDER_MOVE_RETRIES) throw err;
        await sleep(50 * 2 ** attempt);
      }
    }
  });

  router.delete('/v1/client/subscriptions/:id', client, async (ctx) => {
    const owner = await subscriptionOwner(ctx);
    const removed = await removeSubscription(redis, keys, scopeOf(ctx, deps), owner, ctx.params.id!, auditTrailOf(ctx, deps));
    respond(ctx, 200, removed);
  });

  /**
   * @openapi
   * /v1/client/preferences:
   *   get:
   *     operationId: clientGetPreferences
   *     x-query: ClientSubscriberQuery
   *     summary: The app user's own preferences
   *     description: Client key only (scope `client`). 404 `not_found` for an externalId that is no subscriber (PATCH creates it).
   *     tags: [Client]
   *     responses:
   *       '200': { description: The preferences, content: { application/json: { schema: { $ref: '#/components/schemas/PreferencesResponse' } } } }
   *       '404': { $ref: '#/components/responses/Error' }
   *       default: { $ref: '#/components/responses/Error' }
   *   patch:
   *     operationId: clientUpdatePreferences
   *     summary: Change the app user's own preferences
   *     description: Client key only (scope `client`). `channels`, `categories` or both (neither is 400 `validation`, param `body`). `$preferences.updated` only when a value really changes. At most 100 categories are stored
   *       (400 `bad_request` on `categories` for an update that would store more; nothing stored).
   *     tags: [Client]
   *     requestBody: { required: true, content: { application/json: { schema: { $ref: '#/components/schemas/ClientPreferencesUpdate' } } } }
   *     responses:
   *       '200': { description: The preferences, content: { application/json: { schema: { $ref: '#/components/schemas/PreferencesResponse' } } } }
   *       '409': { $ref: '#/components/responses/Error' }
   *       '429': { $ref: '#/components/responses/LockTimeout' }
   *       default: { $ref: '#/components/responses/Error' }
   */
  router.get('/v1/client/preferences', client, async (ctx) => {
    const query = checkQuery<Identified>('ClientSubscriberQuery', ctx.querystring);
    await verifyExisting(deps, ctx, query.externalId, query.identityHash);
    respond(ctx, 200, await getPreferences(redis, keys, scopeOf(ctx, deps), query.externalId));
  });

  router.patch('/v1/client/preferences', client, async (ctx) => {
    const { externalId, identityHash, ...update } = checkBody<Identified & PreferencesUpdate>('ClientPreferencesUpdate', ctx.request.body);
    // an update naming nothing is malformed, as on the backend route (it answered 200 and created the subscriber: probe J)
    if (update.channels === undefined && update.categories === undefined) throw validationError([{ param: 'body', message: 'must name channels or categories (or both)' }]);
    const verified = await verifyClient(deps, ctx, externalId, identityHash);
    const scope = scopeOf(ctx, deps);
    // subscriber.created when the update created the subscriber, else subscriber.updated with the preferences it replaced
    const { preferences } = await updatePreferences(redis, keys, scope, externalId, update, { create: true, audit: auditTrailOf(ctx, deps) });
    await markVerified(deps, ctx, externalId, verified);
    respond(ctx, 200, preferences);
  });

  /**
   * @openapi
   * /v1/client/widgets:
   *   post:
   *     operationId: clientRegisterWidget
   *     summary: Register a widget of the app
   *     description: Client key only (scope `client`). Idempotent, so the app may register its widgets on every launch. A widget of the subscriber
   *       with the same `pushToken` is updated in place (200, same id, its kind, family and configuration replaced); without
   *       `pushToken`, a widget without one and with the same `kind`, `family` and `configuration` (compared as canonical JSON,
   *       key order does not matter) is the same widget (200, unchanged). Otherwise a new widget (201). At most 50 widgets per
   *       subscriber (409 `conflict` beyond, nothing stored).
   *     tags: [Client]
   *     requestBody: { required: true, content: { application/json: { schema: { $ref: '#/components/schemas/WidgetRegister' } } } }
   *     responses:
   *       '200': { description: The widget already registered (updated when it has this pushToken), content: { application/json: { schema: { $ref: '#/components/schemas/WidgetResponse' } } } }
   *       '201': { description: The new widget, content: { application/json: { schema: { $ref: '#/components/schemas/WidgetResponse' } } } }
   *       '409': { $ref: '#/components/responses/Error' }
   *       '429': { $ref: '#/components/responses/LockTimeout' }
   *       default: { $ref: '#/components/responses/Error' }
   *   get:
   *     operationId: clientListWidgets
   *     x-query: ClientWidgetsQuery
   *     summary: The app user's own widgets
   *     description: Client key only (scope `client`). Newest first, paginated (`limit`, `cursor`), with `total`.
   *     tags: [Client]
   *     responses:
   *       '200': { description: The widgets, content: { application/json: { schema: { $ref: '#/components/schemas/WidgetListResponse' } } } }
   *       default: { $ref: '#/components/responses/Error' }
   */
  router.post('/v1/client/widgets', client, async (ctx) => {
    const { externalId, identityHash, ...input } = checkBody<Identified & WidgetInput>('WidgetRegister', ctx.request.body);
    const verified = await verifyClient(deps, ctx, externalId, identityHash);
    const { subscriber } = await upsertSubscriber(redis, keys, scopeOf(ctx, deps), externalId, {}, { create: true, verified });
    const { widget, created } = await registerWidget(redis, keys, scopeOf(ctx, deps), externalId, subscriber.id, input);
    respond(ctx, created ? 201 : 200, widget);
  });

  router.get('/v1/client/widgets', client, async (ctx) => {
    const { query, ...page } = pageRequest<Identified>(ctx, 'ClientWidgetsQuery', (q) => q.externalId);
    await verifyExisting(deps, ctx, query.externalId, query.identityHash);
    const tenantId = tenantOf(ctx).id;
    respond(ctx, 200, await pageRecords(redis, keys.subscriberWidgets(tenantId, query.externalId), page, 'widget', (ids) => loadWidgets(redis, keys, tenantId, ids)));
  });

  /**
   * @openapi
   * /v1/client/widgets/{id}:
   *   delete:
   *     operationId: clientDeleteWidget
   *     x-query: ClientOwnerQuery
   *     summary: Delete a widget
   *     description: Client key only (scope `client`). Answers 200 with the deleted widget, or with `data` null when its
   *       subscriber deleted it before (deleting twice is fine; remembered for the event retention, `EVENT_RETENTION_DAYS`).
   *       Without `externalId` the call acts for the widget's subscriber, as on a subscription id. A malformed id, an id
   *       this tenant never held (another tenant's included) or, with `externalId`, a widget of another subscriber is
   *       404 `not_found` (spec 2.3). 409 is declared because spec 4.4 lists it for this route, but no state makes a
   *       delete conflict here.
   *     tags: [Client]
   *     parameters:
   *       - { name: id, in: path, required: true, schema: { type: string } }
   *       - { name: externalId, in: query, description: "When given, must be the widget's subscriber" }
   *       - { name: identityHash, in: query, description: "Required when the tenant requires identity verification (of the widget's subscriber without `externalId`). In such a tenant an id no subscriber holds is answered as an unproven call is (403 `forbidden`)" }
   *     responses:
   *       '200': { description: The deleted widget or null, content: { application/json: { schema: { $ref: '#/components/schemas/NullableWidgetResponse' } } } }
   *       '400': { $ref: '#/components/responses/Error' }
   *       '401': { $ref: '#/components/responses/Unauthorized' }
   *       '403': { $ref: '#/components/responses/Error' }
   *       '404': { $ref: '#/components/responses/Error' }
   *       '409': { $ref: '#/components/responses/Error' }
   *       default: { $ref: '#/components/responses/Error' }
   */
  router.delete('/v1/client/widgets/:id', client, async (ctx) => {
    // spec 4.4 lists only the path id: without `externalId` the call acts for the widget's owner, as
    // on a subscription id (until session 53 a known id without it was 400, probe BC)
    const owner = await widgetOwnerActedFor(ctx);
    const deleted = await deleteWidget(redis, keys, tenantOf(ctx).id, owner, ctx.params.id!, deps.config.retentionMs);
    if (deleted === 'not_found') throw notFound('Widget');
    respond(ctx, 200, deleted);
  });

}
