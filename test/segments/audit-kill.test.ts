import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { isoNow } from '../../lib/clock.js';
import { newId } from '../../lib/ids.js';
import { sameJson } from '../../streams/ledger.js';
import { callScript } from '../../streams/lua-scripts.js';
import { PENDING, SEGMENT_AUDITS, loadSegments, type Segment } from '../../streams/segments.js';
import { loadWorkflows, type Workflow } from '../../streams/workflows.js';
import { assertSweptOnce, auditEntries, startDiedWriterCtx, startWebProcess, sweepWithWorker, tenantIntent, type DiedWriterCtx } from '../helpers/audit.js';
import { stopRoleProcess, type RoleProcess } from '../helpers/processes.js';
import { bootstrapWorkspace, startTestService, type TestService } from '../helpers/service.js';
import { waitFor } from '../helpers/wait.js';

const PRO = { attribute: 'plan', eq: 'pro' };
const ACTIVE = { all: [PRO, { event: 'app.opened', count: { gte: 3 }, within: '7d' }] };

type Ctx = DiedWriterCtx;
const died = suite<Ctx>('segment writes whose writer died after the script');

died.before((ctx) => startDiedWriterCtx(ctx, 'segment-audit-died'));
died.after(async ({ service }) => service.stop());

/** Puts members in the partitions' member sets of a segment (one after another), as the workers would. */
async function addMembers(ctx: Ctx, segmentId: string, ...externalIds: string[]) {
  const { redis, keys, config } = ctx.service;
  for (const [i, x] of externalIds.entries()) await redis.zadd(keys.segmentMembers(i % config.partitions, ctx.tenant.id, segmentId), 0, x);
}

died('a create: the sweeper appends segment.created, the segment as the API reads it', async (ctx) => {
  const { service, api, key, tenant } = ctx;
  const { redis, keys } = service;
  const id = newId('segment');
  const at = isoNow();
  const segment: Segment = { id, slug: 'died-create', name: 'Died', description: null, where: PRO, memberCount: 0, backfill: { ...PENDING }, createdAt: at, updatedAt: at };
  const intent = tenantIntent(ctx, 'segment.create', segment);
  const reply = await callScript<[number, string]>(redis, 'createSegment',
    [keys.segmentSlugs(tenant.id), keys.segmentIndex(tenant.id), keys.segment(tenant.id, id), keys.automationVersion(tenant.id), intent.key],
    [id, segment.slug, 'Died', '', JSON.stringify(PRO), JSON.stringify(PENDING), at, 100, intent.token, intent.json]);
  assert.equal(reply, [1, id]);
  const [expected] = SEGMENT_AUDITS['segment.create'](segment, reply);
  await assertSweptOnce(service, intent, [expected!]);
  assert.equal(expected!.object, (await api.get('/v1/segments/died-create', key)).body.data);

  const taken = tenantIntent(ctx, 'segment.create', segment);
  const again = await callScript<[number, string]>(redis, 'createSegment',
    [keys.segmentSlugs(tenant.id), keys.segmentIndex(tenant.id), keys.segment(tenant.id, newId('segment')), keys.automationVersion(tenant.id), taken.key],
    [id, segment.slug, '', '', JSON.stringify(PRO), JSON.stringify(PENDING), at, 100, taken.token, taken.json]);
  assert.equal(again, [0, id]);
  assert.is(await redis.hlen(taken.key), 0, 'a create that wrote nothing records no intent');
});

died('an update: the sweeper appends segment.updated with changes, previousAttributes and the member count read before', async (ctx) => {
  const { service, api, key, tenant } = ctx;
  const { redis, keys } = service;
  const created = (await api.post('/v1/segments', key, { slug: 'died-update', name: 'Before', where: PRO })).body.data;
  await addMembers(ctx, created.id, 'a', 'b');
  const current = (await api.get('/v1/segments/died-update', key)).body.data as Segment;
  assert.is(current.memberCount, 2);
  const update = async (fields: string[]) => {
    const intent = tenantIntent(ctx, 'segment.update', current.memberCount);
    const reply = await callScript<[number, string[], string[], number]>(redis, 'updateSegment',
      [keys.segment(tenant.id, created.id), keys.automationVersion(tenant.id), intent.key],
      [isoNow(), JSON.stringify(PENDING), intent.token, intent.json, String(fields.length / 2), ...fields]);
    return { intent, reply };
  };
  const { intent, reply } = await update(['name', 'After', 'where', JSON.stringify(ACTIVE)]);
  assert.is(reply[3], 1, 'the rule changed');
  const [expected] = SEGMENT_AUDITS['segment.update'](current.memberCount, reply);
  assert.equal(expected!.changes, { name: 'After', where: ACTIVE });
  assert.equal(expected!.previousAttributes, { name: 'Before', where: PRO });
  await assertSweptOnce(service, intent, [expected!]);
  assert.equal(expected!.object, (await api.get('/v1/segments/died-update', key)).body.data);

  const same = await update(['name', 'After']);
  assert.is(same.reply[0], 1);
  assert.is(await redis.hlen(same.intent.key), 0, 'an update that changed nothing records no intent');
});

