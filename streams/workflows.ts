import type { Redis } from 'ioredis';
import { GONE_NAMES_KEEP_MS, MAX_GONE_NAMES, MAX_VERSIONS, MAX_WORKFLOWS, watchedNames } from './automation-definitions.js';
import { isoNow, now } from '../lib/clock.js';
import { ApiError, lockTimeout, notFound, validationError } from '../lib/errors.js';
import { newId } from '../lib/ids.js';
import { isSlug } from '../lib/slugs.js';
import { definitionSizeProblem, type WorkflowDefinition } from '../lib/workflow-definition.js';
import type { Writer } from './identity.js';
import type { Keys } from './keys.js';
import { auditIntent, settleAudit, writeScope, type AuditDraft, type AuditIntent } from './audit-outbox.js';
import { diff, sameJson, type Ref } from './ledger.js';
import { callScript } from './lua-scripts.js';
import { recordOf } from '../lib/field-list.js';

/**
 * A workflow: a trigger and steps run per subscriber, addressed by its slug. Its definition lives
 * in immutable versions; the workflow record points at the current one, with which new runs start.
 */
export type Workflow = {
  id: string;
  slug: string;
  name: string | null;
  description: string | null;
  enabled: boolean;
  version: number;
  versionId: string;
  trigger: WorkflowDefinition['trigger'];
  steps: WorkflowDefinition['steps'];
  cancelOn: NonNullable<WorkflowDefinition['cancelOn']> | null;
  createdAt: string;
  updatedAt: string;
};

/** One immutable version of a workflow's definition. */
export type WorkflowVersion = {
  id: string;
  workflowId: string;
  version: number;
  trigger: WorkflowDefinition['trigger'];
  steps: WorkflowDefinition['steps'];
  cancelOn: NonNullable<WorkflowDefinition['cancelOn']> | null;
  createdAt: string;
};

/** The tenant a workflow write works in, and the refs its audit entries carry. */
export type WorkflowScope = { workspace: Ref; tenant: Ref };
export type WorkflowInput = { slug: string; name?: string | null; description?: string | null; enabled?: boolean } & WorkflowDefinition;
export type WorkflowPatch = {
  name?: string | null; description?: string | null; enabled?: boolean;
  trigger?: WorkflowDefinition['trigger']; steps?: WorkflowDefinition['steps']; cancelOn?: WorkflowDefinition['cancelOn'] | null;
};

/** Tries of a PATCH that loses the compare-and-set against a concurrent definition change (each try loses only to a change that won: 50 outlast 50 writers at once). */
const UPDATE_ATTEMPTS = 50;

/** The stored definition: only `trigger`, `steps` and `cancelOn` (absent when none). */
function definitionOf(parts: { trigger: WorkflowDefinition['trigger']; steps: WorkflowDefinition['steps']; cancelOn?: WorkflowDefinition['cancelOn'] | null }): WorkflowDefinition {
  return parts.cancelOn ? { trigger: parts.trigger, steps: parts.steps, cancelOn: parts.cancelOn } : { trigger: parts.trigger, steps: parts.steps };
}

function toVersion(h: Record<string, string>): WorkflowVersion {
  const def = JSON.parse(h.definition!) as WorkflowDefinition;
  return { id: h.id!, workflowId: h.workflowId!, version: Number(h.version), trigger: def.trigger, steps: def.steps, cancelOn: def.cancelOn ?? null, createdAt: h.createdAt! };
}

/** The parts of a version a workflow shows. */
type VersionParts = Pick<WorkflowVersion, 'trigger' | 'steps' | 'cancelOn'>;

/** A workflow from its record and the definition of its current version. */
function toWorkflow(h: Record<string, string>, version: VersionParts): Workflow {
  return {
    id: h.id!,
    slug: h.slug!,
    name: h.name || null,
    description: h.description || null,
    enabled: h.enabled !== '0',
    version: Number(h.version),
    versionId: h.versionId!,
    trigger: version.trigger,
    steps: version.steps,
    cancelOn: version.cancelOn,
    createdAt: h.createdAt!,
    updatedAt: h.updatedAt!,
  };
}

const editable = (w: Workflow) => ({ name: w.name, description: w.description, enabled: w.enabled, version: w.version, versionId: w.versionId, trigger: w.trigger, steps: w.steps, cancelOn: w.cancelOn });

