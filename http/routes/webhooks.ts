import type { RoutesBySegment as Router } from '../routes-by-segment.js';
import type { Context } from 'koa';
import { ApiError, notFound, validationError } from '../../lib/errors.js';
import { checkWebhookUrl, createAllowList, resolveAndCheck, type AllowList } from '../../lib/ssrf-guard.js';
import { bodyProblems } from '../../lib/validator.js';
import { checkPatterns, normalizePatterns, webhookCatalog } from '../../lib/webhook-events.js';
import { MAX_URL_LENGTH } from '../../lib/webhook-policy.js';
import { resolveAllFor } from '../../lib/webhook-resolver.js';
import { findTenantBySlug } from '../../streams/identity.js';
import type { Ref } from '../../streams/ledger.js';
import { seenEventNames } from '../../streams/webhook-catalog.js';
import { readWebhookEvent, requeueOwed, REQUEUE_IN_REQUEST_MS } from '../../streams/webhook-deliveries.js';
import {
  createEndpoint, deleteEndpoint, findEndpoint, loadEndpoints, publicEndpoint, rotateSecret, updateEndpoint,
  type EndpointPatch, type WebhookEndpoint,
} from '../../streams/webhook-endpoints.js';
import { waitAtMost } from '../../lib/wait-at-most.js';
import type { AppDeps } from '../deps.js';
import { respond } from '../envelope.js';
import { pageRecords, pageRequest } from '../list.js';
import { authorize, writerOf, type AuthState } from '../middleware/auth.js';
import { registerWebhookDeliveries } from './webhook-deliveries.js';

type CreateBody = { url: string; description?: string | null; events?: string[]; tenant?: string | null };
type UpdateBody = { url?: string; description?: string | null; events?: string[]; tenant?: string | null; enabled?: boolean };

const withSecret = (e: WebhookEndpoint) => ({ ...publicEndpoint(e), secret: e.secret });

/** How long a save waits for the host name's addresses; past it the name counts as not resolving now. */
const SAVE_RESOLVE_TIMEOUT_MS = 3_000;

/**
 * The URL rules of spec 2.5 and 7 (`invalid_url`): http(s), https in production, no credentials,
 * no private/loopback/link-local/CGNAT/multicast/reserved address, checked on the text and on
 * every address the host name resolves to now. A name that does not resolve now (no such name, no
 * DNS, no answer within SAVE_RESOLVE_TIMEOUT_MS) points nowhere, so nowhere private: it is saved, and
 * every attempt resolves it again through the guarded lookup, which refuses a private address then.
 * Returns the URL as sent (normalised by WHATWG URL).
 */
async function checkUrl(raw: string, options: { production: boolean; allow: AllowList }): Promise<string> {
  const refuse = (message: string): never => { throw validationError([{ param: 'url', message }], 'invalid_url'); };
  const check = checkWebhookUrl(raw, options);
  if (!check.ok) return refuse(check.reason);
  // the schema's bound is on the text as sent; normalising (percent-encoding) can lengthen it (checked before any DNS lookup)
  if (check.url.href.length > MAX_URL_LENGTH) throw validationError([{ param: 'url', message: `must be at most ${MAX_URL_LENGTH} characters once normalised (non-ASCII characters are percent-encoded)` }]);
  let timer: NodeJS.Timeout | undefined;
  const unresolved = new Promise<null>((resolve) => { timer = setTimeout(() => resolve(null), SAVE_RESOLVE_TIMEOUT_MS); });
  try {
    const resolving = resolveAndCheck(check.url.hostname, { allow: options.allow, lookup: resolveAllFor() }).catch(() => null);
    const resolved = await Promise.race([resolving, unresolved]);
    // the answer does not say which address or kind of address the name resolved to: a key holder
    // would otherwise map the names and addresses of the service's own network (probe Z)
    if (resolved && !resolved.ok) return refuse(`${check.url.hostname} does not resolve to a public address only`);
  } finally {
    clearTimeout(timer);
  }
  return check.url.href;
}

function checkEvents(events: string[]): string[] {
  const problem = checkPatterns(events);
  if (problem) throw validationError(problem.details, problem.code);
  return normalizePatterns(events);
}

/**
 * The body of a create or update, checked against its schema; a malformed pattern fails there, so
 * its 400 `validation` also names the list's private patterns (`key.*`…), which only the pattern
 * check finds: each failing field in `details` (docs/webhooks.md; they went unnamed, probe DF).
 */
function checkEndpointBody<T>(name: string, body: unknown): T {
  const details = bodyProblems(name, body);
  if (details.length === 0) return body as T;
  const events = (body as { events?: unknown } | null)?.events;
  if (Array.isArray(events) && events.every((e) => typeof e === 'string')) {
    const named = new Set(details.map((d) => d.param));
    details.push(...(checkPatterns(events)?.details ?? []).filter((d) => !named.has(d.param)));
    // the patterns' details in list order, after the other fields'
    const item = (param: string) => Number(/^events\[(\d+)\]/.exec(param)?.[1] ?? -1);
    details.sort((a, b) => item(a.param) - item(b.param));
  }
  throw validationError(details);
}

