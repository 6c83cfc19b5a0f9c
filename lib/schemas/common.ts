/**
 * Schemas shared by every resource. All schemas are OpenAPI 3.0 Schema Objects (so `nullable`,
 * never type arrays) and are registered once: ajv validates with them and the published
 * OpenAPI document carries them under `components.schemas`.
 */
export type Schema = Record<string, unknown>;

/** The caller's id for a subscriber (spec 2.3 rule 4, 4.4): 1 to 256 characters (code points, as ajv counts). */
export const externalIdField: Schema = { type: 'string', minLength: 1, maxLength: 256, description: "The caller's id for the subscriber." };

export const ErrorDetail: Schema = {
  type: 'object',
  additionalProperties: false,
  required: ['param', 'message'],
  properties: { param: { type: 'string' }, message: { type: 'string' } },
};

export const ErrorBody: Schema = {
  type: 'object',
  additionalProperties: false,
  required: ['code', 'message', 'param', 'details'],
  properties: {
    code: { type: 'string', pattern: '^[a-z][a-z0-9_]*$', description: 'Stable lowercase snake_case code; branch on it.' },
    message: { type: 'string', description: 'Human text; do not branch on it.' },
    param: { type: 'string', nullable: true, description: 'The field (or header, or `body`) the error is about, when there is one: the first failing one of the code answered.' },
    details: { type: 'array', nullable: true, items: { $ref: '#/components/schemas/ErrorDetail' }, description: 'One `{param, message}` per failing field. Always a list for `validation`, `bad_request` and `parse` (a body that is not JSON names `body`; an empty body reads as `{}`, so its required fields are named); null for codes without fields.' },
  },
};

export const Metadata: Schema = {
  type: 'object',
  additionalProperties: false,
  required: ['timestamp', 'requestId'],
  properties: {
    timestamp: { type: 'string', format: 'date-time' },
    requestId: { type: 'string', description: 'Also sent as the Request-Id header.' },
  },
};

export const ErrorEnvelope: Schema = {
  type: 'object',
  additionalProperties: false,
  required: ['success', 'data', 'error', 'metadata'],
  properties: {
    success: { type: 'boolean', enum: [false] },
    data: { type: 'object', nullable: true, enum: [null] },
    error: { $ref: '#/components/schemas/ErrorBody' },
    metadata: { $ref: '#/components/schemas/Metadata' },
  },
};

/** `limit` and `cursor` of every paginated list (spec 2.2); list queries spread them into their own properties. */
export const LIST_QUERY_PROPERTIES: Record<string, Schema> = {
  limit: { type: 'integer', minimum: 1, maximum: 100, default: 50 },
  // a cursor may hold an externalId (up to 256 characters, ~1,500 bytes JSON-escaped) twice over in base64: 4,096 fits every one this service issues
  cursor: { type: 'string', minLength: 1, maxLength: 4096 },
};

/** Query of a paginated list without filters. */
export const ListQuery: Schema = { type: 'object', additionalProperties: false, properties: LIST_QUERY_PROPERTIES };


export const Health: Schema = {
  type: 'object',
  additionalProperties: false,
  required: ['status', 'version', 'redis', 'roles', 'uptimeSeconds'],
  properties: {
    status: { type: 'string', enum: ['ok', 'degraded'], description: '`ok`: Redis takes writes and every role has a live process; `degraded`: Redis refuses writes (`redis.writeError`) or a role has none. (Redis not answering is 503 `unavailable`, an error.)' },
    version: { type: 'string' },
    redis: {
      type: 'object',
      additionalProperties: false,
      required: ['reachable', 'latencyMs', 'writable', 'writeError'],
      properties: {
        reachable: { type: 'boolean', description: 'Always true in a 200 answer: an unreachable Redis is 503 `unavailable`.' },
        latencyMs: { type: 'number', nullable: true },
        writable: { type: 'boolean', description: 'Whether Redis took a small write: false when its memory is full (`maxmemory` with `noeviction`), its snapshots fail, or it is a replica. Writes are then answered 503 `unavailable`, and heartbeats are not recorded, so `roles` may read 0.' },
        writeError: { type: 'string', nullable: true, description: 'Redis\'s answer to that write when it refused it (`OOM command not allowed…`), else null.' },
      },
    },
    roles: {
      type: 'object',
      description: 'Live processes per role (web, worker, dispatcher, scheduler; 0 when none), from heartbeats of the last 15 seconds.',
      additionalProperties: { type: 'integer' },
    },
    uptimeSeconds: { type: 'integer' },
  },
};

export const ApiKey: Schema = {
  type: 'object',
  additionalProperties: false,
  required: ['id', 'kind', 'workspaceId', 'tenantId', 'scopes', 'name', 'hint', 'createdAt', 'expiresAt', 'revokedAt'],
  properties: {
    id: { type: 'string', pattern: '^key_' },
    kind: { type: 'string', enum: ['workspace', 'tenant', 'client'] },
    workspaceId: { type: 'string' },
    tenantId: { type: 'string', nullable: true },
    scopes: { type: 'array', items: { type: 'string' } },
    name: { type: 'string', nullable: true },
    hint: { type: 'string', description: 'Prefix and last four characters of the key.' },
    createdAt: { type: 'string', format: 'date-time' },
    expiresAt: { type: 'string', format: 'date-time', nullable: true },
    revokedAt: { type: 'string', format: 'date-time', nullable: true },
  },
};

export const Caller: Schema = {
  type: 'object',
  additionalProperties: false,
  required: ['kind', 'keyId', 'scopes', 'workspace', 'tenant', 'expiresAt'],
  properties: {
    kind: { type: 'string', enum: ['workspace', 'tenant'] },
    keyId: { type: 'string' },
    scopes: { type: 'array', items: { type: 'string' } },
    workspace: { type: 'object', additionalProperties: false, required: ['id', 'slug'], properties: { id: { type: 'string' }, slug: { type: 'string' } } },
    tenant: {
      type: 'object', additionalProperties: false, required: ['id', 'slug'],
      properties: { id: { type: 'string' }, slug: { type: 'string' } },
      description: 'The tenant the key works in: its own for a tenant key; for a workspace key the one Service-Tenant selects (default `default`).',
    },
    expiresAt: { type: 'string', format: 'date-time', nullable: true },
  },
};
