import { join, dirname } from 'node:path';
import { fileURLToPath } from 'node:url';
import swaggerJsdoc from 'swagger-jsdoc';
import { LIST_QUERY_PROPERTIES } from '../lib/schemas/common.js';
import { allSchemas } from '../lib/schemas/index.js';
import { SLUG_MAX_LENGTH, SLUG_MIN_LENGTH, SLUG_PATTERN } from '../lib/slugs.js';

const here = dirname(fileURLToPath(import.meta.url));

/** A path parameter holding a topic, segment or workflow slug (spec 2.3 rule 3, `lib/slugs.ts`). */
function slugParameter(name: string, kind: string): Record<string, unknown> {
  return {
    name, in: 'path', required: true,
    description: `The ${kind}'s slug. One that is unknown, malformed or another tenant's is 404 \`not_found\`.`,
    schema: { type: 'string', minLength: SLUG_MIN_LENGTH, maxLength: SLUG_MAX_LENGTH, pattern: SLUG_PATTERN },
  };
}

/**
 * Builds the OpenAPI 3.0 document from the `@openapi` blocks beside each handler (in source or
 * in the built output) and the schemas of `lib/schemas`, the same objects ajv validates with.
 */
export function buildOpenApi(): Record<string, unknown> {
  const doc = swaggerJsdoc({
    failOnErrors: true,
    apis: [join(here, 'routes', '*.ts').replace(/\\/g, '/'), join(here, 'routes', '*.js').replace(/\\/g, '/')].filter((p) => !p.endsWith('.d.ts')),
    definition: {
      openapi: '3.0.3',
      info: {
        title: 'Herald',
        version: '1.0.0',
        description: 'Self-hosted notification orchestration for mobile apps. Every response uses the envelope of `ErrorEnvelope` / `<Name>Response`, except the 200 of `GET /v1/openapi.json`, '
          + 'which is this document itself, bare, for tools to read (its errors are enveloped). '
          + 'Every path is also served with one trailing slash (the same operation; a list there is the same list, cursors included); '
          + 'HEAD is answered for every GET, OPTIONS for every path (200 with `data.allow`), and a method a path does not take is 405 '
          + '`method_not_allowed` with an `Allow` header, in the envelope; a method name the server does not know at all (`FOO`, or a standard one not in capitals, '
          + 'such as `patch`: method names are case-sensitive) is 501 `not_implemented`, naming it, and the connection is closed. '
          + 'Query parameters: an operation that takes query parameters refuses any it does not list (400 `validation` naming it, so a misspelt filter never '
          + 'silently widens a list), and each at most once (a parameter given twice is 400 `validation` naming it); an operation that takes none ignores a query string. '
          + 'Request bodies are JSON in UTF-8: a body sent without `Content-Type`, or as `text/plain` (what a browser `fetch` of a string sends) or any `+json` type, is read as '
          + '`application/json` (a `charset` other than UTF-8 is not honoured), and any other type is 400 `bad_request` naming `Content-Type`. '
          + 'A `date-time` is RFC 3339 with a time zone (`Z` or `±hh:mm`), read to the millisecond; a leap second (`23:59:60`) is refused (400 `validation`).',
      },
      servers: [{ url: '/' }],
      security: [{ bearer: [] }],
      components: {
        securitySchemes: { bearer: { type: 'http', scheme: 'bearer', description: 'An API key (svc_ws_…, svc_tn_… or svc_pk_…), or on the event read routes (catalog, volume, recent events, timeline) the JWT of GET /v1/events/token.' } },
        headers: {
          RequestId: { description: 'The request id, equal to `metadata.requestId` of the envelope.', required: true, schema: { type: 'string' } },
        },
        responses: {
          Error: { description: 'An error in the envelope; branch on error.code.', content: { 'application/json': { schema: { $ref: '#/components/schemas/ErrorEnvelope' } } } },
          Unavailable: {
            description: 'Temporarily unable to take the request (unavailable: Redis unreachable or refusing writes, or on the event routes event processing behind); retry after Retry-After.',
            headers: { 'Retry-After': { description: 'Seconds to wait before the retry (5).', required: true, schema: { type: 'integer' } } },
            content: { 'application/json': { schema: { $ref: '#/components/schemas/ErrorEnvelope' } } },
          },
          RateLimited: {
            description: 'Too many requests for now (rate_limited: this tenant has TENANT_INBOX_MAX_BACKLOG or more events waiting to be processed in a partition the request writes to, a subscriber it names SUBSCRIBER_INBOX_MAX_BACKLOG or more, or (event routes) the tenant TENANT_INGEST_CONCURRENCY event requests in progress on the server; nothing of the request is stored); retry after Retry-After.',
            headers: { 'Retry-After': { description: 'Seconds to wait before the retry (1).', required: true, schema: { type: 'integer' } } },
            content: { 'application/json': { schema: { $ref: '#/components/schemas/ErrorEnvelope' } } },
          },
          LockTimeout: {
            description: 'The write kept losing to concurrent writes of the same subscriber, topic membership or workflow (lock_timeout: its compare-and-set was retried a bounded number of times); what it had not written is not written. Retry after Retry-After.',
            headers: { 'Retry-After': { description: 'Seconds to wait before the retry (1).', required: true, schema: { type: 'integer' } } },
            content: { 'application/json': { schema: { $ref: '#/components/schemas/ErrorEnvelope' } } },
          },
          Unauthorized: {
            description: 'No credential, or one refused (missing_authorization, invalid_api_key, api_key_expired, invalid_session); branch on error.code.',
            headers: { 'WWW-Authenticate': { description: '`Bearer`, or `Bearer error="invalid_token"` when a credential was presented and refused.', required: true, schema: { type: 'string' } } },
            content: { 'application/json': { schema: { $ref: '#/components/schemas/ErrorEnvelope' } } },
          },
        },
        parameters: {
          // the bounds the list validators check (lib/schemas/common.ts), so the document and the service agree
          limit: { name: 'limit', in: 'query', required: false, schema: { ...LIST_QUERY_PROPERTIES.limit } },
          cursor: { name: 'cursor', in: 'query', required: false, description: "The previous page's nextCursor, as it was given. A cursor belongs to the list that gave it (the same path, workspace and tenant; the filters may change between pages): a malformed one, or one another list gave, is 400 `validation`.", schema: { ...LIST_QUERY_PROPERTIES.cursor } },
          workspaceSlug: { name: 'workspaceSlug', in: 'path', required: true, schema: { type: 'string' } },
          // spec 2.3 rule 3 (and 4.5: "Slug rules of 2.3"); a malformed slug names nothing, so it is 404 like an unknown one
          topicSlug: slugParameter('topicSlug', 'topic'),
          segmentSlug: slugParameter('segmentSlug', 'segment'),
          workflowSlug: slugParameter('workflowSlug', 'workflow'),
          serviceTenant: {
            name: 'Service-Tenant', in: 'header', required: false, schema: { type: 'string' },
            description: "The tenant to work in (spec 5.4). A workspace key: any tenant of its workspace, `default` when absent. A tenant or client key, or an events token: its own tenant's slug only. "
              + 'A workspace route (`/v1/workspaces/…`) works in no one tenant; a slug sent there must still be a tenant of the workspace. A slug the credential may not use is 403 `forbidden` with `param` `Service-Tenant`; blank is absent; sent on several lines, 400 `bad_request`.',
          },
        },
        schemas: allSchemas(),
      },
    },
  }) as Record<string, unknown>;
  fillQueryParameters(doc.paths as Paths);
  listErrorAnswers(doc.paths as Paths);
  declareServiceTenant(doc.paths as Paths);
  declareRequestId(doc);
  return asOpenApi30(doc) as Record<string, unknown>;
}