async function tenantRef(deps: AppDeps, workspaceId: string, slug: string | null): Promise<Ref | null> {
  if (slug === null) return null;
  const tenant = await findTenantBySlug(deps.redis, deps.keys, workspaceId, slug);
  if (!tenant) throw validationError([{ param: 'tenant', message: `is not a tenant of this workspace ("${slug}")` }]);
  return { id: tenant.id, slug: tenant.slug };
}

export function registerWebhooks(router: Router, deps: AppDeps): void {
  const { redis, keys, config, log } = deps;
  const allow = createAllowList(config.webhookAllowPrivateNetworks);
  const urlOptions = { production: config.production, allow };
  const read = authorize(deps, 'workspace', 'webhooks:read');
  const write = authorize(deps, 'workspace', 'webhooks:write');
  const workspaceOf = (ctx: Context) => (ctx.state.auth as AuthState).workspace;
  const endpointOr404 = async (ctx: Context) => {
    const endpoint = await findEndpoint(redis, keys, workspaceOf(ctx).id, ctx.params.id!);
    if (!endpoint) throw notFound('Webhook endpoint');
    return endpoint;
  };

  /**
   * @openapi
   * /v1/workspaces/{workspaceSlug}/webhooks/catalog:
   *   get:
   *     operationId: getWebhookCatalog
   *     summary: The events an endpoint can subscribe to
   *     description: Scope `webhooks:read`, workspace keys only. Public control-plane (audit) events grouped by
   *       resource, the reserved stream events of spec 6.1 by resource, then the stream event names the
   *       workspace's tenants have sent, grouped by their first segment. `*` subscribes to all of them;
   *       `resource.*` to a group's names with a dot (a group's bare name, such as `order` beside `order.paid`, is
   *       its own entry, which `order.*` does not match). Audit events of `key`, `webhook` and `profile` are private and never listed; the
   *       caller's stream event names in those words (`key.pressed`) reach `*` only, cannot be named, and are not listed
   *       either. Every name and pattern listed is accepted in an endpoint's `events`.
   *     tags: [Webhooks]
   *     parameters: [{ $ref: '#/components/parameters/workspaceSlug' }]
   *     responses:
   *       '200':
   *         description: The catalog
   *         content: { application/json: { schema: { $ref: '#/components/schemas/WebhookCatalogResponse' } } }
   *       default: { $ref: '#/components/responses/Error' }
   */
  router.get('/v1/workspaces/:workspaceSlug/webhooks/catalog', read, async (ctx) => {
    const names = await seenEventNames(redis, keys, config.partitions, workspaceOf(ctx).id);
    respond(ctx, 200, { groups: webhookCatalog(names) });
  });

  /**
   * @openapi
   * /v1/workspaces/{workspaceSlug}/webhooks/events/{id}:
   *   get:
   *     operationId: getWebhookEvent
   *     summary: A delivered event
   *     description: Scope `webhooks:read`. The payload exactly as it was (and is, on every retry and replay)
   *       delivered, kept for the retention (`EVENT_RETENTION_DAYS`). An event no endpoint received is 404, as is one
   *       whose every endpoint was deleted, once the housekeeping sweep has removed those endpoints' deliveries (50,000
   *       deliveries a minute over the deployment; docs/webhooks.md).
   *     tags: [Webhooks]
   *     parameters:
   *       - $ref: '#/components/parameters/workspaceSlug'
   *       - { name: id, in: path, required: true, schema: { type: string } }
   *     responses:
   *       '200':
   *         description: The event payload (spec 2.6)
   *         content: { application/json: { schema: { $ref: '#/components/schemas/WebhookEventResponse' } } }
   *       default: { $ref: '#/components/responses/Error' }
   */
  router.get('/v1/workspaces/:workspaceSlug/webhooks/events/:id', read, async (ctx) => {
    const event = await readWebhookEvent(redis, keys, workspaceOf(ctx).id, ctx.params.id!);
    if (!event) throw notFound('Webhook event');
    respond(ctx, 200, event);
  });

  /**
   * @openapi
   * /v1/workspaces/{workspaceSlug}/webhooks:
   *   post:
   *     operationId: createWebhookEndpoint
   *     summary: Create a webhook endpoint
   *     description: |
   *       Scope `webhooks:write`, workspace keys only (tenant keys 403). At most 50 endpoints per workspace
   *       (`400 bad_request`). `url` must be http(s) without credentials or port 0 and must not point to (or resolve
   *       to) a private, loopback, link-local, CGNAT, multicast or reserved address; https only in production
   *       (`400 invalid_url`). A host name that does not resolve now is saved (each attempt resolves it again and
   *       refuses a private address then). `events` defaults to `["*"]`; private names (`key.*`, `webhook.*`, `profile.*`)
   *       are `400 invalid_event`. `tenant` (a slug of the workspace) narrows the endpoint to that tenant.
   *       The answer carries the signing secret (`secret`, `whsec_…`) this once. The endpoint receives events
   *       from its creation on, never earlier ones.
   *     tags: [Webhooks]
   *     parameters: [{ $ref: '#/components/parameters/workspaceSlug' }]
   *     requestBody:
   *       required: true
   *       content: { application/json: { schema: { $ref: '#/components/schemas/CreateWebhookRequest' } } }
   *     responses:
   *       '201':
   *         description: The endpoint with its secret
   *         content: { application/json: { schema: { $ref: '#/components/schemas/WebhookEndpointWithSecretResponse' } } }
   *       '400': { $ref: '#/components/responses/Error' }
   *       '401': { $ref: '#/components/responses/Unauthorized' }
   *       '403': { $ref: '#/components/responses/Error' }
   *       default: { $ref: '#/components/responses/Error' }
   *   get:
   *     operationId: listWebhookEndpoints
   *     x-query: ListQuery
   *     summary: List webhook endpoints
   *     description: Scope `webhooks:read`. Newest first, with `total`. Secrets are never shown.
   *     tags: [Webhooks]
   *     parameters:
   *       - $ref: '#/components/parameters/workspaceSlug'
   *     responses:
   *       '200':
   *         description: A page of endpoints
   *         content: { application/json: { schema: { $ref: '#/components/schemas/WebhookEndpointListResponse' } } }
   *       default: { $ref: '#/components/responses/Error' }
   */
  router.post('/v1/workspaces/:workspaceSlug/webhooks', write, async (ctx) => {
    const body = checkEndpointBody<CreateBody>('CreateWebhookRequest', ctx.request.body);
    const workspace = workspaceOf(ctx);
    const events = checkEvents(body.events ?? ['*']);
    const tenant = await tenantRef(deps, workspace.id, body.tenant ?? null);
    const url = await checkUrl(body.url, urlOptions);
    const endpoint = await createEndpoint(redis, keys, workspace, { url, description: body.description ?? null, events, tenant }, writerOf(ctx));
    if (!endpoint) throw new ApiError(400, 'bad_request', 'A workspace has at most 50 webhook endpoints; delete one first');
    respond(ctx, 201, withSecret(endpoint));
  });

  router.get('/v1/workspaces/:workspaceSlug/webhooks', read, async (ctx) => {
    const page = pageRequest(ctx);
    const workspaceId = workspaceOf(ctx).id;
    respond(ctx, 200, await pageRecords(redis, keys.webhookEndpoints(workspaceId), page, 'webhookEndpoint', async (ids) =>
      (await loadEndpoints(redis, keys, workspaceId, ids)).map((e) => (e ? publicEndpoint(e) : null))));
  });

  /**
   * @openapi
   * /v1/workspaces/{workspaceSlug}/webhooks/{id}:
   *   get:
   *     operationId: getWebhookEndpoint
   *     summary: One webhook endpoint
   *     description: Scope `webhooks:read`. Never the secret.
   *     tags: [Webhooks]
   *     parameters:
   *       - $ref: '#/components/parameters/workspaceSlug'
   *       - { name: id, in: path, required: true, schema: { type: string } }
   *     responses:
   *       '200':
   *         description: The endpoint
   *         content: { application/json: { schema: { $ref: '#/components/schemas/WebhookEndpointResponse' } } }
   *       default: { $ref: '#/components/responses/Error' }
   *   patch:
   *     operationId: updateWebhookEndpoint
   *     summary: Edit or re-enable a webhook endpoint
   *     description: |
   *       Scope `webhooks:write`. Any of `url`, `description`, `events`, `tenant` (null: every tenant) and
   *       `enabled`, with the rules of creation. A changed `url`, `events` or `tenant` takes effect for events
   *       from now on. `enabled: true` on a disabled endpoint clears its failure streak, re-queues its pending
   *       and failed deliveries at once, and delivers events from now on (never those of the disabled time);
   *       `enabled: false` stops new deliveries and holds its queued attempts; an event from before it that the
   *       dispatcher reads only afterwards still gets its delivery, held with them until the re-enable.
   *     tags: [Webhooks]
   *     parameters:
   *       - $ref: '#/components/parameters/workspaceSlug'
   *       - { name: id, in: path, required: true, schema: { type: string } }
   *     requestBody:
   *       required: true
   *       content: { application/json: { schema: { $ref: '#/components/schemas/UpdateWebhookRequest' } } }
   *     responses:
   *       '200':
   *         description: The endpoint after the change
   *         content: { application/json: { schema: { $ref: '#/components/schemas/WebhookEndpointResponse' } } }
   *       '400': { $ref: '#/components/responses/Error' }
   *       '404': { $ref: '#/components/responses/Error' }
   *       default: { $ref: '#/components/responses/Error' }
   *   delete:
   *     operationId: deleteWebhookEndpoint
   *     summary: Delete a webhook endpoint
   *     description: Scope `webhooks:write`. Stops its deliveries; answers the endpoint as it was.
   *     tags: [Webhooks]
   *     parameters:
   *       - $ref: '#/components/parameters/workspaceSlug'
   *       - { name: id, in: path, required: true, schema: { type: string } }
   *     responses:
   *       '200':
   *         description: The deleted endpoint
   *         content: { application/json: { schema: { $ref: '#/components/schemas/WebhookEndpointResponse' } } }
   *       '404': { $ref: '#/components/responses/Error' }
   *       default: { $ref: '#/components/responses/Error' }
   */
  router.get('/v1/workspaces/:workspaceSlug/webhooks/:id', read, async (ctx) => {
    respond(ctx, 200, publicEndpoint(await endpointOr404(ctx)));
  });

  router.patch('/v1/workspaces/:workspaceSlug/webhooks/:id', write, async (ctx) => {
    const body = checkEndpointBody<UpdateBody>('UpdateWebhookRequest', ctx.request.body);
    const workspace = workspaceOf(ctx);
    await endpointOr404(ctx);
    const patch: EndpointPatch = {};
    if (body.events !== undefined) patch.events = checkEvents(body.events);
    if (body.tenant !== undefined) patch.tenant = await tenantRef(deps, workspace.id, body.tenant);
    if (body.url !== undefined) patch.url = await checkUrl(body.url, urlOptions);
    if (body.description !== undefined) patch.description = body.description;
    if (body.enabled !== undefined) patch.enabled = body.enabled;
    const updated = await updateEndpoint(redis, keys, workspace, ctx.params.id!, patch, writerOf(ctx));
    if (!updated) throw notFound('Webhook endpoint');
    if (updated.reenabled) {
      // a backlog of any size is answered within REQUEUE_IN_REQUEST_MS; the rest goes on after the
      // answer, and a process killed before the end leaves it to the dispatchers' sweep
      const requeue = requeueOwed(redis, keys, workspace.id, updated.endpoint.id, updated.atMs).catch((err: Error) => {
        log.warn('re-queue of a re-enabled webhook endpoint\'s deliveries failed; the dispatchers\' sweep finishes it', { endpoint: updated.endpoint.id, err: err.message });
      });
      await waitAtMost(requeue, REQUEUE_IN_REQUEST_MS);
    }
    respond(ctx, 200, publicEndpoint(updated.endpoint));
  });

  router.delete('/v1/workspaces/:workspaceSlug/webhooks/:id', write, async (ctx) => {
    const deleted = await deleteEndpoint(redis, keys, workspaceOf(ctx), ctx.params.id!, writerOf(ctx));
    if (!deleted) throw notFound('Webhook endpoint');
    respond(ctx, 200, publicEndpoint(deleted));
  });

  /**
   * @openapi
   * /v1/workspaces/{workspaceSlug}/webhooks/{id}/rotate:
   *   post:
   *     operationId: rotateWebhookSecret
   *     summary: Rotate an endpoint's signing secret
   *     description: Scope `webhooks:write`. Answers the endpoint with its new `secret`, shown this once. The
   *       secret it replaces keeps verifying for 24 hours from this rotation, and every request in that window
   *       carries its signature too (current first, then retired secrets newest first). A further rotation
   *       does not shorten an earlier secret's 24 hours; at most 10 retired secrets are kept, so an 11th
   *       rotation within 24 hours ends the oldest at once.
   *     tags: [Webhooks]
   *     parameters:
   *       - $ref: '#/components/parameters/workspaceSlug'
   *       - { name: id, in: path, required: true, schema: { type: string } }
   *     responses:
   *       '200':
   *         description: The endpoint with its new secret
   *         content: { application/json: { schema: { $ref: '#/components/schemas/WebhookEndpointWithSecretResponse' } } }
   *       '404': { $ref: '#/components/responses/Error' }
   *       default: { $ref: '#/components/responses/Error' }
   */
  router.post('/v1/workspaces/:workspaceSlug/webhooks/:id/rotate', write, async (ctx) => {
    const rotated = await rotateSecret(redis, keys, workspaceOf(ctx), ctx.params.id!, writerOf(ctx));
    if (!rotated) throw notFound('Webhook endpoint');
    respond(ctx, 200, withSecret(rotated));
  });

  registerWebhookDeliveries(router, deps, { read, write, endpointOr404 });
}
