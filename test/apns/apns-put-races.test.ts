import { randomBytes } from 'node:crypto';
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { client } from '../helpers/api.js';
import { generateProviderKey } from '../helpers/apns-peer.js';
import { auditEntries } from '../helpers/audit.js';
import { BUNDLE_ID } from '../helpers/push-setup.js';
import { bootstrapWorkspace, startTestService, type TestService } from '../helpers/service.js';

// Concurrent PUT /v1/apps/apns of different credentials: each write's apns.updated names, in
// previousAttributes, the credentials that write replaced, read atomically with it. So the entries,
// taken in the order of the writes, form one chain (each entry's previousAttributes is the entry
// before it, the first's the empty state) ending at the stored credentials. The ledger's own order
// is the order of the settles, not of the writes: the chain is followed by the previous keyId,
// which no two writes share (every PUT carries a Key ID of its own).

type Ctx = { service: TestService; api: ReturnType<typeof client>; key: string; tenantId: string; workspaceId: string };
const races = suite<Ctx>('concurrent APNs credential writes and their audit entries');

races.before(async (ctx) => {
  ctx.service = await startTestService('apns-put-races', { HERALD_ENCRYPTION_KEY: randomBytes(32).toString('hex') });
  ctx.api = client(ctx.service.url);
  const boot = await bootstrapWorkspace(ctx.service, 'apns-races');
  ctx.key = boot.keys.tenant;
  ctx.tenantId = boot.tenant.id;
  ctx.workspaceId = boot.workspace.id;
});
races.after(async ({ service }) => service.stop());

const ROUNDS = 6;
const PARALLEL = 20;
const PUBLIC_FIELDS = ['keyId', 'teamId', 'bundleId', 'keyFingerprint', 'configuredAt'];

races(`${ROUNDS} rounds of ${PARALLEL} concurrent PUTs: the apns.updated entries chain, each naming the credentials it replaced`, async ({ api, key, service, tenantId, workspaceId }) => {
  const provider = generateProviderKey();
  for (let round = 0; round < ROUNDS; round++) {
    const puts = await Promise.all(Array.from({ length: PARALLEL }, (_, i) => api.call('PUT', '/v1/apps/apns', {
      key, body: { keyId: `K${String(round * PARALLEL + i).padStart(9, '0')}`, teamId: provider.teamId, bundleId: BUNDLE_ID, privateKey: provider.privateKeyPem },
    })));
    assert.ok(puts.every((r) => r.status === 200 || r.status === 201), puts.map((r) => r.text).join('\n'));
    assert.is(puts.filter((r) => r.status === 201).length, round === 0 ? 1 : 0, 'one write created the credentials');

    const entries = (await auditEntries(service, workspaceId)).filter((e) => e.type === 'apns.updated' && e.target.id === tenantId);
    assert.is(entries.length, (round + 1) * PARALLEL, 'every PUT changed the credentials: one entry each');
    const byPrevious = new Map<string | null, any[]>();
    for (const e of entries) byPrevious.set(e.previousAttributes.keyId ?? null, [...(byPrevious.get(e.previousAttributes.keyId ?? null) ?? []), e]);
    const shared = [...byPrevious.entries()].filter(([, list]) => list.length > 1).map(([keyId, list]) => `${list.length} entries replaced ${keyId}`);
    assert.equal(shared, [], `round ${round}: two writes cannot both have replaced the same credentials`);

    // follow the chain from the empty state: each entry's previousAttributes are the fields of the one before
    let previous: Record<string, unknown> = Object.fromEntries(PUBLIC_FIELDS.map((f) => [f, null]));
    let followed = 0;
    for (let e = byPrevious.get(null)?.[0]; e; e = byPrevious.get(e.data.object.keyId)?.[0]) {
      for (const [field, value] of Object.entries(e.previousAttributes)) assert.equal(value, previous[field], `round ${round}, entry ${followed}: previous ${field}`);
      for (const [field, value] of Object.entries(e.changes)) assert.equal(value, e.data.object[field], `round ${round}, entry ${followed}: ${field} changed to the stored value`);
      previous = e.data.object;
      followed++;
    }
    assert.is(followed, entries.length, `round ${round}: one chain holds every entry`);
    assert.equal(previous, (await api.get('/v1/apps/apns', key)).body.data, 'the chain ends at the stored credentials');
  }
});

races.run();