type Parameter = { name?: string; in?: string; description?: string; $ref?: string };
type Operation = { security?: unknown[]; requestBody?: unknown; parameters?: Parameter[]; responses?: Record<string, unknown>; 'x-query'?: string };
type Paths = Record<string, Record<string, Operation | unknown>>;
const METHODS = new Set(['get', 'put', 'post', 'patch', 'delete', 'head', 'options']);
const ERROR = { $ref: '#/components/responses/Error' };
const UNAUTHORIZED = { $ref: '#/components/responses/Unauthorized' };
const UNAVAILABLE = { $ref: '#/components/responses/Unavailable' };

/** Methods whose request body is read (http/middleware/json-body.ts): a body over the limit is 413. */
const BODY_METHODS = new Set(['post', 'put', 'patch', 'delete']);

/**
 * Lists on every credentialed operation the error statuses it can answer (spec 4: "the errors of
 * Part 7 for 401, 403 and 404 apply to every credentialed endpoint", so those three everywhere, 404
 * included where the path names no resource; 400 where it takes a body or query; 413
 * `payload_too_large` where a body is read; 503 `unavailable` everywhere, with its Retry-After: Redis unreachable or refusing writes), so a client reading the document sees each status
 * it may get, not only `default`. Statuses an `@openapi` block already lists are left as written.
 */
function listErrorAnswers(paths: Paths): void {
  for (const item of Object.values(paths)) {
    const pathParams = ((item.parameters ?? []) as { in?: string }[]);
    for (const [method, value] of Object.entries(item)) {
      if (!METHODS.has(method)) continue;
      const op = value as Operation;
      if (Array.isArray(op.security) && op.security.length === 0) continue;
      const params = [...pathParams, ...(op.parameters ?? [])];
      const statuses = ['401', '403', '404'];
      if (op.requestBody || params.some((p) => p.in === 'query' || p.in === 'path' || '$ref' in p)) statuses.unshift('400');
      if (BODY_METHODS.has(method)) statuses.push('413');
      // Redis unreachable (http/middleware/redis-gate.ts), on every route that reads it
      statuses.push('503');
      op.responses ??= {};
      for (const status of statuses) op.responses[status] ??= status === '401' ? UNAUTHORIZED : status === '503' ? UNAVAILABLE : ERROR;
    }
  }
}

