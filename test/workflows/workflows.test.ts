import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { newId } from '../../lib/ids.js';
import { DefinitionsCache, GONE_NAMES_KEEP_MS } from '../../streams/automation-definitions.js';
import { client } from '../helpers/api.js';
import { bootstrapWorkspace, makeKey, startTestService, type TestService } from '../helpers/service.js';

type Ctx = { service: TestService; api: ReturnType<typeof client>; key: string; workspaceKey: string; workspaceId: string; tenantId: string; partitions: number };
const workflows = suite<Ctx>('workflows');

workflows.before(async (ctx) => {
  ctx.service = await startTestService('workflows');
  ctx.api = client(ctx.service.url);
  const { keys, workspace, tenant } = await bootstrapWorkspace(ctx.service, 'workflows');
  ctx.key = keys.tenant;
  ctx.workspaceKey = keys.workspace;
  ctx.workspaceId = workspace.id;
  ctx.tenantId = tenant.id;
  ctx.partitions = ctx.service.config.partitions;
});
workflows.after(async (ctx) => ctx.service.stop());

const ISO = /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/;
const TRIGGER = { event: 'user.signed_up', where: { attribute: 'plan', ne: 'enterprise' } };
const WELCOME = [
  { type: 'send', name: 'welcome', message: { title: 'Welcome!', body: 'Glad you are here.', url: 'myapp://home' } },
  { type: 'sleep', duration: '1d' },
  {
    type: 'branch', name: 'opened',
    if: { event: '$app.opened', count: { gte: 1 }, within: '1d' },
    then: [{ type: 'exit' }],
    else: [{ type: 'send', message: { title: 'Missed you', body: 'Come and see what is new.', category: 'onboarding' } }],
  },
];
const CANCEL = { event: 'user.deleted_account' };
const body = (slug: string, extra: Record<string, unknown> = {}) => ({ slug, trigger: TRIGGER, steps: WELCOME, ...extra });

const version = async ({ service, tenantId }: Ctx) => Number((await service.redis.get(service.keys.automationVersion(tenantId))) ?? 0);

workflows('a workflow is created at version 1, enabled, stored for the workers and read back by slug', async (ctx) => {
  const { api, key, service, tenantId } = ctx;
  const before = await version(ctx);
  const created = await api.post('/v1/workflows', key, body('welcome-series', { name: 'Welcome series', description: 'Onboarding', cancelOn: CANCEL }));
  assert.is(created.status, 201);
  const wf = created.body.data;
  assert.match(wf.id, /^wfl_/);
  assert.match(wf.versionId, /^wfv_/);
  assert.equal({ ...wf, id: 'x', versionId: 'x', createdAt: 'x', updatedAt: 'x' }, {
    id: 'x', slug: 'welcome-series', name: 'Welcome series', description: 'Onboarding', enabled: true, version: 1, versionId: 'x',
    trigger: TRIGGER, steps: WELCOME, cancelOn: CANCEL, createdAt: 'x', updatedAt: 'x',
  });
  assert.match(wf.createdAt, ISO);
  assert.equal((await api.get('/v1/workflows/welcome-series', key)).body.data, wf);

  const { redis, keys } = service;
  assert.equal(await redis.hgetall(keys.workflow(tenantId, wf.id)), {
    id: wf.id, slug: 'welcome-series', name: 'Welcome series', description: 'Onboarding', enabled: '1', version: '1', versionId: wf.versionId, createdAt: wf.createdAt, updatedAt: wf.createdAt,
  });
  const v1 = await redis.hgetall(keys.workflowVersion(tenantId, wf.versionId));
  assert.equal({ ...v1, definition: JSON.parse(v1.definition!) }, { id: wf.versionId, workflowId: wf.id, version: '1', definition: { trigger: TRIGGER, steps: WELCOME, cancelOn: CANCEL }, createdAt: wf.createdAt });
  assert.equal(Object.keys(JSON.parse(v1.definition!)), ['trigger', 'steps', 'cancelOn']);
  assert.equal(await redis.zrange(keys.workflowVersions(tenantId, wf.id), 0, -1, 'WITHSCORES'), [wf.versionId, '1']);
  assert.is(await redis.hget(keys.workflowSlugs(tenantId), 'welcome-series'), wf.id);
  assert.is(await redis.zscore(keys.workflowIndex(tenantId), wf.id), '0');
  assert.is(await version(ctx), before + 1);
});

workflows('without cancelOn the record says null and the stored definition leaves it out; enabled may start false', async ({ api, key, service, tenantId }) => {
  const res = await api.post('/v1/workflows', key, body('quiet', { enabled: false, cancelOn: null }));
  assert.is(res.status, 201);
  assert.is(res.body.data.cancelOn, null);
  assert.is(res.body.data.enabled, false);
  assert.is(res.body.data.name, null);
  const v1 = await service.redis.hget(service.keys.workflowVersion(tenantId, res.body.data.versionId), 'definition');
  assert.equal(Object.keys(JSON.parse(v1!)), ['trigger', 'steps']);
  assert.is(await service.redis.hget(service.keys.workflow(tenantId, res.body.data.id), 'enabled'), '0');
});

