import { parseArgs } from 'node:util';
import type { Redis } from 'ioredis';
import { readFileSync } from 'node:fs';
import { resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import { codePoints } from '../lib/code-points.js';
import { ConfigError, loadConfig } from '../lib/config.js';
import { ApiError } from '../lib/errors.js';
import type { Logger } from '../lib/log.js';
import { createSecretBox } from '../lib/secret-box.js';
import { isoTimeMs } from '../lib/iso-time.js';
import { isId } from '../lib/ids.js';
import { apnsIdProblems, describeApnsCredentials, setApnsCredentials, type ApnsCredentialsView } from '../streams/apns-credentials.js';
import { isSlug, KEY_KINDS, type KeyKind } from '../lib/key-kinds.js';
import { scopeProblem, scopeProblemForKind } from '../lib/scopes.js';
import { resolveRedis } from '../streams/embedded-redis.js';
import {
  createApiKey, createTenant, ensureWorkspace, findTenant, findTenantBySlug, findWorkspaceBySlug, listApiKeys, publicKey, revokeApiKey,
  rotateIdentitySecret, setIdentityRequired, tenantIdentity, type Tenant, type Workspace, type Writer,
} from '../streams/identity.js';
import { createKeys, type Keys } from '../streams/keys.js';
import { checkDatabase, connectRedis, describeTarget, type RedisTarget } from '../streams/redis.js';

const USAGE = `usage: herald <command> [options]

  bootstrap     --workspace <slug> [--json]
                  creates the workspace (and its default tenant) if needed, plus one key of each kind with scope *
  tenant create --workspace <slug> --slug <slug> [--json]
  tenant identity-secret --workspace <slug> [--tenant <slug>] [--rotate] [--json]
                  prints the tenant's identity secret (identityHash = hex HMAC-SHA256 of the externalId under it)
  tenant update --workspace <slug> [--tenant <slug>] --identity-verification required|optional [--json]
  key create    --workspace <slug> [--tenant <slug>] --kind workspace|tenant|client --scopes a,b [--expires <iso>] [--name <text>] [--json]
  key revoke    --workspace <slug> --id <key_…> [--json]
  key list      --workspace <slug> [--json]
  apns set      --workspace <slug> [--tenant <slug>] --key-id <id> --team-id <id> --bundle-id <id> --key-file <AuthKey.p8> [--json]
                  stores the tenant's APNs token credentials (the key encrypted with HERALD_ENCRYPTION_KEY)
  apns show     --workspace <slug> [--tenant <slug>] [--json]

Redis: REDIS_URL, else 127.0.0.1:6379, else the embedded server under ./var/redis (see README).`;

/** A mistake in the command line: one line on stderr pointing at --help, exit code 2. */
class UsageError extends Error {}
/** A request that cannot be carried out: printed alone, exit code 1. */
class CliError extends Error {}

/**
 * The one stderr line of a usage mistake. Scripts read stderr line by line, so the usage is not
 * repeated; parseArgs's advice on `--` after an unknown option gives way to the pointer to --help.
 */
function usageLine(reason: string): string {
  // parseArgs's first line says what is wrong; its further lines advise on dashes and `--`
  const first = reason.replace(/\. To specify a positional argument.*$/s, '').split('\n')[0]!;
  return `herald: ${first} (run herald --help for usage)\n`;
}

/** The CLI's word on a wait (the embedded Redis loading its data): a plain line on stderr, as its errors are. */
const waitLog: Logger = {
  debug: () => undefined,
  info: (msg) => process.stderr.write(`herald: ${msg}\n`),
  warn: (msg) => process.stderr.write(`herald: ${msg}\n`),
  error: (msg) => process.stderr.write(`herald: ${msg}\n`),
};

const BY_CLI: Writer = { actor: { type: 'cli', id: null }, request: null };

type Options = {
  workspace?: string; tenant?: string; slug?: string; kind?: string; scopes?: string; expires?: string; name?: string; id?: string;
  rotate?: boolean; 'identity-verification'?: string; json?: boolean; help?: boolean;
  'key-id'?: string; 'team-id'?: string; 'bundle-id'?: string; 'key-file'?: string;
};

function required(options: Options, name: keyof Options): string {
  const value = options[name];
  if (typeof value !== 'string' || value === '') throw new UsageError(`--${name} is required`);
  return value;
}

function slugOption(options: Options, name: 'workspace' | 'slug' | 'tenant'): string {
  const value = required(options, name);
  if (!isSlug(value)) throw new UsageError(`--${name} "${value}" is not a slug (lowercase letters, digits, - and _, starting with a letter or digit, at most 64 characters)`);
  return value;
}

async function workspaceOf(redis: Redis, keys: Keys, slug: string) {
  const workspace = await findWorkspaceBySlug(redis, keys, slug);
  if (!workspace) throw new CliError(`workspace "${slug}" does not exist (create it with: herald bootstrap --workspace ${slug})`);
  return workspace;
}

/** The tenant slug a command names (`--tenant`, else `--slug`, else `default`), checked. */
function tenantSlugOf(options: Options): string {
  return options.tenant ? slugOption(options, 'tenant') : options.slug ? slugOption(options, 'slug') : 'default';
}

async function tenantOf(redis: Redis, keys: Keys, workspace: Workspace, slug: string): Promise<Tenant> {
  const tenant = await findTenantBySlug(redis, keys, workspace.id, slug);
  if (!tenant) throw new CliError(`tenant "${slug}" does not exist in workspace "${workspace.slug}"`);
  return tenant;
}

type Out = (json: unknown, text: string) => void;

const APNS_FLAGS: Record<string, string> = { keyId: '--key-id', teamId: '--team-id', bundleId: '--bundle-id', privateKey: '--key-file' };

type ApnsInput = { keyId: string; teamId: string; bundleId: string; privateKey: string };

/** The flags of `herald apns set`, with the .p8 file read once the other flags are known good (a bad one exits 2 whatever the file holds). */
function apnsInputOf(options: Options): { input: ApnsInput; file: string } {
  const input = { keyId: required(options, 'key-id'), teamId: required(options, 'team-id'), bundleId: required(options, 'bundle-id'), privateKey: '' };
  const file = required(options, 'key-file');
  const malformed = apnsIdProblems(input);
  if (malformed.length) throw new UsageError(malformed.map((d) => `${APNS_FLAGS[d.param] ?? d.param} ${d.message}`).join('; '));
  try {
    input.privateKey = readFileSync(file, 'utf8');
  } catch (err) {
    throw new CliError(`--key-file "${file}" cannot be read: ${(err as NodeJS.ErrnoException).code === 'ENOENT' ? 'no such file' : (err as Error).message}`);
  }
  return { input, file };
}

/** `herald apns set`: stores the credentials; a bad flag value or key is one clear line. */
async function apnsSet(redis: Redis, keys: Keys, workspace: Workspace, tenant: Tenant, { input, file }: { input: ApnsInput; file: string }) {
  const encryptionKey = loadConfig().encryptionKey;
  try {
    return await setApnsCredentials(redis, keys, encryptionKey ? createSecretBox(encryptionKey) : null, workspace, tenant, input, BY_CLI);
  } catch (err) {
    if (!(err instanceof ApiError)) throw err;
    const details = err.details ?? [];
    const keyProblem = details.find((d) => d.param === 'privateKey');
    if (keyProblem) throw new CliError(`--key-file "${file}" ${keyProblem.message}`);
    if (details.length) throw new UsageError(details.map((d) => `${APNS_FLAGS[d.param] ?? d.param} ${d.message}`).join('; '));
    throw new CliError(err.status === 503 ? 'storing APNs credentials needs HERALD_ENCRYPTION_KEY (32 bytes as hex or base64; make one with: openssl rand -hex 32)' : err.message);
  }
}

const describeApns = (c: ApnsCredentialsView) => `key ${c.keyId}, team ${c.teamId}, bundle ${c.bundleId}, ${c.keyFingerprint}, configured ${c.configuredAt}`;

/** `--expires` as an ISO 8601 instant (null when absent); a date alone is its midnight UTC. */
function expiresOf(options: Options): string | null {
  if (options.expires === undefined) return null;
  const ms = isoTimeMs(options.expires, { date: true });
  if (ms === null) throw new UsageError(`--expires "${options.expires}" is not an ISO 8601 date (midnight UTC) or date-time with its offset (Z or +hh:mm)`);
  // A time already past is accepted: the key is made expired (401 api_key_expired), which is how an
  // operator or a conformance suite checks that answer without waiting for a real expiry.
  return new Date(ms).toISOString();
}

/** Longest `--name` of a key. */
const MAX_KEY_NAME_LENGTH = 100;

type Run = (redis: Redis, keys: Keys, out: Out) => Promise<void>;

/**
 * Checks `command`'s arguments and answers what carries it out against Redis. Every usage mistake
 * is found here, before Redis is resolved: it is exit 2 with its reason whether or not Redis is
 * reachable, and it starts no embedded server.
 */
function prepare(command: string, options: Options): Run {
  switch (command) {
    case 'bootstrap': {
      const slug = slugOption(options, 'workspace');
      return async (redis, keys, out) => {
        const { workspace, tenant } = await ensureWorkspace(redis, keys, slug, BY_CLI);
        const made: Record<string, string> = {};
        for (const kind of KEY_KINDS) {
          const { key } = await createApiKey(redis, keys, { workspace, tenant, kind, scopes: ['*'], expiresAt: null, name: 'bootstrap' }, BY_CLI);
          made[kind] = key;
        }
        out(
          { workspace: { id: workspace.id, slug: workspace.slug }, tenant: { id: tenant.id, slug: tenant.slug }, keys: { workspace: made.workspace, tenant: made.tenant, client: made.client } },
          `workspace ${workspace.slug} (${workspace.id}), tenant default (${tenant.id})\nworkspace key: ${made.workspace}\ntenant key:    ${made.tenant}\nclient key:    ${made.client}\nKeys are shown once; store them now.`,
        );
      };
    }
    case 'tenant create': {
      const workspaceSlug = slugOption(options, 'workspace');
      const slug = slugOption(options, 'slug');
      return async (redis, keys, out) => {
        const workspace = await workspaceOf(redis, keys, workspaceSlug);
        // idempotent, as bootstrap is: a slug the workspace has is answered with that tenant, exit 0
        // (a setup script run twice failed there with exit 1, the code of an unreachable Redis, probe BG)
        const { tenant, created } = await createTenant(redis, keys, workspace, slug, BY_CLI);
        out({ id: tenant.id, slug: tenant.slug, workspace: { id: workspace.id, slug: workspace.slug }, created }, `tenant ${tenant.slug} (${tenant.id}) ${created ? 'created in' : 'already in'} ${workspace.slug}`);
      };
    }
    case 'tenant identity-secret': {
      const workspaceSlug = slugOption(options, 'workspace');
      const tenantSlug = tenantSlugOf(options);
      return async (redis, keys, out) => {
        const workspace = await workspaceOf(redis, keys, workspaceSlug);
        const tenant = await tenantOf(redis, keys, workspace, tenantSlug);
        const secret = options.rotate ? await rotateIdentitySecret(redis, keys, workspace, tenant, BY_CLI) : (await tenantIdentity(redis, keys, tenant)).secret;
        out({ tenant: { id: tenant.id, slug: tenant.slug }, identitySecret: secret, rotated: Boolean(options.rotate) }, `identity secret of ${workspace.slug}/${tenant.slug}${options.rotate ? ' (rotated)' : ''}: ${secret}`);
      };
    }
    case 'tenant update': {
      const workspaceSlug = slugOption(options, 'workspace');
      const tenantSlug = tenantSlugOf(options);
      const mode = required(options, 'identity-verification');
      if (mode !== 'required' && mode !== 'optional') throw new UsageError('--identity-verification must be required or optional');
      return async (redis, keys, out) => {
        const workspace = await workspaceOf(redis, keys, workspaceSlug);
        const tenant = await tenantOf(redis, keys, workspace, tenantSlug);
        await setIdentityRequired(redis, keys, workspace, tenant, mode === 'required', BY_CLI);
        out({ tenant: { id: tenant.id, slug: tenant.slug }, identityVerification: mode }, `identity verification of ${workspace.slug}/${tenant.slug}: ${mode}`);
      };
    }
    case 'key create': {
      const workspaceSlug = slugOption(options, 'workspace');
      const kind = required(options, 'kind') as KeyKind;
      if (!KEY_KINDS.includes(kind)) throw new UsageError(`--kind must be one of ${KEY_KINDS.join(', ')}`);
      // a scope named twice is kept once (the key's record lists what it holds)
      const scopes = [...new Set(required(options, 'scopes').split(',').map((s) => s.trim()).filter(Boolean))];
      if (scopes.length === 0) throw new UsageError('--scopes must name at least one scope');
      for (const scope of scopes) {
        // A scope the kind can never use would make a key that authenticates yet is refused everywhere.
        const problem = scopeProblem(scope) ?? scopeProblemForKind(kind, scope);
        if (problem) throw new UsageError(`--scopes: ${problem}`);
      }
      const expiresAt = expiresOf(options);
      const name = options.name ?? null;
      // a name is a label for key list: one line of at most MAX_KEY_NAME_LENGTH characters (code points: an emoji is one; probe DY), with no
      // control character (C0, DEL, C1 such as NEL), line or paragraph separator, or bidirectional
      // mark, override or isolate, which would break or reorder the list's lines (probe DO)
      if (name !== null && (codePoints(name) > MAX_KEY_NAME_LENGTH || /[\u0000-\u001f\u007f-\u009f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]/.test(name))) {
        throw new UsageError(`--name must be one line of at most ${MAX_KEY_NAME_LENGTH} characters`);
      }
      if (kind === 'workspace' && options.tenant) throw new UsageError('--tenant does not apply to workspace keys (they reach every tenant)');
      const tenantSlug = kind === 'workspace' ? null : options.tenant ? slugOption(options, 'tenant') : 'default';
      return async (redis, keys, out) => {
        const workspace = await workspaceOf(redis, keys, workspaceSlug);
        const tenant = tenantSlug === null ? null : await tenantOf(redis, keys, workspace, tenantSlug);
        const { key, record } = await createApiKey(redis, keys, { workspace, tenant, kind, scopes, expiresAt, name }, BY_CLI);
        const expired = expiresAt !== null && Date.parse(expiresAt) <= Date.now() ? `\nIts expiry ${expiresAt} has already passed: every call with it is 401 api_key_expired.` : '';
        out({ id: record.id, key }, `key ${record.id} (${kind}${tenant ? `, tenant ${tenant.slug}` : ''}): ${key}\nThe key is shown once; store it now.${expired}`);
      };
    }
    case 'key revoke': {
      const workspaceSlug = slugOption(options, 'workspace');
      const id = required(options, 'id');
      // a bad argument, as a malformed slug is (exit 2; probe BO: exit 1, as a key that does not exist)
      if (!isId('key', id)) throw new UsageError(`--id "${id}" is not an API key id (key_…, as \`herald key list\` shows)`);
      return async (redis, keys, out) => {
        const workspace = await workspaceOf(redis, keys, workspaceSlug);
        const revoked = await revokeApiKey(redis, keys, workspace, id, BY_CLI);
        if (!revoked) throw new CliError(`key "${id}" does not exist in workspace "${workspace.slug}"`);
        out({ id: revoked.id, revokedAt: revoked.revokedAt }, `key ${revoked.id} revoked at ${revoked.revokedAt}`);
      };
    }
    case 'key list': {
      const workspaceSlug = slugOption(options, 'workspace');
      return async (redis, keys, out) => {
        const workspace = await workspaceOf(redis, keys, workspaceSlug);
        const records = (await listApiKeys(redis, keys, workspace.id)).map(publicKey);
        // the text names each key's tenant and label too, as the JSON does (probe AP: only --json showed them)
        const tenantSlugs = new Map<string, string>();
        for (const id of new Set(records.flatMap((k) => (k.tenantId ? [k.tenantId] : [])))) tenantSlugs.set(id, (await findTenant(redis, keys, workspace.id, id))?.slug ?? id);
        out(
          { items: records },
          records.map((k) => `${k.id}  ${k.kind.padEnd(9)} ${k.hint}  scopes=${k.scopes.join(',')}${k.tenantId ? `  tenant=${tenantSlugs.get(k.tenantId)}` : ''}`
            + `${k.name ? `  name=${JSON.stringify(k.name)}` : ''}${k.revokedAt ? `  revoked ${k.revokedAt}` : ''}${k.expiresAt ? `  expires ${k.expiresAt}` : ''}`).join('\n') || 'no keys',
        );
      };
    }
    case 'apns set': {
      const workspaceSlug = slugOption(options, 'workspace');
      const tenantSlug = tenantSlugOf(options);
      const apns = apnsInputOf(options);
      return async (redis, keys, out) => {
        const workspace = await workspaceOf(redis, keys, workspaceSlug);
        const tenant = await tenantOf(redis, keys, workspace, tenantSlug);
        const { credentials, created, changed } = await apnsSet(redis, keys, workspace, tenant, apns);
        // the same credentials again write nothing: said so (probe I: "updated", showing the first write's time)
        out({ tenant: { id: tenant.id, slug: tenant.slug }, credentials, created, changed }, `APNs credentials of ${workspace.slug}/${tenant.slug} ${created ? 'stored' : changed ? 'updated' : 'unchanged (the same as stored)'}: ${describeApns(credentials)}`);
      };
    }
    case 'apns show': {
      const workspaceSlug = slugOption(options, 'workspace');
      const tenantSlug = tenantSlugOf(options);
      return async (redis, keys, out) => {
        const workspace = await workspaceOf(redis, keys, workspaceSlug);
        const tenant = await tenantOf(redis, keys, workspace, tenantSlug);
        const credentials = await describeApnsCredentials(redis, keys, tenant.id);
        if (!credentials) throw new CliError(`no APNs credentials are configured for ${workspace.slug}/${tenant.slug} (store them with: herald apns set)`);
        out({ tenant: { id: tenant.id, slug: tenant.slug }, credentials }, `APNs credentials of ${workspace.slug}/${tenant.slug}: ${describeApns(credentials)}`);
      };
    }
    default:
      throw new UsageError(command ? `unknown command "${command}"` : 'no command given');
  }
}

/** Longest wait for one Redis reply: a Redis that accepts the connection but never answers fails the run. */
const CLI_COMMAND_TIMEOUT_MS = 10_000;

/**
 * The CLI's Redis client, connected. A CLI run either reaches Redis at once or says so in one
 * line: no reconnecting (that only delays the message), and an 'error' listener so ioredis
 * prints no "Unhandled error event" stack traces of its own.
 */
async function openRedis(target: RedisTarget): Promise<Redis> {
  const seen: { error?: Error } = {};
  const redis = connectRedis(target, { lazyConnect: true, retryStrategy: () => null, commandTimeout: CLI_COMMAND_TIMEOUT_MS });
  redis.on('error', (err: Error) => (seen.error = err));
  const opening = (async () => {
    try {
      await redis.connect();
    } catch (err) {
      // connect() rejects with "Connection is closed."; the socket's own error says why.
      throw new CliError(`cannot reach Redis at ${describeTarget(target)}: ${(seen.error ?? (err as Error)).message}`);
    }
    await checkDatabase(redis, target);
  })();
  // one deadline for the connection and its checks: against a server that takes the connection and
  // never replies, each waited out its own 10 s (22 s, probe BG)
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new CliError(`cannot reach Redis at ${describeTarget(target)}: no answer within ${CLI_COMMAND_TIMEOUT_MS / 1000} s (the connection is open, nothing replies)`)), CLI_COMMAND_TIMEOUT_MS);
  });
  try {
    await Promise.race([opening, late]);
  } catch (err) {
    opening.catch(() => undefined);
    redis.disconnect();
    throw err;
  } finally {
    clearTimeout(timer);
  }
  return redis;
}

