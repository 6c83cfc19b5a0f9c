// A process that writes tenants as the operator CLI does (`herald tenant create`, `tenant
// identity-secret --rotate`, `tenant update --identity-verification required`), from LOOPS
// concurrent loops, until it is killed: the writer of the tenant audit kill test. Each loop makes
// tenants `<SLUG_PREFIX>-<loop>-<n>` one after another, and each tenant gets one of each write.
import { loadConfig } from '../../lib/config.js';
import { createTenant, findWorkspaceBySlug, rotateIdentitySecret, setIdentityRequired, type Writer } from '../../streams/identity.js';
import { createKeys } from '../../streams/keys.js';
import { connectRedis } from '../../streams/redis.js';

const config = loadConfig(process.env, {});
const redis = connectRedis({ url: config.redisUrl! });
const keys = createKeys(config.keyPrefix);
const workspace = await findWorkspaceBySlug(redis, keys, process.env.WORKSPACE!);
if (!workspace) throw new Error(`no workspace ${process.env.WORKSPACE}`);
const by: Writer = { actor: { type: 'cli', id: null }, request: null };

const loop = async (l: number) => {
  for (let n = 0; ; n++) {
    const { tenant } = await createTenant(redis, keys, workspace, `${process.env.SLUG_PREFIX}-${l}-${n}`, by);
    await rotateIdentitySecret(redis, keys, workspace, tenant, by);
    await setIdentityRequired(redis, keys, workspace, tenant, true, by);
  }
};
await Promise.all(Array.from({ length: Number(process.env.LOOPS) }, (_, l) => loop(l)));
