import { spawn } from 'node:child_process';
import { generateKeyPairSync, randomBytes } from 'node:crypto';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { Redis } from 'ioredis';
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { createSecretBox } from '../../lib/secret-box.js';
import { getApnsCredentials } from '../../streams/apns-credentials.js';
import { createTenant, ensureWorkspace, type Tenant } from '../../streams/identity.js';
import { createKeys, type Keys } from '../../streams/keys.js';
import { LEDGER_FIELDS } from '../../streams/ledger.js';
import { connectRedis } from '../../streams/redis.js';
import { generateProviderKey, type ProviderKey } from '../helpers/apns-peer.js';
import { testRedisUrl, uniquePrefix } from '../helpers/redis.js';
import { BY_TEST } from '../helpers/service.js';

const ROOT = join(import.meta.dirname, '..', '..');
const CLI = join(ROOT, 'dist', 'bin', 'cli.js');
/** `node -e` puts the arguments after `--` at process.argv[1…]. */
const INLINE = `import { main } from ${JSON.stringify(CLI)}; process.exitCode = await main(process.argv.slice(1));`;
const BUNDLE = 'com.example.herald';

type Run = { code: number | null; stdout: string; stderr: string };
type Ctx = {
  env: Record<string, string>; redis: Redis; keys: Keys; dir: string; encryptionKey: string;
  provider: ProviderKey; keyFile: string; defaultTenant: Tenant; emea: Tenant;
};