workflows('the definition language: waits with timeouts, reserved triggers, nested steps up to 5 levels, 50 steps', async ({ api, key }) => {
  const wait = {
    type: 'wait', name: 'await-payment', event: 'checkout.paid', where: { property: 'total', gte: 10 }, timeout: '2h',
    onEvent: [{ type: 'send', message: { title: 'Thanks', body: 'Payment received' } }],
    onTimeout: [{ type: 'send', message: { title: 'Still there?', body: 'Your cart is waiting', priority: 'normal', ttl: 3600, badge: 1 } }],
  };
  assert.is((await api.post('/v1/workflows', key, { slug: 'cart', trigger: { event: 'checkout.started' }, steps: [wait] })).status, 201);
  assert.is((await api.post('/v1/workflows', key, { slug: 'on-open', trigger: { event: '$app.opened' }, steps: [{ type: 'exit' }] })).status, 201);
  const nest = (n: number): unknown[] => (n === 0 ? [{ type: 'sleep', duration: '1s' }] : [{ type: 'branch', if: { attribute: 'a', eq: 1 }, then: nest(n - 1) }]);
  assert.is((await api.post('/v1/workflows', key, { slug: 'deep', trigger: { event: 'x' }, steps: nest(4) })).status, 201, '5 levels');
  const fifty = Array.from({ length: 50 }, () => ({ type: 'sleep', duration: '90d' }));
  assert.is((await api.post('/v1/workflows', key, { slug: 'fifty', trigger: { event: 'x' }, steps: fifty })).status, 201);
});

workflows('a definition is at most 64 KB serialized, a PATCH\'s merged with the current version; a refused one stores nothing (probe D1: 838 KB, a 2.45 MB webhook payload)', async ({ api, key }) => {
  // sends of ~4 KB payloads: each step within its own bounds, 50 steps in all over the whole
  const send = (n: number) => ({ type: 'send', message: { title: 't', body: 'b', data: { pad: 'x'.repeat(n) } } });
  const steps = (count: number, n: number) => Array.from({ length: count }, () => send(n));
  const sizeOf = (def: unknown) => Buffer.byteLength(JSON.stringify(def));
  // find the largest padding that fits exactly, then one byte over
  const fixed = sizeOf({ trigger: { event: 'x' }, steps: steps(20, 0) });
  const pad = Math.floor((65_536 - fixed) / 20);
  const fits = { trigger: { event: 'x' }, steps: steps(20, pad) };
  assert.ok(sizeOf(fits) <= 65_536 && sizeOf(fits) > 65_536 - 20);
  assert.is((await api.post('/v1/workflows', key, { slug: 'big-fits', ...fits })).status, 201);
  const over = { trigger: { event: 'x' }, steps: [...steps(19, pad), send(pad + 20)] };
  assert.ok(sizeOf(over) > 65_536);
  const refused = await api.post('/v1/workflows', key, { slug: 'big-over', ...over });
  assert.is(refused.status, 400);
  assert.is(refused.body.error.code, 'validation');
  assert.equal(refused.body.error.details.map((d: any) => d.param), ['body']);
  assert.match(refused.body.error.details[0].message, /at most 65536/);
  assert.is((await api.get('/v1/workflows/big-over', key)).status, 404);
  // a PATCH of the trigger alone, with a where that takes the stored steps over the bound
  const where = { all: Array.from({ length: 40 }, (_, i) => ({ attribute: `a${i}`, in: Array.from({ length: 20 }, (_, k) => `value-${i}-${k}`) })) };
  const patched = await api.patch('/v1/workflows/big-fits', key, { trigger: { event: 'x', where } });
  assert.is(patched.status, 400, patched.text);
  assert.equal(patched.body.error.details.map((d: any) => d.param), ['body']);
  const stored = (await api.get('/v1/workflows/big-fits', key)).body.data;
  assert.equal([stored.version, stored.trigger], [1, { event: 'x' }], 'nothing changed');
});

