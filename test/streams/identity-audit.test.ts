import { join } from 'node:path';
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { isoNow, now } from '../../lib/clock.js';
import { newId } from '../../lib/ids.js';
import { auditIntent, recordIntent } from '../../streams/audit-outbox.js';
import { createTenant, findTenant, rotateIdentitySecret, setIdentityRequired, TENANT_AUDITS, type Tenant, type Workspace } from '../../streams/identity.js';
import { callScript } from '../../streams/lua-scripts.js';
import { assertSweptOnce, auditEntries, killWhen, oneEntryEach, outboxesEmptied, roleEnv, startSweeper } from '../helpers/audit.js';
import { startScriptProcess, stopRoleProcess, type RoleProcess } from '../helpers/processes.js';
import { BY_TEST, bootstrapWorkspace, startTestService, type TestService } from '../helpers/service.js';

type Ctx = { service: TestService; workspace: Workspace };
const died = suite<Ctx>('tenant audit intents whose writer died');

died.before(async (ctx) => {
  ctx.service = await startTestService('identity-audit');
  ctx.workspace = (await bootstrapWorkspace(ctx.service, 'identity-audit')).workspace;
});
died.after(async ({ service }) => service.stop());

const intentOf = (ctx: Ctx, tenant: Tenant, op: string, input: unknown) =>
  auditIntent(ctx.service.keys.workspaceOutbox(ctx.workspace.id), op, { workspace: ctx.workspace, tenant: { id: tenant.id, slug: tenant.slug }, ...BY_TEST }, input);

/** Runs createTenant's script as a writer that dies right after it. */
async function createTenantAndDie(ctx: Ctx, slug: string) {
  const { redis, keys } = ctx.service;
  const at = now();
  const tenant: Tenant = { id: newId('tenant'), slug, workspaceId: ctx.workspace.id, createdAt: isoNow(at) };
  const intent = intentOf(ctx, tenant, 'tenant.create', tenant);
  const reply = await callScript<[number, string]>(
    redis, 'createTenant',
    [keys.tenantSlugs(ctx.workspace.id), keys.tenantIndex(ctx.workspace.id), keys.tenant(ctx.workspace.id, tenant.id), intent.key],
    [tenant.id, slug, ctx.workspace.id, tenant.createdAt, at, intent.token, intent.json],
  );
  return { intent, reply, tenant };
}

/** Writes one identity setting with its intent in one MULTI, as rotateIdentitySecret does, and dies. */
async function writeSettingAndDie(ctx: Ctx, tenant: Tenant, field: string, value: string, op: string, input: unknown) {
  const intent = intentOf(ctx, tenant, op, input);
  await recordIntent(ctx.service.redis.multi().hset(ctx.service.keys.tenant(ctx.workspace.id, tenant.id), field, value), intent).exec();
  return intent;
}

died('tenant.created of a writer that died reaches the ledger once, as the tenant was created; a taken slug records nothing', async (ctx) => {
  const { intent, reply, tenant } = await createTenantAndDie(ctx, 'orphan');
  assert.equal(reply, [1, tenant.id]);
  const [entry] = await assertSweptOnce(ctx.service, intent, TENANT_AUDITS['tenant.create'](tenant, reply));
  assert.is(entry.type, 'tenant.created');
  assert.equal(entry.data.object, { ...(await findTenant(ctx.service.redis, ctx.service.keys, ctx.workspace.id, tenant.id)), identityVerificationRequired: false });

  const again = await createTenantAndDie(ctx, 'orphan');
  assert.equal(again.reply, [0, tenant.id]);
  assert.is(await ctx.service.redis.hlen(again.intent.key), 0, 'a taken slug writes no intent');
});

died('tenant.identity_secret_rotated of a writer that died reaches the ledger once, without the secret', async (ctx) => {
  const { tenant } = await createTenant(ctx.service.redis, ctx.service.keys, ctx.workspace, 'rotated', BY_TEST);
  const secret = 'f'.repeat(64);
  const described = { ...tenant, identityVerificationRequired: false };
  const intent = await writeSettingAndDie(ctx, tenant, 'identitySecret', secret, 'tenant.rotateIdentitySecret', described);
  const [entry] = await assertSweptOnce(ctx.service, intent, TENANT_AUDITS['tenant.rotateIdentitySecret'](described));
  assert.is(entry.type, 'tenant.identity_secret_rotated');
  assert.equal(entry.target, { type: 'tenant', id: tenant.id });
  assert.equal(entry.data.object, described, 'the tenant as tenant.created and tenant.updated describe it');
  assert.not.ok(JSON.stringify(entry).includes(secret), 'the secret is not in the entry');
});

