import { randomBytes } from 'node:crypto';
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { isoNow } from '../../lib/clock.js';
import { APNS_AUDITS, validateApnsCredentials, type ApnsCredentialsView } from '../../streams/apns-credentials.js';
import { auditIntent, recordIntent } from '../../streams/audit-outbox.js';
import { diff } from '../../streams/ledger.js';
import { callScript } from '../../streams/lua-scripts.js';
import { client } from '../helpers/api.js';
import { generateProviderKey, type ProviderKey } from '../helpers/apns-peer.js';
import { assertSweptOnce, auditEntries, killUnderLoad, outboxesEmptied, startSweeper, startWebProcess, killSuite } from '../helpers/audit.js';
import { apnsCredentials } from '../helpers/push-setup.js';
import { BY_TEST, bootstrapWorkspace, makeKey, startTestService, type TestService } from '../helpers/service.js';

const PATH = '/v1/apps/apns';

type Boot = Awaited<ReturnType<typeof bootstrapWorkspace>>;
type Ctx = { service: TestService; boot: Boot; api: ReturnType<typeof client> };
const died = suite<Ctx>('apns credential audit intents whose writer died');

died.before(async (ctx) => {
  ctx.service = await startTestService('apns-audit', { HERALD_ENCRYPTION_KEY: randomBytes(32).toString('hex') });
  ctx.boot = await bootstrapWorkspace(ctx.service, 'apns-audit');
  ctx.api = client(ctx.service.url);
});
died.after(async ({ service }) => service.stop());

const intentOf = (ctx: Ctx, op: string, input: unknown) =>
  auditIntent(ctx.service.keys.tenantOutbox(ctx.boot.tenant.id), op, { workspace: ctx.boot.workspace, tenant: ctx.boot.tenant, ...BY_TEST }, input);

died('apns.updated of a writer that died reaches the ledger once, with the stored view and what its write replaced', async (ctx) => {
  const { redis, keys } = ctx.service;
  const first = await ctx.api.call('PUT', PATH, { key: ctx.boot.keys.tenant, body: apnsCredentials(generateProviderKey()) });
  assert.is(first.status, 201);
  // lua/setApnsCredentials as setApnsCredentials calls it, the writer gone before settling
  const valid = validateApnsCredentials(apnsCredentials(generateProviderKey()));
  const view: ApnsCredentialsView = { keyId: valid.keyId, teamId: valid.teamId, bundleId: valid.bundleId, keyFingerprint: valid.keyFingerprint, configuredAt: isoNow() };
  const input = { tenantId: ctx.boot.tenant.id, view };
  const intent = intentOf(ctx, 'apns.set', input);
  const fields = ['keyId', 'teamId', 'bundleId', 'keyFingerprint', 'configuredAt'];
  const record = { ...view, privateKey: 'v1:sealed', version: 'v' };
  const reply = await callScript<[number, (string | null)[]]>(redis, 'setApnsCredentials', [keys.apnsCredentials(ctx.boot.tenant.id), intent.key], [intent.token, intent.json, '', fields.length, ...fields, ...Object.entries(record).flat()]);
  assert.equal(reply, [1, fields.map((f) => first.body.data[f])]);

  const [entry] = await assertSweptOnce(ctx.service, intent, APNS_AUDITS['apns.set'](input, reply));
  assert.is(entry.type, 'apns.updated');
  assert.equal(entry.target, { type: 'apns_credentials', id: ctx.boot.tenant.id });
  assert.equal(entry.data.object, (await ctx.api.get(PATH, ctx.boot.keys.tenant)).body.data);
  assert.equal(Object.keys(entry.changes).sort(), ['configuredAt', 'keyFingerprint', 'keyId', 'teamId']);
  assert.equal(entry.previousAttributes.keyId, first.body.data.keyId);
});

died('apns.updated of an intent an earlier version\'s MULTI left (apns.update, its entry decided before the write) still reaches the ledger once', async (ctx) => {
  const { redis, keys } = ctx.service;
  const first = (await ctx.api.get(PATH, ctx.boot.keys.tenant));
  assert.is(first.status, 200);
  const valid = validateApnsCredentials(apnsCredentials(generateProviderKey()));
  const view: ApnsCredentialsView = { keyId: valid.keyId, teamId: valid.teamId, bundleId: valid.bundleId, keyFingerprint: valid.keyFingerprint, configuredAt: isoNow() };
  const input = { tenantId: ctx.boot.tenant.id, view, ...diff(first.body.data, view)! };
  const intent = intentOf(ctx, 'apns.update', input);
  const key = keys.apnsCredentials(ctx.boot.tenant.id);
  await recordIntent(redis.multi().del(key).hset(key, view), intent).exec();

  const [entry] = await assertSweptOnce(ctx.service, intent, APNS_AUDITS['apns.update'](input));
  assert.is(entry.type, 'apns.updated');
  assert.equal(entry.target, { type: 'apns_credentials', id: ctx.boot.tenant.id });
  assert.equal(entry.data.object, (await ctx.api.get(PATH, ctx.boot.keys.tenant)).body.data);
  assert.equal(Object.keys(entry.changes).sort(), ['configuredAt', 'keyFingerprint', 'keyId', 'teamId']);
  assert.is(entry.previousAttributes.keyId, first.body.data.keyId);
});

