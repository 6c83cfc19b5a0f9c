import type { RoutesBySegment as Router } from '../routes-by-segment.js';
import type { Context } from 'koa';
import { notFound } from '../../lib/errors.js';
import { signEventsToken } from '../../lib/events-token.js';
import { partitionOf } from '../../lib/partition.js';
import { EVENT_BATCH_BODY_BYTES, readClientEvents, readServerEvents, settleAppIdentify, type NewEvent } from '../../lib/track-events.js';
import { checkQuery } from '../../lib/validator.js';
import { ingestEvents } from '../../streams/ingest.js';
import { CATALOG_ORDER_MAX_NAMES, keepCatalogOrder, readCatalogOrder } from '../../streams/catalog-order.js';
import { readCatalog, readSamples, type CatalogOrdered, readVolume, tenantEventsPage, timelinePage, type VolumeRange } from '../../streams/read-models.js';
import type { AppDeps } from '../deps.js';
import { verifyClient, markVerified } from '../client-identity.js';
import { respond } from '../envelope.js';
import { badCursor, encodeCursor, pageRequest } from '../list.js';
import { externalIdParam } from '../params.js';
import { authorize, tenantOf, type AuthState } from '../middleware/auth.js';
import { requestOrigin } from '../origin.js';


export function registerEvents(router: Router, deps: AppDeps): void {
  const { redis, keys, config } = deps;
  const read = authorize(deps, 'tenant', 'events:read', { eventsToken: true });
  // one tenant's event requests in progress in this process, both routes together (TENANT_INGEST_CONCURRENCY)
  const ingestLimit = { group: 'ingest', limit: config.tenantIngestConcurrency };
  // a backend's batches may come with every non-ASCII character escaped (EVENT_BATCH_BODY_BYTES);
  // the app's route keeps HTTP_BODY_LIMIT_BYTES: its key is public, and a 4 MiB body of tiny JSON
  // values costs seconds of parsing and hundreds of MB (review of session 56: 1.7 GB for 32 at once)
  const ingest = { perTenant: ingestLimit, bodyAtLeast: EVENT_BATCH_BODY_BYTES };
  const appIngest = { perTenant: ingestLimit };

  async function track(ctx: Context, events: NewEvent[]) {
    const auth = ctx.state.auth as AuthState;
    const tenant = tenantOf(ctx);
    const items = await ingestEvents(redis, keys, { workspaceId: auth.workspace.id, tenantId: tenant.id, partitions: config.partitions, maxBacklog: config.inboxMaxBacklog, tenantMaxBacklog: config.tenantInboxMaxBacklog, subscriberMaxBacklog: config.subscriberInboxMaxBacklog }, events);
    respond(ctx, 202, { items, hasMore: false, nextCursor: null });
  }

  /**
   * @openapi
   * /v1/events:
   *   post:
   *     operationId: trackEvents
   *     summary: Track events
   *     description: |
   *       Scope `events:write`. Body `{ events: [...] }` (1 to 100) or one bare event. Answers 202 with one
   *       item per input event, in input order: the stored event plus `status` (`accepted`, or `duplicate`
   *       when the caller's `id` was seen before for that subscriber, in which case nothing is stored).
   *       Each event's `id` is what makes a retry safe; an `Idempotency-Key` header is not read here (it is
   *       `POST /v1/messages`'s): a retry of events without `id`s stores them again.
   *       A batch with any invalid event is refused whole: `validation`, `reserved_event` (a `$` name),
   *       `invalid_timestamp` (outside 7 days back / 1 hour ahead) or `event_data_too_large` (data over
   *       8 KB, status 400), with `details` naming each failing item (`events[3].name`).
   *       An unknown `externalId` creates the subscriber and writes `$subscriber.created` first.
   *       503 `unavailable` when a partition the batch touches holds more than `INBOX_MAX_BACKLOG` entries:
   *       retry the whole request (with event `id`s a retry is exact whatever was stored before).
   *       429 `rate_limited` when the tenant has `TENANT_INBOX_MAX_BACKLOG` (default 500) or more events
   *       not yet processed in a partition the batch touches (a flood), when a subscriber it names has
   *       `SUBSCRIBER_INBOX_MAX_BACKLOG` (default 250) waiting (one subscriber's burst; the message names it), or
   *       when the tenant already has `TENANT_INGEST_CONCURRENCY` (default 32) event requests in progress on the
   *       server that took this one:
   *       nothing of the request is stored; retry it after `Retry-After`. The other tenants' events go on meanwhile.
   *       The body is read up to 4 MiB whatever `HTTP_BODY_LIMIT_BYTES` says (100 events of 8 KB with
   *       every non-ASCII character escaped is 2.4 MB); 413 `payload_too_large` above.
   *     tags: [Events]
   *     parameters: [{ $ref: '#/components/parameters/serviceTenant' }]
   *     requestBody:
   *       required: true
   *       content:
   *         application/json:
   *           schema:
   *             oneOf:
   *               - $ref: '#/components/schemas/TrackEventsRequest'
   *               - $ref: '#/components/schemas/TrackEvent'
   *     responses:
   *       '202':
   *         description: The stored events, in input order
   *         content: { application/json: { schema: { $ref: '#/components/schemas/TrackedEventListResponse' } } }
   *       '400': { $ref: '#/components/responses/Error' }
   *       '401': { $ref: '#/components/responses/Unauthorized' }
   *       '403': { $ref: '#/components/responses/Error' }
   *       '429': { $ref: '#/components/responses/RateLimited' }
   *       '503': { $ref: '#/components/responses/Unavailable' }
   *       default: { $ref: '#/components/responses/Error' }
   *   get:
   *     operationId: listEvents
   *     x-query: EventsListQuery
   *     summary: The tenant's newest events
   *     description: Scope `events:read` (or an events token). Newest first, keyset pagination, no `total`.
   *       Reads trail writes by a few seconds. With a filter a page scans a bounded number of events and
   *       may hold fewer items than `limit` while `hasMore` is true.
   *     tags: [Events]
   *     parameters:
   *       - $ref: '#/components/parameters/serviceTenant'
   *       - { name: provider, in: query, description: 'Only events a source turned from this provider''s webhooks (source `webhook`, such as `stripe`; exact match; docs/sources.md).' }
   *       - { name: after, in: query, description: "Only events received after this time (ISO 8601; URL-encode a + offset as %2B: a bare + in a query string reads as a space)" }
   *     responses:
   *       '200':
   *         description: A page of events
   *         content: { application/json: { schema: { $ref: '#/components/schemas/EventListResponse' } } }
   *       default: { $ref: '#/components/responses/Error' }
   */
  router.post('/v1/events', authorize(deps, 'tenant', 'events:write', ingest), async (ctx) => {
    await track(ctx, readServerEvents(ctx.request.body));
  });

  router.get('/v1/events', read, async (ctx) => {
    const { limit, after, query } = pageRequest<{ name?: string; source?: string; provider?: string; after?: string }>(ctx, 'EventsListQuery');
    let position = null;
    if (after !== null) {
      const match = /^(\d+)\/((?:evt_[0-9a-z]+)?)$/.exec(after);
      if (!match || !Number.isSafeInteger(Number(match[1]))) throw badCursor(); // past that, no stream id
      position = { ms: Number(match[1]), id: match[2]! };
    }
    const filter = { name: query.name, source: query.source, provider: query.provider, afterMs: query.after ? Date.parse(query.after) : undefined };
    const page = await tenantEventsPage(redis, keys, config.partitions, tenantOf(ctx).id, limit, position, filter);
    respond(ctx, 200, { items: page.items, hasMore: page.next !== null, nextCursor: page.next ? encodeCursor(`${page.next.ms}/${page.next.id}`) : null });
  });

  /**
   * @openapi
   * /v1/events/names:
   *   get:
   *     operationId: listEventNames
   *     x-query: CatalogQuery
   *     summary: The event catalog
   *     description: Scope `events:read` (or an events token). One entry per event name the tenant has seen,
   *       ordered by 7-day volume (then all-time volume, then name). A walk through the pages lists the names in
   *       their order at its first page, each once, with the counts of the moment each page is read (so a later
   *       page may hold a name whose count has since grown past an earlier page's); a name first seen after the
   *       first page appears from the next walk. The order is kept 10 minutes for catalogs of at most 10,000
   *       names; past that, or for a larger catalog, the walk goes on from its last entry's place in the order
   *       as it is then.
   *     tags: [Events]
   *     parameters:
   *       - $ref: '#/components/parameters/serviceTenant'
   *     responses:
   *       '200':
   *         description: Catalog entries
   *         content: { application/json: { schema: { $ref: '#/components/schemas/CatalogEntryListResponse' } } }
   *       default: { $ref: '#/components/responses/Error' }
   */
  router.get('/v1/events/names', read, async (ctx) => {
    const { limit, after } = pageRequest(ctx, 'CatalogQuery');
    const tenantId = tenantOf(ctx).id;
    // A walk's first page keeps the order of the names after it (streams/catalog-order.ts), and the
    // cursor says where the walk is in it: `o/<order id>/<offset>/` then the last entry's place in the
    // catalog order (7-day count, all-time count, name), the keyset the walk goes on by when the kept
    // order is gone, or when the catalog was too large to keep one (then without the `o/…/` part).
    let position: CatalogOrdered | null = null;
    let kept: { id: string; offset: number } | null = null;
    if (after !== null) {
      const match = /^(?:o\/([A-Za-z0-9_-]{1,32})\/(\d{1,9})\/)?(\d+)\/(\d+)\/(.+)$/s.exec(after);
      if (!match || !Number.isSafeInteger(Number(match[3])) || !Number.isSafeInteger(Number(match[4]))) throw badCursor();
      position = { name: match[5]!, counts: { last7d: Number(match[3]), allTime: Number(match[4]) } };
      if (match[1] !== undefined) kept = { id: match[1], offset: Number(match[2]) };
    }
    const place = (e: CatalogOrdered) => `${e.counts.last7d}/${e.counts.allTime}/${e.name}`;
    const order = kept ? await readCatalogOrder(redis, keys, tenantId, kept.id, kept.offset, limit) : null;
    if (kept && order) {
      // the kept order's next names, counted now; a name whose every count has expired meanwhile is left out
      const { items: found } = await readCatalog(redis, keys, config.partitions, tenantId, { only: order.names });
      const byName = new Map(found.map((e) => [e.name, e]));
      const items = order.names.flatMap((name) => byName.get(name) ?? []);
      const offset = kept.offset + order.names.length;
      const hasMore = offset < order.length;
      const last = items[items.length - 1] ?? position!;
      respond(ctx, 200, { items, hasMore, nextCursor: hasMore ? encodeCursor(`o/${kept.id}/${offset}/${place(last)}`) : null });
      return;
    }
    const page = await readCatalog(redis, keys, config.partitions, tenantId, { page: { after: position, limit, keepOrder: after === null ? CATALOG_ORDER_MAX_NAMES : 0 } });
    const last = page.items[page.items.length - 1];
    let nextCursor: string | null = null;
    if (page.hasMore && last) {
      const id = page.rest ? await keepCatalogOrder(redis, keys, tenantId, page.rest) : null;
      nextCursor = encodeCursor(`${id ? `o/${id}/0/` : ''}${place(last)}`);
    }
    respond(ctx, 200, { items: page.items, hasMore: page.hasMore, nextCursor });
  });

  /**
   * @openapi
   * /v1/events/volume:
   *   get:
   *     operationId: getEventVolume
   *     x-query: VolumeQuery
   *     summary: Event volume
   *     description: Scope `events:read` (or an events token). `24h` gives hourly buckets, `7d` and `30d` daily
   *       (UTC) buckets, from the one holding the range's start to the one holding now + 1 hour, each with a count and a distinct-subscriber count. Empty buckets are
   *       omitted. Buckets follow the events' `timestamp`.
   *     tags: [Events]
   *     parameters:
   *       - $ref: '#/components/parameters/serviceTenant'
   *     responses:
   *       '200':
   *         description: Volume buckets, oldest first
   *         content: { application/json: { schema: { $ref: '#/components/schemas/VolumeResponse' } } }
   *       default: { $ref: '#/components/responses/Error' }
   */
  router.get('/v1/events/volume', read, async (ctx) => {
    const query = checkQuery<{ range: VolumeRange; name?: string }>('VolumeQuery', ctx.querystring);
    const volume = await readVolume(redis, keys, config.partitions, tenantOf(ctx).id, query.range, query.name);
    respond(ctx, 200, { range: query.range, unit: volume.unit, name: query.name ?? null, buckets: volume.buckets });
  });

  /**
   * @openapi
   * /v1/events/token:
   *   get:
   *     operationId: getEventsToken
   *     summary: A short-lived token for event reads
   *     description: Scope `events:read`, API keys only. The `token` (a JWT, valid one hour) reads the catalog,
   *       volume, recent-events and timeline endpoints of this tenant only (the tenant is fixed in the token)
   *       and cannot track events. An invalid or expired token is 401 `invalid_session`, and so is one whose key has
   *       since been revoked or has expired (a token lives no longer than the key that minted it, and its `expiresAt`
   *       is the key's expiry when that comes within the hour).
   *     tags: [Events]
   *     parameters: [{ $ref: '#/components/parameters/serviceTenant' }]
   *     responses:
   *       '200':
   *         description: The token
   *         content: { application/json: { schema: { $ref: '#/components/schemas/EventsTokenResponse' } } }
   *       default: { $ref: '#/components/responses/Error' }
   */
  router.get('/v1/events/token', authorize(deps, 'tenant', 'events:read'), async (ctx) => {
    const auth = ctx.state.auth as AuthState;
    const key = auth.principal!.key;
    const { token, expiresAt } = await signEventsToken(deps.tokenSecret.key, { workspaceId: auth.workspace.id, tenantId: tenantOf(ctx).id, keyId: key.id }, key.expiresAt ? Date.parse(key.expiresAt) : null);
    respond(ctx, 200, { token, url: `${requestOrigin(ctx, deps.config.trustProxyHops)}/v1/events`, expiresAt });
  });

  /**
   * @openapi
   * /v1/events/names/{name}:
   *   get:
   *     operationId: getEventName
   *     summary: One catalog entry
   *     description: Scope `events:read` (or an events token). The entry, its daily volume series over 30 days and
   *       its 20 newest samples. A name the tenant has not seen is 404.
   *     tags: [Events]
   *     parameters:
   *       - $ref: '#/components/parameters/serviceTenant'
   *       - { name: name, in: path, required: true, schema: { type: string } }
   *     responses:
   *       '200':
   *         description: The entry, series and samples
   *         content: { application/json: { schema: { $ref: '#/components/schemas/CatalogEntryDetailResponse' } } }
   *       default: { $ref: '#/components/responses/Error' }
   */
  router.get('/v1/events/names/:name', read, async (ctx) => {
    const tenantId = tenantOf(ctx).id;
    const name = ctx.params.name!;
    const { items: [entry] } = await readCatalog(redis, keys, config.partitions, tenantId, { only: [name] });
    if (!entry) throw notFound('Event name');
    const [series, samples] = await Promise.all([readVolume(redis, keys, config.partitions, tenantId, '30d', name), readSamples(redis, keys, config.partitions, tenantId, name)]);
    respond(ctx, 200, { entry, series: { range: '30d', unit: series.unit, name, buckets: series.buckets }, samples });
  });

  /**
   * @openapi
   * /v1/subscribers/{externalId}/timeline:
   *   get:
   *     operationId: getSubscriberTimeline
   *     x-query: CatalogQuery
   *     summary: One subscriber's events
   *     description: Scope `events:read` (or an events token). Newest first, every event kind (identifies,
   *       registrations, mutes, preference changes, workflow steps, tracked events), keyset pagination by
   *       sequence, no `total`. An unknown subscriber is 404.
   *     tags: [Events]
   *     parameters:
   *       - $ref: '#/components/parameters/serviceTenant'
   *       - { name: externalId, in: path, required: true, description: "URL-encoded; a longer one is a malformed id: 404 not_found", schema: { type: string, minLength: 1, maxLength: 256 } }
   *     responses:
   *       '200':
   *         description: A page of the timeline
   *         content: { application/json: { schema: { $ref: '#/components/schemas/EventListResponse' } } }
   *       default: { $ref: '#/components/responses/Error' }
   */
  router.get('/v1/subscribers/:externalId/timeline', read, async (ctx) => {
    const externalId = externalIdParam(ctx);
    const tenantId = tenantOf(ctx).id;
    const p = partitionOf(tenantId, externalId, config.partitions);
    // 404 first, whatever the query holds (spec 2.3)
    if (!(await redis.hexists(keys.subscribers(p), `${tenantId}|${externalId}`))) throw notFound('Subscriber');
    const { limit, after } = pageRequest(ctx, 'CatalogQuery');
    // a position is a sequence the list gave (1 or more, digits only): "", "-1", "0x10" or "1e3" are
    // no positions, not the end of the list (probe C1)
    if (after !== null && !/^[1-9]\d{0,15}$/.test(after)) throw badCursor();
    const before = after === null ? null : Number(after);
    if (before !== null && !Number.isSafeInteger(before)) throw badCursor();
    const page = await timelinePage(redis, keys, p, tenantId, externalId, limit, before);
    respond(ctx, 200, { items: page.items, hasMore: page.next !== null, nextCursor: page.next === null ? null : encodeCursor(String(page.next)) });
  });

  /**
   * @openapi
   * /v1/client/events:
   *   post:
   *     operationId: trackClientEvents
   *     summary: Track events from the app
   *     description: Client key (`svc_pk_`) only, scope `client`. Body `{ externalId, identityHash?, source, events }`
   *       with 1 to 100 events and `source` one of `ios`, `android`, `web`. Of the reserved names only the SDK's own
   *       (spec 6.1) are accepted; engine names are `reserved_event`. Same answer and rules as `POST /v1/events`.
   *       `identityHash` is checked as on every client call (see `docs/client.md`). 503 `unavailable` when event
   *       processing is behind (`INBOX_MAX_BACKLOG`), 429 `rate_limited` when the tenant's own events are
   *       (`TENANT_INBOX_MAX_BACKLOG`, `SUBSCRIBER_INBOX_MAX_BACKLOG`) or it has too many event requests in progress (`TENANT_INGEST_CONCURRENCY`),
   *       as on `POST /v1/events`; retry the whole request after `Retry-After`.
   *     tags: [Client]
   *     requestBody:
   *       required: true
   *       content: { application/json: { schema: { $ref: '#/components/schemas/ClientEventsRequest' } } }
   *     responses:
   *       '202':
   *         description: The stored events, in input order
   *         content: { application/json: { schema: { $ref: '#/components/schemas/TrackedEventListResponse' } } }
   *       '429': { $ref: '#/components/responses/RateLimited' }
   *       '503': { $ref: '#/components/responses/Unavailable' }
   *       default: { $ref: '#/components/responses/Error' }
   */
  router.post('/v1/client/events', authorize(deps, 'client', 'client', appIngest), async (ctx) => {
    const { request, events } = readClientEvents(ctx.request.body);
    const verified = await verifyClient(deps, ctx, request.externalId, request.identityHash);
    settleAppIdentify(events, verified);
    await track(ctx, events);
    await markVerified(deps, ctx, request.externalId, verified);
  });
}
