import type { Context } from 'koa';
import type { AuditScope } from '../streams/audit-outbox.js';
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