workflows('problems in a definition are validation details with exact paths, all of them at once', async (ctx) => {
  const { api, key } = ctx;
  const cases: [unknown, string][] = [
    [{ trigger: { event: 'a', where: { all: [{ attribute: 'plan', eq: 'pro' }, { attribute: 'seats', eq: { many: true } }] } }, steps: WELCOME }, 'trigger.where.all[1].eq'],
    [{ trigger: { event: 'Not A Name' }, steps: WELCOME }, 'trigger.event'],
    [{ trigger: { event: '$not.reserved' }, steps: WELCOME }, 'trigger.event'],
    // names ingest refuses (a `$` not in front): no event could ever start the run
    [{ trigger: { event: 'order$paid' }, steps: WELCOME }, 'trigger.event'],
    [{ trigger: { event: 'a' }, steps: [{ type: 'wait', event: 'order.$x', timeout: '1h' }] }, 'steps[0].event'],
    [{ trigger: { event: 'a', where: { event: 'x$y' } }, steps: WELCOME }, 'trigger.where.event'],
    [{ trigger: { event: '$subscriber.deleted' }, steps: WELCOME }, 'trigger.event'],
    // nor can it resume or cancel a run: deleting the subscriber cancels its runs first (probe W)
    [{ trigger: { event: 'a' }, steps: [{ type: 'wait', event: '$subscriber.deleted', timeout: '1h' }] }, 'steps[0].event'],
    [{ trigger: { event: 'a' }, steps: WELCOME, cancelOn: { event: '$subscriber.deleted' } }, 'cancelOn.event'],
    [{ trigger: { event: 'a' }, steps: [{ type: 'branch', if: { attribute: 'a', eq: 1 }, then: [{ type: 'sleep', duration: '91d' }] }] }, 'steps[0].then[0].duration'],
    [{ trigger: { event: 'a' }, steps: [{ type: 'sleep', duration: '0s' }] }, 'steps[0].duration'],
    [{ trigger: { event: 'a' }, steps: [{ type: 'sleep', duration: 90 }] }, 'steps[0].duration'],
    [{ trigger: { event: 'a' }, steps: [{ type: 'wait', event: 'b', timeout: '1d', onEvent: [] }] }, 'steps[0].onEvent'],
    [{ trigger: { event: 'a' }, steps: [{ type: 'wait', event: 'b' }] }, 'steps[0].timeout'],
    [{ trigger: { event: 'a' }, steps: [{ type: 'branch', if: { attribute: 'a', eq: 1 }, then: [] }] }, 'steps[0].then'],
    [{ trigger: { event: 'a' }, steps: [{ type: 'branch', if: { attribute: 'a', eq: 1 }, then: [{ type: 'exit' }], else: [] }] }, 'steps[0].else'],
    [{ trigger: { event: 'a' }, steps: [{ type: 'branch', if: { attribute: 'a', eq: 1 } }] }, 'steps[0]'],
    [{ trigger: { event: 'a' }, steps: [{ type: 'sleep', duration: '1m' }, { type: 'exit' }, { type: 'sleep', duration: '1m' }] }, 'steps[2]'],
    [{ trigger: { event: 'a' }, steps: Array.from({ length: 51 }, () => ({ type: 'sleep', duration: '1s' })) }, 'steps'],
    [{ trigger: { event: 'a' }, steps: [] }, 'steps'],
    [{ trigger: { event: 'a' }, steps: [{ type: 'goto', to: 'steps[0]' }] }, 'steps[0].type'],
    [{ trigger: { event: 'a' }, steps: [{ type: 'sleep', duration: '1s', then: [] }] }, 'steps[0].then'],
    [{ trigger: { event: 'a' }, steps: [{ type: 'send', message: { title: 'no body' } }] }, 'steps[0].message.body'],
    [{ trigger: { event: 'a' }, steps: [{ type: 'send', message: { title: 't', body: 'b', sendAt: '2030-01-01T00:00:00Z' } }] }, 'steps[0].message.sendAt'],
    [{ trigger: { event: 'a' }, steps: [{ type: 'send', message: { title: 't', body: 'b', data: { aps: {} } } }] }, 'steps[0].message.data.aps'],
    [{ trigger: { event: 'a' }, steps: [{ type: 'send', message: { title: 't', body: 'b', priority: 'urgent' } }] }, 'steps[0].message.priority'],
    [{ trigger: { event: 'a' }, steps: [{ type: 'sleep', duration: '1s', name: 'Bad Name' }] }, 'steps[0].name'],
    [{ trigger: { event: 'a' }, steps: [{ type: 'sleep', duration: '1s', name: 'twice' }, { type: 'wait', name: 'twice', event: 'b', timeout: '1h' }] }, 'steps[1].name'],
    [{ trigger: { event: 'a' }, steps: WELCOME, cancelOn: { event: 'b', where: { any: [] } } }, 'cancelOn.where.any'],
    [{ trigger: { event: 'a' }, steps: [{ type: 'wait', event: 'b', timeout: '1h', where: { attribute: 'x', eq: 1, gt: 2 } }] }, 'steps[0].where'],
    [{ steps: WELCOME }, 'trigger'],
    [{ trigger: { event: 'a' } }, 'steps'],
    [{ trigger: { event: 'a' }, steps: WELCOME, enabled: 'yes' }, 'enabled'],
    [{ trigger: { event: 'a' }, steps: WELCOME, version: 3 }, 'version'],
  ];
  for (const [input, param] of cases) {
    const res = await api.post('/v1/workflows', key, { slug: 'invalid', ...(input as object) });
    assert.is(res.status, 400, `${param}: ${JSON.stringify(input).slice(0, 100)}`);
    assert.is(res.body.error.code, 'validation');
    assert.ok(res.body.error.details.some((d: any) => d.param === param), `${param} in ${JSON.stringify(res.body.error.details)}`);
  }
  // the document states the step name rule as a pattern, not only in words (probe F1)
  const doc = (await (await fetch(`${ctx.service.url}/v1/openapi.json`)).json()) as any;
  assert.is(doc.components.schemas.WorkflowStep.properties.name.pattern, '^[a-z0-9][a-z0-9_-]{0,47}$');
  const nest = (n: number): unknown[] => (n === 0 ? [{ type: 'exit' }] : [{ type: 'branch', if: { attribute: 'a', eq: 1 }, then: nest(n - 1) }]);
  const deep = await api.post('/v1/workflows', key, { slug: 'invalid', trigger: { event: 'a' }, steps: nest(5) });
  assert.equal(deep.body.error.details.map((d: any) => d.param), ['steps[0].then[0].then[0].then[0].then[0].then']);
  // the too-deep list's own steps are still checked: every problem at once (probe W)
  const deepAndBad = await api.post('/v1/workflows', key, { slug: 'invalid', trigger: { event: 'a' }, steps: [{ type: 'branch', if: { attribute: 'a', eq: 1 }, then: [{ type: 'branch', if: { attribute: 'a', eq: 1 }, then: [{ type: 'branch', if: { attribute: 'a', eq: 1 }, then: [{ type: 'branch', if: { attribute: 'a', eq: 1 }, then: [{ type: 'branch', if: { attribute: 'a', eq: 1 }, then: [{ type: 'sleep', duration: 'soon' }, { type: 'branch', if: { attribute: 'a', eq: 1 }, then: [{ type: 'exit' }] }] }] }] }] }] }] });
  const inner = 'steps[0].then[0].then[0].then[0].then[0].then';
  assert.equal(deepAndBad.body.error.details.map((d: any) => d.param), [inner, `${inner}[0].duration`], 'the depth once, then what is wrong inside');

  const many = await api.post('/v1/workflows', key, {
    slug: 'x', trigger: { event: 'a', where: { attribute: 'p' } },
    steps: [{ type: 'sleep', duration: 'soon' }, { type: 'branch', if: { attribute: 'a', eq: 1 }, then: [{ type: 'exit' }, { type: 'exit' }] }],
  });
  assert.equal(many.body.error.details.map((d: any) => d.param).sort(), ['slug', 'steps[0].duration', 'steps[1].then[1]', 'trigger.where']);
  // a send step's reserved data keys are named beside its schema problems, as POST /v1/messages names them (probe K)
  const reserved = await api.post('/v1/workflows', key, { slug: 'invalid', trigger: { event: 'a' }, steps: [{ type: 'send', message: { title: 't', body: 'b', data: { aps: 1 }, priority: 'urgent' } }] });
  assert.equal(reserved.body.error.details.map((d: any) => d.param).sort(), ['steps[0].message.data.aps', 'steps[0].message.priority']);
  // an empty body: every required field, the slug among them (probe G: the definition's two alone)
  const empty = await api.post('/v1/workflows', key, {});
  assert.equal(empty.body.error.details.map((d: any) => d.param).sort(), ['slug', 'steps', 'trigger']);
  assert.is((await api.get('/v1/workflows/invalid', key)).status, 404, 'nothing was created');
});

