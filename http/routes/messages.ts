import type { RoutesBySegment as Router } from '../routes-by-segment.js';
import type { Context } from 'koa';
import { now } from '../../lib/clock.js';
import { validationError } from '../../lib/errors.js';
import { validateExpression } from '../../lib/expressions.js';
import { bodyProblems } from '../../lib/validator.js';
import { apnsContentProblems, CONTENT_FIELDS, reservedDataProblems } from '../../lib/apns-payload.js';
import type { ErrorDetail } from '../../lib/errors.js';
import {
  cancelMessage, createMessage, findReplayedMessage, getDelivery, getMessage, loadDeliveries, loadMessages, MAX_SEND_AHEAD_MS, REFUSED, type MessageContent, type Target,
} from '../../streams/messages.js';
import { findTopic } from '../../streams/topics.js';
import { auditScopeOf } from '../audit.js';
import type { AppDeps } from '../deps.js';
import { respond } from '../envelope.js';
import { pageRecords, pageRequest } from '../list.js';
import { authorize, tenantOf, type AuthState } from '../middleware/auth.js';
import { RefusedBody } from '../middleware/json-body.js';
import { repeatsHeader } from '../params.js';

type CreateBody = MessageContent & { to: string | Record<string, unknown>; sendAt?: string };

/** `to` as an object (an inline `where` is checked by the expression validator, with its path). */
function targetOf(to: CreateBody['to']): Target {
  if (typeof to === 'string') return { externalId: to };
  if ('where' in to) return { where: to.where as Record<string, unknown> };
  if ('segment' in to) return { segment: to.segment as string };
  return 'topic' in to ? { topic: to.topic as string } : { externalId: to.externalId as string };
}

const isObject = (v: unknown): v is Record<string, unknown> => typeof v === 'object' && v !== null && !Array.isArray(v);

/**
 * The problems of a create body that its schema cannot state, each with its path: an inline
 * `to.where` (the expression validator), reserved `data` keys, `sendAt` more than 30 days ahead,
 * and, once the schema holds (`shapeOk`), the APNs payload size (`collapseId` is the schema's). Found beside the
 * schema's own problems, so one answer names every failing field (spec 2.1 `details`).
 */
function contentProblems(body: Record<string, unknown>, shapeOk: boolean): ErrorDetail[] {
  const details: ErrorDetail[] = [];
  if (isObject(body.to) && 'where' in body.to && Object.keys(body.to).length === 1) details.push(...validateExpression(body.to.where, 'to.where'));
  const reserved = reservedDataProblems(body.data);
  details.push(...reserved);
  if (typeof body.sendAt === 'string' && Date.parse(body.sendAt) > now() + MAX_SEND_AHEAD_MS) details.push({ param: 'sendAt', message: 'must be at most 30 days ahead' });
  if (shapeOk && reserved.length === 0) details.push(...apnsContentProblems(contentOf(body as CreateBody)));
  return details;
}

const contentOf = (body: CreateBody): MessageContent => Object.fromEntries(CONTENT_FIELDS.filter((f) => body[f] !== undefined).map((f) => [f, body[f]])) as MessageContent;

/** One `validation` answer for `details`, one item per param (the first found). */
function throwProblems(details: ErrorDetail[]): void {
  const seen = new Set<string>();
  const unique = details.filter((d) => !seen.has(d.param) && seen.add(d.param));
  if (unique.length) throw validationError(unique);
}

/**
 * The `Idempotency-Key` header: null when absent; present, it must hold 1 to 255 bytes (an
 * empty or blank one is a mistake to report, not a request without a key).
 */
function idempotencyKeyOf(ctx: Context): string | null {
  if (ctx.headers['idempotency-key'] === undefined) return null;
  if (repeatsHeader(ctx.req, 'idempotency-key')) throw validationError([{ param: 'Idempotency-Key', message: 'must be sent once, not on several lines' }]);
  const key = ctx.get('Idempotency-Key');
  if (key.trim() === '') throw validationError([{ param: 'Idempotency-Key', message: 'must not be empty' }]);
  if (key.length > 255) throw validationError([{ param: 'Idempotency-Key', message: 'must be at most 255 bytes (a UTF-8 character such as é counts two)' }]);
  return key;
}