/** Loads versions by id in one round trip; null for one that no longer exists. */
export async function loadVersions(redis: Redis, keys: Keys, tenantId: string, ids: string[]): Promise<(WorkflowVersion | null)[]> {
  if (ids.length === 0) return [];
  const pipeline = redis.pipeline();
  for (const id of ids) pipeline.hgetall(keys.workflowVersion(tenantId, id));
  return ((await pipeline.exec()) ?? []).map(([err, h]) => {
    if (err) throw err;
    return (h as Record<string, string>).id ? toVersion(h as Record<string, string>) : null;
  });
}

/** Loads workflows by id (records, then their current versions: two round trips); null for one that no longer exists. */
export async function loadWorkflows(redis: Redis, keys: Keys, tenantId: string, ids: string[]): Promise<(Workflow | null)[]> {
  if (ids.length === 0) return [];
  const pipeline = redis.pipeline();
  for (const id of ids) pipeline.hgetall(keys.workflow(tenantId, id));
  const records = ((await pipeline.exec()) ?? []).map(([err, h]) => {
    if (err) throw err;
    return h as Record<string, string>;
  });
  const versions = await loadVersions(redis, keys, tenantId, records.map((h) => h.versionId ?? ''));
  return records.map((h, i) => (h.id && versions[i] ? toWorkflow(h, versions[i]!) : null));
}

/** Reads a workflow by slug, or null (a malformed slug is null too: it cannot exist). */
export async function findWorkflow(redis: Redis, keys: Keys, tenantId: string, slug: string): Promise<Workflow | null> {
  if (!isSlug(slug)) return null;
  const id = await redis.hget(keys.workflowSlugs(tenantId), slug);
  return id ? ((await loadWorkflows(redis, keys, tenantId, [id]))[0] ?? null) : null;
}

/**
 * Creates a workflow at version 1; 409 `conflict` when the tenant already has one with this slug.
 * Audited as `workflow.created` (through the tenant's audit outbox, streams/audit-outbox.ts).
 */
export async function createWorkflow(redis: Redis, keys: Keys, scope: WorkflowScope, input: WorkflowInput, by: Writer): Promise<Workflow> {
  const tenantId = scope.tenant.id;
  const ms = now();
  const id = newId('workflow', ms);
  const versionId = newId('workflowVersion', ms);
  const at = isoNow(ms);
  const definition = definitionOf(input);
  const tooLarge = definitionSizeProblem(definition);
  if (tooLarge) throw validationError([tooLarge]);
  const enabled = input.enabled ?? true;
  const workflow: Workflow = {
    id, slug: input.slug, name: input.name ?? null, description: input.description ?? null, enabled, version: 1, versionId,
    trigger: definition.trigger, steps: definition.steps, cancelOn: definition.cancelOn ?? null, createdAt: at, updatedAt: at,
  };
  const intent = auditIntent(keys.tenantOutbox(tenantId), 'workflow.create', writeScope(scope, by), workflow);
  const reply = await callScript<CreateReply>(
    redis, 'createWorkflow',
    [keys.workflowSlugs(tenantId), keys.workflowIndex(tenantId), keys.workflow(tenantId, id), keys.workflowVersion(tenantId, versionId), keys.workflowVersions(tenantId, id), keys.automationVersion(tenantId), intent.key],
    [id, input.slug, input.name ?? '', input.description ?? '', enabled ? '1' : '0', versionId, JSON.stringify(definition), at, MAX_WORKFLOWS, intent.token, intent.json],
  );
  if (reply[0] === -1) throw new ApiError(400, 'bad_request', `A tenant has at most ${MAX_WORKFLOWS} workflows; delete one first`);
  if (reply[0] !== 1) throw new ApiError(409, 'conflict', `A workflow with slug "${input.slug}" already exists`, { param: 'slug' });
  await settleAudit(redis, keys, intent, WORKFLOW_AUDITS['workflow.create'](workflow, reply));
  return workflow;
}

/**
 * Changes a workflow. `name`, `description` and `enabled` change its record; a change of
 * `trigger`, `steps` or `cancelOn` (compared with the current version; what the patch leaves out
 * is taken from it, `cancelOn: null` removes it) makes version n+1 current. Audited as
 * `workflow.updated` with `changes` and `previousAttributes` only when something changed.
 */