/** `herald <args>` through the built CLI's `main` (dist/, which test/run.ts builds first) in a child process. */
function herald(env: Record<string, string>, ...args: string[]): Promise<Run> {
  return new Promise((done, fail) => {
    const child = spawn(process.execPath, ['--input-type=module', '-e', INLINE, '--', ...args], { cwd: ROOT, env: { ...process.env, ...env }, stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (chunk: Buffer) => (stdout += chunk.toString()));
    child.stderr.on('data', (chunk: Buffer) => (stderr += chunk.toString()));
    const timer = setTimeout(() => {
      child.kill('SIGKILL');
      fail(new Error(`herald ${args.join(' ')} did not finish within 30 s\nstdout: ${stdout}\nstderr: ${stderr}`));
    }, 30_000);
    child.on('error', (err) => {
      clearTimeout(timer);
      fail(err);
    });
    child.on('close', (code) => {
      clearTimeout(timer);
      done({ code, stdout, stderr });
    });
  });
}

function oneJsonLine(run: Run): any {
  assert.is(run.code, 0, `exit code (stderr: ${run.stderr})`);
  assert.is(run.stderr, '');
  assert.is(run.stdout.indexOf('\n'), run.stdout.length - 1, `stdout is one line: ${run.stdout}`);
  return JSON.parse(run.stdout);
}

/** What follows the reason of a usage mistake (exit code 2), on the same and only line. */
const HELP_HINT = ' (run herald --help for usage)';

/** A failure: the exit code, one line of reason on stderr (a usage mistake points at --help), nothing on stdout. */
function failed(run: Run, code: number, reason: RegExp): void {
  assert.is(run.code, code, `exit code (stderr: ${run.stderr})`);
  assert.is(run.stdout, '');
  assert.ok(run.stderr.endsWith('\n') && run.stderr.indexOf('\n') === run.stderr.length - 1, `stderr is one line: ${run.stderr}`);
  let line = run.stderr.slice(0, -1);
  if (code === 2) {
    assert.ok(line.endsWith(HELP_HINT), `a usage mistake points at --help: ${line}`);
    line = line.slice(0, -HELP_HINT.length);
  }
  assert.match(line, reason);
}

const pemBody = (pem: string) => pem.split('\n').filter((l) => l && !l.startsWith('-----')).join('');

const cli = suite<Ctx>('herald apns');

cli.before(async (ctx) => {
  const prefix = uniquePrefix('apns-cli');
  ctx.encryptionKey = randomBytes(32).toString('hex');
  ctx.env = { REDIS_URL: await testRedisUrl(), REDIS_KEY_PREFIX: prefix, LOG_LEVEL: 'error', HERALD_ENCRYPTION_KEY: ctx.encryptionKey };
  ctx.redis = connectRedis({ url: ctx.env.REDIS_URL! });
  ctx.keys = createKeys(prefix);
  const { workspace, tenant } = await ensureWorkspace(ctx.redis, ctx.keys, 'acme', BY_TEST);
  ctx.defaultTenant = tenant;
  ctx.emea = (await createTenant(ctx.redis, ctx.keys, workspace, 'emea', BY_TEST)).tenant;
  ctx.dir = mkdtempSync(join(tmpdir(), 'herald-apns-cli-'));
  ctx.provider = generateProviderKey();
  ctx.keyFile = join(ctx.dir, `AuthKey_${ctx.provider.keyId}.p8`);
  writeFileSync(ctx.keyFile, ctx.provider.privateKeyPem);
});
cli.after(async (ctx) => {
  await ctx.redis?.quit();
  if (ctx.dir) rmSync(ctx.dir, { recursive: true, force: true });
});

/** `apns set` with every flag; a flag in `extra` takes the place of the default one (a flag given twice is a usage error). */
const setArgs = (ctx: Ctx, extra: string[] = [], key: ProviderKey = ctx.provider, file = ctx.keyFile) => {
  const args = ['apns', 'set', '--workspace', 'acme', '--key-id', key.keyId, '--team-id', key.teamId, '--bundle-id', BUNDLE, '--key-file', file];
  for (let i = 0; i < extra.length; i++) {
    const at = extra[i]!.startsWith('--') ? args.indexOf(extra[i]!) : -1;
    if (at >= 0 && extra[i + 1] !== undefined && !extra[i + 1]!.startsWith('--')) args.splice(at, 2, extra[i]!, extra[++i]!);
    else args.push(extra[i]!);
  }
  return args;
};

cli('apns set --json stores the credentials of the default tenant and prints the public view, never the key', async (ctx) => {
  const run = await herald(ctx.env, ...setArgs(ctx, ['--json']));
  const out = oneJsonLine(run);
  assert.equal(Object.keys(out), ['tenant', 'credentials', 'created', 'changed']);
  assert.equal(out.tenant, { id: ctx.defaultTenant.id, slug: 'default' });
  assert.is(out.created, true);
  assert.equal(Object.keys(out.credentials).sort(), ['bundleId', 'configuredAt', 'keyFingerprint', 'keyId', 'teamId']);
  assert.is(out.credentials.keyId, ctx.provider.keyId);
  assert.is(out.credentials.teamId, ctx.provider.teamId);
  assert.is(out.credentials.bundleId, BUNDLE);
  assert.match(out.credentials.keyFingerprint, /^sha256:[0-9a-f]{64}$/);
  assert.not.ok(run.stdout.includes('PRIVATE KEY') || run.stdout.includes(pemBody(ctx.provider.privateKeyPem).slice(0, 40)));

  const stored = await getApnsCredentials(ctx.redis, ctx.keys, createSecretBox(Buffer.from(ctx.encryptionKey, 'hex')), ctx.defaultTenant.id);
  assert.is(stored!.privateKey, ctx.provider.privateKeyPem, 'the sender gets the key back');
  const ledger = await ctx.redis.xrange(ctx.keys.ledger(ctx.defaultTenant.workspaceId), '-', '+');
  const audit = ledger.map(([, f]) => JSON.parse(f[f.indexOf(LEDGER_FIELDS.payload) + 1]!)).find((e) => e.type === 'apns.updated');
  assert.equal(audit.actor, { type: 'cli', id: null });
});

cli('apns show prints the stored credentials; without --json, one line for a person', async (ctx) => {
  const json = oneJsonLine(await herald(ctx.env, 'apns', 'show', '--workspace', 'acme', '--json'));
  assert.equal(json.tenant, { id: ctx.defaultTenant.id, slug: 'default' });
  assert.is(json.credentials.keyId, ctx.provider.keyId);
  const text = await herald(ctx.env, 'apns', 'show', '--workspace', 'acme');
  assert.is(text.code, 0);
  assert.match(text.stdout, new RegExp(`^APNs credentials of acme/default: key ${ctx.provider.keyId}, team ${ctx.provider.teamId}, bundle ${BUNDLE.replace(/\./g, '\\.')}, sha256:[0-9a-f]{64}, configured \\S+\\n$`));
});

cli('apns set --tenant works in that tenant; apns set again with the same key reports it unchanged, with another key updated (probe I: "updated" for the same)', async (ctx) => {
  const other = generateProviderKey();
  const file = join(ctx.dir, 'other.p8');
  writeFileSync(file, other.privateKeyPem);
  const out = oneJsonLine(await herald(ctx.env, ...setArgs(ctx, ['--tenant', 'emea', '--json'], other, file)));
  assert.equal(out.tenant, { id: ctx.emea.id, slug: 'emea' });
  assert.equal([out.created, out.changed], [true, true]);
  assert.equal([oneJsonLine(await herald(ctx.env, ...setArgs(ctx, ['--tenant', 'emea', '--json'], other, file))).changed], [false], 'the same again: nothing written');
  assert.is(out.credentials.keyId, other.keyId);
  assert.is(oneJsonLine(await herald(ctx.env, 'apns', 'show', '--workspace', 'acme', '--json')).credentials.keyId, ctx.provider.keyId, 'the default tenant keeps its own');
  const again = await herald(ctx.env, ...setArgs(ctx, ['--tenant', 'emea'], other, file));
  assert.is(again.code, 0);
  assert.match(again.stdout, /^APNs credentials of acme\/emea unchanged \(the same as stored\): key /);
  const third = generateProviderKey();
  writeFileSync(file, third.privateKeyPem);
  const replaced = await herald(ctx.env, ...setArgs(ctx, ['--tenant', 'emea'], third, file));
  assert.is(replaced.code, 0);
  assert.match(replaced.stdout, new RegExp(`^APNs credentials of acme/emea updated: key ${third.keyId}`));
});

cli('a missing key file fails with exit 1 and says so', async (ctx) => {
  failed(await herald(ctx.env, ...setArgs(ctx, ['--json'], ctx.provider, join(ctx.dir, 'nope.p8'))), 1, /^herald: --key-file ".*nope\.p8" cannot be read: no such file$/);
});

cli('a key file that is not an EC P-256 .p8 key fails with exit 1 and the reason', async (ctx) => {
  const text = join(ctx.dir, 'notes.txt');
  writeFileSync(text, 'not a key\n');
  failed(await herald(ctx.env, ...setArgs(ctx, [], ctx.provider, text)), 1, /^herald: --key-file ".*notes\.txt" is not a PEM private key/);
  const rsa = join(ctx.dir, 'rsa.p8');
  writeFileSync(rsa, generateKeyPairSync('rsa', { modulusLength: 2048 }).privateKey.export({ type: 'pkcs8', format: 'pem' }).toString());
  failed(await herald(ctx.env, ...setArgs(ctx, [], ctx.provider, rsa)), 1, /^herald: --key-file ".*rsa\.p8" must be an EC P-256 key \(an Apple \.p8 key\), got rsa$/);
});

cli('bad ids and missing flags are usage errors (exit 2)', async (ctx) => {
  const [shortId, noKeyId, noFile, badBundle, shortIdNoFile] = await Promise.all([
    herald(ctx.env, ...setArgs(ctx, ['--key-id', 'short'])),
    herald(ctx.env, 'apns', 'set', '--workspace', 'acme', '--team-id', ctx.provider.teamId, '--bundle-id', BUNDLE, '--key-file', ctx.keyFile),
    herald(ctx.env, 'apns', 'set', '--workspace', 'acme', '--key-id', ctx.provider.keyId, '--team-id', ctx.provider.teamId, '--bundle-id', BUNDLE),
    herald(ctx.env, ...setArgs(ctx, ['--bundle-id', 'nodots'])),
    // a bad argument is a usage error whatever the key file holds (it exited 1 on the file: probe V3)
    herald(ctx.env, ...setArgs(ctx, ['--key-id', 'short'], ctx.provider, join(ctx.dir, 'nope.p8'))),
  ]);
  failed(shortIdNoFile!, 2, /^herald: --key-id must be the 10-character Key ID/);
  failed(shortId!, 2, /^herald: --key-id must be the 10-character Key ID/);
  failed(noKeyId!, 2, /^herald: --key-id is required$/);
  failed(noFile!, 2, /^herald: --key-file is required$/);
  failed(badBundle!, 2, /^herald: --bundle-id must be the app's bundle id/);
});

cli('unknown workspaces and tenants, and a tenant without credentials, fail with exit 1', async (ctx) => {
  failed(await herald(ctx.env, 'apns', 'show', '--workspace', 'nowhere'), 1, /^herald: workspace "nowhere" does not exist/);
  failed(await herald(ctx.env, ...setArgs(ctx, ['--tenant', 'mars'])), 1, /^herald: tenant "mars" does not exist in workspace "acme"$/);
  const { workspace } = await ensureWorkspace(ctx.redis, ctx.keys, 'bare', BY_TEST);
  assert.ok(workspace);
  failed(await herald(ctx.env, 'apns', 'show', '--workspace', 'bare'), 1, /^herald: no APNs credentials are configured for bare\/default \(store them with: herald apns set\)$/);
});

cli('without HERALD_ENCRYPTION_KEY, apns set refuses and says how to make a key; a bad key setting is a config error', async (ctx) => {
  await ensureWorkspace(ctx.redis, ctx.keys, 'plain', BY_TEST);
  const args = setArgs(ctx).map((a) => (a === 'acme' ? 'plain' : a));
  const [unset, short] = await Promise.all([herald({ ...ctx.env, HERALD_ENCRYPTION_KEY: '' }, ...args), herald({ ...ctx.env, HERALD_ENCRYPTION_KEY: 'short' }, ...args)]);
  failed(unset, 1, /^herald: storing APNs credentials needs HERALD_ENCRYPTION_KEY \(32 bytes as hex or base64; make one with: openssl rand -hex 32\)$/);
  failed(short, 1, /^herald: HERALD_ENCRYPTION_KEY must be 32 bytes/);
  failed(await herald(ctx.env, 'apns', 'show', '--workspace', 'plain'), 1, /^herald: no APNs credentials/);
});

cli('the usage lists the apns commands', async (ctx) => {
  const help = await herald(ctx.env, '--help');
  assert.match(help.stdout, /\n {2}apns set {6}--workspace <slug> \[--tenant <slug>\] --key-id <id> --team-id <id> --bundle-id <id> --key-file <AuthKey\.p8> \[--json\]\n/);
  assert.match(help.stdout, /\n {2}apns show {5}--workspace <slug> \[--tenant <slug>\] \[--json\]\n/);
});

cli.run();