workflows('a slug already taken in the tenant is 409 conflict', async ({ api, key }) => {
  assert.is((await api.post('/v1/workflows', key, body('taken-workflow'))).status, 201);
  const again = await api.post('/v1/workflows', key, body('taken-workflow', { name: 'other' }));
  assert.is(again.status, 409);
  assert.is(again.body.error.code, 'conflict');
  assert.is(again.body.error.param, 'slug');
});

workflows('an unknown or malformed slug, version or run is 404 not_found on every route', async ({ api, key }) => {
  const replies = [
    await api.get('/v1/workflows/missing', key),
    await api.get('/v1/workflows/NOT-A-SLUG', key),
    await api.get('/v1/workflows/wfl_0000000000000000000000000', key),
    await api.patch('/v1/workflows/missing', key, { enabled: false }),
    await api.del('/v1/workflows/missing', key),
    await api.get('/v1/workflows/missing/versions', key),
    await api.get('/v1/workflows/missing/versions/1', key),
    await api.get('/v1/workflows/missing/runs', key),
    await api.get(`/v1/workflows/missing/runs/${newId('run')}`, key),
    await api.get('/v1/workflows/welcome-series/versions/2', key),
    await api.get('/v1/workflows/welcome-series/versions/0', key),
    await api.get('/v1/workflows/welcome-series/versions/one', key),
    await api.get(`/v1/workflows/welcome-series/runs/${newId('run')}`, key),
    await api.get('/v1/workflows/welcome-series/runs/run_nope', key),
    await api.get(`/v1/workflows/welcome-series/runs/${newId('message')}`, key),
  ];
  for (const res of replies) {
    assert.is(res.status, 404);
    assert.is(res.body.error.code, 'not_found');
  }
});

workflows('the list is newest first with total and keyset pages that join into the whole', async ({ service, api }) => {
  const { keys } = await bootstrapWorkspace(service, 'workflows-list');
  const slugs = Array.from({ length: 5 }, (_, i) => `list-${i}`);
  for (const slug of slugs) await api.post('/v1/workflows', keys.tenant, body(slug));
  const all = (await api.get('/v1/workflows', keys.tenant)).body.data;
  assert.is(all.total, 5);
  assert.equal(all.items.map((w: any) => w.slug), [...slugs].reverse());
  assert.equal(all.items[0].steps, WELCOME);
  const seen: string[] = [];
  let cursor: string | null = null;
  for (let page = 0; page < 10; page++) {
    const res: any = await api.get(`/v1/workflows?limit=2${cursor ? `&cursor=${cursor}` : ''}`, keys.tenant);
    assert.is(res.body.data.total, 5);
    seen.push(...res.body.data.items.map((w: any) => w.slug));
    cursor = res.body.data.nextCursor;
    if (!res.body.data.hasMore) break;
  }
  assert.equal(seen, [...slugs].reverse());
});

workflows('a workflow keeps at most 100 versions: the change that would make the 101st is 409 conflict and writes nothing; other fields still change (probe W)', async (ctx) => {
  const { api, key } = ctx;
  assert.is((await api.post('/v1/workflows', key, body('many-versions'))).status, 201);
  for (let n = 2; n <= 100; n++) {
    const res = await api.patch('/v1/workflows/many-versions', key, { steps: [{ type: 'sleep', duration: `${n}s` }] });
    assert.is(res.body.data?.version, n, JSON.stringify(res.body.error));
  }
  const refused = await api.patch('/v1/workflows/many-versions', key, { name: 'Too many', steps: [{ type: 'sleep', duration: '101s' }] });
  assert.equal([refused.status, refused.body.error?.code], [409, 'conflict']);
  const after = (await api.get('/v1/workflows/many-versions', key)).body.data;
  assert.equal([after.version, after.name, after.steps], [100, null, [{ type: 'sleep', duration: '100s' }]], 'nothing of the refused change was written');
  assert.is((await api.get('/v1/workflows/many-versions/versions?limit=1', key)).body.data.total, 100);
  const renamed = await api.patch('/v1/workflows/many-versions', key, { name: 'Renamed', enabled: false });
  assert.equal([renamed.status, renamed.body.data.name, renamed.body.data.version], [200, 'Renamed', 100]);
});