export async function updateWorkflow(redis: Redis, keys: Keys, scope: WorkflowScope, slug: string, patch: WorkflowPatch, by: Writer): Promise<Workflow> {
  const tenantId = scope.tenant.id;
  for (let attempt = 0; attempt < UPDATE_ATTEMPTS; attempt++) {
    const current = await findWorkflow(redis, keys, tenantId, slug);
    if (!current) throw notFound('Workflow');
    const next = definitionOf({
      trigger: patch.trigger ?? current.trigger,
      steps: patch.steps ?? current.steps,
      cancelOn: patch.cancelOn === undefined ? current.cancelOn : patch.cancelOn,
    });
    const changesDefinition = !sameJson(next, definitionOf(current));
    // the parts a PATCH leaves out are the current version's: the whole is bounded, not each part
    const tooLarge = changesDefinition ? definitionSizeProblem(next) : null;
    if (tooLarge) throw validationError([tooLarge]);
    const versionId = changesDefinition ? newId('workflowVersion') : '';
    const at = isoNow();
    const fields: [string, string][] = [];
    if (patch.name !== undefined) fields.push(['name', patch.name ?? '']);
    if (patch.description !== undefined) fields.push(['description', patch.description ?? '']);
    if (patch.enabled !== undefined) fields.push(['enabled', patch.enabled ? '1' : '0']);
    // the definitions before and after: the script answers the records, the versions are known here
    const input: UpdateInput = {
      from: { trigger: current.trigger, steps: current.steps, cancelOn: current.cancelOn },
      to: changesDefinition ? { trigger: next.trigger, steps: next.steps, cancelOn: next.cancelOn ?? null } : null,
    };
    const intent = auditIntent(keys.tenantOutbox(tenantId), 'workflow.update', writeScope(scope, by), input);
    const reply = await callScript<UpdateReply>(
      redis, 'updateWorkflow',
      [keys.workflow(tenantId, current.id), keys.workflowVersions(tenantId, current.id), keys.workflowVersion(tenantId, versionId || current.versionId), keys.automationVersion(tenantId), intent.key],
      [at, current.versionId, versionId, changesDefinition ? JSON.stringify(next) : '', intent.token, intent.json, MAX_VERSIONS, String(fields.length), ...fields.flat()],
    );
    if (reply[0] === -1) continue; // another change made a new version first: recompute from it
    if (reply[0] === -2) {
      throw new ApiError(409, 'conflict', `A workflow keeps at most ${MAX_VERSIONS} versions (every run keeps its own until it ends); create a new workflow for further changes of trigger, steps or cancelOn`);
    }
    if (reply[0] !== 1) throw notFound('Workflow');
    const drafts = WORKFLOW_AUDITS['workflow.update'](input, reply);
    if (drafts.length) await settleAudit(redis, keys, intent, drafts);
    return toWorkflow(recordOf(reply[2]!), input.to ?? input.from);
  }
  throw lockTimeout('The workflow');
}

/**
 * Deletes a workflow: record, slug, index entry and every version. No run starts afterwards;
 * active runs are canceled by the workers at their next step (reason `workflow_deleted`): a timer
 * that fires, or an event one of its versions waits for or is canceled on (those names stay watched,
 * `GONE_NAMES_KEEP_MS`). Returns the workflow as it was, audited as `workflow.deleted`; 404 for an
 * unknown slug.
 */