/** Each command and the options it takes besides --json and --help (as USAGE lists them); any other is a usage mistake. */
const COMMAND_OPTIONS: Record<string, string[]> = {
  bootstrap: ['workspace'],
  'tenant create': ['workspace', 'slug'],
  'tenant identity-secret': ['workspace', 'tenant', 'rotate'],
  'tenant update': ['workspace', 'tenant', 'identity-verification'],
  'key create': ['workspace', 'tenant', 'kind', 'scopes', 'expires', 'name'],
  'key revoke': ['workspace', 'id'],
  'key list': ['workspace'],
  'apns set': ['workspace', 'tenant', 'key-id', 'team-id', 'bundle-id', 'key-file'],
  'apns show': ['workspace', 'tenant'],
};
const COMMANDS = Object.keys(COMMAND_OPTIONS);

/** Runs the CLI with `argv` (without node and script); resolves to the exit code. */
export async function main(argv: string[]): Promise<number> {
  let parsed;
  try {
    parsed = parseArgs({
      args: argv,
      allowPositionals: true,
      strict: true,
      tokens: true,
      options: {
        workspace: { type: 'string' }, tenant: { type: 'string' }, slug: { type: 'string' }, kind: { type: 'string' }, scopes: { type: 'string' },
        expires: { type: 'string' }, name: { type: 'string' }, id: { type: 'string' }, json: { type: 'boolean' }, help: { type: 'boolean', short: 'h' },
        rotate: { type: 'boolean' }, 'identity-verification': { type: 'string' },
        'key-id': { type: 'string' }, 'team-id': { type: 'string' }, 'bundle-id': { type: 'string' }, 'key-file': { type: 'string' },
      },
    });
  } catch (err) {
    process.stderr.write(usageLine((err as Error).message));
    return 2;
  }
  const options = parsed.values as Options;
  const command = parsed.positionals.join(' ');
  // an option given twice kept the last one silently: `--workspace a --workspace b` acted on b (probe DI)
  const seen = new Set<string>();
  for (const token of parsed.tokens ?? []) {
    // a switch (`-h --help`, `--json --json`) says the same twice; a value given twice is ambiguous
    if (token.kind !== 'option' || token.value === undefined) continue;
    if (seen.has(token.name)) {
      process.stderr.write(usageLine(`--${token.name} is given more than once`));
      return 2;
    }
    seen.add(token.name);
  }
  if (options.help || command === 'help') {
    return writeOut(USAGE + '\n').then(() => 0, (err: Error) => {
      process.stderr.write(`herald: ${err.message}\n`);
      return 1;
    });
  }
  // A bare `herald` is someone finding out what it does: the usage answers. Anything else is a usage mistake.
  if (argv.length === 0) {
    process.stderr.write(`herald: no command given\n\n${USAGE}\n`);
    return 2;
  }
  if (!COMMANDS.includes(command)) {
    process.stderr.write(usageLine(command ? `unknown command "${command}"` : 'no command given'));
    return 2;
  }
  const foreign = Object.keys(options).find((name) => name !== 'json' && name !== 'help' && !COMMAND_OPTIONS[command]!.includes(name));
  if (foreign) {
    process.stderr.write(usageLine(`--${foreign} does not apply to ${command}`));
    return 2;
  }
  let resolved;
  try {
    const run = prepare(command, options);
    const config = loadConfig();
    resolved = await resolveRedis(config, undefined, { log: waitLog });
    const redis = await openRedis(resolved.target);
    try {
      const keys = createKeys(config.keyPrefix);
      const written: Promise<void>[] = [];
      // what a command that makes keys made is not lost with its output: the operator is told where to find it
      const made = command === 'bootstrap' || command === 'key create' ? '; the keys were made all the same: herald key list shows them, herald key revoke ends them' : '';
      await run(redis, keys, (json, text) => void written.push(writeOut((options.json ? JSON.stringify(json) : text) + '\n', made)));
      await Promise.all(written);
      return 0;
    } finally {
      await redis.quit().catch(() => redis.disconnect());
    }
  } catch (err) {
    if (err instanceof UsageError) {
      process.stderr.write(usageLine(err.message));
      return 2;
    }
    const message = err instanceof CliError || err instanceof ConfigError ? err.message : `failed: ${(err as Error).message}`;
    process.stderr.write(`herald: ${message}\n`);
    return 1;
  } finally {
    await resolved?.stop();
  }
}

/**
 * Writes `text` to stdout, settling once it is written or refused: a refusal is one line and exit 1,
 * not an unhandled 'error' event's stack trace (probe I: `bootstrap >/dev/full` printed 25 lines,
 * its keys made and never shown).
 */
function writeOut(text: string, made = ''): Promise<void> {
  return new Promise((done, fail) => {
    // the stream's 'error' event comes with the callback's error: told by the callback, it must not crash the process
    process.stdout.once('error', () => undefined);
    process.stdout.write(text, (err) => (err ? fail(new CliError(`cannot write the output (${(err as NodeJS.ErrnoException).code ?? err.message})${made}`)) : done()));
  });
}

// Run directly (`node dist/bin/cli.js …`, as a release phase or a script may) it does what
// `npx herald …` does (probe BX: it did nothing and exited 0); imported by bin/herald.js, nothing.
if (process.argv[1] && import.meta.url === pathToFileURL(resolve(process.argv[1])).href) process.exit(await main(process.argv.slice(2)));
