import type { RoutesBySegment as Router } from '../routes-by-segment.js';
import type { Context } from 'koa';
import { notFound, type ErrorDetail } from '../../lib/errors.js';
import { validateWorkflowDefinition } from '../../lib/workflow-definition.js';
import { findRun, runPage, type RunStatus } from '../../streams/workflow-runs.js';
import {
  createWorkflow, deleteWorkflow, findVersion, findWorkflow, loadWorkflows, updateWorkflow, versionPage,
  type Workflow, type WorkflowInput, type WorkflowPatch,
} from '../../streams/workflows.js';
import type { AppDeps } from '../deps.js';
import { respond } from '../envelope.js';
import { isId } from '../../lib/ids.js';
import { badCursor, encodeCursor, pageRecords, pageRequest } from '../list.js';
import { authorize, refsOf, tenantOf, writerOf } from '../middleware/auth.js';
import { readBody } from '../read-body.js';

/** The definition parts of a body (`cancelOn: null` is "none"), checked in full with their paths. */
function definitionProblems(partial: boolean) {
  return (body: Record<string, unknown>): ErrorDetail[] => {
    const def: Record<string, unknown> = {};
    if (body.trigger !== undefined) def.trigger = body.trigger;
    if (body.steps !== undefined) def.steps = body.steps;
    if (body.cancelOn !== undefined && body.cancelOn !== null) def.cancelOn = body.cancelOn;
    return validateWorkflowDefinition(def, '', { partial });
  };
}

/** A version number in a path: a positive integer, else nothing can match (404). */
const VERSION = /^[1-9][0-9]{0,8}$/;

