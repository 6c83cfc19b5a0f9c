import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { sweepAuditOutboxes } from '../../actors/audit-outbox-sweeper.js';
import { createLogger } from '../../lib/log.js';
import type { Redis } from 'ioredis';
import { auditIntent, type AuditDraft, type AuditIntent } from '../../streams/audit-outbox.js';
import { LEDGER_FIELDS, type Ref } from '../../streams/ledger.js';
import type { RoleContext } from '../../streams/role-context.js';
import { client } from './api.js';
import { startRoleProcess, stopRoleProcess, type RoleProcess } from './processes.js';
import { BY_TEST, bootstrapWorkspace, startTestService, type TestService } from './service.js';
import { waitFor } from './wait.js';

/** The ledger's audit payloads of a workspace, oldest first. */
export async function auditEntries(service: TestService, workspaceId: string): Promise<any[]> {
  const entries = await service.redis.xrange(service.keys.ledger(workspaceId), '-', '+');
  return entries
    .filter(([, fields]) => fields[fields.indexOf(LEDGER_FIELDS.kind) + 1] === 'audit')
    .map(([, fields]) => JSON.parse(fields[fields.indexOf(LEDGER_FIELDS.payload) + 1]!));
}

/** The distinct event ids of each target's entries of one type (a settle repeated after a crash repeats its id). */
export function eventIdsByTarget(entries: any[], type: string): Map<string, Set<string>> {
  const byTarget = new Map<string, Set<string>>();
  for (const e of entries) if (e.type === type) byTarget.set(e.target.id, (byTarget.get(e.target.id) ?? new Set()).add(e.id));
  return byTarget;
}

/**
 * What is wrong with the `type` entries when exactly the `records` (ids of `noun`) had that write:
 * records without an entry, entries for other records, records with more than one event id.
 */
export function oneEntryEach(entries: any[], type: string, records: Set<string>, noun: string): string[] {
  const ids = eventIdsByTarget(entries, type);
  const problems: string[] = [];
  const missing = [...records].filter((id) => !ids.has(id)).length;
  if (missing) problems.push(`${missing} of ${records.size} ${noun} have no ${type} entry`);
  const stray = [...ids.keys()].filter((id) => !records.has(id)).length;
  if (stray) problems.push(`${stray} ${type} entries for other ${noun}`);
  const repeated = [...ids.values()].filter((events) => events.size !== 1).length;
  if (repeated) problems.push(`${repeated} ${noun} have more than one ${type} event id`);
  return problems;
}

/** The worker's context, for running the sweep in the test process. */
export const roleContext = (service: TestService): RoleContext =>
  ({ config: service.config, redis: service.redis, keys: service.keys, log: createLogger('error'), target: null as never });

/** What a role process needs to share the test service's Redis and key prefix. */
export const roleEnv = (service: TestService): Record<string, string> =>
  ({ REDIS_URL: service.env.REDIS_URL!, REDIS_KEY_PREFIX: service.env.REDIS_KEY_PREFIX!, HERALD_PARTITIONS: service.env.HERALD_PARTITIONS! });

/**
 * The sweep of an intent whose writer died right after its write: the entries the live writer
 * would have appended (`drafts`, what its `AuditOp` makes of the write's reply) reach the ledger
 * once, under the intent's ids, with the intent's scope; the outbox is emptied, and a second sweep
 * settles nothing. Returns the entries.
 */
export async function assertSweptOnce(service: TestService, intent: AuditIntent, drafts: AuditDraft[]): Promise<any[]> {
  const { scope, ids } = intent.record;
  const mine = async () => (await auditEntries(service, scope.workspace.id)).filter((e) => ids.includes(e.id));
  assert.is((await mine()).length, 0, 'no entry before the sweep');
  assert.is(await service.redis.hexists(intent.key, intent.token), 1, 'the intent waits in the outbox');

  assert.equal(await sweepAuditOutboxes(roleContext(service), 0), { settled: 1, kept: 0 });
  const entries = await mine();
  const shape = (d: AuditDraft) => ({ type: d.type, target: d.target, object: d.object, changes: d.changes, previousAttributes: d.changes ? d.previousAttributes ?? {} : undefined });
  assert.equal(entries.map((e) => shape({ ...e, object: e.data.object })), drafts.map(shape));
  entries.forEach((e, i) => {
    assert.is(e.id, ids[i]);
    assert.equal([e.workspace, e.tenant, e.actor, e.request], [scope.workspace, scope.tenant, scope.actor, scope.request]);
    assert.is(e.createdAt, new Date(intent.record.at).toISOString());
  });
  assert.is(await service.redis.hexists(intent.key, intent.token), 0, 'the outbox is emptied');

  assert.equal(await sweepAuditOutboxes(roleContext(service), 0), { settled: 0, kept: 0 });
  assert.is((await mine()).length, drafts.length, 'a second sweep appends nothing');
  return entries;
}

