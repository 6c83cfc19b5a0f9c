import type { Context } from 'koa';
import { appendAudit } from '../streams/ledger.js';
import type { AppDeps } from './deps.js';
import { writerOf, type AuthState } from './middleware/auth.js';

/** Appends the audit event of a control-plane write made by the current request (actor, request, tenant from the context). */
export async function audit(
  deps: AppDeps, ctx: Context,
  event: { type: string; target: { type: string; id: string }; object: Record<string, unknown>; changes?: Record<string, unknown>; previousAttributes?: Record<string, unknown> },
): Promise<void> {
  const { workspace, tenant } = ctx.state.auth as AuthState;
  const { actor, request } = writerOf(ctx);
  await appendAudit(deps.redis, deps.keys, {
    type: event.type, target: event.target, object: event.object, changes: event.changes, previousAttributes: event.previousAttributes,
    workspace: { id: workspace.id, slug: workspace.slug },
    tenant: tenant ? { id: tenant.id, slug: tenant.slug } : null,
    actor, request,
  });
}
