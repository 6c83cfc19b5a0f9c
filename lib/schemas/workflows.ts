import { SLUG_MAX_LENGTH, SLUG_MIN_LENGTH, SLUG_PATTERN } from '../slugs.js';
import { LIST_QUERY_PROPERTIES, type Schema } from './common.js';
import { MessageCreate } from './messages.js';
import { CONTENT_FIELDS } from '../apns-payload.js';
import { EXPRESSION_EVENT_PATTERN } from '../expressions.js';
import { MAX_STEPS, STEP_NAME_PATTERN, STEP_TYPES } from '../workflow-limits.js';

// Every export of this module is a schema: lib/schemas/index.ts registers them all.
// The definition (trigger, steps, cancelOn) is checked in full by lib/workflow-definition.ts, whose
// details carry exact paths; these schemas describe its shape for the document and clients.

const slug: Schema = {
  type: 'string', minLength: SLUG_MIN_LENGTH, maxLength: SLUG_MAX_LENGTH, pattern: SLUG_PATTERN,
  description: 'Lowercase letters and digits in groups joined by single hyphens, 3 to 48 characters. Immutable.',
};
const name: Schema = { type: 'string', nullable: true, minLength: 1, maxLength: 128, description: 'Display name; null for none.' };
const description: Schema = { type: 'string', nullable: true, minLength: 1, maxLength: 1024, description: 'Free text; null for none.' };
const enabled: Schema = { type: 'boolean', description: 'A disabled workflow starts no new runs; its running ones go on.' };
const expression: Schema = { type: 'object', description: 'An expression (docs/expressions.md); property conditions test the event being handled.' };
const eventName: Schema = { type: 'string', pattern: EXPRESSION_EVENT_PATTERN, description: 'An event name; reserved `$` names (spec 6.1) included.' };
const eventSpec = (what: string): Schema => ({
  type: 'object',
  additionalProperties: false,
  required: ['event'],
  description: what,
  properties: {
    event: eventName,
    where: expression,
  },
});
const trigger = eventSpec('Starts a run for the subscriber of each matching event (one run per event).');
const cancelOn: Schema = { ...eventSpec('Cancels the subscriber\'s active runs of the workflow when a matching event arrives; null for none.'), nullable: true };
const steps: Schema = {
  type: 'array', minItems: 1, maxItems: MAX_STEPS, items: { $ref: '#/components/schemas/WorkflowStep' },
  description: '1 to 50 steps in all, nested ones counted, nested at most 5 levels deep. `trigger`, `steps` and `cancelOn` together are at most '
    + '65536 bytes serialized as JSON (a PATCH with the parts it leaves out taken from the current version; 400 `validation` on `body`).',
};
const time: Schema = { type: 'string', format: 'date-time' };
const nullableTime: Schema = { ...time, nullable: true };
const version: Schema = { type: 'integer', minimum: 1 };


export const SendContent: Schema = {
  type: 'object',
  additionalProperties: false,
  required: ['title', 'body'],
  description: 'The content of a message, with the rules of `POST /v1/messages` (no `to`: the run\'s subscriber; no `sendAt`: use a sleep step).',
  properties: Object.fromEntries(CONTENT_FIELDS.map((field) => {
    // no default: a definition is stored as written (the sender applies `high` when priority is absent)
    const { default: _default, ...schema } = (MessageCreate.properties as Record<string, Schema>)[field]!;
    return [field, schema];
  })),
};

export const WorkflowStep: Schema = {
  type: 'object',
  required: ['type'],
  description: 'One step; which fields it takes depends on `type` (docs/workflows.md): `sleep` { duration }, `wait` { event, '
    + 'where?, timeout, onEvent?, onTimeout? }, `branch` { if, then?, else? }, `send` { message }, `exit` {}. Every step may have '
    + 'a `name`, unique in the workflow. Durations are 1s to 90d (`30s`, `15m`, `24h`, `7d`).',
  properties: {
    type: { type: 'string', enum: [...STEP_TYPES] },
    name: { type: 'string', pattern: STEP_NAME_PATTERN, 'x-errorMessage': `must match ${STEP_NAME_PATTERN}`, description: 'Unique within the workflow.' },
    duration: { type: 'string', description: 'sleep: how long.' },
    event: { ...eventName, description: 'wait: the event awaited; reserved `$` names (spec 6.1) included.' },
    where: { ...expression, description: 'wait: what the awaited event must satisfy.' },
    timeout: { type: 'string', description: 'wait: how long to wait at most.' },
    onEvent: { ...steps, description: 'wait: steps run when the event arrives (then the steps after the wait).' },
    onTimeout: { ...steps, description: 'wait: steps run on timeout (then the steps after the wait).' },
    if: { ...expression, description: 'branch: the condition.' },
    then: { ...steps, description: 'branch: steps run when `if` holds.' },
    else: { ...steps, description: 'branch: steps run otherwise.' },
    message: { $ref: '#/components/schemas/SendContent' },
  },
};