/** A `web` role process on the test service's Redis, once it answers, with a client for it, its URL and the settings it shares. */
export async function startWebProcess(service: TestService, extra: Record<string, string> = {}): Promise<{ web: RoleProcess; api: ReturnType<typeof client>; url: string; env: Record<string, string> }> {
  const env = roleEnv(service);
  // the port is the one the process says it listens on (PORT 0): a port picked free here could be taken
  // by another shard's process before this one binds it, and that one's health answered for it (a CI
  // run: the retried deletes met another service, 401 invalid_api_key)
  const web = startRoleProcess('web', { ...env, LOG_LEVEL: 'info', ...extra, PORT: '0' });
  let port = 0;
  await waitFor('the web process to listen', async () => {
    const said = /"msg":"web listening"[^\n]*"port":(\d+)/.exec(web.output());
    if (said) port = Number(said[1]);
    return port > 0;
  }, 45_000);
  const url = `http://127.0.0.1:${port}`;
  const api = client(url);
  await waitFor('the web process to answer', async () => (await api.get('/v1/health').catch(() => null))?.status === 200, 45_000);
  return { web, api, url, env };
}

/**
 * Runs `clients` loops of `step(client, n)` against `victim`, SIGKILLs the process once `enough()`
 * holds, and waits for every loop to end (at its first failure: the process is gone). A step that
 * failed before the kill fails the test.
 */
export async function killUnderLoad(victim: RoleProcess, clients: number, step: (client: number, n: number) => Promise<unknown>, enough: () => Promise<boolean>): Promise<void> {
  let failure: unknown = null;
  const loop = async (c: number) => {
    for (let n = 0; ; n++) {
      try {
        await step(c, n);
      } catch (err) {
        if (!victim.child.killed) failure ??= err;
        return;
      }
    }
  };
  const loops = Array.from({ length: clients }, (_, c) => loop(c));
  await killWhen(victim, enough, () => failure !== null);
  await Promise.all(loops);
  if (failure) throw failure;
}

/** SIGKILLs `victim` once `enough()` holds (or `failed()`: the writes went wrong), and waits for it to exit. */
export async function killWhen(victim: RoleProcess, enough: () => Promise<boolean>, failed: () => boolean = () => false): Promise<void> {
  await waitFor('enough writes before the kill', async () => failed() || victim.child.exitCode !== null || (await enough()), 30_000, 5);
  if (victim.child.exitCode !== null) throw new Error(`the process exited before the kill (${victim.child.exitCode}): ${victim.output()}`);
  victim.child.kill('SIGKILL');
  await victim.exited;
}

/** A `worker` role process on the test service's Redis, sweeping the outboxes every 200 ms. */
export function startSweeper(service: TestService): RoleProcess {
  return startRoleProcess('worker', { ...roleEnv(service), AUDIT_OUTBOX_SWEEP_MS: '200' });
}

/** Waits until every outbox in `outboxes` is empty (a sweeper settled what killed writers left). */
export async function outboxesEmptied(service: TestService, outboxes: string[]): Promise<void> {
  const pending = async () => (await Promise.all(outboxes.map((key) => service.redis.hlen(key)))).reduce((a, b) => a + b, 0);
  await waitFor('the sweeper to empty the outboxes', async () => (await pending()) === 0, 45_000, 100);
}

/**
 * Once the web processes are dead: starts a `worker` role process that sweeps every 200 ms and
 * waits until it has emptied `outbox`; answers the worker and how many intents it found there.
 */
export async function sweepWithWorker(env: Record<string, string>, redis: Redis, outbox: string): Promise<{ worker: RoleProcess; left: number }> {
  const left = await redis.hlen(outbox);
  const worker = startRoleProcess('worker', { ...env, AUDIT_OUTBOX_SWEEP_MS: '200' });
  await waitFor('the sweeper to empty the outbox', async () => (await redis.hlen(outbox)) === 0, 45_000, 100);
  return { worker, left };
}

/** What a test of writers that died uses: its service, a client, a tenant key and the refs of that workspace and tenant. */
export type DiedWriterCtx = { service: TestService; api: ReturnType<typeof client>; key: string; workspace: Ref; tenant: Ref };

/** Starts the service of a test of writers that died (`name`: its key prefix and workspace slug). */
export async function startDiedWriterCtx(ctx: DiedWriterCtx, name: string): Promise<void> {
  ctx.service = await startTestService(name);
  ctx.api = client(ctx.service.url);
  const boot = await bootstrapWorkspace(ctx.service, name);
  ctx.key = boot.keys.tenant;
  ctx.workspace = { id: boot.workspace.id, slug: boot.workspace.slug };
  ctx.tenant = { id: boot.tenant.id, slug: boot.tenant.slug };
}

/** An intent of a write in the test's tenant, for its outbox, as the writer makes it. */
export const tenantIntent = (ctx: DiedWriterCtx, op: string, input: unknown): AuditIntent =>
  auditIntent(ctx.service.keys.tenantOutbox(ctx.tenant.id), op, { workspace: ctx.workspace, tenant: ctx.tenant, ...BY_TEST }, input);

/** The context of a kill suite: its service, and the web and worker processes a test starts and kills. */
export type KillCtx = { service: TestService; web?: RoleProcess; worker?: RoleProcess };

/** A suite whose tests kill role processes: a service started before, and after it every process stopped. */
export function killSuite(title: string, serviceName: string, env: Record<string, string> = {}) {
  const kill = suite<KillCtx>(title);
  kill.before(async (ctx) => {
    ctx.service = await startTestService(serviceName, env);
  });
  kill.after(async (ctx) => {
    if (ctx.web) await stopRoleProcess(ctx.web);
    if (ctx.worker) await stopRoleProcess(ctx.worker);
    await ctx.service.stop();
  });
  return kill;
}