died('a delete: the sweeper appends segment.deleted, the segment as it was with its members', async (ctx) => {
  const { service, api, key, tenant } = ctx;
  const { redis, keys } = service;
  await api.post('/v1/segments', key, { slug: 'died-delete', name: 'Gone', where: PRO });
  const before = (await api.get('/v1/segments/died-delete', key)).body.data as Segment;
  await addMembers(ctx, before.id, 'a', 'b', 'c');
  const intent = tenantIntent(ctx, 'segment.delete', 3);
  const reply = await callScript<[number, string[]]>(redis, 'deleteSegment',
    [keys.segmentSlugs(tenant.id), keys.segmentIndex(tenant.id), keys.segment(tenant.id, before.id), keys.automationVersion(tenant.id), intent.key],
    [before.id, intent.token, intent.json]);
  assert.is(reply[0], 1);
  const [expected] = SEGMENT_AUDITS['segment.delete'](3, reply);
  assert.equal(expected!.object, { ...before, memberCount: 3 });
  await assertSweptOnce(service, intent, [expected!]);
  assert.is((await api.get('/v1/segments/died-delete', key)).status, 404);
  // the partition half the writer never made is made by the sweep (probe EF: the member sets stayed for good)
  for (let p = 0; p < service.config.partitions; p++) {
    assert.is(await redis.exists(keys.segmentMembers(p, tenant.id, before.id)), 0, `no member set left in p${p}`);
    assert.ok(await redis.zscore(keys.deletedSegments(p), `${tenant.id}|${before.id}`), `listed as deleted in p${p}`);
  }

  const gone = tenantIntent(ctx, 'segment.delete', 0);
  assert.equal(await callScript(redis, 'deleteSegment',
    [keys.segmentSlugs(tenant.id), keys.segmentIndex(tenant.id), keys.segment(tenant.id, before.id), keys.automationVersion(tenant.id), gone.key],
    [before.id, gone.token, gone.json]), [0]);
  assert.is(await redis.hlen(gone.key), 0, 'a delete that found nothing records no intent');
});

died.run();

// ---------------------------------------------------------------------------------------------

type KillCtx = { service: TestService; webs: RoleProcess[]; worker?: RoleProcess };
const kill = suite<KillCtx>('segment and workflow audit entries survive web processes killed mid-write');

kill.before(async (ctx) => {
  ctx.service = await startTestService('segment-audit-kill');
  ctx.webs = [];
});
kill.after(async (ctx) => {
  for (const web of ctx.webs) await stopRoleProcess(web);
  if (ctx.worker) await stopRoleProcess(ctx.worker);
  await ctx.service.stop();
});

/** Web processes, each with clients of its own; a client owns one segment slug and one workflow slug (a record is written by one client, one request at a time). */
const WEB_PROCESSES = 3;
const CLIENTS_PER_PROCESS = 24;
/** Writes answered by the first process before its SIGKILL; the second is killed after twice as many, and so on. */
const WRITES_BEFORE_KILL = 250;
const KINDS = ['segment', 'workflow'] as const;
type Kind = (typeof KINDS)[number];
/** The fields an entry's object must share with the record as it is, when it is the record's newest entry. */
const STATE: Record<Kind, string[]> = {
  segment: ['name', 'description', 'where', 'updatedAt'],
  workflow: ['name', 'description', 'enabled', 'version', 'versionId', 'trigger', 'steps', 'cancelOn', 'updatedAt'],
};
const STEPS = [{ type: 'send', message: { title: 'Hi', body: 'Welcome.' } }];
type Request = { method: 'POST' | 'PATCH' | 'DELETE'; path: string; body?: unknown };

/**
 * The request of the n-th write a client makes to one of its records (`exists`: as it knows):
 * create, update, delete, and again. Every other segment update changes its rule, every workflow
 * update its trigger (a new version).
 */
function requestOf(kind: Kind, slug: string, exists: boolean, n: number): Request {
  const base = `/v1/${kind}s`;
  if (!exists) {
    return kind === 'segment'
      ? { method: 'POST', path: base, body: { slug, name: `n${n}`, where: PRO } }
      : { method: 'POST', path: base, body: { slug, name: `n${n}`, trigger: { event: 'user.joined' }, steps: STEPS } };
  }
  if (n % 3 === 2) return { method: 'DELETE', path: `${base}/${slug}` };
  const body: Record<string, unknown> = { name: `n${n}`, description: n % 5 === 0 ? null : `d${n}` };
  if (kind === 'segment') body.where = n % 2 ? ACTIVE : PRO;
  else Object.assign(body, { enabled: n % 2 === 0, trigger: { event: `user.event${n % 7}` } });
  return { method: 'PATCH', path: `${base}/${slug}`, body };
}

