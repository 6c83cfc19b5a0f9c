import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { isoNow, now } from '../../lib/clock.js';
import { newId } from '../../lib/ids.js';
import { MAX_RETIRED_SECRETS, OLD_SECRET_VALIDITY_MS } from '../../lib/webhook-signing.js';
import { callScript } from '../../streams/lua-scripts.js';
import { SOURCE_AUDITS, type Source } from '../../streams/sources.js';
import { client } from '../helpers/api.js';
import { assertSweptOnce, auditEntries, killSuite, killUnderLoad, outboxesEmptied, startDiedWriterCtx, startSweeper, startWebProcess, tenantIntent, type DiedWriterCtx } from '../helpers/audit.js';
import { bootstrapWorkspace } from '../helpers/service.js';
import { swSecret } from './signing.js';

// A source write whose writer died right after its script: the outbox sweeper appends the entry the
// writer would have (source.created, source.updated, source.deleted) once, never with a secret.

type Ctx = DiedWriterCtx;
const died = suite<Ctx>('source writes whose writer died after the script');

died.before((ctx) => startDiedWriterCtx(ctx, 'source-audit-died'));
died.after(async ({ service }) => service.stop());

const CLERK = { name: 'Clerk', provider: 'clerk', format: 'standard-webhooks', mapping: { externalId: 'data.id' } };
/** A source as the API answers it, without what depends on the request (`inboundUrl`) or is shown once (`secret`). */
const asStored = ({ inboundUrl: _url, secret: _secret, ...rest }: Record<string, unknown>) => rest;

died('a create: the sweeper appends source.created, the source as the API reads it', async (ctx) => {
  const { service, api, key, tenant, workspace } = ctx;
  const { redis, keys } = service;
  const id = newId('source');
  const at = isoNow();
  const mapping = { externalId: 'data.id', name: null, id: null, timestamp: null, data: null };
  const source: Source = { id, name: 'Died', provider: 'clerk', format: 'standard-webhooks', mapping, namePrefix: 'clerk.', enabled: true,
    counts: { accepted: 0, duplicate: 0, ignored: 0, rejected: 0 }, lastReceivedAt: null, lastError: null, lastIgnored: null, secretUpdatedAt: null, createdAt: at, updatedAt: at };
  await redis.hset(keys.sourceRoutes, id, `${workspace.id}|${tenant.id}`);
  const intent = tenantIntent(ctx, 'source.create', source);
  const fields = { id, name: 'Died', provider: 'clerk', format: 'standard-webhooks', secret: swSecret(), mapping: JSON.stringify(mapping), namePrefix: '"clerk."', enabled: '1', createdAt: at, updatedAt: at };
  const reply = await callScript<[number, string]>(redis, 'createSource', [keys.sourceIndex(tenant.id), keys.source(tenant.id, id), intent.key],
    [id, intent.token, intent.json, 100, Object.keys(fields).length, ...Object.entries(fields).flat()]);
  assert.equal(reply, [1, id]);
  const [expected] = SOURCE_AUDITS['source.create'](source, reply);
  await assertSweptOnce(service, intent, [expected!]);
  assert.equal(expected!.object, asStored((await api.get(`/v1/sources/${id}`, key)).body.data));
});

died('an update of the secret: the sweeper appends source.updated with secretUpdatedAt changed and no secret anywhere', async (ctx) => {
  const { service, api, key, tenant } = ctx;
  const { redis, keys } = service;
  const created = (await api.post('/v1/sources', key, CLERK)).body.data;
  const rotated = swSecret();
  const intent = tenantIntent(ctx, 'source.update', null);
  const at = isoNow();
  const reply = await callScript<[number, string[], string[]]>(redis, 'updateSource', [keys.source(tenant.id, created.id), intent.key],
    [at, intent.token, intent.json, now(), OLD_SECRET_VALIDITY_MS, MAX_RETIRED_SECRETS, 2, 'secret', rotated, 'name', 'Renamed']);
  assert.is(reply[0], 1);
  const [expected] = SOURCE_AUDITS['source.update'](null, reply);
  assert.equal(expected!.changes, { name: 'Renamed', secretUpdatedAt: at });
  assert.equal(expected!.previousAttributes, { name: 'Clerk', secretUpdatedAt: null });
  const [entry] = await assertSweptOnce(service, intent, [expected!]);
  assert.equal(expected!.object, asStored((await api.get(`/v1/sources/${created.id}`, key)).body.data));
  for (const secret of [created.secret, rotated]) assert.not.ok(JSON.stringify(entry).includes(secret.slice('whsec_'.length)), 'no secret in the entry');
});

