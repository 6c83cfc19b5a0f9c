import type { RoutesBySegment as Router } from '../routes-by-segment.js';
import type { Context } from 'koa';
import { now } from '../../lib/clock.js';
import { ApiError, notFound, validationError } from '../../lib/errors.js';
import { generatedSecret, readDelivery, secretProblem, verifyDelivery } from '../../lib/source-formats.js';
import { MAX_INBOUND_BYTES } from '../../lib/source-limits.js';
import { isHeraldLoop } from '../../lib/webhook-policy.js';
import { checkBody } from '../../lib/validator.js';
import { ingestEvents } from '../../streams/ingest.js';
import {
  countDelivery, createSource, deleteSource, findInboundSource, findSource, isRoutedSource, loadSources, updateSource,
  type IgnoredReason, type InboundSource, type Source, type SourceInput, type SourcePatch,
} from '../../streams/sources.js';
import type { AppDeps } from '../deps.js';
import { respond } from '../envelope.js';
import { readBody } from '../read-body.js';
import { pageRecords, pageRequest } from '../list.js';
import { authorize, refsOf, tenantOf, writerOf } from '../middleware/auth.js';
import { parsedJsonProblem, utf8Text } from '../middleware/json-body.js';
import { requestOrigin } from '../origin.js';

/**
 * The exact bytes of a request body, at most `limit` (413 above it, counted on the way, so a
 * sender cannot make the process hold more). Only uncompressed bodies: a signature is over the
 * bytes the provider sent.
 */
async function rawBody(ctx: Context, limit: number): Promise<Buffer> {
  const encoding = (ctx.get('Content-Encoding') || 'identity').toLowerCase();
  if (encoding !== 'identity') throw new ApiError(400, 'bad_request', 'Send the delivery uncompressed: its signature is over the bytes as sent', { param: 'Content-Encoding' });
  if (Number(ctx.get('Content-Length') || 0) > limit) throw new ApiError(413, 'payload_too_large', `A delivery is at most ${limit} bytes`);
  const chunks: Buffer[] = [];
  let size = 0;
  try {
    // leaving the loop at the limit must not destroy the request: its answer (413) is still to be
    // written, and the rest of the body read and dropped (http/middleware/errors.ts `readRestOf`;
    // destroyed, the answer was a bare 500, probe CI)
    for await (const chunk of ctx.req.iterator({ destroyOnReturn: false }) as AsyncIterable<Buffer>) {
      size += chunk.length;
      if (size > limit) throw new ApiError(413, 'payload_too_large', `A delivery is at most ${limit} bytes`);
      chunks.push(chunk);
    }
  } catch (err) {
    if (err instanceof ApiError) throw err;
    // the sender went away (or stalled past Node's request timeout) before the body was whole:
    // a malformed request like any other, not a fault of the service
    throw new ApiError(400, 'bad_request', 'The request body did not arrive whole', { param: 'request' });
  }
  return Buffer.concat(chunks);
}

/** Why `provider` and `format` cannot be in a PATCH: they decide how every delivery is read. */
const IMMUTABLE = 'cannot be changed; create another source';

