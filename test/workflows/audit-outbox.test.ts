import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { isoNow, now } from '../../lib/clock.js';
import { newId } from '../../lib/ids.js';
import type { AuditIntent } from '../../streams/audit-outbox.js';
import { GONE_NAMES_KEEP_MS, MAX_GONE_NAMES } from '../../streams/automation-definitions.js';
import { callScript } from '../../streams/lua-scripts.js';
import { WORKFLOW_AUDITS, type Workflow } from '../../streams/workflows.js';
import { assertSweptOnce, startDiedWriterCtx, tenantIntent, type DiedWriterCtx } from '../helpers/audit.js';
import { MAX_VERSIONS } from '../../streams/automation-definitions.js';

type Ctx = DiedWriterCtx;
const died = suite<Ctx>('workflow writes whose writer died after the script');

died.before((ctx) => startDiedWriterCtx(ctx, 'workflow-audit-died'));
died.after(async ({ service }) => service.stop());

const TRIGGER = { event: 'user.signed_up' };
const STEPS = [{ type: 'send', message: { title: 'Welcome!', body: 'Glad you are here.' } }, { type: 'wait', event: 'app.opened', timeout: '1d' }];

const read = async (ctx: Ctx, slug: string): Promise<Workflow> => (await ctx.api.get(`/v1/workflows/${slug}`, ctx.key)).body.data;
const definition = (w: Workflow) => ({ trigger: w.trigger, steps: w.steps, cancelOn: w.cancelOn });

/** Runs updateWorkflow's script as a writer that dies right after it: `next`, a new definition (a new version), or null. */
async function updateAndDie(ctx: Ctx, current: Workflow, fields: string[], next: Pick<Workflow, 'trigger' | 'steps' | 'cancelOn'> | null) {
  const { redis, keys } = ctx.service;
  const tenantId = ctx.tenant.id;
  const versionId = next ? newId('workflowVersion') : '';
  const input = { from: definition(current), to: next };
  const intent = tenantIntent(ctx, 'workflow.update', input);
  const reply = await callScript<[number, string[], string[]]>(redis, 'updateWorkflow',
    [keys.workflow(tenantId, current.id), keys.workflowVersions(tenantId, current.id), keys.workflowVersion(tenantId, versionId || current.versionId), keys.automationVersion(tenantId), intent.key],
    [isoNow(), current.versionId, versionId, next ? JSON.stringify({ trigger: next.trigger, steps: next.steps }) : '', intent.token, intent.json, MAX_VERSIONS, String(fields.length / 2), ...fields]);
  return { intent, reply, expected: WORKFLOW_AUDITS['workflow.update'](input, reply) };
}

died('a create: the sweeper appends workflow.created, the workflow as the API reads it', async (ctx) => {
  const { service, tenant } = ctx;
  const { redis, keys } = service;
  const id = newId('workflow');
  const versionId = newId('workflowVersion');
  const at = isoNow();
  const workflow: Workflow = { id, slug: 'died-create', name: 'Died', description: null, enabled: true, version: 1, versionId, trigger: TRIGGER, steps: STEPS as Workflow['steps'], cancelOn: null, createdAt: at, updatedAt: at };
  const create = (intent: AuditIntent, workflowId: string) => callScript<[number, string]>(redis, 'createWorkflow',
    [keys.workflowSlugs(tenant.id), keys.workflowIndex(tenant.id), keys.workflow(tenant.id, workflowId), keys.workflowVersion(tenant.id, versionId), keys.workflowVersions(tenant.id, workflowId), keys.automationVersion(tenant.id), intent.key],
    [workflowId, workflow.slug, 'Died', '', '1', versionId, JSON.stringify({ trigger: TRIGGER, steps: STEPS }), at, 100, intent.token, intent.json]);
  const intent = tenantIntent(ctx, 'workflow.create', workflow);
  const reply = await create(intent, id);
  assert.equal(reply, [1, id]);
  const [expected] = WORKFLOW_AUDITS['workflow.create'](workflow, reply);
  await assertSweptOnce(service, intent, [expected!]);
  assert.equal(expected!.object, await read(ctx, 'died-create'));

  const taken = tenantIntent(ctx, 'workflow.create', workflow);
  assert.equal(await create(taken, newId('workflow')), [0, id]);
  assert.is(await redis.hlen(taken.key), 0, 'a create that wrote nothing records no intent');
});

