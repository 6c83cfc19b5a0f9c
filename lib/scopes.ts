import type { KeyKind } from './key-kinds.js';

/**
 * Scopes are `resource:action`, `resource:*`, `*`, or the client scope `client`.
 * Session-only scopes (spec 5.7) can never be held by an API key, not even through `*`.
 */
export const SESSION_ONLY_SCOPES = ['keys:*', 'invites:*', 'members:write', 'workspace:delete', 'tenants:secrets', 'account:*'] as const;

/**
 * Every `resource:action` a route requires (besides `client` and the session-only `keys:write`):
 * the scopes a key may hold, one by one or as `resource:*`. A scope no route requires would be
 * refused by every route, so it is not granted (`deliveries:read`: deliveries are read with
 * `messages:read`). test/http/auth.test.ts reads the routes to keep this list true.
 */
export const ROUTE_SCOPES = [
  'apps:read', 'apps:write', 'events:read', 'events:write', 'messages:read', 'messages:send',
  'preferences:read', 'preferences:write', 'segments:read', 'segments:write', 'sources:read', 'sources:write',
  'subscribers:read', 'subscribers:write', 'subscriptions:read', 'subscriptions:write', 'topics:read', 'topics:write',
  'webhooks:read', 'webhooks:write', 'workflows:read', 'workflows:write',
] as const;

/** Resources a key's scopes may name: those of ROUTE_SCOPES. */
export const SCOPE_RESOURCES: readonly string[] = [...new Set(ROUTE_SCOPES.map((scope) => scope.split(':')[0]!))];
const GRANTABLE: ReadonlySet<string> = new Set(ROUTE_SCOPES);

/**
 * Resources whose every route is a workspace route (`authorize(deps, 'workspace', …)` in
 * http/routes), which refuse tenant keys: a tenant key could never use their scopes.
 * test/http/auth.test.ts reads the routes to keep this list true.
 */
export const WORKSPACE_ONLY_RESOURCES = ['webhooks'] as const;

const SCOPE_SHAPE = /^(?:\*|client|[a-z][a-z_]*:(?:\*|[a-z][a-z_]*))$/;

/** SESSION_ONLY_SCOPES as [resource, action] pairs, split once. */
const SESSION_ONLY_PARTS = SESSION_ONLY_SCOPES.map((s) => s.split(':') as [string, string]);

/** True when `scope` is session-only (or matches a session-only pattern). */
export function isSessionOnly(scope: string): boolean {
  const [resource, action] = scope.split(':');
  return SESSION_ONLY_PARTS.some(([r, a]) => r === resource && (a === '*' || a === action || action === '*'));
}

/** Why `scope` cannot be granted to a key, or null when it can. */
export function scopeProblem(scope: string): string | null {
  if (!SCOPE_SHAPE.test(scope)) return `"${scope}" is not a scope (resource:action, resource:*, * or client)`;
  if (isSessionOnly(scope)) return `"${scope}" is session-only and can never be granted to a key`;
  if (scope === '*' || scope === 'client') return null;
  const [resource = '', action = ''] = scope.split(':');
  if (!SCOPE_RESOURCES.includes(resource)) return `"${scope}" names an unknown resource "${resource}" (the resources: ${SCOPE_RESOURCES.join(', ')})`;
  if (action !== '*' && !GRANTABLE.has(scope)) {
    const actions = ROUTE_SCOPES.filter((s) => s.startsWith(`${resource}:`)).map((s) => s.split(':')[1]);
    return `"${scope}" is no route's scope: ${resource} takes ${actions.join(', ')} (or *)`;
  }
  return null;
}

/**
 * Why a key of `kind` could never use `scope`, or null when some route lets it. Only client keys
 * reach /v1/client routes, which all need `client`, and they are refused everywhere else; tenant
 * keys are refused on workspace routes. `*` suits every kind. Check `scopeProblem` first: this
 * only judges the kind.
 */
export function scopeProblemForKind(kind: KeyKind, scope: string): string | null {
  if (scope === '*') return null;
  if (kind === 'client') {
    return scope === 'client' ? null : `"${scope}" can never be used by a client key: client keys call only /v1/client routes, which need the scope client (or *)`;
  }
  if (scope === 'client') return `"client" can never be used by a ${kind} key: only client keys call /v1/client routes`;
  const resource = scope.split(':')[0] ?? '';
  if (kind === 'tenant' && (WORKSPACE_ONLY_RESOURCES as readonly string[]).includes(resource)) {
    return `"${scope}" can never be used by a tenant key: ${resource} routes are workspace routes, which refuse tenant keys (use a workspace key)`;
  }
  return null;
}

/** True when `granted` (a key's scopes) covers `required` (a route's scope). */
export function hasScope(granted: readonly string[], required: string): boolean {
  if (isSessionOnly(required)) return false;
  const [resource] = required.split(':');
  for (const scope of granted) {
    if (scope === '*' || scope === required) return true;
    if (scope.endsWith(':*') && scope.slice(0, -2) === resource) return true;
  }
  return false;
}
