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