export const WorkflowCreate: Schema = {
  type: 'object',
  additionalProperties: false,
  required: ['slug', 'trigger', 'steps'],
  properties: { slug, name, description, enabled: { ...enabled, default: true }, trigger, steps, cancelOn },
};

export const WorkflowUpdate: Schema = {
  type: 'object',
  additionalProperties: false,
  minProperties: 1,
  properties: { name, description, enabled, trigger, steps, cancelOn },
  description: 'A change of trigger, steps or cancelOn makes a new version; name, description and enabled do not. The slug cannot be changed.',
};

const definition: Record<string, Schema> = {
  trigger,
  steps,
  cancelOn: { ...cancelOn, description: 'null when none.' },
};

export const Workflow: Schema = {
  type: 'object',
  additionalProperties: false,
  required: ['id', 'slug', 'name', 'description', 'enabled', 'version', 'versionId', 'trigger', 'steps', 'cancelOn', 'createdAt', 'updatedAt'],
  properties: {
    id: { type: 'string', pattern: '^wfl_' },
    slug: { type: 'string' },
    name: { type: 'string', nullable: true },
    description: { type: 'string', nullable: true },
    enabled: { type: 'boolean' },
    version: { ...version, description: 'The current version: new runs start with it.' },
    versionId: { type: 'string', pattern: '^wfv_' },
    ...definition,
    createdAt: time,
    updatedAt: time,
  },
};

export const WorkflowVersion: Schema = {
  type: 'object',
  additionalProperties: false,
  required: ['id', 'workflowId', 'version', 'trigger', 'steps', 'cancelOn', 'createdAt'],
  description: 'One immutable definition of a workflow; runs keep the version they started with.',
  properties: {
    id: { type: 'string', pattern: '^wfv_' },
    workflowId: { type: 'string', pattern: '^wfl_' },
    version,
    ...definition,
    createdAt: time,
  },
};

export const WorkflowRunStatus: Schema = { type: 'string', enum: ['running', 'sleeping', 'waiting', 'completed', 'canceled', 'failed'] };

export const WorkflowRunsQuery: Schema = {
  type: 'object',
  additionalProperties: false,
  properties: { ...LIST_QUERY_PROPERTIES, status: { $ref: '#/components/schemas/WorkflowRunStatus' } },
};

export const WorkflowRun: Schema = {
  type: 'object',
  additionalProperties: false,
  required: ['id', 'workflowId', 'workflow', 'versionId', 'version', 'externalId', 'status', 'step', 'triggerEventId', 'reason', 'wakeAt', 'startedAt', 'updatedAt', 'completedAt', 'history', 'depth'],
  properties: {
    id: { type: 'string', pattern: '^run_' },
    workflowId: { type: 'string', pattern: '^wfl_' },
    workflow: { type: 'string', description: 'The workflow\'s slug.' },
    versionId: { type: 'string', pattern: '^wfv_' },
    version,
    externalId: { type: 'string' },
    status: { $ref: '#/components/schemas/WorkflowRunStatus' },
    step: { type: 'string', nullable: true, description: 'Path of the current (or last) step, e.g. `steps[1].then[0]`.' },
    triggerEventId: { type: 'string', description: 'The `evt_` id of the event that started the run.' },
    reason: { type: 'string', nullable: true, description: 'Why it ended when canceled or failed: canceled_by_event, subscriber_deleted, workflow_deleted, send_failed; step_not_found and too_many_steps only for a broken stored run (docs/workflows.md)' },
    wakeAt: { ...nullableTime, description: 'When a sleep ends or a wait times out.' },
    startedAt: { ...time, description: 'When the trigger event arrived (not when a worker got to it, docs/automation.md).' },
    updatedAt: time,
    completedAt: nullableTime,
    history: {
      type: 'array',
      description: 'What each step did, oldest first.',
      items: {
        type: 'object',
        additionalProperties: false,
        required: ['step', 'type', 'outcome', 'at'],
        properties: {
          step: { type: 'string', description: 'The step\'s path, e.g. `steps[1].then[0]`.' },
          name: { type: 'string', description: 'The step\'s `name`, when it has one.' },
          type: { type: 'string' },
          outcome: { type: 'string', description: 'sleep: sleeping, woke; wait: waiting, event, timeout; branch: then, else; send: sent, failed; exit: exit.' },
          at: { ...time, description: 'When the step\'s cause happened: the arrival of the event that caused it, or the due time of its timer.' },
          messageId: { type: 'string', description: 'send: the message created.' },
          branch: { type: 'string', enum: ['then', 'else'] },
          eventId: { type: 'string', description: 'wait: the event that resumed the run.' },
        },
      },
    },
    depth: {
      type: 'integer', minimum: 0, maximum: 3,
      description: 'Hops from an event of no run: 0 when the trigger event came from outside a run, else one more than the run whose `$run.*` or `$send` event started it. A trigger that would start a run deeper than 3 starts nothing.',
    },
  },
};
