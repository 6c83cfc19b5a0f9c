import type { Context, Next } from 'koa';
import { now } from '../../lib/clock.js';
import { ApiError } from '../../lib/errors.js';
import { KEY_PREFIX, KEY_SECRET_HEX, kindOfPresentedKey } from '../../lib/key-kinds.js';
import { hasScope, isSessionOnly } from '../../lib/scopes.js';
import { sha256Hex } from '../../lib/secrets.js';
import { looksLikeToken, verifyEventsToken } from '../../lib/events-token.js';
import { findApiKey, findTenant, findTenantBySlug, findWorkspace, type Tenant, type Workspace } from '../../streams/identity.js';
import type { Principal } from '../../streams/key-cache.js';
import type { Ref } from '../../streams/ledger.js';
import type { AppDeps } from '../deps.js';
import { jsonBody } from './json-body.js';
import { repeatsHeader } from '../params.js';
import { authenticating } from '../routes-by-segment.js';

/**
 * Which credentials reach a route:
 * - `tenant`: data-plane routes, workspace keys (tenant from `Service-Tenant`, else `default`) and tenant keys;
 * - `workspace`: `/v1/workspaces/{workspaceSlug}/…`, workspace keys of that workspace only;
 * - `client`: `/v1/client/…`, client keys only.
 */
export type Plane = 'tenant' | 'workspace' | 'client';

/** What a route knows about its caller once `authorize` has run; `principal` is null for an events token, `tokenExpiresAt` its expiry. */
export type AuthState = { principal: Principal | null; workspace: Workspace; tenant: Tenant | null; tokenExpiresAt?: string };

export type AuthOptions = {
  /** the route also accepts an events token (`GET /v1/events/token`), which holds `events:read` for one tenant */
  eventsToken?: boolean;
  /**
   * At most this many requests of one tenant on the route's group (`group`, e.g. `ingest`) are
   * handled at once in this process, counted from when the body is read (a slow upload holds no
   * place: probe L1, 32 client-key uploads trickling their bodies held the backend's events off
   * for 30 s); another is 429 `rate_limited`.
   */
  perTenant?: { group: string; limit: number };
  /** the least body size the route reads whatever `HTTP_BODY_LIMIT_BYTES` says (event batches: `EVENT_BATCH_BODY_BYTES`) */
  bodyAtLeast?: number;
  /** a body the JSON layer refuses reaches the route as a `RefusedBody` (json-body.ts), which answers its problem itself */
  refusedBodyToRoute?: boolean;
};

/** Requests in progress per `group|tenant id` (only while some are). */
const inProgress = new Map<string, number>();

/** How many requests of `group` the tenant has in progress in this process (tests wait on it). */
export function tenantRequestsInProgress(group: string, tenantId: string): number {
  return inProgress.get(`${group}|${tenantId}`) ?? 0;
}

/** Runs `handle` counted against the tenant's limit of `group`: 429 at the limit. */
export async function withinTenantLimit(group: string, limit: number, tenantId: string, handle: () => Promise<void>): Promise<void> {
  const slot = `${group}|${tenantId}`;
  const running = inProgress.get(slot) ?? 0;
  if (running >= limit) {
    throw new ApiError(429, 'rate_limited', `This tenant already has ${limit} such requests in progress on this server; retry the request later`);
  }
  inProgress.set(slot, running + 1);
  try {
    await handle();
  } finally {
    const left = (inProgress.get(slot) ?? 1) - 1;
    if (left > 0) inProgress.set(slot, left);
    else inProgress.delete(slot);
  }
}

