import type { Redis } from 'ioredis';
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { isId } from '../../lib/ids.js';
import { createApiKey, createTenant, ensureWorkspace, publicKey, revokeApiKey, type Writer } from '../../streams/identity.js';
import { createKeys, type Keys } from '../../streams/keys.js';
import { appendAudit, auditPayload, diff, LEDGER_FIELDS } from '../../streams/ledger.js';
import { connectRedis } from '../../streams/redis.js';
import { testRedisUrl, uniquePrefix } from '../helpers/redis.js';

type Entry = { streamId: string; kind: string; payload: any };
type Ctx = { redis: Redis; keys: Keys };

/** Every entry of a workspace ledger, oldest first, read with XRANGE <ledger> - +. */
async function ledger({ redis, keys }: Ctx, workspaceId: string): Promise<Entry[]> {
  const rows = await redis.xrange(keys.ledger(workspaceId), '-', '+');
  return rows.map(([streamId, fields]) => {
    assert.equal([fields[0], fields[2]], [LEDGER_FIELDS.kind, LEDGER_FIELDS.payload], 'an entry has the fields kind and payload, in that order');
    assert.is(fields.length, 4, 'and no others');
    return { streamId, kind: fields[1]!, payload: JSON.parse(fields[3]!) };
  });
}

const ISO = /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$/;

/** The fields every audit payload carries, in the order the webhook body shows them. */
function assertAuditEnvelope(payload: any): void {
  assert.ok(isId('webhookEvent', payload.id), `a whe_ id: ${payload.id}`);
  assert.is(payload.apiVersion, 'v1');
  assert.match(payload.createdAt, ISO);
  assert.equal(Object.keys(payload).slice(0, 10), ['id', 'type', 'apiVersion', 'createdAt', 'workspace', 'tenant', 'actor', 'target', 'request', 'data']);
  assert.equal(Object.keys(payload.data), ['object']);
}

const BY_CLI: Writer = { actor: { type: 'cli', id: null }, request: null };
const BY_API: Writer = {
  actor: { type: 'api_key', id: 'key_01m83rykb89q821hw8q0v20ewj' },
  request: { id: 'req_01m83rykb89q821hw8q0v20ewj', ip: '203.0.113.7', userAgent: 'ledger-test/1.0' },
};

const audit = suite<Ctx>('audit ledger');

audit.before(async (ctx) => {
  ctx.redis = connectRedis({ url: await testRedisUrl() });
  ctx.keys = createKeys(uniquePrefix('ledger'));
});
audit.after(async (ctx) => {
  await ctx.redis.quit();
});

audit('ensureWorkspace appends workspace.created and tenant.created once; a second ensureWorkspace appends nothing', async (ctx) => {
  const { workspace, tenant, created } = await ensureWorkspace(ctx.redis, ctx.keys, 'acme', BY_CLI);
  assert.is(created, true);
  const entries = await ledger(ctx, workspace.id);
  assert.is(entries.length, 2);
  for (const e of entries) {
    assert.is(e.kind, 'audit');
    assertAuditEnvelope(e.payload);
    assert.equal(e.payload.actor, { type: 'cli', id: null });
    assert.is(e.payload.request, null);
    assert.equal(e.payload.workspace, { id: workspace.id, slug: 'acme' });
    assert.not.ok('changes' in e.payload, 'a creation carries no changes');
    assert.not.ok('previousAttributes' in e.payload);
  }
  const byType = new Map(entries.map((e) => [e.payload.type, e.payload]));
  assert.equal(entries.map((e) => e.payload.type), ['workspace.created', 'tenant.created'], 'the workspace is announced before its tenant');

  const ws = byType.get('workspace.created');
  assert.is(ws.tenant, null);
  assert.equal(ws.target, { type: 'workspace', id: workspace.id });
  assert.equal(ws.data.object, { id: workspace.id, slug: 'acme', createdAt: workspace.createdAt });

  const tn = byType.get('tenant.created');
  assert.equal(tn.tenant, { id: tenant.id, slug: 'default' });
  assert.equal(tn.target, { type: 'tenant', id: tenant.id });
  assert.equal(tn.data.object, { id: tenant.id, slug: 'default', workspaceId: workspace.id, createdAt: tenant.createdAt, identityVerificationRequired: false });
  assert.is.not(ws.id, tn.id, 'each event has its own id');

  const again = await ensureWorkspace(ctx.redis, ctx.keys, 'acme', BY_CLI);
  assert.is(again.created, false);
  assert.is(again.workspace.id, workspace.id);
  assert.is(again.tenant.id, tenant.id);
  assert.equal(await ledger(ctx, workspace.id), entries);
});

