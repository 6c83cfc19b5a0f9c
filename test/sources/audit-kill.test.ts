import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { isoNow, now } from '../../lib/clock.js';
import { newId } from '../../lib/ids.js';
import { MAX_RETIRED_SECRETS, OLD_SECRET_VALIDITY_MS } from '../../lib/webhook-signing.js';
import { callScript } from '../../streams/lua-scripts.js';
import { SOURCE_AUDITS, type Source } from '../../streams/sources.js';
import { assertSweptOnce, startDiedWriterCtx, tenantIntent, type DiedWriterCtx } from '../helpers/audit.js';
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
    counts: { accepted: 0, duplicate: 0, ignored: 0, rejected: 0 }, lastReceivedAt: null, lastError: null, secretUpdatedAt: null, createdAt: at, updatedAt: at };
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