died('an update of the record: the sweeper appends workflow.updated with its changes, the version unchanged', async (ctx) => {
  const { service, api, key } = ctx;
  await api.post('/v1/workflows', key, { slug: 'died-rename', name: 'Before', trigger: TRIGGER, steps: STEPS });
  const current = await read(ctx, 'died-rename');
  const { intent, reply, expected: [expected] } = await updateAndDie(ctx, current, ['name', 'After', 'enabled', '0'], null);
  assert.is(reply[0], 1);
  assert.equal(expected!.changes, { name: 'After', enabled: false });
  assert.equal(expected!.previousAttributes, { name: 'Before', enabled: true });
  await assertSweptOnce(service, intent, [expected!]);
  assert.equal(expected!.object, await read(ctx, 'died-rename'));

  const same = await updateAndDie(ctx, await read(ctx, 'died-rename'), ['name', 'After'], null);
  assert.is(same.reply[0], 1);
  assert.equal(same.expected, []);
  assert.is(await service.redis.hlen(same.intent.key), 0, 'an update that changed nothing records no intent');
});

died('an update of the definition: the sweeper appends workflow.updated naming the new version and its id', async (ctx) => {
  const { service, api, key } = ctx;
  await api.post('/v1/workflows', key, { slug: 'died-version', trigger: TRIGGER, steps: STEPS });
  const current = await read(ctx, 'died-version');
  const next = { trigger: { event: 'user.upgraded' }, steps: current.steps, cancelOn: null };
  const { intent, reply, expected: [expected] } = await updateAndDie(ctx, current, [], next);
  assert.is(reply[0], 1);
  const after = await read(ctx, 'died-version');
  assert.is(after.version, 2);
  assert.equal(expected!.changes, { version: 2, versionId: after.versionId, trigger: next.trigger });
  assert.equal(expected!.previousAttributes, { version: 1, versionId: current.versionId, trigger: TRIGGER });
  await assertSweptOnce(service, intent, [expected!]);
  assert.equal(expected!.object, after);

  const stale = await updateAndDie(ctx, current, ['name', 'Late'], null);
  assert.equal(stale.reply, [-1], 'computed from version 1, which is no longer current');
  assert.is(await service.redis.hlen(stale.intent.key), 0, 'a compare-and-set that lost records no intent');
});

died('a delete: the sweeper appends workflow.deleted, the workflow as it was with its current version', async (ctx) => {
  const { service, api, key, tenant } = ctx;
  const { redis, keys } = service;
  await api.post('/v1/workflows', key, { slug: 'died-delete', name: 'Gone', trigger: TRIGGER, steps: STEPS });
  await api.patch('/v1/workflows/died-delete', key, { trigger: { event: 'user.upgraded' } });
  const before = await read(ctx, 'died-delete');
  const remove = (intent: AuditIntent) => callScript<[number, string[], string[], string[]]>(redis, 'deleteWorkflow',
    [keys.workflowSlugs(tenant.id), keys.workflowIndex(tenant.id), keys.workflow(tenant.id, before.id), keys.workflowVersions(tenant.id, before.id), keys.automationVersion(tenant.id), keys.workflowGoneNames(tenant.id), keys.workflowVersion(tenant.id, before.versionId), intent.key],
    [before.id, before.versionId, now(), GONE_NAMES_KEEP_MS, MAX_GONE_NAMES, intent.token, intent.json, 'app.opened']);
  const intent = tenantIntent(ctx, 'workflow.delete', null);
  const reply = await remove(intent);
  assert.is(reply[0], 1);
  assert.is(reply[2].length, 2, 'both versions for the writer to delete');
  const [expected] = WORKFLOW_AUDITS['workflow.delete'](null, reply);
  assert.equal(expected!.object, before);
  await assertSweptOnce(service, intent, [expected!]);
  assert.is((await api.get('/v1/workflows/died-delete', key)).status, 404);

  const gone = tenantIntent(ctx, 'workflow.delete', null);
  assert.equal(await remove(gone), [0]);
  assert.is(await redis.hlen(gone.key), 0, 'a delete that found nothing records no intent');
});

died.run();