audit('createTenant appends tenant.created only when the slug is new', async (ctx) => {
  const { workspace } = await ensureWorkspace(ctx.redis, ctx.keys, 'tenants', BY_CLI);
  const before = (await ledger(ctx, workspace.id)).length;
  const { tenant, created } = await createTenant(ctx.redis, ctx.keys, workspace, 'emea', BY_API);
  assert.is(created, true);
  const entries = await ledger(ctx, workspace.id);
  assert.is(entries.length, before + 1);
  const last = entries.at(-1)!.payload;
  assert.is(last.type, 'tenant.created');
  assert.equal(last.actor, BY_API.actor);
  assert.equal(last.request, BY_API.request);
  assert.equal(last.tenant, { id: tenant.id, slug: 'emea' });

  const repeat = await createTenant(ctx.redis, ctx.keys, workspace, 'emea', BY_API);
  assert.is(repeat.created, false);
  assert.is(repeat.tenant.id, tenant.id);
  assert.is((await ledger(ctx, workspace.id)).length, before + 1);
});

audit('createApiKey appends key.created with actor, target, request and the key record without its hash', async (ctx) => {
  const { workspace, tenant } = await ensureWorkspace(ctx.redis, ctx.keys, 'keys', BY_CLI);
  const before = (await ledger(ctx, workspace.id)).length;
  const { key, record } = await createApiKey(ctx.redis, ctx.keys, { workspace, tenant, kind: 'tenant', scopes: ['events:read', 'events:write'], expiresAt: '2999-01-01T00:00:00.000Z', name: 'backend' }, BY_API);
  const entries = await ledger(ctx, workspace.id);
  assert.is(entries.length, before + 1);
  const { kind, payload } = entries.at(-1)!;
  assert.is(kind, 'audit');
  assertAuditEnvelope(payload);
  assert.is(payload.type, 'key.created');
  assert.equal(payload.workspace, { id: workspace.id, slug: 'keys' });
  assert.equal(payload.tenant, { id: tenant.id, slug: 'default' });
  assert.equal(payload.actor, BY_API.actor);
  assert.equal(payload.target, { type: 'api_key', id: record.id });
  assert.equal(payload.request, BY_API.request);
  assert.equal(payload.data.object, publicKey(record));
  assert.equal(payload.data.object, {
    id: record.id, kind: 'tenant', workspaceId: workspace.id, tenantId: tenant.id, scopes: ['events:read', 'events:write'], name: 'backend',
    hint: `svc_tn_…${key.slice(-4)}`, createdAt: record.createdAt, expiresAt: '2999-01-01T00:00:00.000Z', revokedAt: null,
  });
  assert.not.ok('hash' in payload.data.object, 'no hash in the object');
  const raw = (await ctx.redis.xrange(ctx.keys.ledger(workspace.id), '-', '+')).at(-1)![1][3]!;
  assert.not.ok(raw.includes(record.hash), 'the hash appears nowhere in the stored payload');
  assert.not.ok(raw.includes(key), 'nor does the key');
  assert.not.ok('changes' in payload);

  const wsKey = await createApiKey(ctx.redis, ctx.keys, { workspace, tenant: null, kind: 'workspace', scopes: ['*'], expiresAt: null, name: null }, BY_CLI);
  const wsEntry = (await ledger(ctx, workspace.id)).at(-1)!.payload;
  assert.is(wsEntry.type, 'key.created');
  assert.is(wsEntry.tenant, null, 'a workspace key belongs to no tenant');
  assert.equal(wsEntry.target, { type: 'api_key', id: wsKey.record.id });
  assert.is(wsEntry.data.object.tenantId, null);
  assert.is.not(wsEntry.id, payload.id);
});

audit('revokeApiKey appends key.revoked with changes.revokedAt and previousAttributes.revokedAt null, once', async (ctx) => {
  const { workspace, tenant } = await ensureWorkspace(ctx.redis, ctx.keys, 'revoke', BY_CLI);
  const { record } = await createApiKey(ctx.redis, ctx.keys, { workspace, tenant, kind: 'client', scopes: ['client'], expiresAt: null, name: null }, BY_CLI);
  const before = (await ledger(ctx, workspace.id)).length;

  const revoked = await revokeApiKey(ctx.redis, ctx.keys, workspace, record.id, BY_API);
  assert.ok(revoked);
  assert.match(revoked.revokedAt!, ISO);
  const entries = await ledger(ctx, workspace.id);
  assert.is(entries.length, before + 1);
  const { payload } = entries.at(-1)!;
  assertAuditEnvelope(payload);
  assert.is(payload.type, 'key.revoked');
  assert.equal(Object.keys(payload).slice(10), ['changes', 'previousAttributes']);
  assert.equal(payload.changes, { revokedAt: revoked.revokedAt });
  assert.equal(payload.previousAttributes, { revokedAt: null });
  assert.equal(payload.target, { type: 'api_key', id: record.id });
  assert.equal(payload.actor, BY_API.actor);
  assert.equal(payload.request, BY_API.request);
  assert.equal(payload.workspace, { id: workspace.id, slug: 'revoke' });
  assert.equal(payload.tenant, { id: tenant.id, slug: 'default' }, 'a tenant-bound key names its tenant, as on creation');
  assert.equal(payload.data.object, publicKey(revoked));
  assert.is(payload.data.object.revokedAt, revoked.revokedAt);
  assert.not.ok('hash' in payload.data.object);

  const again = await revokeApiKey(ctx.redis, ctx.keys, workspace, record.id, BY_API);
  assert.is(again?.revokedAt, revoked.revokedAt, 'a revoked key stays revoked at its first time');
  assert.is((await ledger(ctx, workspace.id)).length, before + 1, 'revoking again appends nothing');
});