/** Sends a write, its answer unchecked against the API's schema: the load is on the web process, not on this one. */
async function send(url: string, key: string, req: Request): Promise<{ status: number; body: any }> {
  const headers: Record<string, string> = { authorization: `Bearer ${key}` };
  if (req.body !== undefined) headers['content-type'] = 'application/json';
  const res = await fetch(url + req.path, { method: req.method, headers, body: req.body === undefined ? undefined : JSON.stringify(req.body) });
  return { status: res.status, body: await res.json() };
}

/**
 * The ledger invariant of one kind, as a list of what breaks it: every record that exists has
 * exactly one `created` event and no `deleted`, and its newest entry describes it as it is; every
 * record that no longer exists has one `created` and its newest entry is its `deleted`; there is
 * no entry of a record that never existed.
 */
function violations(kind: Kind, entries: any[], current: Map<string, Record<string, unknown>>, known: Set<string>): string[] {
  const byTarget = new Map<string, any[]>();
  const seen = new Set<string>();
  for (const e of entries) {
    if (e.target.type !== kind || seen.has(e.id)) continue; // an append repeated after a crash has the same event id
    seen.add(e.id);
    byTarget.set(e.target.id, [...(byTarget.get(e.target.id) ?? []), e]);
  }
  const bad: string[] = [];
  for (const id of new Set([...current.keys(), ...known, ...byTarget.keys()])) {
    const mine = byTarget.get(id) ?? [];
    const created = mine.filter((e) => e.type === `${kind}.created`).length;
    const newest = mine[mine.length - 1];
    const record = current.get(id);
    if (!record && !known.has(id)) bad.push(`${id}: entries of a ${kind} that never existed`);
    else if (created !== 1) bad.push(`${id}: ${created} ${kind}.created`);
    else if (record && !STATE[kind].every((f) => sameJson(newest.data.object[f], record[f]))) bad.push(`${id}: newest entry (${newest.type}) is not its state`);
    else if (!record && newest.type !== `${kind}.deleted`) bad.push(`${id}: deleted, newest entry ${newest.type}`);
  }
  return bad;
}

kill('after SIGKILLs of web processes under concurrent segment and workflow writes, the ledger tells each record\'s story to its end', async (ctx) => {
  const { service } = ctx;
  const { redis, keys } = service;
  const boot = await bootstrapWorkspace(service, 'segment-kill');
  const tenantId = boot.tenant.id;
  const started = await Promise.all(Array.from({ length: WEB_PROCESSES }, () => startWebProcess(service)));
  ctx.webs = started.map((s) => s.web);

  const known: Record<Kind, Set<string>> = { segment: new Set(), workflow: new Set() };
  const unexpected: string[] = [];
  // each web process has its clients, each client its records; a process is killed after its clients had that many answers
  const killed = started.map(async ({ web, url }, w) => {
    let done = 0;
    let stop = false;
    const load = async (c: number) => {
      const records = KINDS.map((kind) => ({ kind, slug: `${kind}-${w}-${c}`, exists: false, writes: 0 }));
      for (let i = c; !stop; i++) {
        const record = records[i % records.length]!;
        const req = requestOf(record.kind, record.slug, record.exists, record.writes++);
        const res = await send(url, boot.keys.tenant, req).catch(() => null);
        if (!res) return; // the process is gone
        if (res.status !== (req.method === 'POST' ? 201 : 200)) return void unexpected.push(`${req.method} ${req.path}: ${res.status} ${JSON.stringify(res.body)}`);
        if (req.method === 'POST') known[record.kind].add(res.body.data.id);
        record.exists = req.method !== 'DELETE';
        done++;
      }
    };
    const clients = Array.from({ length: CLIENTS_PER_PROCESS }, (_, c) => load(c));
    await waitFor('writes to be made', async () => done >= (w + 1) * WRITES_BEFORE_KILL || unexpected.length > 0, 60_000, 5);
    web.child.kill('SIGKILL');
    await web.exited;
    stop = true;
    await Promise.all(clients);
    return done;
  });
  const done = (await Promise.all(killed)).reduce((a, b) => a + b, 0);
  const { worker, left } = await sweepWithWorker(started[0]!.env, redis, keys.tenantOutbox(tenantId));
  ctx.worker = worker;
  assert.equal(unexpected, [], 'every write answered as the client expected');

  const entries = await auditEntries(service, boot.workspace.id);
  const current: Record<Kind, Map<string, Record<string, unknown>>> = {
    segment: new Map((await loadSegments(redis, keys, tenantId, service.config.partitions, await redis.zrange(keys.segmentIndex(tenantId), 0, -1)))
      .filter((s): s is Segment => s !== null).map((s) => [s.id, s])),
    workflow: new Map((await loadWorkflows(redis, keys, tenantId, await redis.zrange(keys.workflowIndex(tenantId), 0, -1)))
      .filter((w): w is Workflow => w !== null).map((w) => [w.id, w])),
  };
  for (const kind of KINDS) {
    const bad = violations(kind, entries, current[kind], known[kind]);
    const records = new Set([...current[kind].keys(), ...known[kind]]).size;
    assert.equal(bad, [], `${bad.length} of ${records} ${kind}s break the ledger invariant (${done} writes answered, ${left} intents left by the killed processes)`);
  }
});

kill.run();
