import { spawn, spawnSync } from 'node:child_process';
import { closeSync, openSync } from 'node:fs';
import { createServer, type AddressInfo, type Socket } from 'node:net';
import { join } from 'node:path';
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { client } from '../helpers/api.js';
import { freePort, testRedisUrl, uniquePrefix } from '../helpers/redis.js';
import { BY_TEST, startTestService, type TestService } from '../helpers/service.js';
import { waitFor } from '../helpers/wait.js';
import { createTenant, ensureWorkspace, findWorkspaceBySlug } from '../../streams/identity.js';

const ROOT = join(import.meta.dirname, '..', '..');
const CLI = join(ROOT, 'dist', 'bin', 'cli.js');
/** `node -e` puts the arguments after `--` at process.argv[1…]. */
const INLINE = `import { main } from ${JSON.stringify(CLI)}; process.exitCode = await main(process.argv.slice(1));`;

type Run = { code: number | null; stdout: string; stderr: string };
type Ctx = { service: TestService; api: ReturnType<typeof client>; env: Record<string, string>; bad: Map<string, Promise<Run>> };

function spawnNode(args: string[], env: Record<string, string>, timeoutMs: number): Promise<Run> {
  return new Promise((done, fail) => {
    const child = spawn(process.execPath, args, { cwd: ROOT, env: { ...process.env, ...env }, stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (chunk: Buffer) => (stdout += chunk.toString()));
    child.stderr.on('data', (chunk: Buffer) => (stderr += chunk.toString()));
    const timer = setTimeout(() => {
      child.kill('SIGKILL');
      fail(new Error(`node ${args.join(' ')} did not finish within ${timeoutMs} ms\nstdout: ${stdout}\nstderr: ${stderr}`));
    }, timeoutMs);
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

/** `herald <args>` through the built CLI's `main` (dist/, which test/run.ts builds first) in a child process. */
function herald(env: Record<string, string>, ...args: string[]): Promise<Run> {
  return spawnNode(['--input-type=module', '-e', INLINE, '--', ...args], env, 30_000);
}

/**
 * How long `herald --help` takes here and now (a node start, no Redis): a test bounding a command's time
 * bounds what it spends beyond that, which a loaded machine does not stretch by seconds.
 */
async function startupMs(env: Record<string, string>): Promise<number> {
  const started = Date.now();
  const run = await herald(env, '--help');
  assert.is(run.code, 0, run.stderr);
  return Date.now() - started;
}

function ok(run: Run, what: string): void {
  assert.is(run.code, 0, `${what} exits 0 (stderr: ${run.stderr})`);
  assert.is(run.stderr, '', `${what} writes nothing on stderr`);
}

/** stdout is exactly one line of JSON; returns it parsed. */
function oneJsonLine(run: Run): any {
  assert.ok(run.stdout.endsWith('\n'), 'stdout ends with a newline');
  assert.is(run.stdout.indexOf('\n'), run.stdout.length - 1, `stdout is one line: ${run.stdout}`);
  const parsed = JSON.parse(run.stdout);
  assert.is(run.stdout, JSON.stringify(parsed) + '\n', 'stdout is the JSON and nothing else');
  return parsed;
}

const WS_ID = /^ws_[0-9a-z]{26}$/;
const TNT_ID = /^tnt_[0-9a-z]{26}$/;
const KEY_ID = /^key_[0-9a-z]{26}$/;

function assertBootstrapShape(out: any, slug: string): void {
  assert.equal(Object.keys(out), ['workspace', 'tenant', 'keys']);
  assert.equal(Object.keys(out.workspace), ['id', 'slug']);
  assert.equal(Object.keys(out.tenant), ['id', 'slug']);
  assert.equal(Object.keys(out.keys), ['workspace', 'tenant', 'client']);
  assert.match(out.workspace.id, WS_ID);
  assert.is(out.workspace.slug, slug);
  assert.match(out.tenant.id, TNT_ID);
  assert.is(out.tenant.slug, 'default');
  assert.match(out.keys.workspace, /^svc_ws_[0-9a-f]{48}$/);
  assert.match(out.keys.tenant, /^svc_tn_[0-9a-f]{48}$/);
  assert.match(out.keys.client, /^svc_pk_[0-9a-f]{48}$/);
}

/** Runs the functions given to it at most `n` at a time, in the order given. */
function atMost(n: number): <T>(f: () => Promise<T>) => Promise<T> {
  let active = 0;
  const waiting: (() => void)[] = [];
  return async (f) => {
    if (active >= n) await new Promise<void>((wake) => waiting.push(wake));
    else active++;
    try {
      return await f();
    } finally {
      // the slot passes to the next waiter, or is freed
      const next = waiting.shift();
      if (next) next();
      else active--;
    }
  };
}

const cli = suite<Ctx>('operator cli');

/** What follows the reason of a usage mistake (exit code 2), on the same and only line. */
const HELP_HINT = ' (run herald --help for usage)';

/**
 * Command lines an operator gets wrong: each must exit non-zero, print exactly one line on stderr
 * (the reason; for a command-line mistake followed by HELP_HINT) and nothing on stdout.
 * Workspace `acme` with tenant `emea` exists; `--name bad-…` lets a later test check nothing was made.
 */
const BAD: { what: string; args: string[]; code: number; reason: RegExp }[] = [
  { what: 'an unknown command', args: ['frobnicate', '--workspace', 'acme'], code: 2, reason: /^herald: unknown command "frobnicate"$/ },
  { what: 'an unknown subcommand', args: ['key', 'rotate', '--workspace', 'acme'], code: 2, reason: /^herald: unknown command "key rotate"$/ },
  { what: 'a missing --workspace', args: ['key', 'create', '--kind', 'workspace', '--scopes', 'events:read', '--name', 'bad-missing-ws', '--json'], code: 2, reason: /^herald: --workspace is required$/ },
  { what: 'a workspace slug that is not a slug', args: ['bootstrap', '--workspace', 'Not A Slug', '--json'], code: 2, reason: /^herald: --workspace "Not A Slug" is not a slug/ },
  { what: 'a bad --kind', args: ['key', 'create', '--workspace', 'acme', '--kind', 'admin', '--scopes', 'events:read', '--name', 'bad-kind', '--json'], code: 2, reason: /^herald: --kind must be one of workspace, tenant, client$/ },
  { what: 'a session-only scope', args: ['key', 'create', '--workspace', 'acme', '--kind', 'workspace', '--scopes', 'events:read,keys:write', '--name', 'bad-session-scope', '--json'], code: 2, reason: /^herald: --scopes: "keys:write" is session-only/ },
  { what: 'a malformed scope', args: ['key', 'create', '--workspace', 'acme', '--kind', 'workspace', '--scopes', 'Events-Read', '--name', 'bad-scope', '--json'], code: 2, reason: /^herald: --scopes: "Events-Read" is not a scope/ },
  { what: 'a scope naming an unknown resource', args: ['key', 'create', '--workspace', 'acme', '--kind', 'workspace', '--scopes', 'spaceships:read', '--name', 'bad-resource', '--json'], code: 2, reason: /^herald: --scopes: "spaceships:read" names an unknown resource "spaceships" \(the resources: apps, events, .*workflows\)$/ },
  { what: 'a scope no route requires', args: ['key', 'create', '--workspace', 'acme', '--kind', 'tenant', '--scopes', 'events:read,messages:write', '--name', 'bad-action', '--json'], code: 2, reason: /^herald: --scopes: "messages:write" is no route's scope: messages takes read, send \(or \*\)$/ },
  { what: 'an empty --scopes', args: ['key', 'create', '--workspace', 'acme', '--kind', 'workspace', '--scopes', ' , ', '--name', 'bad-empty-scopes', '--json'], code: 2, reason: /^herald: --scopes must name at least one scope$/ },
  { what: 'an --expires that is not a date', args: ['key', 'create', '--workspace', 'acme', '--kind', 'workspace', '--scopes', 'events:read', '--expires', 'tomorrow', '--name', 'bad-expires-word', '--json'], code: 2, reason: /^herald: --expires "tomorrow" is not an ISO 8601 date \(midnight UTC\) or date-time with its offset \(Z or \+hh:mm\)$/ },
  { what: 'an --expires on a day the month lacks', args: ['key', 'create', '--workspace', 'acme', '--kind', 'workspace', '--scopes', 'events:read', '--expires', '2030-02-30T00:00:00Z', '--name', 'bad-expires-day', '--json'], code: 2, reason: /^herald: --expires "2030-02-30T00:00:00Z" is not an ISO 8601 date \(midnight UTC\) or date-time with its offset \(Z or \+hh:mm\)$/ },
  { what: 'an --expires with an impossible month', args: ['key', 'create', '--workspace', 'acme', '--kind', 'workspace', '--scopes', 'events:read', '--expires', '2031-13-40T00:00:00Z', '--name', 'bad-expires-month', '--json'], code: 2, reason: /^herald: --expires "2031-13-40T00:00:00Z" is not an ISO 8601 date \(midnight UTC\) or date-time with its offset \(Z or \+hh:mm\)$/ },
  { what: 'an --expires with a note after the date (Date.parse took it)', args: ['key', 'create', '--workspace', 'acme', '--kind', 'workspace', '--scopes', 'events:read', '--expires', '2027-01-01 (note)', '--name', 'bad-expires-0', '--json'], code: 2, reason: /^herald: --expires "2027-01-01 \(note\)" is not an ISO 8601 date/ },
  { what: 'an --expires in a named zone', args: ['key', 'create', '--workspace', 'acme', '--kind', 'workspace', '--scopes', 'events:read', '--expires', '2027-06-01 10:00 PST', '--name', 'bad-expires-1', '--json'], code: 2, reason: /^herald: --expires "2027-06-01 10:00 PST" is not an ISO 8601 date/ },
  { what: 'an --expires time without its offset (it was read in the zone of the CLI machine)', args: ['key', 'create', '--workspace', 'acme', '--kind', 'workspace', '--scopes', 'events:read', '--expires', '2027-01-01T10:00', '--name', 'bad-expires-2', '--json'], code: 2, reason: /^herald: --expires "2027-01-01T10:00" is not an ISO 8601 date/ },
  { what: 'an --expires at 24:00', args: ['key', 'create', '--workspace', 'acme', '--kind', 'workspace', '--scopes', 'events:read', '--expires', '2027-01-01T24:00Z', '--name', 'bad-expires-3', '--json'], code: 2, reason: /^herald: --expires "2027-01-01T24:00Z" is not an ISO 8601 date/ },
  { what: 'a --name over 100 characters', args: ['key', 'create', '--workspace', 'acme', '--kind', 'workspace', '--scopes', 'events:read', '--name', 'n'.repeat(101), '--json'], code: 2, reason: /^herald: --name must be one line of at most 100 characters$/ },
  { what: 'a --name of two lines', args: ['key', 'create', '--workspace', 'acme', '--kind', 'workspace', '--scopes', 'events:read', '--name', 'two\nlines', '--json'], code: 2, reason: /^herald: --name must be one line of at most 100 characters$/ },
  { what: 'a --name of 101 emoji', args: ['key', 'create', '--workspace', 'acme', '--kind', 'workspace', '--scopes', 'events:read', '--name', '😀'.repeat(101), '--json'], code: 2, reason: /^herald: --name must be one line of at most 100 characters$/ },
  ...['\u2028', '\u0085', '\u202e', '\u2067', '\u200f', '\u061c'].map((c) => ({ what: `a --name holding U+${c.codePointAt(0)!.toString(16).padStart(4, '0')}`, args: ['key', 'create', '--workspace', 'acme', '--kind', 'workspace', '--scopes', 'events:read', '--name', `a${c}b`, '--json'], code: 2, reason: /^herald: --name must be one line of at most 100 characters$/ })),
  { what: 'an unknown workspace', args: ['key', 'create', '--workspace', 'nowhere', '--kind', 'workspace', '--scopes', 'events:read', '--name', 'bad-unknown-ws', '--json'], code: 1, reason: /^herald: workspace "nowhere" does not exist \(create it with: herald bootstrap --workspace nowhere\)$/ },
  { what: 'an unknown tenant', args: ['key', 'create', '--workspace', 'acme', '--tenant', 'mars', '--kind', 'tenant', '--scopes', 'events:read', '--name', 'bad-unknown-tenant', '--json'], code: 1, reason: /^herald: tenant "mars" does not exist in workspace "acme"$/ },
  { what: '--tenant with --kind workspace', args: ['key', 'create', '--workspace', 'acme', '--tenant', 'emea', '--kind', 'workspace', '--scopes', 'events:read', '--name', 'bad-tenant-on-ws', '--json'], code: 2, reason: /^herald: --tenant does not apply to workspace keys/ },
  { what: 'an unknown flag', args: ['bootstrap', '--workspace', 'acme', '--colour', 'red', '--json'], code: 2, reason: /^herald: Unknown option '--colour'$/ },
  { what: 'a flag without its value', args: ['key', 'list', '--workspace'], code: 2, reason: /^herald: Option '--workspace <value>' argument missing$/ },
  { what: 'flags without a command', args: ['--workspace', 'acme', '--json'], code: 2, reason: /^herald: no command given$/ },
  // probe DI: parseArgs's three-line advice, and a repeated flag whose last value was used silently
  { what: 'a flag whose value was forgotten before the next flag', args: ['key', 'create', '--workspace', 'acme', '--kind', 'tenant', '--scopes', 'events:read', '--expires', '--json'], code: 2, reason: /^herald: Option '--expires' argument is ambiguous\.$/ },
  { what: 'a flag given twice', args: ['bootstrap', '--workspace', 'acme', '--workspace', 'bad-other', '--json'], code: 2, reason: /^herald: --workspace is given more than once$/ },
  // Scopes a key of that kind can never use: the key would authenticate and then be refused on every route.
  { what: 'a client key with a data-plane scope', args: ['key', 'create', '--workspace', 'acme', '--kind', 'client', '--scopes', 'events:write', '--name', 'bad-client-scope', '--json'], code: 2, reason: /^herald: --scopes: "events:write" can never be used by a client key: client keys call only \/v1\/client routes, which need the scope client \(or \*\)$/ },
  { what: 'a client key with client and a data-plane scope', args: ['key', 'create', '--workspace', 'acme', '--kind', 'client', '--scopes', 'client,subscribers:*', '--name', 'bad-client-mixed', '--json'], code: 2, reason: /^herald: --scopes: "subscribers:\*" can never be used by a client key/ },
  { what: 'a tenant key with a webhooks scope', args: ['key', 'create', '--workspace', 'acme', '--tenant', 'emea', '--kind', 'tenant', '--scopes', 'events:read,webhooks:*', '--name', 'bad-tenant-webhooks', '--json'], code: 2, reason: /^herald: --scopes: "webhooks:\*" can never be used by a tenant key: webhooks routes are workspace routes, which refuse tenant keys \(use a workspace key\)$/ },
  { what: 'a tenant key with the client scope', args: ['key', 'create', '--workspace', 'acme', '--kind', 'tenant', '--scopes', 'client', '--name', 'bad-tenant-client', '--json'], code: 2, reason: /^herald: --scopes: "client" can never be used by a tenant key: only client keys call \/v1\/client routes$/ },
  { what: 'a workspace key with the client scope', args: ['key', 'create', '--workspace', 'acme', '--kind', 'workspace', '--scopes', 'events:read,client', '--name', 'bad-workspace-client', '--json'], code: 2, reason: /^herald: --scopes: "client" can never be used by a workspace key/ },
  { what: 'a missing --slug on tenant create', args: ['tenant', 'create', '--workspace', 'acme', '--json'], code: 2, reason: /^herald: --slug is required$/ },
  // An option the command does not take is a mistake too: `key list --tenant emea` listed every key of the workspace as if they were emea's.
  { what: 'an option key list does not take', args: ['key', 'list', '--workspace', 'acme', '--tenant', 'emea', '--json'], code: 2, reason: /^herald: --tenant does not apply to key list$/ },
  { what: 'an option bootstrap does not take', args: ['bootstrap', '--workspace', 'acme', '--tenant', 'emea', '--name', 'bad-bootstrap-tenant', '--json'], code: 2, reason: /^herald: --tenant does not apply to bootstrap$/ },
  { what: 'an option key revoke does not take', args: ['key', 'revoke', '--workspace', 'acme', '--id', 'key_00000000000000000000000000', '--kind', 'tenant'], code: 2, reason: /^herald: --kind does not apply to key revoke$/ },
  { what: 'a missing --id on key revoke', args: ['key', 'revoke', '--workspace', 'acme', '--json'], code: 2, reason: /^herald: --id is required$/ },
  // probe BO: exit 1, as a key that does not exist
  { what: 'a malformed --id on key revoke', args: ['key', 'revoke', '--workspace', 'acme', '--id', 'notakey', '--json'], code: 2, reason: /^herald: --id "notakey" is not an API key id \(key_…, as `herald key list` shows\)$/ },
];

cli.before(async (ctx) => {
  const prefix = uniquePrefix('cli');
  ctx.env = { REDIS_URL: await testRedisUrl(), REDIS_KEY_PREFIX: prefix, LOG_LEVEL: 'error' };
  ctx.service = await startTestService('cli', { REDIS_KEY_PREFIX: prefix });
  ctx.api = client(ctx.service.url);
  const { workspace } = await ensureWorkspace(ctx.service.redis, ctx.service.keys, 'acme', BY_TEST);
  await createTenant(ctx.service.redis, ctx.service.keys, workspace, 'emea', BY_TEST);
  // The bad command lines do not depend on each other: run them now, four at a time (each is a tsx
  // process; all at once overran their time on a busy 2-core machine), and check each in its own test.
  const four = atMost(4);
  ctx.bad = new Map(BAD.map((c) => [c.what, four(() => herald(ctx.env, ...c.args))]));
  for (const pending of ctx.bad.values()) pending.catch(() => {});
});
cli.after(async (ctx) => {
  await Promise.allSettled(ctx.bad?.values() ?? []);
  await ctx.service?.stop();
});

cli('bootstrap --json prints exactly one line of JSON: the workspace, its default tenant and one key of each kind', async ({ env }) => {
  const run = await herald(env, 'bootstrap', '--workspace', 'orbit', '--json');
  ok(run, 'bootstrap');
  assertBootstrapShape(oneJsonLine(run), 'orbit');
});

cli('bootstrap a second time keeps the workspace and tenant ids and makes new keys', async ({ env }) => {
  const first = oneJsonLine(await herald(env, 'bootstrap', '--workspace', 'twice', '--json'));
  const run = await herald(env, 'bootstrap', '--workspace', 'twice', '--json');
  ok(run, 'the second bootstrap');
  const second = oneJsonLine(run);
  assertBootstrapShape(second, 'twice');
  assert.equal(second.workspace, first.workspace);
  assert.equal(second.tenant, first.tenant);
  for (const kind of ['workspace', 'tenant', 'client']) assert.is.not(second.keys[kind], first.keys[kind], `a new ${kind} key`);
});

cli('an output stdout refuses (a full disk) is one line on stderr and exit 1, saying what was made (probe I: an unhandled error event, 25 lines)', async ({ env }) => {
  const full = openSync('/dev/full', 'w');
  try {
    const run = spawnSync(process.execPath, ['--input-type=module', '-e', INLINE, '--', 'bootstrap', '--workspace', 'full-disk', '--json'], { cwd: ROOT, env: { ...process.env, ...env }, stdio: ['ignore', full, 'pipe'], timeout: 30_000 });
    assert.is(run.status, 1, run.stderr.toString());
    assert.match(run.stderr.toString(), /^herald: cannot write the output \(ENOSPC\); the keys were made all the same: herald key list shows them, herald key revoke ends them\n$/);
  } finally {
    closeSync(full);
  }
  const listed = oneJsonLine(await herald(env, 'key', 'list', '--workspace', 'full-disk', '--json'));
  assert.is(listed.items.length, 3, 'the keys were made');
  // a command that makes nothing says only that; so does --help (it exited 0, silent)
  const fullAgain = openSync('/dev/full', 'w');
  try {
    for (const args of [['key', 'list', '--workspace', 'full-disk'], ['--help']]) {
      const run = spawnSync(process.execPath, ['--input-type=module', '-e', INLINE, '--', ...args], { cwd: ROOT, env: { ...process.env, ...env }, stdio: ['ignore', fullAgain, 'pipe'], timeout: 30_000 });
      assert.equal([run.status, run.stderr.toString()], [1, 'herald: cannot write the output (ENOSPC)\n'], args.join(' '));
    }
  } finally {
    closeSync(fullAgain);
  }
});

cli('the keys bootstrap prints authenticate against the running service', async ({ env, api }) => {
  const out = oneJsonLine(await herald(env, 'bootstrap', '--workspace', 'live', '--json'));
  const byTenantKey = await api.get('/v1/events/names', out.keys.tenant);
  assert.is(byTenantKey.status, 200, byTenantKey.text);
  assert.equal(byTenantKey.body.data.items, []);
  const byWorkspaceKey = await api.get('/v1/events/names', out.keys.workspace);
  assert.is(byWorkspaceKey.status, 200, byWorkspaceKey.text);
  const stranger = await api.get('/v1/events/names', 'svc_tn_' + '0'.repeat(48));
  assert.is(stranger.status, 401);
  assert.is(stranger.body.error.code, 'invalid_api_key');
});

cli('bootstrap without --json prints the keys for a person, once, with a warning to store them', async ({ env }) => {
  const run = await herald(env, 'bootstrap', '--workspace', 'human');
  ok(run, 'bootstrap');
  assert.match(run.stdout, /^workspace human \(ws_[0-9a-z]{26}\), tenant default \(tnt_[0-9a-z]{26}\)\n/);
  assert.match(run.stdout, /workspace key: svc_ws_[0-9a-f]{48}\n/);
  assert.match(run.stdout, /tenant key: {4}svc_tn_[0-9a-f]{48}\n/);
  assert.match(run.stdout, /client key: {4}svc_pk_[0-9a-f]{48}\n/);
  assert.match(run.stdout, /Keys are shown once; store them now\.\n$/);
});

cli('the real entry bin/herald.js (building dist/ when it is missing or stale) prints the bootstrap JSON and nothing else on stdout', async ({ env }) => {
  const run = await spawnNode([join(ROOT, 'bin', 'herald.js'), 'bootstrap', '--workspace', 'x', '--json'], env, 120_000);
  assert.is(run.code, 0, `exit code (stderr: ${run.stderr})`);
  // A build, when one is needed, reports on stderr only: stdout belongs to the command.
  assert.ok(run.stderr === '' || /^herald: building dist\/ with tsc…\n$/.test(run.stderr), `stderr: ${run.stderr}`);
  assertBootstrapShape(oneJsonLine(run), 'x');
});

cli('dist/bin/cli.js run directly is the CLI too (after bin/herald.js built it): same output and exit codes (probe BX: it did nothing, exit 0)', async ({ env }) => {
  const cliJs = join(ROOT, 'dist', 'bin', 'cli.js');
  const run = await spawnNode([cliJs, 'bootstrap', '--workspace', 'direct', '--json'], env, 30_000);
  ok(run, 'node dist/bin/cli.js bootstrap');
  assertBootstrapShape(oneJsonLine(run), 'direct');
  const bad = await spawnNode([cliJs, 'bogus'], env, 30_000);
  assert.equal([bad.code, bad.stdout], [2, '']);
  assert.match(bad.stderr, /^herald: unknown command "bogus"/);
});

cli('tenant create --json prints the tenant and its workspace; the same slug a second time is that tenant, created false, exit 0 (idempotent as bootstrap; probe BG: exit 1)', async ({ env }) => {
  const boot = oneJsonLine(await herald(env, 'bootstrap', '--workspace', 'tenants', '--json'));
  const run = await herald(env, 'tenant', 'create', '--workspace', 'tenants', '--slug', 'apac', '--json');
  ok(run, 'tenant create');
  const out = oneJsonLine(run);
  assert.equal(Object.keys(out), ['id', 'slug', 'workspace', 'created']);
  assert.match(out.id, TNT_ID);
  assert.is.not(out.id, boot.tenant.id);
  assert.is(out.slug, 'apac');
  assert.equal(out.workspace, boot.workspace);
  assert.is(out.created, true);

  const again = await herald(env, 'tenant', 'create', '--workspace', 'tenants', '--slug', 'apac', '--json');
  ok(again, 'tenant create again');
  assert.equal(oneJsonLine(again), { ...out, created: false });

  const defaultAgain = await herald(env, 'tenant', 'create', '--workspace', 'tenants', '--slug', 'default', '--json');
  ok(defaultAgain, 'tenant create default');
  assert.equal(oneJsonLine(defaultAgain), { id: boot.tenant.id, slug: 'default', workspace: boot.workspace, created: false });
});

cli('key create makes a key of each kind with the prefix of its kind, the tenant asked for, the scopes and the expiry', async ({ env, api }) => {
  const nordics = oneJsonLine(await herald(env, 'tenant', 'create', '--workspace', 'acme', '--slug', 'nordics', '--json'));
  const made: Record<string, { id: string; key: string }> = {};
  const expectations = [
    { kind: 'workspace', prefix: 'svc_ws_', scopes: 'events:read,events:write', extra: ['--expires', '2999-01-01T02:00:00+02:00', '--name', '😀'.repeat(100)] },
    { kind: 'tenant', prefix: 'svc_tn_', scopes: 'events:read,events:write,events:read', extra: ['--tenant', 'nordics'] },
    { kind: 'client', prefix: 'svc_pk_', scopes: 'client', extra: ['--tenant', 'nordics', '--name', 'ios app'] },
  ];
  for (const { kind, prefix, scopes, extra } of expectations) {
    const run = await herald(env, 'key', 'create', '--workspace', 'acme', '--kind', kind, '--scopes', scopes, ...extra, '--json');
    ok(run, `key create --kind ${kind}`);
    const out = oneJsonLine(run);
    assert.equal(Object.keys(out), ['id', 'key']);
    assert.match(out.id, KEY_ID);
    assert.ok(out.key.startsWith(prefix), `${kind} key starts with ${prefix}: ${out.key}`);
    assert.match(out.key.slice(prefix.length), /^[0-9a-f]{48}$/);
    made[kind] = out;
  }
  const list = oneJsonLine(await herald(env, 'key', 'list', '--workspace', 'acme', '--json'));
  const nordicsId = nordics.id;
  const byId = new Map<string, any>(list.items.map((k: any) => [k.id, k]));
  const ws = byId.get(made.workspace!.id);
  assert.is(ws.kind, 'workspace');
  assert.is(ws.tenantId, null);
  assert.equal(ws.scopes, ['events:read', 'events:write']);
  assert.is(ws.expiresAt, '2999-01-01T00:00:00.000Z', '--expires is stored as UTC ISO 8601');
  const tn = byId.get(made.tenant!.id);
  assert.is(tn.kind, 'tenant');
  assert.is(tn.tenantId, nordicsId);
  assert.is(tn.expiresAt, null);
  assert.equal(tn.scopes, ['events:read', 'events:write'], 'a scope named twice is kept once');
  const pk = byId.get(made.client!.id);
  assert.is(pk.kind, 'client');
  assert.is(pk.tenantId, nordicsId);
  assert.is(pk.name, 'ios app');
  assert.is(byId.get(made.workspace!.id).name, '😀'.repeat(100), 'a name of 100 characters, emoji counted one each (probe DY: 200 UTF-16 units were refused)');
  assert.equal(pk.scopes, ['client']);

  // The tenant key reaches its own tenant's data plane, with the scopes it was given.
  const names = await api.get('/v1/events/names', made.tenant!.key);
  assert.is(names.status, 200, names.text);
  const wrongTenant = await api.get('/v1/events/names', made.tenant!.key, { 'service-tenant': 'default' });
  assert.is(wrongTenant.status, 403);
  const expiring = await api.get('/v1/events/names', made.workspace!.key, { 'service-tenant': 'nordics' });
  assert.is(expiring.status, 200, expiring.text);
});

cli('key create with an --expires already past makes a key the service answers 401 api_key_expired', async ({ env, api }) => {
  // The operator contract's way to see spec Part 7's api_key_expired row without waiting for a real expiry.
  const past = '2020-01-01T00:00:00Z';
  const run = await herald(env, 'key', 'create', '--workspace', 'acme', '--kind', 'workspace', '--scopes', 'events:read', '--expires', past, '--json');
  ok(run, 'key create --expires <past>');
  const { id, key } = oneJsonLine(run);
  const refused = await api.get('/v1/events/names', key);
  assert.is(refused.status, 401, refused.text);
  assert.is(refused.body.error.code, 'api_key_expired');
  const list = oneJsonLine(await herald(env, 'key', 'list', '--workspace', 'acme', '--json'));
  assert.is(list.items.find((k: any) => k.id === id).expiresAt, '2020-01-01T00:00:00.000Z');

  const text = await herald(env, 'key', 'create', '--workspace', 'acme', '--kind', 'workspace', '--scopes', 'events:read', '--expires', past);
  ok(text, 'key create --expires <past> without --json');
  assert.match(text.stdout, /has already passed: every call with it is 401 api_key_expired\.\n$/);
});

cli('key create without --tenant gives tenant and client keys the default tenant', async ({ env, service }) => {
  const run = await herald(env, 'key', 'create', '--workspace', 'acme', '--kind', 'client', '--scopes', 'client', '--json');
  ok(run, 'key create --kind client');
  const { id, key } = oneJsonLine(run);
  assert.ok(key.startsWith('svc_pk_'));
  const acme = (await findWorkspaceBySlug(service.redis, service.keys, 'acme'))!;
  const defaultTenant = await service.redis.hget(service.keys.tenantSlugs(acme.id), 'default');
  const list = oneJsonLine(await herald(env, 'key', 'list', '--workspace', 'acme', '--json'));
  assert.is(list.items.find((k: any) => k.id === id).tenantId, defaultTenant);
});

for (const c of BAD) {
  cli(`${c.what} fails with exit code ${c.code}, one clear reason on stderr and nothing on stdout`, async ({ bad }) => {
    const run = await bad.get(c.what)!;
    assert.is(run.code, c.code, `exit code (stderr: ${run.stderr})`);
    assert.is(run.stdout, '');
    assert.ok(run.stderr.endsWith('\n') && run.stderr.indexOf('\n') === run.stderr.length - 1, `stderr is one line: ${run.stderr}`);
    let reason = run.stderr.slice(0, -1);
    if (c.code === 2) {
      assert.ok(reason.endsWith(HELP_HINT), `a usage mistake points at --help: ${reason}`);
      reason = reason.slice(0, -HELP_HINT.length);
    }
    assert.match(reason, c.reason);
  });
}

cli('the rejected command lines created nothing', async ({ env, bad, service }) => {
  await Promise.all(bad.values());
  const list = oneJsonLine(await herald(env, 'key', 'list', '--workspace', 'acme', '--json'));
  assert.equal(list.items.filter((k: any) => String(k.name).startsWith('bad-')), []);
  assert.is(await findWorkspaceBySlug(service.redis, service.keys, 'nowhere'), null);
  assert.is(await findWorkspaceBySlug(service.redis, service.keys, 'Not A Slug'), null);
});

cli('key revoke makes the key fail with 401 invalid_api_key at the running service', async ({ env, api }) => {
  const { id, key } = oneJsonLine(await herald(env, 'key', 'create', '--workspace', 'acme', '--kind', 'tenant', '--scopes', 'events:read', '--json'));
  const before = await api.get('/v1/events/names', key); // also caches the principal in the service
  assert.is(before.status, 200, before.text);

  const run = await herald(env, 'key', 'revoke', '--workspace', 'acme', '--id', id, '--json');
  ok(run, 'key revoke');
  const out = oneJsonLine(run);
  assert.equal(Object.keys(out), ['id', 'revokedAt']);
  assert.is(out.id, id);
  assert.ok(!Number.isNaN(Date.parse(out.revokedAt)), out.revokedAt);

  // Revocation is published to every process; allow the message a moment (generous for a loaded
  // machine), still far below the cache TTL (30 s) that would refuse it without the message.
  const after = await waitFor('the revoked key to be refused', async () => {
    const res = await api.get('/v1/events/names', key);
    return res.status === 401 ? res : null;
  }, 10_000);
  assert.is(after.body.error.code, 'invalid_api_key');

  const again = await herald(env, 'key', 'revoke', '--workspace', 'acme', '--id', id, '--json');
  ok(again, 'revoking a revoked key');
  assert.is(oneJsonLine(again).revokedAt, out.revokedAt, 'a second revoke keeps the first revocation time');

  const text = await herald(env, 'key', 'revoke', '--workspace', 'acme', '--id', id);
  ok(text, 'key revoke without --json');
  assert.is(text.stdout, `key ${id} revoked at ${out.revokedAt}\n`);
});

cli('revoking an unknown key id, or a key of another workspace, fails and revokes nothing', async ({ env, api }) => {
  const unknown = await herald(env, 'key', 'revoke', '--workspace', 'acme', '--id', 'key_0000000000000000000000000z', '--json');
  assert.is(unknown.code, 1);
  assert.is(unknown.stdout, '');
  assert.is(unknown.stderr, 'herald: key "key_0000000000000000000000000z" does not exist in workspace "acme"\n');

  const other = oneJsonLine(await herald(env, 'bootstrap', '--workspace', 'other', '--json'));
  const { id, key } = oneJsonLine(await herald(env, 'key', 'create', '--workspace', 'other', '--kind', 'tenant', '--scopes', 'events:read', '--json'));
  const cross = await herald(env, 'key', 'revoke', '--workspace', 'acme', '--id', id, '--json');
  assert.is(cross.code, 1);
  assert.is(cross.stdout, '');
  assert.is(cross.stderr, `herald: key "${id}" does not exist in workspace "acme"\n`);
  const still = await api.get('/v1/events/names', key);
  assert.is(still.status, 200, 'the other workspace\'s key still works');
  assert.is((await api.get('/v1/events/names', other.keys.tenant)).status, 200);
});

cli('key list --json lists keys newest first, marks revoked ones, and never shows a hash or a key', async ({ env }) => {
  const boot = oneJsonLine(await herald(env, 'bootstrap', '--workspace', 'lister', '--json'));
  const first = oneJsonLine(await herald(env, 'key', 'create', '--workspace', 'lister', '--kind', 'workspace', '--scopes', 'events:read', '--json'));
  const second = oneJsonLine(await herald(env, 'key', 'create', '--workspace', 'lister', '--kind', 'tenant', '--scopes', 'events:read,events:write', '--expires', '2999-06-01T00:00:00Z', '--name', 'ci "nightly"', '--json'));
  const revoked = oneJsonLine(await herald(env, 'key', 'revoke', '--workspace', 'lister', '--id', first.id, '--json'));

  const run = await herald(env, 'key', 'list', '--workspace', 'lister', '--json');
  ok(run, 'key list');
  const out = oneJsonLine(run);
  assert.equal(Object.keys(out), ['items']);
  assert.is(out.items.length, 5);
  assert.is(out.items[0].id, second.id, 'the newest key comes first');
  assert.is(out.items[1].id, first.id);
  const createdAt = out.items.map((k: any) => Date.parse(k.createdAt));
  for (let i = 1; i < createdAt.length; i++) assert.ok(createdAt[i - 1] >= createdAt[i], `newest first by createdAt: ${out.items.map((k: any) => k.createdAt)}`);
  assert.equal(out.items.slice(2).map((k: any) => k.kind).sort(), ['client', 'tenant', 'workspace'], 'then the three bootstrap keys');

  for (const item of out.items) {
    assert.equal(Object.keys(item).sort(), ['createdAt', 'expiresAt', 'hint', 'id', 'kind', 'name', 'revokedAt', 'scopes', 'tenantId', 'workspaceId']);
    assert.is(item.workspaceId, boot.workspace.id);
    assert.match(item.hint, /^svc_(ws|tn|pk)_…[0-9a-f]{4}$/);
  }
  assert.is(out.items[1].revokedAt, revoked.revokedAt);
  for (const item of [out.items[0], ...out.items.slice(2)]) assert.is(item.revokedAt, null, `${item.id} is not revoked`);
  assert.is(out.items[0].expiresAt, '2999-06-01T00:00:00.000Z');
  for (const key of [first.key, second.key, ...Object.values<string>(boot.keys)]) {
    assert.not.ok(run.stdout.includes(key), 'no key appears in the list');
    assert.not.ok(run.stdout.includes(key.slice(7, 27)), 'not even a long part of a key');
  }
  assert.not.match(run.stdout, /[0-9a-f]{64}/, 'no SHA-256 appears in the list');
  assert.not.ok(run.stdout.includes('"hash"'));

  const text = await herald(env, 'key', 'list', '--workspace', 'lister');
  ok(text, 'key list without --json');
  const lines = text.stdout.trimEnd().split('\n');
  assert.is(lines.length, 5);
  assert.ok(lines[0]!.startsWith(`${second.id}  tenant    svc_tn_…`), lines[0]);
  // its tenant and label as the JSON has them (probe AP: the text showed neither)
  assert.match(lines[0]!, /scopes=events:read,events:write {2}tenant=default {2}name="ci \\"nightly\\"" {2}expires 2999-06-01T00:00:00\.000Z$/);
  assert.match(lines[1]!, new RegExp(`^${first.id}  workspace svc_ws_…[0-9a-f]{4}  scopes=events:read  revoked ${revoked.revokedAt.replace(/\./g, '\\.')}$`));
});

cli('key list of a workspace without keys says so', async ({ env, service }) => {
  await ensureWorkspace(service.redis, service.keys, 'empty', BY_TEST);
  const json = await herald(env, 'key', 'list', '--workspace', 'empty', '--json');
  ok(json, 'key list --json');
  assert.equal(oneJsonLine(json), { items: [] });
  const text = await herald(env, 'key', 'list', '--workspace', 'empty');
  assert.is(text.stdout, 'no keys\n');
});

cli('key create accepts the scopes each kind can use, and those keys reach their routes', async ({ env, api }) => {
  const create = async (kind: string, scopes: string) => {
    const run = await herald(env, 'key', 'create', '--workspace', 'acme', '--kind', kind, '--scopes', scopes, '--json');
    ok(run, `key create --kind ${kind} --scopes ${scopes}`);
    return oneJsonLine(run).key as string;
  };
  const [webhooksReader, clientKey, starClientKey] = await Promise.all([create('workspace', 'webhooks:read'), create('client', 'client'), create('client', '*')]);
  const catalog = await api.get('/v1/workspaces/acme/webhooks/catalog', webhooksReader);
  assert.is(catalog.status, 200, catalog.text);
  for (const key of [clientKey, starClientKey]) {
    const widgets = await api.get('/v1/client/widgets?externalId=cli-user', key);
    assert.is(widgets.status, 200, widgets.text);
  }
});

cli('an unreachable Redis is one line naming it, exit 1, without ioredis stack traces or retries', async ({ env }) => {
  const port = await freePort(); // bound a moment ago, then closed: nothing listens there
  const startup = await startupMs(env);
  const started = Date.now();
  const run = await herald({ ...env, REDIS_URL: `redis://127.0.0.1:${port}` }, 'key', 'list', '--workspace', 'acme', '--json');
  const elapsed = Date.now() - started - startup;
  assert.is(run.code, 1, `exit code (stderr: ${run.stderr})`);
  assert.is(run.stdout, '');
  assert.is(run.stderr, `herald: cannot reach Redis at redis://127.0.0.1:${port}: connect ECONNREFUSED 127.0.0.1:${port}\n`);
  // the bound only catches a client left reconnecting (connectRedis's default of 20 retries takes over 10 s)
  assert.ok(elapsed < 8_000, `finished ${elapsed} ms after a start (${startup} ms)`);
});

cli('a Redis that takes the connection and never replies is one line after 10 s, exit 1 (probe BG: 22 s, the connection and the checks waiting 10 s each)', async ({ env }) => {
  const sockets = new Set<Socket>();
  const hole = createServer((socket) => {
    sockets.add(socket);
    socket.on('error', () => undefined);
  });
  const port = await new Promise<number>((done) => hole.listen(0, '127.0.0.1', () => done((hole.address() as AddressInfo).port)));
  try {
    const startup = await startupMs(env);
    const started = Date.now();
    const run = await herald({ ...env, REDIS_URL: `redis://127.0.0.1:${port}` }, 'bootstrap', '--workspace', 'acme', '--json');
    const elapsed = Date.now() - started - startup;
    assert.is(run.code, 1, run.stderr);
    assert.is(run.stdout, '');
    assert.is(run.stderr, `herald: cannot reach Redis at redis://127.0.0.1:${port}: no answer within 10 s (the connection is open, nothing replies)\n`);
    assert.ok(elapsed < 15_000, `finished ${elapsed} ms after a start (${startup} ms)`);
  } finally {
    for (const socket of sockets) socket.destroy();
    hole.close();
  }
});

cli('a usage mistake is exit 2 with its reason whether or not Redis can be reached: arguments are checked before Redis is (probe F: exit 1, "cannot reach Redis")', async ({ env }) => {
  const port = await freePort(); // nothing listens there
  const mistakes = BAD.filter((c) => c.code === 2 && ['a workspace slug that is not a slug', 'a session-only scope', 'an --expires on a day the month lacks', 'a missing --slug on tenant create'].includes(c.what));
  assert.is(mistakes.length, 4);
  const runs = await Promise.all(mistakes.map((c) => herald({ ...env, REDIS_URL: `redis://127.0.0.1:${port}` }, ...c.args)));
  runs.forEach((run, i) => {
    assert.is(run.code, 2, `${mistakes[i]!.what} (stderr: ${run.stderr})`);
    assert.match(run.stderr.slice(0, -1 - HELP_HINT.length), mistakes[i]!.reason);
  });
});

cli('a REDIS_URL naming a database the server does not have is one line, exit 1, and writes nothing to database 0', async ({ env }) => {
  // ioredis reports a failed SELECT only as an 'error' event and goes on in database 0: the run
  // printed another deployment's workspace (or created one there) instead of failing.
  const url = new URL(env.REDIS_URL!);
  const run = await herald({ ...env, REDIS_URL: `redis://${url.host}/99` }, 'bootstrap', '--workspace', 'db-missing', '--json');
  assert.is(run.code, 1, `exit code (stdout: ${run.stdout})`);
  assert.is(run.stdout, '');
  assert.is(run.stderr, `herald: cannot use Redis at redis://${url.host}/99: it has no database 99 (ERR DB index is out of range)\n`);
  const list = await herald(env, 'key', 'list', '--workspace', 'db-missing', '--json');
  assert.is(list.code, 1, 'no workspace db-missing was made in database 0');
});

cli('a REDIS_URL with a database number keeps the deployment in that database', async ({ env }) => {
  const url = new URL(env.REDIS_URL!);
  const run = await herald({ ...env, REDIS_URL: `redis://${url.host}/5` }, 'bootstrap', '--workspace', 'db-five', '--json');
  ok(run, 'bootstrap in database 5');
  assertBootstrapShape(oneJsonLine(run), 'db-five');
  assert.is((await herald(env, 'key', 'list', '--workspace', 'db-five', '--json')).code, 1, 'database 0 has no workspace db-five');
  const five = await herald({ ...env, REDIS_URL: `redis://${url.host}/5` }, 'key', 'list', '--workspace', 'db-five', '--json');
  ok(five, 'key list in database 5');
});

cli('help prints the usage on stdout; no command is exit 2 with the usage on stderr', async ({ env }) => {
  for (const args of [['--help'], ['help'], ['key', 'create', '--help'], ['-h']]) {
    const help = await herald(env, ...args);
    ok(help, args.join(' '));
    assert.match(help.stdout, /^usage: herald <command> \[options\]\n/);
  }
  const none = await herald(env);
  assert.is(none.code, 2);
  assert.is(none.stdout, '');
  assert.match(none.stderr, /^herald: no command given\n\nusage: herald <command>/);
});

cli.run();