workflows('a definition change makes a new version; old versions stay as they were; other changes keep the version', async (ctx) => {
  const { api, key } = ctx;
  const created = (await api.post('/v1/workflows', key, body('versioned', { name: 'First' }))).body.data;
  await new Promise((r) => setTimeout(r, 5));

  let v = await version(ctx);
  const renamed = (await api.patch('/v1/workflows/versioned', key, { name: 'Renamed', description: 'Now described' })).body.data;
  assert.is(renamed.version, 1);
  assert.is(renamed.versionId, created.versionId);
  assert.is(renamed.name, 'Renamed');
  assert.ok(renamed.updatedAt > created.updatedAt);
  assert.is(await version(ctx), v + 1);

  const steps = [{ type: 'sleep', duration: '2h' }, ...WELCOME];
  const changed = await api.patch('/v1/workflows/versioned', key, { steps });
  assert.is(changed.status, 200);
  const v2 = changed.body.data;
  assert.is(v2.version, 2);
  assert.is.not(v2.versionId, created.versionId);
  assert.equal(v2.steps, steps);
  assert.equal(v2.trigger, TRIGGER, 'what the patch leaves out comes from the current version');
  assert.is(v2.name, 'Renamed');

  const old = (await api.get('/v1/workflows/versioned/versions/1', key)).body.data;
  assert.equal(old, { id: created.versionId, workflowId: created.id, version: 1, trigger: TRIGGER, steps: WELCOME, cancelOn: null, createdAt: created.createdAt });
  const current = (await api.get('/v1/workflows/versioned/versions/2', key)).body.data;
  assert.equal({ ...current, createdAt: 'x' }, { id: v2.versionId, workflowId: created.id, version: 2, trigger: TRIGGER, steps, cancelOn: null, createdAt: 'x' });

  v = await version(ctx);
  const same = (await api.patch('/v1/workflows/versioned', key, { steps: JSON.parse(JSON.stringify(steps, ['duration', 'type', 'name', 'message', 'title', 'body', 'url', 'if', 'event', 'count', 'gte', 'within', 'then', 'else', 'category'].reverse())) })).body.data;
  assert.is(same.version, 2, 'the same steps in another key order are no change');
  assert.is(same.updatedAt, v2.updatedAt);
  assert.is(await version(ctx), v);

  const withCancel = (await api.patch('/v1/workflows/versioned', key, { cancelOn: CANCEL, enabled: false })).body.data;
  assert.is(withCancel.version, 3);
  assert.equal(withCancel.cancelOn, CANCEL);
  assert.is(withCancel.enabled, false);
  const without = (await api.patch('/v1/workflows/versioned', key, { cancelOn: null })).body.data;
  assert.is(without.version, 4);
  assert.is(without.cancelOn, null);
  const enabled = (await api.patch('/v1/workflows/versioned', key, { enabled: true })).body.data;
  assert.is(enabled.version, 4);
  assert.is(enabled.enabled, true);

  const list = (await api.get('/v1/workflows/versioned/versions', key)).body.data;
  assert.is(list.total, 4);
  assert.equal(list.items.map((x: any) => x.version), [4, 3, 2, 1]);
  const page1 = (await api.get('/v1/workflows/versioned/versions?limit=3', key)).body.data;
  assert.equal(page1.items.map((x: any) => x.version), [4, 3, 2]);
  assert.is(page1.hasMore, true);
  const page2 = (await api.get(`/v1/workflows/versioned/versions?limit=3&cursor=${page1.nextCursor}`, key)).body.data;
  assert.equal(page2.items.map((x: any) => x.version), [1]);
  assert.is(page2.hasMore, false);
  assert.is(page2.total, 4);

  const slug = await api.patch('/v1/workflows/versioned', key, { slug: 'renamed' });
  assert.is(slug.body.error.param, 'slug');
  const bad = await api.patch('/v1/workflows/versioned', key, { slug: 'x', steps: [{ type: 'sleep', duration: '1s' }, { type: 'exit', name: 'X' }] });
  assert.equal(bad.body.error.details.map((d: any) => d.param).sort(), ['slug', 'steps[1].name']);
  for (const b of [{}, { enabled: 'no' }, { trigger: { event: 'a', extra: 1 } }, { other: 1 }]) assert.is((await api.patch('/v1/workflows/versioned', key, b)).body.error.code, 'validation');
  assert.is((await api.get('/v1/workflows/versioned', key)).body.data.version, 4);
});

workflows('20 parallel definition changes all answer 200 and number their versions 2 to 21, none twice', async ({ api, key }) => {
  await api.post('/v1/workflows', key, body('raced'));
  const answers = await Promise.all(Array.from({ length: 20 }, (_, i) => api.patch('/v1/workflows/raced', key, { steps: [{ type: 'sleep', duration: `${i + 1}m` }, ...WELCOME] })));
  assert.equal(answers.map((a) => a.status), Array(20).fill(200));
  assert.equal(answers.map((a) => a.body.data.version).sort((a, b) => a - b), Array.from({ length: 20 }, (_, i) => i + 2));
  assert.is((await api.get('/v1/workflows/raced', key)).body.data.version, 21);
});