export function registerMessages(router: Router, deps: AppDeps): void {
  const { redis, keys } = deps;

  /**
   * The topic or segment a target names, by id (null for an externalId or `where`, which need none),
   * and the problem of one the tenant does not have.
   */
  const resolveTarget = async (tenantId: string, to: Target): Promise<{ audienceId: string | null; problems: ErrorDetail[] }> => {
    if ('topic' in to) {
      const topic = await findTopic(redis, keys, tenantId, to.topic);
      return topic ? { audienceId: topic.id, problems: [] } : { audienceId: null, problems: [{ param: 'to.topic', message: `no topic "${to.topic}" in this tenant` }] };
    }
    if ('segment' in to) {
      const id = await redis.hget(keys.segmentSlugs(tenantId), to.segment);
      return id ? { audienceId: id, problems: [] } : { audienceId: null, problems: [{ param: 'to.segment', message: `no segment "${to.segment}" in this tenant` }] };
    }
    return { audienceId: null, problems: [] };
  };

  /**
   * @openapi
   * /v1/messages:
   *   post:
   *     operationId: sendMessage
   *     summary: Send a push message
   *     description: |
   *       Scope `messages:send`. `to` is an externalId, or `{ externalId }`, or `{ topic }` (a topic slug), `{ segment }` (a segment
   *       slug: its members when the fan-out walks them) or `{ where }` (an inline expression, docs/expressions.md, evaluated
   *       over the tenant's subscribers in chunks when the message fans out). Answers 202 with the message; the dispatcher then
   *       creates one delivery per subscription of the audience (skipped ones with a reason) and sends them over APNs.
   *       With `sendAt` the message is `scheduled` and can be canceled until due. With `Idempotency-Key`, replaying the same
   *       request answers the original message (202, `Idempotent-Replayed: true`) and sends nothing again; the same key with a
   *       different request is 409 `idempotency_key_reused`, whatever is wrong with it (not JSON, refused by the schema):
   *       a used key is looked up before the body is checked. Keys are per tenant and never expire. An empty (or blank) or
   *       longer than 255 bytes `Idempotency-Key`, or one sent on several header lines (read as one, `k, k` would be a
   *       new key), is 400 `validation` (param `Idempotency-Key`). A `to` that is neither
   *       a string nor an object with exactly one of its four fields is 400 `validation` with one detail, param `to`.
   *       The whole APNs payload (title, body, data and the rest) must fit in 4 KB: over it is 400 `validation`
   *       naming `data` when there is some, else `body`; `collapseId` is 1 to 64 printable ASCII characters (an HTTP header).
   *       One 400 names every failing field in `details` (an invalid `to.where` beside a missing `body`, a payload over 4 KB
   *       beside a topic or segment the tenant does not have).
   *     tags: [Messages]
   *     parameters:
   *       - $ref: '#/components/parameters/serviceTenant'
   *       - name: Idempotency-Key
   *         in: header
   *         required: false
   *         description: 1 to 255 bytes as UTF-8 (a character such as é counts two), not only whitespace; unique per tenant, never expires.
   *         schema: { type: string, minLength: 1, maxLength: 255 }
   *     requestBody: { required: true, content: { application/json: { schema: { $ref: '#/components/schemas/MessageCreate' } } } }
   *     responses:
   *       '202':
   *         description: The message
   *         headers: { Idempotent-Replayed: { description: true when this answers a replay, schema: { type: string } } }
   *         content: { application/json: { schema: { $ref: '#/components/schemas/MessageResponse' } } }
   *       '409':
   *         description: '`idempotency_key_reused`: this Idempotency-Key was used with a different request'
   *         content: { application/json: { schema: { $ref: '#/components/schemas/ErrorEnvelope' } } }
   *       default: { $ref: '#/components/responses/Error' }
   *   get:
   *     operationId: listMessages
   *     x-query: MessagesQuery
   *     summary: List messages
   *     description: Scope `messages:read`. Newest first, `total` under the same filter. A message is kept for `EVENT_RETENTION_DAYS`
   *       (default 30) after it ended (`completed`, `canceled`, `failed`), then expires with its deliveries; one sent with an
   *       `Idempotency-Key` stays (its replay answers it), without its deliveries (docs/messages.md, Retention).
   *     tags: [Messages]
   *     parameters:
   *       - $ref: '#/components/parameters/serviceTenant'
   *     responses:
   *       '200': { description: A page, content: { application/json: { schema: { $ref: '#/components/schemas/MessageListResponse' } } } }
   *       default: { $ref: '#/components/responses/Error' }
   */
  router.post('/v1/messages', authorize(deps, 'tenant', 'messages:send', { refusedBodyToRoute: true }), async (ctx) => {
    const idempotencyKey = idempotencyKeyOf(ctx);
    const raw: unknown = ctx.request.body;
    const refused = raw instanceof RefusedBody ? raw.error : null;
    if (refused && idempotencyKey === null) throw refused;
    const tenantId = tenantOf(ctx).id;
    // the body as sent is what a replay must repeat: validation fills in defaults (`priority`), and a
    // body that adds one is another request (probe AM: `priority: "high"` replayed one sent without it)
    const asSent: unknown = idempotencyKey === null ? null : refused ? REFUSED : structuredClone(raw);
    // a key already used answers before anything is checked: the original for the same body (its topic
    // or segment may be gone since), 409 for any other, one the schema refuses too (spec 4.2: it was
    // 400 until session 62, probe E), or even the JSON layer (not JSON, too deep: probe X2); only an
    // unused key lets a body's problems be answered
    const original = idempotencyKey === null ? null : await findReplayedMessage(redis, keys, tenantId, idempotencyKey, asSent);
    if (original) {
      ctx.set('Idempotent-Replayed', 'true');
      return respond(ctx, 202, original);
    }
    if (refused) throw refused;
    const schemaProblems = bodyProblems('MessageCreate', raw);
    if (schemaProblems.length) {
      const content = isObject(raw) ? contentProblems(raw, false) : [];
      // an expression's own wording of a bad `to.where` (as a segment's `where` says it), not the schema's `must be object` (probe AQ)
      const problems = [...schemaProblems.filter((d) => d.param !== 'to.where' || !content.some((c) => c.param === 'to.where')), ...content];
      // a well-formed `to` is checked against the tenant too, so the one answer names it as well
      const toOk = isObject(raw) && raw.to !== undefined && !problems.some((d) => d.param === 'to' || d.param.startsWith('to.'));
      throwProblems(toOk ? [...problems, ...(await resolveTarget(tenantId, targetOf(raw.to as CreateBody['to']))).problems] : problems);
    }
    const body = raw as CreateBody;
    const to = targetOf(body.to);
    const target = await resolveTarget(tenantId, to);
    throwProblems([...contentProblems(body as unknown as Record<string, unknown>, true), ...target.problems]);
    let sendAtMs: number | null = null;
    if (body.sendAt) {
      sendAtMs = Date.parse(body.sendAt);
      if (sendAtMs <= now()) sendAtMs = null; // due already: send now
    }
    const content = contentOf(body); // checked above: the APNs payload fits in 4 KB
    const auth = ctx.state.auth as AuthState;
    // audits message.created when the message is new; a replay is answered, not audited again
    const { message, replayed } = await createMessage(
      redis, keys, { workspaceId: auth.workspace.id, tenantId: tenantOf(ctx).id }, { to, content, sendAt: sendAtMs ? { atMs: sendAtMs, partitions: deps.config.partitions } : null, audienceId: target.audienceId }, { key: idempotencyKey, request: asSent }, auditScopeOf(ctx), deps.log,
    );
    if (replayed) ctx.set('Idempotent-Replayed', 'true');
    respond(ctx, 202, message);
  });

  router.get('/v1/messages', authorize(deps, 'tenant', 'messages:read'), async (ctx) => {
    const { limit, after, query } = pageRequest<{ status?: string }>(ctx, 'MessagesQuery');
    const tenantId = tenantOf(ctx).id;
    const index = query.status ? keys.messagesByStatus(tenantId, query.status) : keys.messageIndex(tenantId);
    respond(ctx, 200, await pageRecords(redis, index, { limit, after }, 'message', (ids) => loadMessages(redis, keys, tenantId, ids)));
  });

  /**
   * @openapi
   * /v1/messages/{id}:
   *   get:
   *     operationId: getMessage
   *     summary: One message, with its counts by delivery status
   *     description: Scope `messages:read`. 404 once expired, `EVENT_RETENTION_DAYS` after it ended, unless it was sent with an `Idempotency-Key`.
   *     tags: [Messages]
   *     parameters: [{ $ref: '#/components/parameters/serviceTenant' }, { name: id, in: path, required: true, schema: { type: string } }]
   *     responses:
   *       '200': { description: The message, content: { application/json: { schema: { $ref: '#/components/schemas/MessageResponse' } } } }
   *       default: { $ref: '#/components/responses/Error' }
   * /v1/messages/{id}/cancel:
   *   post:
   *     operationId: cancelMessage
   *     summary: Cancel a message that has not started sending
   *     description: Scope `messages:send`. A scheduled (or still queued) message becomes `canceled`; once sending has begun, 409 `conflict`.
   *       Canceling a canceled message answers it again (200); `message.canceled` is audited once.
   *     tags: [Messages]
   *     parameters: [{ $ref: '#/components/parameters/serviceTenant' }, { name: id, in: path, required: true, schema: { type: string } }]
   *     responses:
   *       '200': { description: The canceled message, content: { application/json: { schema: { $ref: '#/components/schemas/MessageResponse' } } } }
   *       '409': { $ref: '#/components/responses/Error' }
   *       default: { $ref: '#/components/responses/Error' }
   * /v1/messages/{id}/deliveries:
   *   get:
   *     operationId: listMessageDeliveries
   *     x-query: DeliveriesQuery
   *     summary: A message's deliveries
   *     description: Scope `messages:read`. Newest first, `total` under the same filter. Deliveries expire `EVENT_RETENTION_DAYS` after their
   *       message ended; a message kept for its `Idempotency-Key` then lists none (its `counts` stay).
   *     tags: [Messages]
   *     parameters:
   *       - $ref: '#/components/parameters/serviceTenant'
   *       - { name: id, in: path, required: true, schema: { type: string } }
   *     responses:
   *       '200': { description: A page, content: { application/json: { schema: { $ref: '#/components/schemas/DeliveryListResponse' } } } }
   *       default: { $ref: '#/components/responses/Error' }
   * /v1/deliveries/{id}:
   *   get:
   *     operationId: getDelivery
   *     summary: One delivery with the provider's last answer
   *     description: Scope `messages:read`. 404 once expired (`EVENT_RETENTION_DAYS` after its message ended).
   *     tags: [Messages]
   *     parameters: [{ $ref: '#/components/parameters/serviceTenant' }, { name: id, in: path, required: true, schema: { type: string } }]
   *     responses:
   *       '200': { description: The delivery, content: { application/json: { schema: { $ref: '#/components/schemas/DeliveryResponse' } } } }
   *       default: { $ref: '#/components/responses/Error' }
   */
  router.get('/v1/messages/:id', authorize(deps, 'tenant', 'messages:read'), async (ctx: Context) => {
    respond(ctx, 200, await getMessage(redis, keys, tenantOf(ctx).id, ctx.params.id!));
  });

  router.post('/v1/messages/:id/cancel', authorize(deps, 'tenant', 'messages:send'), async (ctx: Context) => {
    // a message canceled before (by this request's retry, or a concurrent one) is answered as it is, audited once
    const { message } = await cancelMessage(redis, keys, tenantOf(ctx).id, ctx.params.id!, auditScopeOf(ctx), deps.config.partitions);
    respond(ctx, 200, message);
  });

  router.get('/v1/messages/:id/deliveries', authorize(deps, 'tenant', 'messages:read'), async (ctx: Context) => {
    const tenantId = tenantOf(ctx).id;
    const message = await getMessage(redis, keys, tenantId, ctx.params.id!);
    const { limit, after, query } = pageRequest<{ status?: string }>(ctx, 'DeliveriesQuery');
    const index = query.status ? keys.messageDeliveriesByStatus(tenantId, message.id, query.status) : keys.messageDeliveries(tenantId, message.id);
    // newest first by creation (the scores lua/createDeliveries gives; ids are derived, in no order:
    // probe CF); a cursor of an id alone (given before session 55) is placed by that delivery's score
    // in the message's index, whatever its status now, else at 0 (where those made before are)
    const all = keys.messageDeliveries(tenantId, message.id);
    respond(ctx, 200, await pageRecords(redis, index, { limit, after }, 'delivery', (ids) => loadDeliveries(redis, keys, tenantId, ids), {
      unscored: async (id) => (await redis.zscore(all, id)) ?? '0',
    }));
  });

  router.get('/v1/deliveries/:id', authorize(deps, 'tenant', 'messages:read'), async (ctx: Context) => {
    respond(ctx, 200, await getDelivery(redis, keys, tenantOf(ctx).id, ctx.params.id!));
  });
}
