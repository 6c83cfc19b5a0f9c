import { spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, symlinkSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { ConfigError, loadConfig } from '../../lib/config.js';
import { PROJECT_ROOT } from '../../lib/paths.js';

const config = suite('config');

config('numeric settings are decimal digits within their range; other spellings of a number are refused, naming the setting', () => {
  assert.is(loadConfig({ EVENT_RETENTION_DAYS: '10' }, {}).retentionMs, 10 * 86_400_000);
  assert.is(loadConfig({ EVENT_RETENTION_DAYS: '' }, {}).retentionMs, 30 * 86_400_000, 'empty is the default');
  for (const bad of ['1e1', '0x1e', '30.0', '30.5', ' 30', '+30', '-1', '0', 'abc', '99999999999']) {
    assert.throws(() => loadConfig({ EVENT_RETENTION_DAYS: bad }, {}), (err: Error) => err instanceof ConfigError && err.message === `EVENT_RETENTION_DAYS must be an integer from 1 to 3650, got "${bad}"`, bad);
  }
  assert.throws(() => loadConfig({ PORT: '3e3' }, {}), (err: Error) => err instanceof ConfigError && /^PORT /.test(err.message));
});

config('a REDIS_URL that is not a URL is refused naming the setting (it was \"cannot start: Invalid URL\"), without echoing it (it may hold a password)', () => {
  for (const bad of ['redis://127.0.0.1:notaport', 'redis://:secret@127.0.0.1:99999', 'rediss://[::1']) {
    assert.throws(() => loadConfig({ REDIS_URL: bad }, {}), (err: Error) => err instanceof ConfigError && err.message === 'REDIS_URL is not a valid URL (percent-encode @, :, / and # in a password)', bad);
  }
  assert.is(loadConfig({ REDIS_URL: 'redis://:s%40cret@127.0.0.1:6380/2' }, {}).redisUrl, 'redis://:s%40cret@127.0.0.1:6380/2');
  // the path is the database number or nothing (probe BG: /abc crashed the start with a stack trace, /1x was database 1)
  for (const good of ['redis://127.0.0.1:6380', 'redis://127.0.0.1:6380/', 'redis://127.0.0.1:6380/15']) assert.is(loadConfig({ REDIS_URL: good }, {}).redisUrl, good);
  assert.throws(() => loadConfig({ REDIS_URL: 'redis://:p@ss#x@127.0.0.1:6380' }, {}), (err: Error) => err instanceof ConfigError && err.message === 'REDIS_URL holds a "#": percent-encode it in a password (%23)', 'an unencoded # (the rest was read as the host, and echoed)');
  for (const bad of ['redis://127.0.0.1:6380/?db=abc', 'redis://127.0.0.1:6380?db=3']) {
    assert.throws(() => loadConfig({ REDIS_URL: bad }, {}), (err: Error) => err instanceof ConfigError && err.message === 'REDIS_URL takes no query parameters: give the database as its path (redis://host:6379/2)', bad);
  }
  for (const bad of ['redis://127.0.0.1:6380/abc', 'redis://127.0.0.1:6380/1x', 'redis://127.0.0.1:6380/%202', 'redis://127.0.0.1:6380/1/2']) {
    assert.throws(() => loadConfig({ REDIS_URL: bad }, {}), (err: Error) => err instanceof ConfigError && /^REDIS_URL's path must be a database number/.test(err.message), bad);
  }
});

config('HERALD_TOKEN_SECRET, the events tokens\' HMAC key, is at least 32 characters (probe BG: one character was taken)', () => {
  assert.is(loadConfig({}, {}).tokenSecret, null, 'unset: generated and kept in Redis');
  assert.is(loadConfig({ HERALD_TOKEN_SECRET: 'a'.repeat(32) }, {}).tokenSecret, 'a'.repeat(32));
  for (const bad of ['x', 'a'.repeat(31)]) {
    assert.throws(() => loadConfig({ HERALD_TOKEN_SECRET: bad }, {}), (err: Error) => err instanceof ConfigError && err.message === `HERALD_TOKEN_SECRET must be at least 32 characters (it signs events tokens; make one with: openssl rand -hex 32), got ${bad.length}`, bad);
  }
});

config('the embedded Redis data folder is in the project folder whatever the working directory: `npx herald` from a subfolder finds the server `npm start` runs', () => {
  // npm start runs in the project folder; npx keeps the caller's. A data folder relative to the
  // working directory made the CLI start a second, empty embedded server under <subfolder>/var.
  const script = `import { loadConfig } from ${JSON.stringify(join(PROJECT_ROOT, 'lib', 'config.ts'))}; import { resolve } from 'node:path';
    process.stdout.write(JSON.stringify([resolve(loadConfig({}, {}).dataDir), resolve(loadConfig({ HERALD_DATA_DIR: 'data/herald' }, {}).dataDir), resolve(loadConfig({ HERALD_DATA_DIR: '/srv/herald' }, {}).dataDir)]));`;
  for (const cwd of [join(PROJECT_ROOT, 'docs'), tmpdir()]) {
    const run = spawnSync(process.execPath, ['--import', import.meta.resolve('tsx'), '--input-type=module', '-e', script], { cwd, encoding: 'utf8', env: { ...process.env, HERALD_DATA_DIR: '' } });
    assert.is(run.status, 0, run.stderr);
    assert.equal(JSON.parse(run.stdout), [join(PROJECT_ROOT, 'var'), join(PROJECT_ROOT, 'data', 'herald'), resolve('/srv/herald')], cwd);
  }
});

config('NODE_ENV production, in any case and with spaces around, turns on production rules; anything else does not (probe I: " production" and "Production" left webhook URLs free of the https rule)', () => {
  for (const on of ['production', ' production', 'Production', 'PRODUCTION\n']) assert.is(loadConfig({ NODE_ENV: on }, {}).production, true, JSON.stringify(on));
  for (const off of [undefined, '', 'development', 'test', 'prod', 'productions']) assert.is(loadConfig(off === undefined ? {} : { NODE_ENV: off }, {}).production, false, JSON.stringify(off));
});

config('REDIS_TLS_REJECT_UNAUTHORIZED is true unless set to false (or 0); anything else is refused', () => {
  assert.is(loadConfig({}, {}).redisTlsRejectUnauthorized, true);
  assert.is(loadConfig({ REDIS_TLS_REJECT_UNAUTHORIZED: 'false' }, {}).redisTlsRejectUnauthorized, false);
  assert.is(loadConfig({ REDIS_TLS_REJECT_UNAUTHORIZED: '0' }, {}).redisTlsRejectUnauthorized, false);
  assert.is(loadConfig({ REDIS_TLS_REJECT_UNAUTHORIZED: 'true' }, {}).redisTlsRejectUnauthorized, true);
  assert.throws(() => loadConfig({ REDIS_TLS_REJECT_UNAUTHORIZED: 'off' }, {}), /REDIS_TLS_REJECT_UNAUTHORIZED must be true or false/);
});

config('lists are checked when the config is loaded, naming the setting (probe V): private networks, roles named twice, retry schedules with an empty entry, more delays than attempts or a delay over 7 days; LOG_LEVEL says what it got', () => {
  const refused = (env: Record<string, string>, message: RegExp) => assert.throws(() => loadConfig(env, {}), (err: Error) => err instanceof ConfigError && message.test(err.message), JSON.stringify(env));
  for (const bad of ['garbage', '10.0.0.0/33', '10.0.0.1', '127.0.0.0/8,nope']) refused({ WEBHOOK_ALLOW_PRIVATE_NETWORKS: bad }, /^WEBHOOK_ALLOW_PRIVATE_NETWORKS: "[^"]+" is not a CIDR/);
  assert.equal(loadConfig({ WEBHOOK_ALLOW_PRIVATE_NETWORKS: '127.0.0.0/8, ::1/128' }, {}).webhookAllowPrivateNetworks, ['127.0.0.0/8', '::1/128']);
  refused({ HERALD_ROLES: 'web,worker,worker' }, /^HERALD_ROLES: "worker" is named twice$/);
  assert.equal(loadConfig({ HERALD_ROLES: 'worker,web' }, {}).roles, ['worker', 'web']);
  // empty or blank is every role; an empty entry is a slip, refused (probe G: `,` started all four)
  for (const all of ['', '  ']) assert.equal(loadConfig({ HERALD_ROLES: all }, {}).roles, ['web', 'worker', 'dispatcher', 'scheduler']);
  for (const slip of [',', ',,', ' , ', 'web,', ',worker']) refused({ HERALD_ROLES: slip }, /^HERALD_ROLES: an entry is empty in /);
  refused({ WEBHOOK_RETRY_SCHEDULE: '5m,,30m' }, /^WEBHOOK_RETRY_SCHEDULE: "" is not a duration/);
  refused({ WEBHOOK_RETRY_SCHEDULE: Array(10).fill('1s').join(',') }, /^WEBHOOK_RETRY_SCHEDULE lists 10 delays; at most 9 are used/);
  refused({ WEBHOOK_RETRY_SCHEDULE: '5m,8d' }, /^WEBHOOK_RETRY_SCHEDULE: "8d" is longer than 7d$/);
  refused({ WEBHOOK_RETRY_SCHEDULE: '0s,5m' }, /^WEBHOOK_RETRY_SCHEDULE: "0s" is no delay; each is at least 1s$/);
  // empty is unset, as for every setting (probe AP: refused; an empty REDIS_KEY_PREFIX wrote keys unprefixed)
  assert.equal(loadConfig({ WEBHOOK_RETRY_SCHEDULE: '' }, {}).webhookRetryScheduleMs, loadConfig({}, {}).webhookRetryScheduleMs);
  assert.equal(loadConfig({ WEBHOOK_RETRY_SCHEDULE: ' ' }, {}).webhookRetryScheduleMs.length, 6);
  assert.is(loadConfig({ REDIS_KEY_PREFIX: '' }, {}).keyPrefix, 'herald:');
  assert.is(loadConfig({ REDIS_KEY_PREFIX: 'acme:' }, {}).keyPrefix, 'acme:');
  assert.equal(loadConfig({ WEBHOOK_RETRY_SCHEDULE: Array(9).fill('1s').join(',') }, {}).webhookRetryScheduleMs.length, 9);
  assert.equal(loadConfig({ WEBHOOK_RETRY_SCHEDULE: '1s, 7d' }, {}).webhookRetryScheduleMs, [1_000, 7 * 86_400_000]);
  refused({ LOG_LEVEL: 'verbose' }, /^LOG_LEVEL must be one of debug, info, warn, error, got "verbose"$/);
  assert.is(loadConfig({ LOG_LEVEL: '' }, {}).logLevel, 'info', 'empty is unset, as for every setting');
});

config('every setting lib/config.ts reads is in the README\'s configuration table', () => {
  const source = readFileSync(join(PROJECT_ROOT, 'lib', 'config.ts'), 'utf8');
  const read = new Set([...source.matchAll(/\be\.([A-Z][A-Z0-9_]+)|\(e, '([A-Z][A-Z0-9_]+)'/g)].map((m) => m[1] ?? m[2]!));
  const readme = readFileSync(join(PROJECT_ROOT, 'README.md'), 'utf8');
  const documented = new Set(readme.split('\n').filter((line) => line.startsWith('| `')).flatMap((line) => [...line.split('|')[1]!.matchAll(/`([A-Z][A-Z0-9_]+)`/g)].map((m) => m[1]!)));
  assert.ok(read.size >= 30, `${read.size} settings read`);
  assert.equal([...read].filter((name) => !documented.has(name)).sort(), [], 'settings missing from the README table');
});

config('only this project\'s own npm start makes the service stop with its parent; another npm script\'s children, which inherit npm\'s variables, do not (probe EN: a script starting it in the background stopped it, or not, by timing)', () => {
  const own = resolve(PROJECT_ROOT, 'package.json');
  assert.is(loadConfig({ npm_lifecycle_event: 'start', npm_package_json: own }, {}).stopWithParent, true);
  assert.is(loadConfig({ npm_lifecycle_event: 'herald:bg', npm_package_json: own }, {}).stopWithParent, false, 'another script of this project');
  assert.is(loadConfig({ npm_lifecycle_event: 'start', npm_package_json: '/srv/app/package.json' }, {}).stopWithParent, false, 'another project\'s start');
  assert.is(loadConfig({}, {}).stopWithParent, false, 'no npm');
  // npm gives the folder as typed: a linked prefix (`npm --prefix /srv/current start`) is this project still (probe EW)
  const dir = mkdtempSync(join(tmpdir(), 'herald-prefix-'));
  try {
    symlinkSync(PROJECT_ROOT, join(dir, 'current'));
    assert.is(loadConfig({ npm_lifecycle_event: 'start', npm_package_json: join(dir, 'current', 'package.json') }, {}).stopWithParent, true, 'through a link');
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

config.run();