workflows('delete answers the workflow as it was and removes it with every version', async (ctx) => {
  const { api, key, service, tenantId } = ctx;
  const created = (await api.post('/v1/workflows', key, body('short-lived'))).body.data;
  const v2 = (await api.patch('/v1/workflows/short-lived', key, { trigger: { event: 'other.event' } })).body.data;
  const v = await version(ctx);
  const deleted = await api.del('/v1/workflows/short-lived', key);
  assert.is(deleted.status, 200);
  assert.equal(deleted.body.data, v2);
  assert.is(await version(ctx), v + 1);
  const { redis, keys } = service;
  assert.is(await redis.exists(keys.workflow(tenantId, created.id), keys.workflowVersions(tenantId, created.id), keys.workflowVersion(tenantId, created.versionId), keys.workflowVersion(tenantId, v2.versionId)), 0);
  assert.is(await redis.hget(keys.workflowSlugs(tenantId), 'short-lived'), null);
  assert.is(await redis.zscore(keys.workflowIndex(tenantId), created.id), null);
  assert.is((await api.get('/v1/workflows/short-lived', key)).status, 404);
  assert.is((await api.del('/v1/workflows/short-lived', key)).status, 404);
  const again = await api.post('/v1/workflows', key, body('short-lived'));
  assert.is(again.status, 201);
  assert.is(again.body.data.version, 1);
  assert.is.not(again.body.data.id, created.id);
});

workflows('a deleted workflow\'s versions leave a worker\'s cache at its next reload, and its wait and cancelOn names stay watched', async (ctx) => {
  const { api, key, service, tenantId } = ctx;
  const { redis, keys } = service;
  const steps = [{ type: 'wait', event: 'gone.awaited', timeout: '1d' }, { type: 'send', message: { title: 'a', body: 'b' } }];
  const created = (await api.post('/v1/workflows', key, { slug: 'cached-gone', trigger: { event: 'gone.start' }, cancelOn: { event: 'gone.cancel' }, steps })).body.data;
  const v2 = (await api.patch('/v1/workflows/cached-gone', key, { steps: [{ type: 'wait', event: 'gone.awaited-v2', timeout: '1d' }], cancelOn: null })).body.data;
  const cache = new DefinitionsCache(redis, keys);
  const before = await cache.get(tenantId, String(await version(ctx)));
  assert.ok(before.relevant.has('gone.awaited') && before.relevant.has('gone.cancel') && before.relevant.has('gone.awaited-v2'));
  assert.is((await cache.version(tenantId, created.versionId))?.slug, 'cached-gone', 'cached by the load');
  const old = Date.now() - GONE_NAMES_KEEP_MS - 60_000;
  await redis.zadd(keys.workflowGoneNames(tenantId), old, 'long.gone');
  assert.is((await api.del('/v1/workflows/cached-gone', key)).status, 200);
  // the same definitions version still answers from the cache; the next one drops the workflow's versions
  const after = await cache.get(tenantId, String(await version(ctx)));
  assert.is(await cache.version(tenantId, created.versionId), null);
  assert.is(await cache.version(tenantId, v2.versionId), null);
  assert.not.ok(after.workflows.some((w) => w.id === created.id));
  for (const name of ['gone.awaited', 'gone.cancel', 'gone.awaited-v2']) assert.ok(after.relevant.has(name), `${name} stays watched`);
  assert.not.ok(after.relevant.has('gone.start'), 'the trigger is not watched: nothing starts');
  const gone = await redis.zrange(keys.workflowGoneNames(tenantId), 0, -1, 'WITHSCORES');
  assert.equal(gone.filter((_, i) => i % 2 === 0).sort(), ['gone.awaited', 'gone.awaited-v2', 'gone.cancel'].map((name) => `${created.id}|${name}`), 'kept per workflow; names older than the longest step are dropped');
  assert.equal([...after.goneNames.get(created.id)!].sort(), ['gone.awaited', 'gone.awaited-v2', 'gone.cancel'], 'read back per workflow');
  assert.ok(Math.abs(Number(gone[1]) - Date.now()) < 10_000, 'kept with the time of the delete');
  // a version record that outlived its workflow (a crash before the cleanup) reads as gone
  await redis.hset(keys.workflowVersion(tenantId, created.versionId), { id: created.versionId, workflowId: created.id, version: '1', definition: JSON.stringify({ trigger: { event: 'gone.start' }, steps }), createdAt: created.createdAt });
  assert.is(await new DefinitionsCache(redis, keys).version(tenantId, created.versionId), null);
  await redis.del(keys.workflowVersion(tenantId, created.versionId));
});