died('a delete: the sweeper appends source.deleted, the source as it was', async (ctx) => {
  const { service, api, key, tenant } = ctx;
  const { redis, keys } = service;
  const created = (await api.post('/v1/sources', key, CLERK)).body.data;
  const intent = tenantIntent(ctx, 'source.delete', null);
  const reply = await callScript<[number, string[]]>(redis, 'deleteSource', [keys.sourceIndex(tenant.id), keys.source(tenant.id, created.id), intent.key], [created.id, intent.token, intent.json]);
  assert.is(reply[0], 1);
  const [expected] = SOURCE_AUDITS['source.delete'](null, reply);
  assert.equal(expected!.object, asStored(created));
  await assertSweptOnce(service, intent, [expected!]);
  // the writer died before removing the route: the source's URL still answers 404, and the route goes with it
  assert.is(await redis.hexists(keys.sourceRoutes, created.id), 1);
  assert.is((await api.call('POST', `/v1/sources/${created.id}/inbound`, { raw: '{}' })).status, 404);
  assert.is(await redis.hexists(keys.sourceRoutes, created.id), 0, 'the first delivery to a dead route removes it');
});

died.run();

// ---------------------------------------------------------------------------------------------

/** Clients; each kill may orphan one source per client, so the tenant stays under its 100 sources. */
const CLIENTS = 20;
/** Web processes killed one after another, each once this many more writes were answered. */
const ROUNDS = 3;
const WRITES_PER_ROUND = 120;
const kill = killSuite('source audit entries survive web processes killed mid-write', 'source-audit-kill');

kill('clients create, rename and delete sources through web processes SIGKILLed mid-write; after a sweep the ledger tells each source\'s story exactly once', async (ctx) => {
  const { service } = ctx;
  const boot = await bootstrapWorkspace(service, 'source-audit-kill');
  const key = boot.keys.tenant;
  // each client works on one source at a time: create, rename, delete, and again; after a kill a
  // write it sent may or may not have been applied, so a 404 on its source means the delete was
  const mine: (string | null)[] = new Array(CLIENTS).fill(null);
  let answered = 0;
  for (let round = 1; round <= ROUNDS; round++) {
    const { web, api: webApi } = await startWebProcess(service);
    ctx.web = web;
    await killUnderLoad(web, CLIENTS, async (c, n) => {
      const id = mine[c];
      if (id === null) {
        const res = await webApi.post('/v1/sources', key, { ...CLERK, name: `c${c}-r${round}-n${n}` });
        assert.is(res.status, 201, res.text);
        mine[c] = res.body.data.id;
      } else {
        const renaming = n % 3 === 1;
        const res = renaming
          ? await webApi.patch(`/v1/sources/${id}`, key, { name: `c${c}-r${round}-n${n}`, enabled: n % 2 === 0 })
          : await webApi.del(`/v1/sources/${id}`, key);
        assert.ok(res.status === 200 || res.status === 404, res.text);
        if (res.status === 404 || !renaming) mine[c] = null;
      }
      answered++;
    }, async () => answered >= round * WRITES_PER_ROUND);
    ctx.web = undefined;
  }
  ctx.worker = startSweeper(service);
  await outboxesEmptied(service, [service.keys.tenantOutbox(boot.tenant.id)]);

  // a client holds one source at a time, and a kill may orphan one per client
  const listed = (await client(service.url).get('/v1/sources?limit=100', key)).body.data;
  assert.ok(listed.total <= CLIENTS * (ROUNDS + 1) && !listed.hasMore, `${listed.total} sources`);
  const existing = new Map<string, any>(listed.items.map((s: Record<string, unknown>) => [s.id, asStored(s)]));
  const seen = new Set<string>();
  const byTarget = new Map<string, any[]>();
  for (const e of await auditEntries(service, boot.workspace.id)) {
    if (!e.type.startsWith('source.') || seen.has(e.id)) continue; // a settle repeated after a crash repeats its id
    seen.add(e.id);
    byTarget.set(e.target.id, [...(byTarget.get(e.target.id) ?? []), e]);
  }
  assert.ok(byTarget.size >= CLIENTS, `${byTarget.size} sources in the ledger`);
  const bad: string[] = [];
  for (const [id, appended] of byTarget) {
    // an entry a sweep recovers lands after those written meanwhile: the story is in createdAt order (spec 6.2.6), the time of the write
    const entries = [...appended].sort((a, b) => (a.createdAt < b.createdAt ? -1 : a.createdAt > b.createdAt ? 1 : a.id < b.id ? -1 : 1));
    const types = entries.map((e) => e.type);
    if (types.filter((t) => t === 'source.created').length !== 1 || types[0] !== 'source.created') bad.push(`${id}: ${types.join(',')}`);
    const last = entries.at(-1);
    if (existing.has(id)) {
      if (types.includes('source.deleted')) bad.push(`${id} exists but was told deleted`);
      else if (JSON.stringify(asStored(last.data.object)) !== JSON.stringify(existing.get(id))) bad.push(`${id}: the newest entry is not the source as it is`);
    } else if (last.type !== 'source.deleted') bad.push(`${id} is gone but its last entry is ${last.type}`);
  }
  for (const id of existing.keys()) if (!byTarget.has(id)) bad.push(`${id} exists with no entry`);
  assert.equal(bad, []);
  for (const entries of byTarget.values()) for (const e of entries) assert.not.ok('secret' in e.data.object);
});

kill.run();