export function registerSources(router: Router, deps: AppDeps): void {
  const { redis, keys, config } = deps;
  const read = authorize(deps, 'tenant', 'sources:read');
  const write = authorize(deps, 'tenant', 'sources:write');

  /** The source as the API shows it: with the URL its provider sends to, as this caller reached the service. */
  const shown = (ctx: Context, source: Source) => ({ ...source, inboundUrl: `${requestOrigin(ctx, config.trustProxyHops)}/v1/sources/${source.id}/inbound` });

  /**
   * @openapi
   * /v1/sources:
   *   post:
   *     operationId: createSource
   *     summary: Create a source (an inbound webhook URL)
   *     description: |
   *       Scope `sources:write`. Another service's webhooks sent to the answer's `inboundUrl` become events
   *       (`source` `webhook`, `provider` this source's provider) on the subscriber the `mapping` names
   *       (docs/sources.md). `format` says how deliveries are signed: `standard-webhooks`, `stripe` or `github`.
   *       `secret` is required for `stripe` (the endpoint's signing secret from Stripe) and generated when omitted
   *       otherwise; the answer shows it, and no other answer will. A tenant has at most 100 sources (400
   *       `bad_request`). Audited as `source.created` (without the secret).
   *     tags: [Sources]
   *     parameters: [{ $ref: '#/components/parameters/serviceTenant' }]
   *     requestBody:
   *       required: true
   *       content: { application/json: { schema: { $ref: '#/components/schemas/SourceCreate' } } }
   *     responses:
   *       '201':
   *         description: The new source with its secret
   *         content: { application/json: { schema: { $ref: '#/components/schemas/SourceWithSecretResponse' } } }
   *       default: { $ref: '#/components/responses/Error' }
   *   get:
   *     operationId: listSources
   *     x-query: ListQuery
   *     summary: List sources
   *     description: Scope `sources:read`. The tenant's sources, newest first, with `total`; never a secret.
   *     tags: [Sources]
   *     parameters:
   *       - $ref: '#/components/parameters/serviceTenant'
   *     responses:
   *       '200':
   *         description: A page of sources
   *         content: { application/json: { schema: { $ref: '#/components/schemas/SourceListResponse' } } }
   *       default: { $ref: '#/components/responses/Error' }
   */
  router.post('/v1/sources', write, async (ctx) => {
    const body = checkBody<Omit<SourceInput, 'secret'> & { secret?: string }>('SourceCreate', ctx.request.body);
    const secret = body.secret ?? generatedSecret(body.format);
    if (secret === null) throw validationError([{ param: 'secret', message: `is required for format ${body.format}: paste the signing secret the provider shows` }]);
    const problem = secretProblem(body.format, secret);
    if (problem) throw validationError([{ param: 'secret', message: problem }]);
    const source = await createSource(redis, keys, refsOf(ctx), { ...body, secret }, writerOf(ctx));
    respond(ctx, 201, { ...shown(ctx, source), secret });
  });

  router.get('/v1/sources', read, async (ctx) => {
    const tenantId = tenantOf(ctx).id;
    const page = await pageRecords(redis, keys.sourceIndex(tenantId), pageRequest(ctx), 'source', (ids) => loadSources(redis, keys, tenantId, ids));
    respond(ctx, 200, { ...page, items: page.items.map((s) => shown(ctx, s)) });
  });

  /**
   * @openapi
   * /v1/sources/{id}:
   *   parameters:
   *     - { name: id, in: path, required: true, schema: { type: string } }
   *   get:
   *     operationId: getSource
   *     summary: One source
   *     description: Scope `sources:read`. Its settings, delivery counts by outcome and last error; never its secret.
   *       An unknown or malformed id, or another tenant's, is 404.
   *     tags: [Sources]
   *     parameters: [{ $ref: '#/components/parameters/serviceTenant' }]
   *     responses:
   *       '200':
   *         description: The source
   *         content: { application/json: { schema: { $ref: '#/components/schemas/SourceResponse' } } }
   *       default: { $ref: '#/components/responses/Error' }
   *   patch:
   *     operationId: updateSource
   *     summary: Change a source
   *     description: |
   *       Scope `sources:write`. Changes `name`, `mapping` (replaced whole), `namePrefix`, `enabled` or `secret`.
   *       A new secret leaves the replaced one verifying for 24 hours; `revokeOldSecrets: true` ends every replaced
   *       secret at once (a leaked one). `provider` and `format` cannot change
   *       (`validation` naming them). Audited as `source.updated` with `changes` and `previousAttributes` when a
   *       value changes (`updatedAt` moves only then; a new secret shows as `secretUpdatedAt`).
   *     tags: [Sources]
   *     parameters: [{ $ref: '#/components/parameters/serviceTenant' }]
   *     requestBody:
   *       required: true
   *       content: { application/json: { schema: { $ref: '#/components/schemas/SourceUpdate' } } }
   *     responses:
   *       '200':
   *         description: The source after the change
   *         content: { application/json: { schema: { $ref: '#/components/schemas/SourceResponse' } } }
   *       default: { $ref: '#/components/responses/Error' }
   *   delete:
   *     operationId: deleteSource
   *     summary: Delete a source
   *     description: Scope `sources:write`. Its inbound URL answers 404 from then on; the events it stored stay.
   *       Answers the source as it was. Audited as `source.deleted`.
   *     tags: [Sources]
   *     parameters: [{ $ref: '#/components/parameters/serviceTenant' }]
   *     responses:
   *       '200':
   *         description: The deleted source
   *         content: { application/json: { schema: { $ref: '#/components/schemas/SourceResponse' } } }
   *       default: { $ref: '#/components/responses/Error' }
   */
  router.get('/v1/sources/:id', read, async (ctx) => {
    const source = await findSource(redis, keys, tenantOf(ctx).id, ctx.params.id ?? '');
    if (!source) throw notFound('Source');
    respond(ctx, 200, shown(ctx, source));
  });

  router.patch('/v1/sources/:id', write, async (ctx) => {
    const id = ctx.params.id ?? '';
    // the body first, as on every other PATCH: a bad body is 400 whatever the id; the secret's rule
    // depends on the source's format, so that one check waits for the record
    const patch = readBody<SourcePatch>('SourceUpdate', ctx.request.body, undefined, { provider: IMMUTABLE, format: IMMUTABLE });
    const current = await findSource(redis, keys, tenantOf(ctx).id, id);
    if (!current) throw notFound('Source');
    const problem = patch.secret === undefined ? null : secretProblem(current.format, patch.secret);
    if (problem) throw validationError([{ param: 'secret', message: problem }]);
    respond(ctx, 200, shown(ctx, await updateSource(redis, keys, refsOf(ctx), id, patch, writerOf(ctx))));
  });

  router.delete('/v1/sources/:id', write, async (ctx) => {
    respond(ctx, 200, shown(ctx, await deleteSource(redis, keys, refsOf(ctx), ctx.params.id ?? '', writerOf(ctx))));
  });

  /**
   * @openapi
   * /v1/sources/{id}/inbound:
   *   post:
   *     operationId: receiveSourceDelivery
   *     summary: A provider's webhook delivery
   *     description: |
   *       **No Authorization header**: the provider signs each delivery, and the signature is verified under the
   *       source's secret against the exact bytes received (`standard-webhooks`: webhook-id, webhook-timestamp,
   *       webhook-signature, or Svix's svix-id, svix-timestamp, svix-signature; `stripe`: Stripe-Signature; `github`: X-Hub-Signature-256), with a timestamp at most
   *       5 minutes off where the format signs one. A JSON object body of at most 256 KB.
   *
   *       202 `accepted` with the stored event, or `duplicate` with the original one when the delivery's dedupe key
   *       was seen before (nothing stored). 200 `ignored` (a disabled source, no externalId or no name in the
   *       payload, or `loop`: a Herald webhook event (by its sender or its shape: a `whe_` id, `apiVersion` `v1`, a `workspace.id`) of this workspace's own outbound webhooks, or of what a Herald made itself: an event a source stored or the engine wrote, a control-plane event of the system): the provider need not retry. 401 `missing_authorization` without the signature header,
   *       `invalid_signature` when it does not verify; 400 `parse`, `validation`, `invalid_timestamp` or
   *       `event_data_too_large` when the payload cannot be an event (counted as `rejected`, shown in `lastError`);
   *       404 for an unknown or deleted source. 429 `rate_limited` (`Retry-After: 1`) while the tenant has
   *       `TENANT_INBOX_MAX_BACKLOG` or more events waiting to be processed in the event's partition (or its subscriber
   *       `SUBSCRIBER_INBOX_MAX_BACKLOG`), 503 `unavailable` while
   *       the partition's inbox is over `INBOX_MAX_BACKLOG`: nothing stored, and providers retry such answers.
   *     tags: [Sources]
   *     security: []
   *     parameters:
   *       - { name: id, in: path, required: true, schema: { type: string } }
   *       - { name: webhook-id, in: header, required: false, description: 'standard-webhooks: the message id (the default dedupe key)', schema: { type: string } }
   *       - { name: webhook-timestamp, in: header, required: false, description: 'standard-webhooks: unix seconds, at most 5 minutes off', schema: { type: string } }
   *       - { name: webhook-signature, in: header, required: false, description: 'standard-webhooks: space-separated `v1,<base64 HMAC-SHA256>` of `id.timestamp.body`', schema: { type: string } }
   *       - { name: svix-id, in: header, required: false, description: 'standard-webhooks as Svix sends it (Clerk, Resend): webhook-id under its Svix name, read when webhook-id is absent', schema: { type: string } }
   *       - { name: svix-timestamp, in: header, required: false, description: 'standard-webhooks as Svix sends it: webhook-timestamp under its Svix name', schema: { type: string } }
   *       - { name: svix-signature, in: header, required: false, description: 'standard-webhooks as Svix sends it: webhook-signature under its Svix name', schema: { type: string } }
   *       - { name: Stripe-Signature, in: header, required: false, description: 'stripe: `t=<unix seconds>,v1=<hex HMAC-SHA256 of "t.body">`', schema: { type: string } }
   *       - { name: X-Hub-Signature-256, in: header, required: false, description: 'github: `sha256=<hex HMAC-SHA256 of the body>`', schema: { type: string } }
   *       - { name: X-GitHub-Event, in: header, required: false, description: 'github: the event (with the payload''s `action`, the default name)', schema: { type: string } }
   *       - { name: X-GitHub-Delivery, in: header, required: false, description: 'github: the delivery id (not signed, so not the dedupe key: a github delivery is deduplicated by the SHA-256 of its body)', schema: { type: string } }
   *     requestBody:
   *       required: true
   *       description: The provider's JSON payload, read as the exact bytes received whatever its Content-Type (the signature covers them).
   *       content: { application/json: { schema: { type: object, description: "The provider's payload." } } }
   *     responses:
   *       '202':
   *         description: Stored, or a duplicate of a stored delivery
   *         content: { application/json: { schema: { $ref: '#/components/schemas/SourceDeliveryResponse' } } }
   *       '200':
   *         description: Ignored; nothing stored
   *         content: { application/json: { schema: { $ref: '#/components/schemas/SourceDeliveryResponse' } } }
   *       '400': { $ref: '#/components/responses/Error' }
   *       '401': { $ref: '#/components/responses/Error' }
   *       '404': { $ref: '#/components/responses/Error' }
   *       '413': { $ref: '#/components/responses/Error' }
   *       '429': { $ref: '#/components/responses/RateLimited' }
   *       '503': { $ref: '#/components/responses/Unavailable' }
   *       default: { $ref: '#/components/responses/Error' }
   */
  router.post('/v1/sources/:id/inbound', async (ctx) => {
    // an unknown id is answered before its body is read; the source is read again once the body is
    // in: a delete, disable, mapping or secret change answered while a slow body arrived (up to
    // HTTP_REQUEST_TIMEOUT_MS) applies to it (probe AG)
    if (!await isRoutedSource(redis, keys, ctx.params.id ?? '')) throw notFound('Source');
    const body = await rawBody(ctx, MAX_INBOUND_BYTES);
    const source = await findInboundSource(redis, keys, ctx.params.id ?? '');
    if (!source) throw notFound('Source');
    const verdict = verifyDelivery(source.format, source.secrets, ctx.req.headers, body, Math.floor(now() / 1000));
    if (!verdict.ok) return refuse(source, new ApiError(401, verdict.code, verdict.message), false);
    let payload: unknown;
    try {
      payload = JSON.parse(utf8Text(body));
    } catch (err) {
      if (err instanceof ApiError) return refuse(source, err, true); // not UTF-8 (probe BP: read as U+FFFD and stored)
      payload = undefined;
    }
    if (payload === null || typeof payload !== 'object' || Array.isArray(payload)) {
      return refuse(source, new ApiError(400, 'parse', 'A delivery must be a JSON object', { param: 'body' }), true);
    }
    // what no request body may hold (a __proto__ key, deep nesting, a lone surrogate, 1e999)
    const problem = parsedJsonProblem(payload);
    if (problem) return refuse(source, validationError([problem]), true);
    if (!source.enabled) return ignore(ctx, source, 'disabled');
    // Herald's own webhook of this workspace coming back, or what a Herald made itself forwarded by
    // one: each event stored would be delivered again and come back again, for ever with no
    // namePrefix (probe F1: 126 in a few seconds until names outgrew 100 characters; probes AG, AK:
    // two workspaces)
    if (isHeraldLoop(ctx.req.headers['user-agent'], payload as Record<string, unknown>, source.workspaceId)) return ignore(ctx, source, 'loop');
    const reading = readDelivery(source, payload as Record<string, unknown>, ctx.req.headers, body);
    if (reading.kind === 'ignored') return ignore(ctx, source, reading.reason);
    if (reading.kind === 'rejected') {
      return refuse(source, validationError([{ param: reading.param, message: reading.message }], reading.code), true);
    }
    const [event] = await ingestEvents(redis, keys, { workspaceId: source.workspaceId, tenantId: source.tenantId, partitions: config.partitions, maxBacklog: config.inboxMaxBacklog, tenantMaxBacklog: config.tenantInboxMaxBacklog, subscriberMaxBacklog: config.subscriberInboxMaxBacklog }, [{
      externalId: reading.externalId, name: reading.name, source: 'webhook', timestampMs: reading.timestampMs, data: reading.data,
      // dedupe keys are the source's own: two sources (or a backend's ids) never match
      callerId: reading.dedupeId === null ? null : `${source.id}:${reading.dedupeId}`, provider: source.provider, runId: null, messageId: null, step: null,
    }]);
    const { status, ...stored } = event!;
    await countDelivery(redis, keys, source, status, true);
    respond(ctx, 202, { status, reason: null, event: stored });
  });

  /** Counts a refused delivery with its error, then answers the error. */
  async function refuse(source: InboundSource, err: ApiError, verified: boolean): Promise<never> {
    await countDelivery(redis, keys, source, 'rejected', verified, err);
    throw err;
  }

  async function ignore(ctx: Context, source: InboundSource, reason: IgnoredReason): Promise<void> {
    await countDelivery(redis, keys, source, 'ignored', true, reason);
    respond(ctx, 200, { status: 'ignored', reason, event: null });
  }
}