workflows('a workflow an earlier version let grow past 100 versions: every version\'s wait and cancelOn names are watched, and stay watched after its delete (probe K: only the newest 100 were, and a run of version 1 missed its event)', async (ctx) => {
  const { api, key, service, tenantId } = ctx;
  const { redis, keys } = service;
  const created = (await api.post('/v1/workflows', key, { slug: 'ancient', trigger: { event: 'ancient.start' }, steps: [{ type: 'wait', event: 'ancient.paid', timeout: '1d' }] })).body.data;
  // versions 2 to 105 as a version without the bound wrote them: records, the version list, the workflow's current version
  let last = created.versionId as string;
  for (let n = 2; n <= 105; n++) {
    last = newId('workflowVersion');
    const definition = { trigger: { event: 'ancient.start' }, steps: [{ type: 'wait', event: `ancient.paid${n}`, timeout: '1d' }] };
    await redis.hset(keys.workflowVersion(tenantId, last), { id: last, workflowId: created.id, version: String(n), definition: JSON.stringify(definition), createdAt: created.createdAt });
    await redis.zadd(keys.workflowVersions(tenantId, created.id), n, last);
  }
  await redis.hset(keys.workflow(tenantId, created.id), { version: '105', versionId: last });
  await redis.incr(keys.automationVersion(tenantId));
  const loaded = await new DefinitionsCache(redis, keys).get(tenantId, String(await version(ctx)));
  for (const name of ['ancient.paid', 'ancient.paid5', 'ancient.paid105']) assert.ok(loaded.relevant.has(name), `${name} is watched`);
  assert.is((await api.patch('/v1/workflows/ancient', key, { steps: [{ type: 'sleep', duration: '1h' }] })).status, 409, 'such a workflow takes no further version');
  assert.is((await api.del('/v1/workflows/ancient', key)).status, 200);
  const gone = await redis.zrange(keys.workflowGoneNames(tenantId), 0, -1);
  for (const name of ['ancient.paid', 'ancient.paid105']) assert.ok(gone.includes(`${created.id}|${name}`), `${name} stays watched after the delete`);
  assert.is(await redis.exists(keys.workflowVersions(tenantId, created.id)), 0, 'every version went with it');
});

workflows('runs are listed newest first across partitions, by status, with total and keyset pages; one run reads by id', async ({ api, key, service, tenantId, partitions }) => {
  const wf = (await api.post('/v1/workflows', key, body('with-runs'))).body.data;
  const other = (await api.post('/v1/workflows', key, body('other-runs'))).body.data;
  const { redis, keys } = service;
  const statuses = ['running', 'sleeping', 'waiting', 'completed', 'canceled', 'failed', 'completed', 'sleeping', 'completed'];
  const runs: { id: string; p: number; status: string }[] = [];
  const base = Date.now() - 60_000;
  for (const [i, status] of statuses.entries()) {
    const id = newId('run', base + i * 1000);
    const p = i % partitions;
    const ended = ['completed', 'canceled', 'failed'].includes(status);
    const at = new Date(base + i * 1000).toISOString();
    await redis.hset(keys.run(p, tenantId, id), {
      id, workflowId: wf.id, workflow: 'with-runs', versionId: wf.versionId, version: '1', externalId: `user-${i}`, status,
      step: status === 'completed' ? '' : 'steps[1]', triggerEventId: newId('event'), reason: status === 'canceled' ? 'canceled_by_event' : status === 'failed' ? 'send_failed' : '',
      wakeAt: status === 'sleeping' ? String(base + 86_400_000) : '', startedAt: at, updatedAt: at, completedAt: ended ? at : '',
      history: JSON.stringify([{ step: 'steps[0]', type: 'send', outcome: 'sent', at, messageId: newId('message') }]),
    });
    await redis.zadd(keys.workflowRuns(p, tenantId, wf.id), 0, id);
    await redis.zadd(keys.workflowRuns(p, tenantId, wf.id, status), 0, id);
    runs.push({ id, p, status });
  }
  // a run of another workflow, in the same partition as one of ours
  const foreign = newId('run');
  await redis.hset(keys.run(0, tenantId, foreign), { id: foreign, workflowId: other.id, workflow: 'other-runs', versionId: other.versionId, version: '1', externalId: 'x', status: 'running', step: 'steps[0]', triggerEventId: newId('event'), reason: '', wakeAt: '', startedAt: wf.createdAt, updatedAt: wf.createdAt, completedAt: '', history: '[]' });
  await redis.zadd(keys.workflowRuns(0, tenantId, other.id), 0, foreign);

  const newest = [...runs].reverse();
  const all = (await api.get('/v1/workflows/with-runs/runs', key)).body.data;
  assert.is(all.total, statuses.length);
  assert.equal(all.items.map((r: any) => r.id), newest.map((r) => r.id));

  const seen: string[] = [];
  let cursor: string | null = null;
  for (let page = 0; page < 10; page++) {
    const res: any = await api.get(`/v1/workflows/with-runs/runs?limit=4${cursor ? `&cursor=${cursor}` : ''}`, key);
    assert.is(res.body.data.total, statuses.length);
    assert.ok(res.body.data.items.length <= 4);
    seen.push(...res.body.data.items.map((r: any) => r.id));
    cursor = res.body.data.nextCursor;
    if (!res.body.data.hasMore) break;
  }
  assert.equal(seen, newest.map((r) => r.id));

  const completed = (await api.get('/v1/workflows/with-runs/runs?status=completed&limit=2', key)).body.data;
  assert.is(completed.total, 3);
  assert.equal(completed.items.map((r: any) => r.id), newest.filter((r) => r.status === 'completed').slice(0, 2).map((r) => r.id));
  const rest = (await api.get(`/v1/workflows/with-runs/runs?status=completed&limit=2&cursor=${completed.nextCursor}`, key)).body.data;
  assert.equal(rest.items.map((r: any) => r.id), [runs[3]!.id]);
  assert.is((await api.get('/v1/workflows/with-runs/runs?status=failed', key)).body.data.items[0].reason, 'send_failed');
  const bad = await api.get('/v1/workflows/with-runs/runs?status=paused', key);
  assert.is(bad.status, 400);
  assert.is(bad.body.error.code, 'validation');
  assert.is(bad.body.error.param, 'status');

  const sleeping = runs[1]!;
  const one = await api.get(`/v1/workflows/with-runs/runs/${sleeping.id}`, key);
  assert.is(one.status, 200);
  assert.equal({ ...one.body.data, triggerEventId: 'x', history: 'x' }, {
    id: sleeping.id, workflowId: wf.id, workflow: 'with-runs', versionId: wf.versionId, version: 1, externalId: 'user-1', status: 'sleeping',
    step: 'steps[1]', triggerEventId: 'x', reason: null, wakeAt: new Date(base + 86_400_000).toISOString(),
    startedAt: new Date(base + 1000).toISOString(), updatedAt: new Date(base + 1000).toISOString(), completedAt: null, history: 'x',
    depth: 0, // a record written without one (before runs had a depth) reads as 0
  });
  assert.match(one.body.data.triggerEventId, /^evt_/);
  assert.is(one.body.data.history[0].type, 'send');
  const done = (await api.get(`/v1/workflows/with-runs/runs/${runs[3]!.id}`, key)).body.data;
  assert.is(done.step, null);
  assert.is(done.wakeAt, null);
  assert.match(done.completedAt, ISO);
  assert.is((await api.get(`/v1/workflows/with-runs/runs/${foreign}`, key)).status, 404, 'another workflow\'s run');
  assert.is((await api.get(`/v1/workflows/other-runs/runs/${foreign}`, key)).status, 200);
  assert.is((await api.get('/v1/workflows/other-runs/runs', key)).body.data.total, 1);
});

