import type { Context } from 'koa';
import type { AuditScope } from '../streams/audit-outbox.js';
import { appendAudit } from '../streams/ledger.js';
import type { AppDeps } from './deps.js';
import { writerOf, type AuthState } from './middleware/auth.js';

/**
 * The audit scope of the current request: workspace and tenant from its authentication, actor and
 * request from `writerOf`. Writes take it to make their audit intents (streams/audit-outbox.ts).
 */
export function auditScopeOf(ctx: Context): AuditScope {
  const { workspace, tenant } = ctx.state.auth as AuthState;
  const { actor, request } = writerOf(ctx);
  return { workspace: { id: workspace.id, slug: workspace.slug }, tenant: tenant ? { id: tenant.id, slug: tenant.slug } : null, actor, request };
}

/** Appends the audit event of a control-plane write made by the current request (actor, request, tenant from the context). */
export async function audit(
  deps: AppDeps, ctx: Context,
  event: { type: string; target: { type: string; id: string }; object: Record<string, unknown>; changes?: Record<string, unknown>; previousAttributes?: Record<string, unknown> },
): Promise<void> {
  const scope = auditScopeOf(ctx);
  await appendAudit(deps.redis, deps.keys, { ...scope, ...event });
}
