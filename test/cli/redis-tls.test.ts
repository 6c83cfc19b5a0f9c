import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { client } from '../helpers/api.js';
import { startRoleProcess, stopRoleProcess } from '../helpers/processes.js';
import { freePort } from '../helpers/redis.js';
import { makeTestCertificates } from '../helpers/tls.js';
import { waitFor } from '../helpers/wait.js';
import { connectRedis } from '../../streams/redis.js';

const ROOT = join(import.meta.dirname, '..', '..');

/**
 * A `rediss://` REDIS_URL (README: TLS URLs, a private CA trusted with NODE_EXTRA_CA_CERTS): the CLI
 * and a Procfile role reach a redis-server that speaks only TLS, with a certificate from a CA of
 * the operator's; without that CA the CLI says why in one line.
 */
type Ctx = { dir: string; port: number; caFile: string; redis: ChildProcess };
const tls = suite<Ctx>('rediss');

function herald(env: Record<string, string>, ...args: string[]): Promise<{ code: number | null; stdout: string; stderr: string }> {
  return new Promise((done) => {
    const child = spawn(process.execPath, ['--import', 'tsx', '--input-type=module', '-e', `import { main } from ${JSON.stringify(join(ROOT, 'bin', 'cli.ts'))}; process.exitCode = await main(process.argv.slice(1));`, '--', ...args], { cwd: ROOT, env: { ...process.env, ...env }, stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (d) => (stdout += d));
    child.stderr.on('data', (d) => (stderr += d));
    child.on('close', (code) => done({ code, stdout, stderr }));
  });
}

tls.before(async (ctx) => {
  const certs = makeTestCertificates();
  ctx.dir = mkdtempSync(join(tmpdir(), 'herald-rediss-'));
  for (const [name, pem] of [['ca.pem', certs.caPem], ['server.pem', certs.certPem], ['server.key', certs.keyPem]]) writeFileSync(join(ctx.dir, name!), pem!);
  ctx.caFile = join(ctx.dir, 'ca.pem');
  ctx.port = await freePort();
  ctx.redis = spawn('redis-server', [
    '--port', '0', '--tls-port', String(ctx.port), '--bind', '127.0.0.1', '--tls-cert-file', join(ctx.dir, 'server.pem'), '--tls-key-file', join(ctx.dir, 'server.key'),
    '--tls-ca-cert-file', ctx.caFile, '--tls-auth-clients', 'no', '--save', '', '--appendonly', 'no', '--dir', ctx.dir,
  ], { stdio: 'ignore' });
  const probe = connectRedis({ url: `rediss://127.0.0.1:${ctx.port}` }, { tls: { ca: certs.caPem }, lazyConnect: true, retryStrategy: () => null, maxRetriesPerRequest: 0 });
  probe.on('error', () => undefined);
  await waitFor('the TLS redis-server to answer', () => probe.connect().then(() => true, () => false), 10_000, 100);
  probe.disconnect();
});

tls.after((ctx) => {
  ctx.redis?.kill('SIGTERM');
  rmSync(ctx.dir, { recursive: true, force: true });
});

tls('the CLI and a web process work over rediss:// with the CA given in NODE_EXTRA_CA_CERTS; without it the CLI says why', async (ctx) => {
  const url = `rediss://127.0.0.1:${ctx.port}`;
  const untrusted = await herald({ REDIS_URL: url, LOG_LEVEL: 'error' }, 'bootstrap', '--workspace', 'tls', '--json');
  assert.is(untrusted.code, 1);
  assert.is(untrusted.stdout, '');
  assert.is(untrusted.stderr, `herald: cannot reach Redis at ${url}: self-signed certificate in certificate chain\n`);

  const env = { REDIS_URL: url, NODE_EXTRA_CA_CERTS: ctx.caFile, LOG_LEVEL: 'error' };
  const boot = await herald(env, 'bootstrap', '--workspace', 'tls', '--json');
  assert.is(boot.code, 0, boot.stderr);
  const { keys } = JSON.parse(boot.stdout);

  const port = await freePort();
  const web = startRoleProcess('web', { ...env, PORT: String(port) });
  try {
    const api = client(`http://127.0.0.1:${port}`);
    // a role process's start on a loaded machine: a CI-like run saw none within 30 s
    await waitFor('the web role to answer', () => fetch(`http://127.0.0.1:${port}/v1/health`).then((r) => r.status > 0, () => false), 60_000, 200).catch((err: Error) => {
      throw new Error(`${err.message}\n${web.output()}`);
    });
    const health = await api.get('/v1/health');
    assert.is(health.body.data.redis.reachable, true);
    assert.is(health.body.data.roles.web, 1);
    const tracked = await api.post('/v1/events', keys.tenant, { externalId: 'tls-user', name: 'tls.works' });
    assert.is(tracked.status, 202, tracked.text);
  } finally {
    await stopRoleProcess(web);
  }
});

tls('REDIS_TLS_REJECT_UNAUTHORIZED=false reaches a rediss:// server whose CA is not trusted (hosted Redis such as Heroku\'s), for Redis only', async (ctx) => {
  const url = `rediss://127.0.0.1:${ctx.port}`;
  const boot = await herald({ REDIS_URL: url, REDIS_TLS_REJECT_UNAUTHORIZED: 'false', LOG_LEVEL: 'error' }, 'bootstrap', '--workspace', 'tls-unverified', '--json');
  assert.is(boot.code, 0, boot.stderr);
  assert.match(JSON.parse(boot.stdout).keys.tenant, /^svc_tn_/);
  const bad = await herald({ REDIS_URL: url, REDIS_TLS_REJECT_UNAUTHORIZED: 'no', LOG_LEVEL: 'error' }, 'bootstrap', '--workspace', 'tls-unverified', '--json');
  assert.is(bad.code, 1);
  assert.match(bad.stderr, /REDIS_TLS_REJECT_UNAUTHORIZED must be true or false, got "no"/);
});

tls.run();