/** Authenticates an events token: 401 `invalid_session` when it is invalid or expired. */
async function authenticateToken(ctx: Context, deps: AppDeps, token: string, options: AuthOptions, scope: string | null): Promise<AuthState> {
  const claims = await verifyEventsToken(deps.tokenSecret.key, token);
  if (!claims) throw new ApiError(401, 'invalid_session', 'The events token is invalid or has expired; request a new one');
  if (!options.eventsToken) throw new ApiError(403, 'forbidden', 'An events token only reads the event catalog, volume, recent events and timelines');
  const [workspace, tenant, key] = await Promise.all([
    findWorkspace(deps.redis, deps.keys, claims.workspaceId), findTenant(deps.redis, deps.keys, claims.workspaceId, claims.tenantId), findApiKey(deps.redis, deps.keys, claims.keyId),
  ]);
  if (!workspace || !tenant) throw new ApiError(401, 'invalid_session', 'The events token names a tenant that no longer exists');
  // a token lives no longer than the key that minted it: revoking the key (spec 4.7: at once) or its expiry ends its tokens too
  // nor reaches a tenant its key could not (a tenant key mints for its own tenant only)
  if (!key || key.workspaceId !== claims.workspaceId || (key.tenantId !== null && key.tenantId !== claims.tenantId) || key.revokedAt || (key.expiresAt && Date.parse(key.expiresAt) <= now())) {
    throw new ApiError(401, 'invalid_session', 'The API key that issued this events token is revoked or has expired; request a new token with a valid key');
  }
  const header = serviceTenantOf(ctx);
  if (header && header !== tenant.slug) throw new ApiError(403, 'forbidden', 'This events token reads its own tenant only: send no Service-Tenant, or its slug', { param: 'Service-Tenant' });
  if (scope !== null && !hasScope(['events:read'], scope)) throw new ApiError(403, 'missing_permission', `An events token lacks the scope ${scope}`);
  return { principal: null, workspace, tenant, tokenExpiresAt: claims.expiresAt };
}

/**
 * The `Service-Tenant` header, trimmed ('' when absent or blank: the key's own or the default tenant).
 * Sent on several lines it is 400 `bad_request`, as two Authorization lines are: HTTP joins repeated
 * lines into one value (`eu, eu`), which would name no tenant and read as 403 (probe AM).
 */
function serviceTenantOf(ctx: Context): string {
  // HTTP's whitespace only (space, tab): String.trim() took a no-break space off too (`eu\u00a0` named eu: probe I)
  const header = ctx.get('Service-Tenant').replace(/^[ \t]+|[ \t]+$/g, '');
  if (header && repeatsHeader(ctx.req, 'service-tenant')) throw new ApiError(400, 'bad_request', 'Send one Service-Tenant header, not several', { param: 'Service-Tenant' });
  return header;
}

const BEARER = /^Bearer[ \t]+([^\s]+)[ \t]*$/i;

// Hashing a presented key is most of an authenticated request's own cost; remember recent ones.
const MAX_HASHES = 10_000;
const hashes = new Map<string, string>();
function hashOf(presented: string): string {
  let hash = hashes.get(presented);
  if (hash === undefined) {
    if (hashes.size >= MAX_HASHES) hashes.delete(hashes.keys().next().value as string);
    hash = sha256Hex(presented);
    hashes.set(presented, hash);
  }
  return hash;
}

async function authenticate(ctx: Context, deps: AppDeps, presented: string): Promise<Principal> {
  if (!ctx.get('Authorization')) throw new ApiError(401, 'missing_authorization', 'Send Authorization: Bearer <API key>');
  const kind = kindOfPresentedKey(presented);
  if (!kind) throw new ApiError(401, 'invalid_api_key', `The API key is malformed (it must be ${Object.values(KEY_PREFIX).join(', ')} followed by ${KEY_SECRET_HEX} hex characters)`);
  const principal = await deps.keyCache.lookup(hashOf(presented));
  // A key under another kind's prefix hashes differently and is not found; the kind check is belt and braces.
  if (!principal || principal.key.kind !== kind || principal.key.revokedAt) throw new ApiError(401, 'invalid_api_key', 'The API key is unknown or revoked');
  if (principal.key.expiresAt && Date.parse(principal.key.expiresAt) <= now()) throw new ApiError(401, 'api_key_expired', 'The API key has expired');
  return principal;
}

async function tenantFor(ctx: Context, deps: AppDeps, principal: Principal): Promise<Tenant> {
  const header = serviceTenantOf(ctx);
  if (principal.key.kind !== 'workspace') {
    if (header && header !== principal.tenant!.slug) throw new ApiError(403, 'forbidden', 'This key works in its own tenant only: send no Service-Tenant, or its slug', { param: 'Service-Tenant' });
    return principal.tenant!;
  }
  const tenant = await findTenantBySlug(deps.redis, deps.keys, principal.workspace.id, header || 'default');
  // the header is not echoed: it may be long, and Node reads its bytes as latin-1
  if (!tenant) throw new ApiError(403, 'forbidden', "Service-Tenant names no tenant of this key's workspace", { param: 'Service-Tenant' });
  return tenant;
}