audit('revoking a key of another workspace returns null and appends nothing to either ledger', async (ctx) => {
  const mine = await ensureWorkspace(ctx.redis, ctx.keys, 'mine', BY_CLI);
  const theirs = await ensureWorkspace(ctx.redis, ctx.keys, 'theirs', BY_CLI);
  const { record } = await createApiKey(ctx.redis, ctx.keys, { workspace: theirs.workspace, tenant: theirs.tenant, kind: 'tenant', scopes: ['*'], expiresAt: null, name: null }, BY_CLI);
  const [mineBefore, theirsBefore] = [await ledger(ctx, mine.workspace.id), await ledger(ctx, theirs.workspace.id)];
  assert.is(await revokeApiKey(ctx.redis, ctx.keys, mine.workspace, record.id, BY_API), null);
  assert.is(await revokeApiKey(ctx.redis, ctx.keys, mine.workspace, 'key_nonsense', BY_API), null);
  assert.equal(await ledger(ctx, mine.workspace.id), mineBefore);
  assert.equal(await ledger(ctx, theirs.workspace.id), theirsBefore);
});

audit('appendAudit stores the payload auditPayload builds and returns its whe_ id', async (ctx) => {
  const { workspace, tenant } = await ensureWorkspace(ctx.redis, ctx.keys, 'append', BY_CLI);
  const id = await appendAudit(ctx.redis, ctx.keys, {
    type: 'subscriber.updated', workspace: { id: workspace.id, slug: workspace.slug }, tenant: { id: tenant.id, slug: tenant.slug },
    actor: BY_API.actor, target: { type: 'subscriber', id: 'sub_x' }, request: BY_API.request,
    object: { id: 'sub_x', locale: 'fr' }, changes: { locale: 'fr' },
  });
  assert.ok(isId('webhookEvent', id));
  const last = (await ledger(ctx, workspace.id)).at(-1)!.payload;
  assert.is(last.id, id);
  assert.equal(last.changes, { locale: 'fr' });
  assert.equal(last.previousAttributes, {}, 'changes without previous attributes store an empty object');
  assert.equal(last.data, { object: { id: 'sub_x', locale: 'fr' } });

  const built = auditPayload({ type: 't.x', workspace: last.workspace, tenant: null, actor: BY_CLI.actor, target: { type: 't', id: 'x' }, request: null, object: {} }, 'whe_fixed');
  assert.is(built.id, 'whe_fixed');
  assert.not.ok('changes' in built);
});

audit('diff() returns only the fields that changed, with their previous values', () => {
  assert.equal(
    diff({ name: 'a', locale: 'en', tags: ['x', 'y'], meta: { n: 1 }, same: 1 }, { name: 'b', locale: 'en', tags: ['x', 'y'], meta: { n: 2 }, same: 1 }),
    { changes: { name: 'b', meta: { n: 2 } }, previousAttributes: { name: 'a', meta: { n: 1 } } },
  );
  assert.is(diff({ a: 1, list: [1, 2] }, { a: 1, list: [1, 2] }), null, 'nothing changed: null');
  assert.is(diff({}, {}), null);
  assert.equal(diff({ a: 1, gone: 'x' }, { a: 1 }), { changes: { gone: null }, previousAttributes: { gone: 'x' } }, 'a removed field changes to null');
  assert.equal(diff({ a: 1 }, { a: 1, added: true }), { changes: { added: true }, previousAttributes: { added: null } }, 'an added field was null');
  assert.equal(diff({ a: null }, { a: 0 }), { changes: { a: 0 }, previousAttributes: { a: null } }, 'null and 0 differ');
  assert.equal(diff({ list: [1, 2] }, { list: [2, 1] }), { changes: { list: [2, 1] }, previousAttributes: { list: [1, 2] } }, 'order in a list matters');
});

audit('an ensureWorkspace interrupted after claiming the slug is completed by the next run', async (ctx) => {
  await ctx.redis.hset(ctx.keys.workspaceSlugs, 'halfway', 'ws_01m83s5b6a482qh098w7hypj49');
  await ctx.redis.hset(ctx.keys.workspace('ws_01m83s5b6a482qh098w7hypj49'), 'id', 'ws_01m83s5b6a482qh098w7hypj49');
  const resumed = await ensureWorkspace(ctx.redis, ctx.keys, 'halfway', BY_CLI);
  assert.is(resumed.workspace.slug, 'halfway');
  assert.ok(resumed.workspace.createdAt);
  const types = (await ledger(ctx, resumed.workspace.id)).map((e) => e.payload.type);
  assert.equal(types, ['workspace.created', 'tenant.created']);
  await ensureWorkspace(ctx.redis, ctx.keys, 'halfway', BY_CLI);
  assert.is((await ledger(ctx, resumed.workspace.id)).length, 2, 'nothing more once complete');
});

audit.run();