died('a live rotation describes the tenant as tenant.created and tenant.updated do: identityVerificationRequired included', async (ctx) => {
  const { redis, keys } = ctx.service;
  const { tenant } = await createTenant(redis, keys, ctx.workspace, 'rotated-live', BY_TEST);
  await setIdentityRequired(redis, keys, ctx.workspace, tenant, true, BY_TEST);
  await rotateIdentitySecret(redis, keys, ctx.workspace, tenant, BY_TEST);
  const entries = (await auditEntries(ctx.service, ctx.workspace.id)).filter((e) => e.target?.id === tenant.id);
  assert.equal(entries.map((e) => e.type), ['tenant.created', 'tenant.updated', 'tenant.identity_secret_rotated']);
  assert.equal(entries.map((e) => e.data.object.identityVerificationRequired), [false, true, true]);
});

died('tenant.updated of a writer that died reaches the ledger once, shaped as the live writer shapes it', async (ctx) => {
  const { redis, keys } = ctx.service;
  const { tenant } = await createTenant(redis, keys, ctx.workspace, 'required', BY_TEST);
  const input = { tenant, required: true };
  // lua/setIdentityRequired as setIdentityRequired calls it, the writer gone before settling
  const setAndDie = async () => {
    const intent = intentOf(ctx, tenant, 'tenant.setIdentityRequired', input);
    const reply = await callScript<[number]>(redis, 'setIdentityRequired', [keys.tenant(ctx.workspace.id, tenant.id), intent.key], ['1', intent.token, intent.json]);
    return { intent, reply };
  };
  const { intent, reply } = await setAndDie();
  assert.equal(reply, [1]);
  const [swept] = await assertSweptOnce(ctx.service, intent, TENANT_AUDITS['tenant.setIdentityRequired'](input));
  assert.equal([swept.type, swept.data.object, swept.changes, swept.previousAttributes], [
    'tenant.updated', { ...tenant, identityVerificationRequired: true }, { identityVerificationRequired: true }, { identityVerificationRequired: false },
  ]);
  const again = await setAndDie();
  assert.equal(again.reply, [0]);
  assert.is(await redis.hlen(again.intent.key), 0, 'a value already set writes no intent');

  // the live writer turning it off again writes the mirror entry, and nothing is left in the outbox
  await setIdentityRequired(redis, keys, ctx.workspace, tenant, false, BY_TEST);
  const live = (await auditEntries(ctx.service, ctx.workspace.id)).at(-1);
  assert.equal([live.type, live.data.object, live.changes, live.previousAttributes], [
    'tenant.updated', { ...tenant, identityVerificationRequired: false }, { identityVerificationRequired: false }, { identityVerificationRequired: true },
  ]);
  assert.is(await redis.hlen(keys.workspaceOutbox(ctx.workspace.id)), 0);
});

died.run();

const ROUNDS = 3;
const WRITER = join(import.meta.dirname, '..', 'helpers', 'tenant-writer.ts');

type KillCtx = { service: TestService; writer?: RoleProcess; worker?: RoleProcess };
const kill = suite<KillCtx>('tenant audit entries survive a writer killed mid-write');

kill.before(async (ctx) => {
  ctx.service = await startTestService('identity-audit-kill');
});
kill.after(async (ctx) => {
  if (ctx.writer) await stopRoleProcess(ctx.writer);
  if (ctx.worker) await stopRoleProcess(ctx.worker);
  await ctx.service.stop();
});

kill('after SIGKILLs of a process creating tenants and changing their identity settings, each write that took effect has exactly one entry', async (ctx) => {
  const { service } = ctx;
  const { redis, keys } = service;
  const { workspace } = await bootstrapWorkspace(service, 'kill');
  const index = keys.tenantIndex(workspace.id);
  for (let round = 1; round <= ROUNDS; round++) {
    ctx.writer = startScriptProcess(WRITER, { ...roleEnv(service), WORKSPACE: 'kill', SLUG_PREFIX: `r${round}`, LOOPS: '16' });
    await killWhen(ctx.writer, async () => (await redis.zcard(index)) >= 1 + round * 150);
  }
  ctx.worker = startSweeper(service);
  await outboxesEmptied(service, [keys.workspaceOutbox(workspace.id)]);

  const tenants = await redis.zrange(index, 0, -1);
  const records = await Promise.all(tenants.map((id) => redis.hmget(keys.tenant(workspace.id, id), 'identitySecret', 'identityRequired')));
  const entries = await auditEntries(service, workspace.id);
  const having = (written: (i: number) => boolean) => new Set(tenants.filter((_, i) => written(i)));
  const problems = [
    ...oneEntryEach(entries, 'tenant.created', new Set(tenants), 'tenants'),
    ...oneEntryEach(entries, 'tenant.identity_secret_rotated', having((i) => records[i]![0] !== null), 'tenants'),
    ...oneEntryEach(entries, 'tenant.updated', having((i) => records[i]![1] === '1'), 'tenants'),
  ];
  assert.equal(problems, [], `of ${tenants.length} tenants`);
});

kill.run();