workflows('a workflows:read key reads but cannot write; a key without workflows scopes cannot read', async ({ service, api }) => {
  const reader = (await makeKey(service, 'workflows', 'tenant', ['workflows:read'])).key;
  for (const path of ['/v1/workflows', '/v1/workflows/welcome-series', '/v1/workflows/welcome-series/versions', '/v1/workflows/welcome-series/versions/1', '/v1/workflows/welcome-series/runs']) {
    assert.is((await api.get(path, reader)).status, 200, path);
  }
  const writes = [
    await api.post('/v1/workflows', reader, body('by-reader')),
    await api.patch('/v1/workflows/welcome-series', reader, { enabled: false }),
    await api.del('/v1/workflows/welcome-series', reader),
  ];
  for (const res of writes) {
    assert.is(res.status, 403);
    assert.is(res.body.error.code, 'missing_permission');
  }
  const other = (await makeKey(service, 'workflows', 'tenant', ['segments:*'])).key;
  for (const path of ['/v1/workflows', '/v1/workflows/welcome-series', '/v1/workflows/welcome-series/runs']) {
    const res = await api.get(path, other);
    assert.is(res.status, 403);
    assert.is(res.body.error.code, 'missing_permission');
  }
  const writer = (await makeKey(service, 'workflows', 'tenant', ['workflows:*'])).key;
  assert.is((await api.post('/v1/workflows', writer, body('by-writer'))).status, 201);
});

workflows('another tenant\'s workflow is 404; a workspace key reaches it with Service-Tenant', async ({ service, api, key, workspaceKey }) => {
  const euKey = (await makeKey(service, 'workflows', 'tenant', ['*'], { tenant: 'eu' })).key;
  assert.is((await api.post('/v1/workflows', euKey, body('eu-only'))).status, 201);
  assert.is((await api.post('/v1/workflows', euKey, body('welcome-series'))).status, 201, 'slugs are per tenant');
  assert.is((await api.get('/v1/workflows/eu-only', key)).status, 404);
  assert.is((await api.get('/v1/workflows/eu-only', workspaceKey)).status, 404);
  assert.is((await api.get('/v1/workflows/eu-only', workspaceKey, { 'Service-Tenant': 'eu' })).status, 200);
});

workflows('create, update and delete are audited in the workspace ledger', async ({ service, api, key, workspaceId }) => {
  const created = (await api.post('/v1/workflows', key, body('audited', { name: 'Before' }))).body.data;
  await api.patch('/v1/workflows/audited', key, { name: 'After', enabled: false });
  await api.patch('/v1/workflows/audited', key, { name: 'After' }); // no change, no entry
  await api.patch('/v1/workflows/audited', key, { trigger: { event: 'user.upgraded' } });
  await api.del('/v1/workflows/audited', key);
  const entries = (await service.redis.xrange(service.keys.ledger(workspaceId), '-', '+'))
    .map(([, fields]) => JSON.parse(fields[fields.indexOf('payload') + 1]!))
    .filter((p) => p.target?.id === created.id);
  assert.equal(entries.map((e) => e.type), ['workflow.created', 'workflow.updated', 'workflow.updated', 'workflow.deleted']);
  const [c, u1, u2, d] = entries;
  assert.equal(c.data.object, created);
  assert.equal(c.target, { type: 'workflow', id: created.id });
  assert.equal(u1.changes, { name: 'After', enabled: false });
  assert.equal(u1.previousAttributes, { name: 'Before', enabled: true });
  // a new version changes the record's versionId too (the one the runs' $run.* events carry): old and new
  assert.equal(u2.changes, { version: 2, versionId: u2.data.object.versionId, trigger: { event: 'user.upgraded' } });
  assert.equal(u2.previousAttributes, { version: 1, versionId: created.versionId, trigger: TRIGGER });
  assert.is.not(u2.data.object.versionId, created.versionId);
  assert.is(d.data.object.version, 2);
  const groups = (await api.get('/v1/workspaces/workflows/webhooks/catalog', (await bootstrapWorkspace(service, 'workflows')).keys.workspace)).body.data.groups as any[];
  assert.equal(groups.find((g) => g.resource === 'workflow' && g.source === 'audit').events.map((e: any) => e.name), ['workflow.created', 'workflow.updated', 'workflow.deleted']);
});

workflows.run();