died('apns.deleted of a writer that died reaches the ledger once, with the credentials as they were; a second delete records nothing', async (ctx) => {
  const { redis, keys } = ctx.service;
  const stored = (await ctx.api.get(PATH, ctx.boot.keys.tenant)).body.data;
  const fields = ['keyId', 'teamId', 'bundleId', 'keyFingerprint', 'configuredAt'];
  const deleteAndDie = async () => {
    const intent = intentOf(ctx, 'apns.delete', ctx.boot.tenant.id);
    const reply = await callScript<[number, string[]?]>(redis, 'deleteApnsCredentials', [keys.apnsCredentials(ctx.boot.tenant.id), intent.key], [intent.token, intent.json, ...fields]);
    return { intent, reply };
  };
  const { intent, reply } = await deleteAndDie();
  assert.equal(reply, [1, fields.map((f) => stored[f])]);
  assert.is(await redis.exists(keys.apnsCredentials(ctx.boot.tenant.id)), 0);
  const [entry] = await assertSweptOnce(ctx.service, intent, APNS_AUDITS['apns.delete'](ctx.boot.tenant.id, reply));
  assert.is(entry.type, 'apns.deleted');
  assert.equal(entry.data.object, stored);

  const again = await deleteAndDie();
  assert.equal(again.reply, [0]);
  assert.is(await redis.hlen(again.intent.key), 0, 'a delete that removed nothing writes no intent');
  assert.is((await ctx.api.del(PATH, ctx.boot.keys.tenant)).status, 404);
});

died.run();

const ROUNDS = 3;
const TENANTS = 32;

const kill = killSuite('apns credential audit entries survive a web process killed mid-write', 'apns-audit-kill', { HERALD_ENCRYPTION_KEY: randomBytes(32).toString('hex') });

kill('after SIGKILLs under puts and deletes, each tenant\'s apns entries alternate updated/deleted and the newest describes its credentials', async (ctx) => {
  const { service } = ctx;
  const { workspace } = await bootstrapWorkspace(service, 'kill');
  const tenants = await Promise.all(Array.from({ length: TENANTS }, async (_, i) => {
    const { key, record } = await makeKey(service, 'kill', 'tenant', ['*'], { tenant: `t-${i}` });
    return { key, id: record.tenantId! };
  }));
  const providers: ProviderKey[] = [generateProviderKey(), generateProviderKey()];
  ctx.worker = startSweeper(service);

  // each tenant has one client, one write at a time: a PUT when it has no credentials, a DELETE when it has
  let writes = 0;
  const step = (api: ReturnType<typeof client>) => async (c: number, n: number) => {
    const { key } = tenants[c]!;
    const stored = await api.get(PATH, key);
    const res = stored.status === 404 ? await api.call('PUT', PATH, { key, body: apnsCredentials(providers[n % 2]!) }) : await api.del(PATH, key);
    assert.ok(res.status === 200 || res.status === 201, res.text);
    writes++;
  };
  for (let round = 1; round <= ROUNDS; round++) {
    const { web, api } = await startWebProcess(service, { HERALD_ENCRYPTION_KEY: service.env.HERALD_ENCRYPTION_KEY! });
    ctx.web = web;
    await killUnderLoad(web, TENANTS, step(api), async () => writes >= round * 200);
    await outboxesEmptied(service, tenants.map((t) => service.keys.tenantOutbox(t.id)));
  }

  // a settle repeated (by the writer and the sweeper) repeats its event id: count each id once
  const seen = new Set<string>();
  const entries = (await auditEntries(service, workspace.id)).filter((e) => e.type.startsWith('apns.') && !seen.has(e.id) && seen.add(e.id));
  const problems: string[] = [];
  for (const tenant of tenants) {
    const mine = entries.filter((e) => e.target.id === tenant.id);
    const types = mine.map((e) => e.type);
    if (types.some((type, i) => type !== (i % 2 ? 'apns.deleted' : 'apns.updated'))) problems.push(`${tenant.id}: entries do not alternate (${types.length} entries)`);
    const stored = await service.redis.hgetall(service.keys.apnsCredentials(tenant.id));
    const newest = mine.at(-1);
    if (stored.keyId ? newest?.type !== 'apns.updated' || newest.data.object.configuredAt !== stored.configuredAt : newest && newest.type !== 'apns.deleted') {
      problems.push(`${tenant.id}: the newest entry (${newest?.type ?? 'none'}) does not describe the credentials (${stored.keyId ? 'stored' : 'none'})`);
    }
  }
  assert.equal(problems, [], `${new Set(problems.map((p) => p.split(':')[0])).size} of ${TENANTS} tenants wrong; ${entries.length} entries, ${writes} writes answered`);
});

kill.run();
