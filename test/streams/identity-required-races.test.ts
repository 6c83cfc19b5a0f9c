import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { createTenant, setIdentityRequired, tenantIdentity, type Workspace } from '../../streams/identity.js';
import { auditEntries } from '../helpers/audit.js';
import { BY_TEST, bootstrapWorkspace, startTestService, type TestService } from '../helpers/service.js';

// Concurrent toggles of a tenant's required identity verification (as concurrent `herald tenant
// identity` commands make them): each tenant.updated names, in previousAttributes, the value its write
// replaced, read atomically with it, and a toggle to the value already set writes nothing. So in the
// order of the writes the entries alternate (each previousAttributes is the value of the entry
// before it), starting from the value before the round and ending at the stored one. The ledger's
// order is the order of the settles, so what is checked is what alternation means: as many entries
// turning it on as off, give or take the one that leaves it changed.

type Ctx = { service: TestService; workspace: Workspace };
const races = suite<Ctx>('concurrent identity-required toggles and their audit entries');

races.before(async (ctx) => {
  ctx.service = await startTestService('identity-required-races');
  ctx.workspace = (await bootstrapWorkspace(ctx.service, 'identity-races')).workspace;
});
races.after(async ({ service }) => service.stop());

const ROUNDS = 10;
const PARALLEL = 20;

races(`${ROUNDS} rounds of ${PARALLEL} concurrent toggles (alternately on and off): the entries alternate from the value before to the value after`, async ({ service, workspace }) => {
  const { redis, keys } = service;
  const { tenant } = await createTenant(redis, keys, workspace, 'toggled', BY_TEST);
  let counted = 0;
  for (let round = 0; round < ROUNDS; round++) {
    const before = (await tenantIdentity(redis, keys, tenant)).required;
    // odd rounds start with the other value, so both directions race first
    await Promise.all(Array.from({ length: PARALLEL }, (_, i) => setIdentityRequired(redis, keys, workspace, tenant, (i + round) % 2 === 0, BY_TEST)));
    const after = (await tenantIdentity(redis, keys, tenant)).required;
    const entries = (await auditEntries(service, workspace.id)).filter((e) => e.type === 'tenant.updated' && e.target.id === tenant.id).slice(counted);
    counted += entries.length;
    for (const e of entries) {
      assert.equal(e.previousAttributes, { identityVerificationRequired: !e.changes.identityVerificationRequired }, 'a real change');
      assert.is(e.data.object.identityVerificationRequired, e.changes.identityVerificationRequired);
    }
    const on = entries.filter((e) => e.changes.identityVerificationRequired === true).length;
    const off = entries.length - on;
    // alternating from `before`: the first entry turns it to !before, the last leaves `after`
    const expected = before === after ? 0 : after ? 1 : -1;
    assert.is(on - off, expected, `round ${round}: ${on} entries turned it on and ${off} off, from ${before} to ${after}`);
  }
});

races.run();