export async function deleteWorkflow(redis: Redis, keys: Keys, scope: WorkflowScope, slug: string, by: Writer): Promise<Workflow> {
  const tenantId = scope.tenant.id;
  const id = isSlug(slug) ? await redis.hget(keys.workflowSlugs(tenantId), slug) : null;
  if (!id) throw notFound('Workflow');
  let reply: DeleteReply = [-1];
  let intent: AuditIntent | null = null;
  for (let attempt = 0; attempt < UPDATE_ATTEMPTS && reply[0] === -1; attempt++) {
    // the record before the version list: a version made in between changes the current version id,
    // which the script compares, so the names below never miss a version the delete removes
    const read = await redis.pipeline().hget(keys.workflow(tenantId, id), 'versionId').zrevrange(keys.workflowVersions(tenantId, id), 0, -1).exec();
    const [[recordErr, currentVersionId], [listErr, versionIds]] = read as [[Error | null, string | null], [Error | null, string[]]];
    if (recordErr || listErr) throw recordErr ?? listErr;
    if (!currentVersionId) throw notFound('Workflow');
    const names = new Set<string>();
    for (const v of await loadVersions(redis, keys, tenantId, versionIds)) if (v) watchedNames({ steps: v.steps, cancelOn: v.cancelOn ?? undefined }, names);
    intent = auditIntent(keys.tenantOutbox(tenantId), 'workflow.delete', writeScope(scope, by), null);
    reply = await callScript<DeleteReply>(
      redis, 'deleteWorkflow',
      [
        keys.workflowSlugs(tenantId), keys.workflowIndex(tenantId), keys.workflow(tenantId, id), keys.workflowVersions(tenantId, id), keys.automationVersion(tenantId),
        keys.workflowGoneNames(tenantId), keys.workflowVersion(tenantId, currentVersionId), intent.key,
      ],
      [id, currentVersionId, now(), GONE_NAMES_KEEP_MS, MAX_GONE_NAMES, intent.token, intent.json, ...[...names].map((name) => `${id}|${name}`)],
    );
  }
  if (reply[0] === -1) throw lockTimeout('The workflow');
  if (reply[0] !== 1) throw notFound('Workflow');
  // the script answered the record and its current version as they were: every version record goes
  const cleanup = redis.pipeline();
  for (const versionId of reply[2] ?? []) cleanup.del(keys.workflowVersion(tenantId, versionId));
  const replies = (await cleanup.exec()) ?? [];
  for (const [err] of replies) if (err) throw err;
  await settleAudit(redis, keys, intent!, WORKFLOW_AUDITS['workflow.delete'](null, reply));
  return deletedWorkflow(reply);
}

type CreateReply = [number, string?];
type UpdateReply = [number, string[]?, string[]?];
type DeleteReply = [number, string[]?, string[]?, string[]?];
/** What an update knew before its script: the current definition, and the new one (null when it stays). */
type UpdateInput = { from: VersionParts; to: VersionParts | null };

/** The workflow a delete removed, as it was: its record and current version from the script's reply. */
const deletedWorkflow = (reply: DeleteReply): Workflow => toWorkflow(recordOf(reply[1]!), toVersion(recordOf(reply[3]!)));

/** The audit entries of workflow writes, from their scripts' replies (streams/audit-outbox.ts). */
export const WORKFLOW_AUDITS = {
  'workflow.create': (workflow: Workflow, reply: CreateReply): AuditDraft[] =>
    reply[0] === 1 ? [{ type: 'workflow.created', target: { type: 'workflow', id: workflow.id }, object: { ...workflow } }] : [],
  'workflow.update': (input: UpdateInput, reply: UpdateReply): AuditDraft[] => {
    if (reply[0] !== 1) return [];
    const before = toWorkflow(recordOf(reply[1]!), input.from);
    const after = toWorkflow(recordOf(reply[2]!), input.to ?? input.from);
    const changed = diff(editable(before), editable(after));
    return changed ? [{ type: 'workflow.updated', target: { type: 'workflow', id: after.id }, object: { ...after }, ...changed }] : [];
  },
  'workflow.delete': (_: null, reply: DeleteReply): AuditDraft[] => {
    if (reply[0] !== 1) return [];
    const workflow = deletedWorkflow(reply);
    return [{ type: 'workflow.deleted', target: { type: 'workflow', id: workflow.id }, object: { ...workflow } }];
  },
};

/**
 * One page of a workflow's versions, newest first: `after` is the version number the previous page
 * ended with. `total` is the number of versions.
 */
export async function versionPage(redis: Redis, keys: Keys, tenantId: string, workflowId: string, limit: number, after: number | null): Promise<{ items: WorkflowVersion[]; next: number | null; total: number }> {
  const index = keys.workflowVersions(tenantId, workflowId);
  const [ids, total] = await Promise.all([
    redis.zrange(index, after === null ? '+inf' : `(${after}`, '-inf', 'BYSCORE', 'REV', 'LIMIT', 0, limit + 1),
    redis.zcard(index),
  ]);
  const page = ids.slice(0, limit);
  const items = (await loadVersions(redis, keys, tenantId, page)).filter((v): v is WorkflowVersion => v !== null);
  return { items, next: ids.length > limit && items.length ? items[items.length - 1]!.version : null, total };
}

/** One version of a workflow by its number, or null. */
export async function findVersion(redis: Redis, keys: Keys, tenantId: string, workflowId: string, version: number): Promise<WorkflowVersion | null> {
  const [id] = await redis.zrange(keys.workflowVersions(tenantId, workflowId), version, version, 'BYSCORE');
  return id ? ((await loadVersions(redis, keys, tenantId, [id]))[0] ?? null) : null;
}