/**
 * Declares the `Service-Tenant` header on every credentialed operation that does not list it: every
 * credential is checked against it (http/middleware/auth.ts), client and workspace routes included.
 * After listErrorAnswers: a bad header is 403, never the 400 a parameter reference there would add.
 */
function declareServiceTenant(paths: Paths): void {
  const ref = '#/components/parameters/serviceTenant';
  for (const item of Object.values(paths)) {
    const pathParams = (item.parameters ?? []) as Parameter[];
    for (const [method, value] of Object.entries(item)) {
      if (!METHODS.has(method)) continue;
      const op = value as Operation;
      if (Array.isArray(op.security) && op.security.length === 0) continue;
      if ([...pathParams, ...(op.parameters ?? [])].some((p) => p.$ref === ref || p.name === 'Service-Tenant')) continue;
      (op.parameters ??= []).push({ $ref: ref });
    }
  }
}

/** The list parameters every paginated list shares, as components (`limit`, `cursor`). */
const LIST_PARAMETERS = new Set(['limit', 'cursor']);

/**
 * The query parameters of an operation are those of the schema its route validates the query with
 * (`x-query: <schema>` on the operation, a schema of lib/schemas given to `checkQuery` or
 * `pageRequest`), so the document lists exactly the parameters, bounds and patterns the service
 * checks: the schema is written once (issue 3). A parameter an `@openapi` block lists by name (on
 * the operation or its path) gives only its description; `limit` and `cursor` are the shared
 * components. A test keeps each route's `x-query` equal to the schema its handler reads.
 */
function fillQueryParameters(paths: Paths): void {
  const schemas = allSchemas() as Record<string, { properties?: Record<string, Record<string, unknown>>; required?: string[] }>;
  for (const item of Object.values(paths)) {
    const shared = (item.parameters ?? []) as Parameter[];
    const sharedQuery = shared.filter((p) => p.in === 'query');
    if (sharedQuery.length) item.parameters = shared.filter((p) => p.in !== 'query');
    for (const [method, value] of Object.entries(item)) {
      if (!METHODS.has(method)) continue;
      const op = value as Operation;
      const name = op['x-query'];
      if (name === undefined) continue;
      const schema = schemas[name];
      if (!schema?.properties) throw new Error(`x-query ${name} of ${method}: no such query schema in lib/schemas`);
      const own = op.parameters ?? [];
      const listed = [...sharedQuery, ...own.filter((p) => p.in === 'query')];
      const required = new Set(schema.required ?? []);
      const query = Object.entries(schema.properties).map(([prop, propSchema]): Parameter | Record<string, unknown> => {
        if (LIST_PARAMETERS.has(prop)) return { $ref: `#/components/parameters/${prop}` };
        const { description, ...bare } = propSchema;
        const text = listed.find((p) => p.name === prop)?.description ?? description;
        return { name: prop, in: 'query', required: required.has(prop), ...(text ? { description: text } : {}), schema: bare };
      });
      const rest = own.filter((p) => p.in !== 'query' && !(p.$ref && LIST_PARAMETERS.has(p.$ref.slice(p.$ref.lastIndexOf('/') + 1))));
      op.parameters = [...rest, ...(query as Parameter[])];
    }
  }
}

/**
 * Every answer carries the `Request-Id` header (spec 2.1): declared once under
 * `components.headers` and referenced from every response object, the shared ones and each
 * operation's own (a response that is itself a `$ref` gets it through the component).
 */
function declareRequestId(doc: Record<string, unknown>): void {
  const header = { $ref: '#/components/headers/RequestId' };
  const add = (response: unknown) => {
    if (response === null || typeof response !== 'object' || '$ref' in response) return;
    const r = response as { headers?: Record<string, unknown> };
    r.headers = { 'Request-Id': header, ...r.headers };
  };
  const components = doc.components as { responses?: Record<string, unknown> };
  for (const response of Object.values(components.responses ?? {})) add(response);
  for (const item of Object.values(doc.paths as Paths)) {
    for (const [method, value] of Object.entries(item)) {
      if (!METHODS.has(method)) continue;
      for (const response of Object.values((value as Operation).responses ?? {})) add(response);
    }
  }
}

/**
 * JSON Schema keywords ajv enforces but OpenAPI 3.0 Schema Objects do not have (`propertyNames`)
 * move under an `x-` extension in the document, so it stays a valid 3.0 document and still says
 * the rule; ajv keeps validating with the schema as written.
 */
const NOT_IN_OPENAPI_30 = new Set(['propertyNames']);
function asOpenApi30(value: unknown): unknown {
  if (Array.isArray(value)) return value.map(asOpenApi30);
  if (value === null || typeof value !== 'object') return value;
  return Object.fromEntries(Object.entries(value).map(([key, v]) => [NOT_IN_OPENAPI_30.has(key) ? `x-${key}` : key, asOpenApi30(v)]));
}