export function registerWorkflows(router: Router, deps: AppDeps): void {
  const { redis, keys, config } = deps;
  const read = authorize(deps, 'tenant', 'workflows:read');
  const write = authorize(deps, 'tenant', 'workflows:write');

  /** The workflow the path names, or 404 (a malformed slug too). */
  const workflowOf = async (ctx: Context): Promise<Workflow> => {
    const workflow = await findWorkflow(redis, keys, tenantOf(ctx).id, ctx.params.workflowSlug ?? '');
    if (!workflow) throw notFound('Workflow');
    return workflow;
  };

  /**
   * @openapi
   * /v1/workflows:
   *   post:
   *     operationId: createWorkflow
   *     summary: Create a workflow
   *     description: |
   *       Scope `workflows:write`. `slug` is 3 to 48 characters matching `^[a-z0-9]+(?:-[a-z0-9]+)*$`, unique in the
   *       tenant (a taken slug is 409 `conflict`) and immutable. A tenant has at most 100 workflows (400 `bad_request`). The definition is `trigger`, `steps` and optional
   *       `cancelOn` (docs/workflows.md); each problem in it is a `validation` detail naming its path
   *       (`steps[2].then[0].duration`). The workflow starts at version 1, enabled unless `enabled` is false.
   *       A trigger may be an engine event (`$run.completed`, `$send`...): a run started by another run's event is one
   *       deeper than it (`depth` on the run), and one that would be deeper than 3 is not started (logged, nothing
   *       written), so workflows that trigger one another stop. Any reserved event may trigger except
   *       `$subscriber.deleted` (a deleted subscriber runs nothing: 400 `validation` on `trigger.event`). Audited as `workflow.created`.
   *     tags: [Workflows]
   *     parameters: [{ $ref: '#/components/parameters/serviceTenant' }]
   *     requestBody:
   *       required: true
   *       content: { application/json: { schema: { $ref: '#/components/schemas/WorkflowCreate' } } }
   *     responses:
   *       '201':
   *         description: The new workflow
   *         content: { application/json: { schema: { $ref: '#/components/schemas/WorkflowResponse' } } }
   *       '400': { $ref: '#/components/responses/Error' }
   *       '401': { $ref: '#/components/responses/Unauthorized' }
   *       '403': { $ref: '#/components/responses/Error' }
   *       '409': { $ref: '#/components/responses/Error' }
   *       default: { $ref: '#/components/responses/Error' }
   *   get:
   *     operationId: listWorkflows
   *     x-query: ListQuery
   *     summary: List workflows
   *     description: |
   *       Scope `workflows:read`. The tenant's workflows with their current definitions, newest first, keyset
   *       pagination, with `total`.
   *     tags: [Workflows]
   *     parameters:
   *       - $ref: '#/components/parameters/serviceTenant'
   *     responses:
   *       '200':
   *         description: A page of workflows
   *         content: { application/json: { schema: { $ref: '#/components/schemas/WorkflowListResponse' } } }
   *       default: { $ref: '#/components/responses/Error' }
   */
  router.post('/v1/workflows', write, async (ctx) => {
    const input = readBody<WorkflowInput>('WorkflowCreate', ctx.request.body, definitionProblems(false));
    respond(ctx, 201, await createWorkflow(redis, keys, refsOf(ctx), input, writerOf(ctx)));
  });

  router.get('/v1/workflows', read, async (ctx) => {
    const tenantId = tenantOf(ctx).id;
    const page = pageRequest(ctx);
    respond(ctx, 200, await pageRecords(redis, keys.workflowIndex(tenantId), page, 'workflow', (ids) => loadWorkflows(redis, keys, tenantId, ids)));
  });

  /**
   * @openapi
   * /v1/workflows/{workflowSlug}:
   *   get:
   *     operationId: getWorkflow
   *     summary: One workflow
   *     description: |
   *       Scope `workflows:read`. With its current version's definition. An unknown or malformed slug, or
   *       another tenant's workflow, is 404.
   *     tags: [Workflows]
   *     parameters:
   *       - $ref: '#/components/parameters/serviceTenant'
   *       - $ref: '#/components/parameters/workflowSlug'
   *     responses:
   *       '200':
   *         description: The workflow
   *         content: { application/json: { schema: { $ref: '#/components/schemas/WorkflowResponse' } } }
   *       '404': { $ref: '#/components/responses/Error' }
   *       default: { $ref: '#/components/responses/Error' }
   *   patch:
   *     operationId: updateWorkflow
   *     summary: Change, enable or disable a workflow
   *     description: |
   *       Scope `workflows:write`. `name`, `description` (null clears one) and `enabled` change the workflow itself;
   *       `{ "enabled": false }` disables it (no new runs; running ones finish). A change of `trigger`, `steps` or
   *       `cancelOn` (null removes it) makes a new version, current from then on: what the body leaves out is taken
   *       from the current version, and a definition equal to the current one makes no version. Runs keep the
   *       version they started with. The slug is immutable; sending it is a `validation` error naming `slug`.
   *       Audited as `workflow.updated` with `changes` and `previousAttributes` when something changes.
   *     tags: [Workflows]
   *     parameters:
   *       - $ref: '#/components/parameters/serviceTenant'
   *       - $ref: '#/components/parameters/workflowSlug'
   *     requestBody:
   *       required: true
   *       content: { application/json: { schema: { $ref: '#/components/schemas/WorkflowUpdate' } } }
   *     responses:
   *       '200':
   *         description: The workflow after the change
   *         content: { application/json: { schema: { $ref: '#/components/schemas/WorkflowResponse' } } }
   *       '400': { $ref: '#/components/responses/Error' }
   *       '404': { $ref: '#/components/responses/Error' }
   *       '409':
   *         description: 'A change of the definition that would make a 101st version: a workflow keeps at most 100 (create a new workflow for more)'
   *         content: { application/json: { schema: { $ref: '#/components/schemas/ErrorEnvelope' } } }
   *       '429': { $ref: '#/components/responses/LockTimeout' }
   *       default: { $ref: '#/components/responses/Error' }
   *   delete:
   *     operationId: deleteWorkflow
   *     summary: Delete a workflow
   *     description: |
   *       Scope `workflows:write`. Removes the workflow, its slug (free for a new workflow) and its versions.
   *       No run starts afterwards; active runs are canceled at their next step (reason `workflow_deleted`) and send
   *       nothing more: a sleeping run when its timer fires, a waiting run when its timeout fires or the event it waits
   *       for (or its `cancelOn` event) arrives. Its runs are no longer listed (404); their `$run.canceled` events are
   *       on the subscribers' timelines. Answers the workflow as it was. Audited as `workflow.deleted`.
   *     tags: [Workflows]
   *     parameters:
   *       - $ref: '#/components/parameters/serviceTenant'
   *       - $ref: '#/components/parameters/workflowSlug'
   *     responses:
   *       '200':
   *         description: The deleted workflow
   *         content: { application/json: { schema: { $ref: '#/components/schemas/WorkflowResponse' } } }
   *       '404': { $ref: '#/components/responses/Error' }
   *       '409': { $ref: '#/components/responses/Error' }
   *       '429': { $ref: '#/components/responses/LockTimeout' }
   *       default: { $ref: '#/components/responses/Error' }
   */
  router.get('/v1/workflows/:workflowSlug', read, async (ctx) => {
    respond(ctx, 200, await workflowOf(ctx));
  });

  router.patch('/v1/workflows/:workflowSlug', write, async (ctx) => {
    const patch = readBody<WorkflowPatch>('WorkflowUpdate', ctx.request.body, definitionProblems(true), { slug: 'cannot be changed; create a workflow with the new slug' });
    respond(ctx, 200, await updateWorkflow(redis, keys, refsOf(ctx), ctx.params.workflowSlug ?? '', patch, writerOf(ctx)));
  });

  router.delete('/v1/workflows/:workflowSlug', write, async (ctx) => {
    respond(ctx, 200, await deleteWorkflow(redis, keys, refsOf(ctx), ctx.params.workflowSlug ?? '', writerOf(ctx)));
  });

  /**
   * @openapi
   * /v1/workflows/{workflowSlug}/versions:
   *   get:
   *     operationId: listWorkflowVersions
   *     x-query: ListQuery
   *     summary: A workflow's versions
   *     description: |
   *       Scope `workflows:read`. Every version of the definition, newest first, keyset pagination, with
   *       `total`. Versions are immutable.
   *     tags: [Workflows]
   *     parameters:
   *       - $ref: '#/components/parameters/serviceTenant'
   *       - $ref: '#/components/parameters/workflowSlug'
   *     responses:
   *       '200':
   *         description: A page of versions
   *         content: { application/json: { schema: { $ref: '#/components/schemas/WorkflowVersionListResponse' } } }
   *       '404': { $ref: '#/components/responses/Error' }
   *       default: { $ref: '#/components/responses/Error' }
   */
  router.get('/v1/workflows/:workflowSlug/versions', read, async (ctx) => {
    const workflow = await workflowOf(ctx); // 404 first, whatever the query holds (spec 2.3)
    // a cursor of a workflow deleted since, the same slug made anew, is another list's
    const { limit, after } = pageRequest(ctx, 'ListQuery', () => workflow.id);
    if (after !== null && !VERSION.test(after)) throw badCursor();
    const page = await versionPage(redis, keys, tenantOf(ctx).id, workflow.id, limit, after === null ? null : Number(after));
    respond(ctx, 200, { items: page.items, hasMore: page.next !== null, nextCursor: page.next === null ? null : encodeCursor(String(page.next)), total: page.total });
  });

  /**
   * @openapi
   * /v1/workflows/{workflowSlug}/versions/{version}:
   *   get:
   *     operationId: getWorkflowVersion
   *     summary: One version of a workflow
   *     description: Scope `workflows:read`. `version` is the version number (1, 2...); an unknown one is 404.
   *     tags: [Workflows]
   *     parameters:
   *       - $ref: '#/components/parameters/serviceTenant'
   *       - $ref: '#/components/parameters/workflowSlug'
   *       - { name: version, in: path, required: true, schema: { type: integer, minimum: 1 } }
   *     responses:
   *       '200':
   *         description: The version
   *         content: { application/json: { schema: { $ref: '#/components/schemas/WorkflowVersionResponse' } } }
   *       '404': { $ref: '#/components/responses/Error' }
   *       default: { $ref: '#/components/responses/Error' }
   */
  router.get('/v1/workflows/:workflowSlug/versions/:version', read, async (ctx) => {
    const workflow = await workflowOf(ctx);
    const number = ctx.params.version ?? '';
    const version = VERSION.test(number) ? await findVersion(redis, keys, tenantOf(ctx).id, workflow.id, Number(number)) : null;
    if (!version) throw notFound('Workflow version');
    respond(ctx, 200, version);
  });

  /**
   * @openapi
   * /v1/workflows/{workflowSlug}/runs:
   *   get:
   *     operationId: listWorkflowRuns
   *     x-query: WorkflowRunsQuery
   *     summary: A workflow's runs
   *     description: |
   *       Scope `workflows:read`. Runs of every version of the workflow, newest first, keyset pagination,
   *       with `total` under the same filter. `status` keeps the runs in one status (`running`, `sleeping`,
   *       `waiting`, `completed`, `canceled`, `failed`); the workers maintain runs, so a run appears moments after
   *       its trigger event. An ended run is kept for `EVENT_RETENTION_DAYS` (default 30) after it ended, then expires
   *       (404, no longer listed or counted); an active run never does (docs/automation.md).
   *     tags: [Workflows]
   *     parameters:
   *       - $ref: '#/components/parameters/serviceTenant'
   *       - $ref: '#/components/parameters/workflowSlug'
   *     responses:
   *       '200':
   *         description: A page of runs
   *         content: { application/json: { schema: { $ref: '#/components/schemas/WorkflowRunListResponse' } } }
   *       '400': { $ref: '#/components/responses/Error' }
   *       '404': { $ref: '#/components/responses/Error' }
   *       default: { $ref: '#/components/responses/Error' }
   */
  router.get('/v1/workflows/:workflowSlug/runs', read, async (ctx) => {
    // the workflow first: a malformed or unknown slug is 404 whatever the query holds (spec 2.3)
    const workflow = await workflowOf(ctx);
    const { limit, after, query } = pageRequest<{ status?: RunStatus }>(ctx, 'WorkflowRunsQuery', () => workflow.id);
    if (after !== null && !isId('run', after)) throw badCursor();
    const page = await runPage(redis, keys, { tenantId: tenantOf(ctx).id, partitions: config.partitions }, workflow.id, { status: query.status, limit, after });
    respond(ctx, 200, { items: page.items, hasMore: page.next !== null, nextCursor: page.next === null ? null : encodeCursor(page.next), total: page.total });
  });

  /**
   * @openapi
   * /v1/workflows/{workflowSlug}/runs/{runId}:
   *   get:
   *     operationId: getWorkflowRun
   *     summary: One run of a workflow
   *     description: |
   *       Scope `workflows:read`. With its current step and history. A malformed id, another kind's id, or
   *       a run of another workflow or tenant is 404.
   *     tags: [Workflows]
   *     parameters:
   *       - $ref: '#/components/parameters/serviceTenant'
   *       - $ref: '#/components/parameters/workflowSlug'
   *       - { name: runId, in: path, required: true, schema: { type: string } }
   *     responses:
   *       '200':
   *         description: The run
   *         content: { application/json: { schema: { $ref: '#/components/schemas/WorkflowRunResponse' } } }
   *       '404': { $ref: '#/components/responses/Error' }
   *       default: { $ref: '#/components/responses/Error' }
   */
  router.get('/v1/workflows/:workflowSlug/runs/:runId', read, async (ctx) => {
    const workflow = await workflowOf(ctx);
    const run = await findRun(redis, keys, { tenantId: tenantOf(ctx).id, partitions: config.partitions }, workflow.id, ctx.params.runId ?? '');
    if (!run) throw notFound('Run');
    respond(ctx, 200, run);
  });
}