/**
 * Authenticates the caller, checks the key kind against the route's plane, resolves the tenant
 * or workspace, then checks the route's scope. Sets `ctx.state.auth`, then reads the request's
 * JSON body: nothing of a request is parsed before its caller is known.
 * A route needing a session-only scope (spec 5.7) answers every API key of the right kind and
 * workspace 403 `missing_permission`: no key can ever hold that scope. The wrong kind or another
 * workspace is 403 `forbidden` first, as on every route (spec Part 7).
 */
export function authorize(deps: AppDeps, plane: Plane, scope: string | null, options: AuthOptions = {}) {
  const body = jsonBody(Math.max(deps.config.bodyLimitBytes, options.bodyAtLeast ?? 0), { refusedToRoute: options.refusedBodyToRoute });
  const sessionOnly = scope !== null && isSessionOnly(scope);
  const auth = async function auth(ctx: Context, next: Next): Promise<void> {
    if (repeatsHeader(ctx.req, 'authorization')) throw new ApiError(400, 'bad_request', 'Send one Authorization header, not several', { param: 'Authorization' });
    const credential = BEARER.exec(ctx.get('Authorization'))?.[1] ?? '';
    if (looksLikeToken(credential)) {
      ctx.state.auth = await authenticateToken(ctx, deps, credential, options, scope);
      return body(ctx, next);
    }
    const principal = await authenticate(ctx, deps, credential);
    const kind = principal.key.kind;
    let tenant: Tenant | null = null;
    if (plane === 'client') {
      if (kind !== 'client') throw new ApiError(403, 'forbidden', 'Only client keys (svc_pk_) may call /v1/client routes');
      tenant = await tenantFor(ctx, deps, principal);
    } else if (kind === 'client') {
      throw new ApiError(403, 'forbidden', 'Client keys (svc_pk_) may only call /v1/client routes');
    } else if (plane === 'workspace') {
      if (kind !== 'workspace') throw new ApiError(403, 'forbidden', 'Tenant keys are refused on workspace routes; use a workspace key');
      if (ctx.params.workspaceSlug !== principal.workspace.slug) throw new ApiError(403, 'forbidden', 'This key belongs to another workspace');
      // a workspace route works in no one tenant, but a `Service-Tenant` it is sent must still be one of this workspace's (spec 5.5)
      if (serviceTenantOf(ctx)) await tenantFor(ctx, deps, principal);
    } else {
      tenant = await tenantFor(ctx, deps, principal);
    }
    if (sessionOnly) throw new ApiError(403, 'missing_permission', `The scope ${scope} is session-only; no API key can hold it`);
    if (scope !== null && !hasScope(principal.key.scopes, scope)) throw new ApiError(403, 'missing_permission', `This key lacks the scope ${scope}`);
    const state: AuthState = { principal, workspace: principal.workspace, tenant };
    ctx.state.auth = state;
    const { perTenant } = options;
    // counted once the body is in: a slow upload (a client key's, whoever holds it) holds no place
    if (perTenant && tenant) await body(ctx, () => withinTenantLimit(perTenant.group, perTenant.limit, tenant.id, next));
    else await body(ctx, next);
  };
  authenticating.add(auth);
  return auth;
}

/** The tenant a tenant-plane or client-plane route works in. */
export function tenantOf(ctx: Context): Tenant {
  return (ctx.state.auth as AuthState).tenant!;
}

/** The workspace and tenant a tenant-plane write works in, as the refs its audit entries carry. */
export function refsOf(ctx: Context): { workspace: Ref; tenant: Ref } {
  const { workspace } = ctx.state.auth as AuthState;
  const tenant = tenantOf(ctx);
  return { workspace: { id: workspace.id, slug: workspace.slug }, tenant: { id: tenant.id, slug: tenant.slug } };
}

/** The audit actor and request of the current caller. */
export function writerOf(ctx: Context) {
  const auth = ctx.state.auth as AuthState | undefined;
  return {
    actor: { type: 'api_key' as const, id: auth?.principal?.key.id ?? null },
    request: { id: ctx.state.requestId as string, ip: plainIp(ctx.ip), userAgent: ctx.get('User-Agent') || null },
  };
}

/** An IPv4 address as IPv4 (`127.0.0.1`, not the `::ffff:127.0.0.1` a dual-stack socket reports); null when none. */
function plainIp(ip: string): string | null {
  if (!ip) return null;
  return ip.startsWith('::ffff:') && ip.includes('.') ? ip.slice('::ffff:'.length) : ip;
}
