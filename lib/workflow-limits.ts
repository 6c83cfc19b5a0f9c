/**
 * The shape limits of a workflow definition, in a module of their own (no imports) so that both the
 * definition's validator (`lib/workflow-definition.ts`) and the request schemas (`lib/schemas/`),
 * which the validator loads, can use them without an import cycle.
 */

export const STEP_TYPES = ['sleep', 'wait', 'branch', 'send', 'exit'] as const;
/** Most steps of a definition, nested ones counted. */
export const MAX_STEPS = 50;
/** Deepest step list: the top-level `steps` is level 1, a branch's `then` inside it level 2... */
export const MAX_NESTING = 5;
/**
 * Most bytes of a definition (`trigger`, `steps` and `cancelOn`) serialized as JSON. Each part has
 * its own bounds (an expression 16 KB, a send's APNs payload 4 KB), but 50 steps of them added up to
 * 838 KB, and every change of such a workflow put three copies in its `workflow.updated` webhook
 * payload (the workflow, `changes`, `previousAttributes`: 2.45 MB, probe D1), stored for the
 * retention and sent on every retry. 64 KB keeps that payload under ~200 KB and holds 50 steps
 * of over a kilobyte each.
 */
export const MAX_DEFINITION_BYTES = 65_536;
/** A step's `name`: unique in the workflow, for runs to report where they are. */
export const STEP_NAME_PATTERN = '^[a-z0-9][a-z0-9_-]{0,47}$';
