import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { client } from '../helpers/api.js';
import { encodeCursor } from '../../http/list.js';
import { auditEntries } from '../helpers/audit.js';
import { waitFor } from '../helpers/wait.js';
import { inboxEvents, names } from '../helpers/inbox.js';
import { bootstrapWorkspace, makeKey, startTestService, type TestService } from '../helpers/service.js';

type Ctx = { service: TestService; api: ReturnType<typeof client>; key: string; tenantId: string; workspaceId: string };
const subs = suite<Ctx>('subscribers');

subs.before(async (ctx) => {
  ctx.service = await startTestService('subscribers');
  ctx.api = client(ctx.service.url);
  const { keys, tenant, workspace } = await bootstrapWorkspace(ctx.service, 'subs');
  ctx.key = keys.tenant;
  ctx.tenantId = tenant.id;
  ctx.workspaceId = workspace.id;
});
subs.after(async (ctx) => ctx.service.stop());

subs('POST creates a subscriber (201) and writes $subscriber.created once', async ({ api, key, service, tenantId }) => {
  const res = await api.post('/v1/subscribers', key, { externalId: 'ada', email: 'Ada@Example.com', locale: 'en-GB', timezone: 'Europe/London', properties: { plan: 'pro' } });
  assert.is(res.status, 201);
  assert.match(res.body.data.id, /^sub_/);
  assert.is(res.body.data.email, 'Ada@Example.com');
  assert.equal(res.body.data.properties, { plan: 'pro' });
  assert.is(res.body.data.verified, false);
  const again = await api.post('/v1/subscribers', key, { externalId: 'ada', email: 'Ada@Example.com' });
  assert.is(again.status, 200);
  assert.is(again.body.data.id, res.body.data.id);
  assert.equal(names(await inboxEvents(service, tenantId, 'ada')), ['$subscriber.created'], 'an unchanged upsert writes nothing');
});

subs('a time zone is stored as IANA writes it whatever the case it was sent in (an alias as sent); a locale written with _ is stored with -, and BCP 47 extensions are taken (probe U)', async ({ api, key, service, tenantId }) => {
  const lower = await api.post('/v1/subscribers', key, { externalId: 'tz-1', timezone: 'europe/paris' });
  assert.is(lower.body.data.timezone, 'Europe/Paris');
  assert.is((await api.patch('/v1/subscribers/tz-1', key, { timezone: 'EUROPE/PARIS' })).body.data.timezone, 'Europe/Paris');
  assert.equal(names(await inboxEvents(service, tenantId, 'tz-1')), ['$subscriber.created'], 'the same zone in another case changes nothing');
  assert.is((await api.patch('/v1/subscribers/tz-1', key, { timezone: 'utc' })).body.data.timezone, 'UTC');
  assert.is((await api.patch('/v1/subscribers/tz-1', key, { timezone: 'Asia/Kolkata' })).body.data.timezone, 'Asia/Kolkata', 'an alias as sent');
  // an alias in another case is IANA's spelling of that alias (probe DL: kept as sent, one zone many spellings)
  for (const [sent, stored] of [['asia/kolkata', 'Asia/Kolkata'], ['EUROPE/KYIV', 'Europe/Kyiv'], ['us/eastern', 'US/Eastern'], ['etc/utc', 'Etc/UTC'], ['america/argentina/buenos_aires', 'America/Argentina/Buenos_Aires']]) {
    assert.is((await api.patch('/v1/subscribers/tz-1', key, { timezone: sent })).body.data.timezone, stored, sent);
  }
  // names ICU knows that IANA removed (tzdata 2020b) are no IANA time zones (probe EK: taken)
  for (const sent of ['SystemV/AST4', 'systemv/ast4', 'US/Pacific-New']) {
    const refused = await api.patch('/v1/subscribers/tz-1', key, { timezone: sent });
    assert.equal([refused.status, refused.body.error?.param], [400, 'timezone'], sent);
  }
  assert.is((await api.patch('/v1/subscribers/tz-1', key, { timezone: null })).body.data.timezone, null);
  assert.is((await api.patch('/v1/subscribers/tz-1', key, { locale: 'en_US' })).body.data.locale, 'en-US', 'an Apple-style locale is stored with -');
  assert.is((await api.patch('/v1/subscribers/tz-1', key, { locale: 'en-US-u-ca-gregory' })).body.data.locale, 'en-US-u-ca-gregory', 'BCP 47 extensions are well-formed tags');
  assert.is((await api.patch('/v1/subscribers/tz-1', key, { locale: 'en-US-x-twain' })).body.data.locale, 'en-US-x-twain');
});

subs('an update writes $subscriber.updated with only the changed fields, and nothing when nothing changes', async ({ api, key, service, tenantId }) => {
  await api.post('/v1/subscribers', key, { externalId: 'bob', email: 'bob@example.com', properties: { plan: 'free', seats: 1 } });
  const res = await api.patch('/v1/subscribers/bob', key, { phone: '+14155550100', properties: { plan: 'pro', seats: null } });
  assert.is(res.status, 200);
  assert.equal(res.body.data.properties, { plan: 'pro' });
  await api.patch('/v1/subscribers/bob', key, { phone: '+14155550100' });
  const events = await inboxEvents(service, tenantId, 'bob');
  assert.equal(names(events), ['$subscriber.created', '$subscriber.updated']);
  // properties carry only the changed keys (null on the side where a key is absent)
  assert.equal(events[1]!.data, { changes: { phone: '+14155550100', properties: { plan: 'pro', seats: null } }, previousAttributes: { phone: null, properties: { plan: 'free', seats: 1 } } });
  assert.is(events[1]!.source, 'system');
});

subs('properties named like Object\'s own members (toString, constructor, valueOf) are changed and reported like any other', async ({ api, key, service, tenantId }) => {
  await api.post('/v1/subscribers', key, { externalId: 'builtin-names', properties: { toString: 3, plan: 'pro' } });
  const res = await api.patch('/v1/subscribers/builtin-names', key, { properties: { toString: null, constructor: 'x', valueOf: 0 } });
  assert.is(res.status, 200);
  assert.equal(res.body.data.properties, { plan: 'pro', constructor: 'x', valueOf: 0 });
  const [, updated] = await inboxEvents(service, tenantId, 'builtin-names');
  assert.equal(updated!.data, {
    changes: { properties: { toString: null, constructor: 'x', valueOf: 0 } },
    previousAttributes: { properties: { toString: 3, constructor: null, valueOf: null } },
  });
});

subs('the 8 KB bound of properties holds for the merged result: an update that would go over is 400 on properties and stores nothing', async ({ api, key, service, tenantId }) => {
  const half = 'x'.repeat(5000);
  assert.is((await api.post('/v1/subscribers', key, { externalId: 'grow', properties: { a: half } })).status, 201);
  const patch = await api.patch('/v1/subscribers/grow', key, { properties: { b: half } });
  assert.is(patch.status, 400);
  assert.is(patch.body.error.code, 'validation');
  assert.is(patch.body.error.param, 'properties');
  const upsert = await api.post('/v1/subscribers', key, { externalId: 'grow', properties: { b: half } });
  assert.is(upsert.status, 400);
  assert.is(upsert.body.error.param, 'properties');
  assert.equal(Object.keys((await api.get('/v1/subscribers/grow', key)).body.data.properties), ['a'], 'nothing stored');
  assert.equal(names(await inboxEvents(service, tenantId, 'grow')), ['$subscriber.created']);
  // replacing a key, or removing one while adding another, is fine as long as the result fits
  const swap = await api.patch('/v1/subscribers/grow', key, { properties: { a: null, b: half } });
  assert.is(swap.status, 200);
  assert.equal(Object.keys(swap.body.data.properties), ['b']);
  const events = await inboxEvents(service, tenantId, 'grow');
  // 10 KB of changes and previous values: the previous value gives way, within the 8 KB of event data
  assert.equal(events[1]!.data, { changes: { properties: { a: null, b: half } }, previousAttributes: { properties: { b: null } }, truncated: ['previousAttributes.properties.a'] });
});

subs('a $subscriber.updated for one changed property carries that key only, not the whole object twice', async ({ api, key, service, tenantId }) => {
  const big = Object.fromEntries(Array.from({ length: 7 }, (_, i) => [`k${i}`, 'v'.repeat(1000)]));
  await api.post('/v1/subscribers', key, { externalId: 'small-diff', properties: big });
  await api.patch('/v1/subscribers/small-diff', key, { properties: { k3: 'changed' } });
  const [, updated] = await inboxEvents(service, tenantId, 'small-diff');
  assert.equal(updated!.data, { changes: { properties: { k3: 'changed' } }, previousAttributes: { properties: { k3: 'v'.repeat(1000) } } });
});

subs('a $subscriber.updated stays within 8 KB of data: values give way, previous ones first, named in truncated; the audit keeps them all (probe D1: 16 KB)', async ({ api, key, service, tenantId, workspaceId }) => {
  const a = 'a'.repeat(7900), b = 'b'.repeat(7900);
  await api.post('/v1/subscribers', key, { externalId: 'big-swap', email: 'old@example.com', properties: { bio: a } });
  assert.is((await api.patch('/v1/subscribers/big-swap', key, { email: 'new@example.com', properties: { bio: b } })).status, 200);
  const [, updated] = await inboxEvents(service, tenantId, 'big-swap');
  assert.ok(Buffer.byteLength(JSON.stringify(updated!.data)) <= 8192, `${Buffer.byteLength(JSON.stringify(updated!.data))} bytes`);
  assert.equal(updated!.data, {
    changes: { email: 'new@example.com', properties: { bio: b } },
    previousAttributes: { email: 'old@example.com', properties: {} },
    truncated: ['previousAttributes.properties.bio'],
  });
  // the audit entry is no event: it keeps both values
  const audit = await waitFor('the audit entry', async () => (await auditEntries(service, workspaceId)).find((e: any) => e.type === 'subscriber.updated' && e.data.object.externalId === 'big-swap') ?? null, 5_000, 50);
  assert.equal([audit.changes.properties.bio, audit.previousAttributes.properties.bio], [b, a]);
});

subs('a null attribute removes it', async ({ api, key }) => {
  await api.post('/v1/subscribers', key, { externalId: 'nulls', email: 'n@example.com' });
  const res = await api.patch('/v1/subscribers/nulls', key, { email: null });
  assert.is(res.body.data.email, null);
});

subs('bad attributes are validation errors naming the field, and unknown fields are refused', async ({ api, key }) => {
  const cases: [unknown, string][] = [
    [{ externalId: 'v', email: 'not-an-email' }, 'email'],
    [{ externalId: 'v', phone: '555-1234' }, 'phone'],
    [{ externalId: 'v', timezone: 'Mars/Olympus' }, 'timezone'],
    [{ externalId: 'v', locale: 'english please' }, 'locale'],
    [{ externalId: 'v', properties: [1] }, 'properties'],
    [{ externalId: 'v', properties: { pad: 'x'.repeat(9000) } }, 'properties'],
    [{ externalId: 'v', nickname: 'x' }, 'nickname'],
    [{ externalId: '' }, 'externalId'],
    [{ externalId: 'x'.repeat(257) }, 'externalId'],
  ];
  for (const [body, param] of cases) {
    const res = await api.post('/v1/subscribers', key, body);
    assert.is(res.status, 400, JSON.stringify(body).slice(0, 60));
    assert.is(res.body.error.code, 'validation');
    assert.ok(res.body.error.details.some((d: any) => d.param === param), `${param}: ${JSON.stringify(res.body.error.details)}`);
  }
  assert.is((await api.patch('/v1/subscribers/v', key, {})).body.error.code, 'validation');
  // every failing field at once (spec 2.1), the time zone among them
  const all = await api.post('/v1/subscribers', key, { externalId: 'v', phone: '12345', locale: 'not a locale!!', timezone: 'Mars/Olympus' });
  assert.equal(all.body.error.details.map((d: any) => d.param).sort(), ['locale', 'phone', 'timezone']);
  assert.equal(all.body.error.details.find((d: any) => d.param === 'timezone').message, 'is not an IANA time zone');
});

subs('an externalId with /, %, spaces and non-ASCII round-trips through paths', async ({ api, key }) => {
  const odd = 'team/α %20 ü ✓';
  await api.post('/v1/subscribers', key, { externalId: odd, email: 'odd@example.com' });
  const res = await api.get(`/v1/subscribers/${encodeURIComponent(odd)}`, key);
  assert.is(res.status, 200);
  assert.is(res.body.data.externalId, odd);
  assert.is((await api.patch(`/v1/subscribers/${encodeURIComponent(odd)}`, key, { locale: 'fr' })).body.data.locale, 'fr');
  assert.is((await api.get(`/v1/subscribers/${encodeURIComponent('team/other')}`, key)).status, 404);
});

subs('a + in a path externalId is a plus, as in any URL path, not a space (RFC 3986; only form-encoded queries read + as a space)', async ({ api, key }) => {
  await api.post('/v1/subscribers', key, { externalId: 'jane doe' });
  await api.post('/v1/subscribers', key, { externalId: 'jane+doe@example.com' });
  const plus = await api.get('/v1/subscribers/jane+doe@example.com', key);
  assert.is(plus.status, 200, plus.text);
  assert.is(plus.body.data.externalId, 'jane+doe@example.com');
  assert.is((await api.get('/v1/subscribers/jane+doe@example.com/preferences', key)).status, 200);
  assert.is((await api.del('/v1/subscribers/jane+doe@example.com', key)).body.data.externalId, 'jane+doe@example.com');
  assert.is((await api.get('/v1/subscribers/jane%20doe', key)).status, 200, 'the subscriber with a space is untouched');
  assert.is((await api.get('/v1/subscribers/jane+doe', key)).status, 404);
});

subs('text holding $SUB is stored as sent: attributes, properties, and an externalId in the indexes (the write substitutes the subscriber id only in its own index members)', async ({ api, key }) => {
  const externalId = 'odd$SUB$id';
  const res = await api.post('/v1/subscribers', key, { externalId, email: 'sub$SUB@example.com', locale: 'en', properties: { note: '$SUB', tag: '$SUB|x' } });
  assert.is(res.status, 201, res.text);
  const path = `/v1/subscribers/${encodeURIComponent(externalId)}`;
  await api.patch(path, key, { timezone: 'Europe/Paris', properties: { more: 'a $SUB b' } });
  const got = await api.get(path, key);
  assert.is(got.body.data.externalId, externalId);
  assert.is(got.body.data.email, 'sub$SUB@example.com');
  assert.equal(got.body.data.properties, { note: '$SUB', tag: '$SUB|x', more: 'a $SUB b' });
  // the email index member names this subscriber, so the filter finds it
  const byEmail = await api.get(`/v1/subscribers?email=${encodeURIComponent('sub$SUB@example.com')}`, key);
  assert.equal(byEmail.body.data.items.map((s: { externalId: string }) => s.externalId), [externalId]);
  const listed = await api.get('/v1/subscribers?limit=100', key);
  assert.ok(listed.body.data.items.some((s: { externalId: string }) => s.externalId === externalId), 'listed under its own externalId');
  assert.is((await api.del(path, key)).status, 200);
  const after = await api.get('/v1/subscribers?limit=100', key);
  assert.not.ok(after.body.data.items.some((s: { externalId: string }) => s.externalId === externalId), 'the delete removed its index member');
  assert.is((await api.get(`/v1/subscribers?email=${encodeURIComponent('sub$SUB@example.com')}`, key)).body.data.total, 0);
});

subs('the list is newest first with total, pages by cursor and filters by email', async ({ api, key }) => {
  for (let i = 0; i < 7; i++) await api.post('/v1/subscribers', key, { externalId: `list-${i}`, email: i % 2 ? 'odd@list.example' : `even${i}@list.example` });
  const all = (await api.get('/v1/subscribers?limit=100', key)).body.data;
  assert.ok(all.total >= 7);
  assert.is(all.items.length, all.total);
  const ids = all.items.map((s: any) => s.id);
  assert.equal(ids, [...ids].sort().reverse());
  const seen: string[] = [];
  let cursor = '';
  for (let page = 0; page < 50; page++) {
    const res: any = await api.get(`/v1/subscribers?limit=3${cursor ? `&cursor=${cursor}` : ''}`, key);
    assert.is(res.body.data.total, all.total);
    seen.push(...res.body.data.items.map((s: any) => s.id));
    if (!res.body.data.hasMore) break;
    cursor = res.body.data.nextCursor;
  }
  assert.equal(seen, ids);
  const odd = (await api.get('/v1/subscribers?email=ODD@list.example', key)).body.data;
  assert.is(odd.total, 3);
  assert.equal(odd.items.map((s: any) => s.externalId).sort(), ['list-1', 'list-3', 'list-5']);
  // another list's cursor, or a forged one, is 400 like on every other list
  await api.post('/v1/topics', key, { slug: 'cursor-a' });
  await api.post('/v1/topics', key, { slug: 'cursor-b' });
  const topics = (await api.get('/v1/topics?limit=1', key)).body.data;
  for (const cursor of [topics.nextCursor, encodeCursor('zzz'), encodeCursor('sub_x|list-1')]) {
    const res = await api.get(`/v1/subscribers?cursor=${cursor}`, key);
    assert.is(res.status, 400, res.text);
    assert.is(res.body.error.param, 'cursor');
  }
});

subs('an email change moves the subscriber between email filters', async ({ api, key }) => {
  await api.post('/v1/subscribers', key, { externalId: 'mover', email: 'before@example.com' });
  await api.patch('/v1/subscribers/mover', key, { email: 'after@example.com' });
  assert.is((await api.get('/v1/subscribers?email=before@example.com', key)).body.data.total, 0);
  assert.is((await api.get('/v1/subscribers?email=after@example.com', key)).body.data.total, 1);
});

subs('a subscriber created by an event is listed and readable', async ({ api, key }) => {
  await api.post('/v1/events', key, { externalId: 'from-event', name: 'app.open' });
  const res = await api.get('/v1/subscribers/from-event', key);
  assert.is(res.status, 200);
  assert.is(res.body.data.email, null);
});

subs('delete writes $subscription.removed for each subscription and $subscriber.deleted, removes subscriptions and the record; a later event creates it anew', async ({ api, key, service, tenantId, workspaceId }) => {
  const clientKey = (await makeKey(service, 'subs', 'client', ['client'])).key;
  await api.post('/v1/subscribers', key, { externalId: 'gone', email: 'gone@example.com' });
  const reg = await api.post('/v1/client/subscriptions', clientKey, { externalId: 'gone', channel: 'push', token: 'a'.repeat(64), platform: 'ios' });
  assert.is(reg.status, 201);
  const del = await api.del('/v1/subscribers/gone', key);
  assert.is(del.status, 200);
  assert.is((await api.get('/v1/subscribers/gone', key)).status, 404);
  assert.is((await api.get('/v1/subscribers?email=gone@example.com', key)).body.data.total, 0);
  assert.is((await api.del('/v1/subscribers/gone', key)).status, 404);
  const stream = await inboxEvents(service, tenantId, 'gone');
  assert.equal(names(stream), ['$subscriber.created', '$subscription.registered', '$subscription.removed', '$subscriber.deleted']);
  assert.equal(stream[2]!.data, { subscription: { id: reg.body.data.id, channel: 'push', platform: 'ios', enabled: true }, reason: 'subscriber_deleted' });
  // the token is free again: registering it for someone else creates a new subscription
  const again = await api.post('/v1/client/subscriptions', clientKey, { externalId: 'someone', channel: 'push', token: 'a'.repeat(64), platform: 'ios' });
  assert.is(again.status, 201);
  await api.post('/v1/events', key, { externalId: 'gone', name: 'back' });
  assert.is((await api.get('/v1/subscribers/gone', key)).status, 200);
  const ledger = (await service.redis.xrange(service.keys.ledger(workspaceId), '-', '+')).map(([, f]) => JSON.parse(f[3]!).type);
  assert.ok(ledger.includes('subscriber.created') && ledger.includes('subscriber.updated') && ledger.includes('subscriber.deleted'));
});

subs('preferences default to on, change per channel and category, and write $preferences.updated only on a real change', async ({ api, key, service, tenantId, workspaceId }) => {
  await api.post('/v1/subscribers', key, { externalId: 'prefs' });
  const initial = await api.get('/v1/subscribers/prefs/preferences', key);
  assert.equal(initial.body.data, { channels: { push: true, email: true }, categories: {} });
  const changed = await api.patch('/v1/subscribers/prefs/preferences', key, { channels: { email: false }, categories: { marketing: { push: false } } });
  assert.equal(changed.body.data, { channels: { push: true, email: false }, categories: { marketing: { push: false } } });
  await api.patch('/v1/subscribers/prefs/preferences', key, { channels: { email: false } });
  const reset = await api.patch('/v1/subscribers/prefs/preferences', key, { categories: { marketing: null } });
  assert.equal(reset.body.data.categories, {});
  // an empty category says nothing: not stored, no event
  const empty = await api.patch('/v1/subscribers/prefs/preferences', key, { categories: { promo: {} } });
  assert.equal(empty.body.data.categories, {});
  const events = (await inboxEvents(service, tenantId, 'prefs')).filter((e) => e.name === '$preferences.updated');
  assert.is(events.length, 2);
  assert.equal(events[0]!.data.previous, { channels: { push: true, email: true }, categories: {} });
  // the audit's subscriber.updated tells only what changed, as it does for properties
  const prefsId = (await api.get('/v1/subscribers/prefs', key)).body.data.id;
  const audits = await waitFor('two subscriber.updated in the ledger', async () => {
    const found = (await auditEntries(service, workspaceId)).filter((e) => e.type === 'subscriber.updated' && e.target.id === prefsId);
    return found.length >= 2 ? found : null;
  }, 5_000);
  assert.equal(audits.map((e) => [e.changes, e.previousAttributes]), [
    [{ preferences: { channels: { email: false }, categories: { marketing: { push: false } } } }, { preferences: { channels: { email: true }, categories: { marketing: null } } }],
    [{ preferences: { categories: { marketing: null } } }, { preferences: { categories: { marketing: { push: false } } } }],
  ]);
  assert.equal(audits[1]!.data.object.preferences, { channels: { push: true, email: false }, categories: {} }, 'the object is the whole record after the change');
  assert.is((await api.get('/v1/subscribers/nobody/preferences', key)).status, 404);
  assert.is((await api.patch('/v1/subscribers/prefs/preferences', key, { channels: { sms: true } })).body.error.code, 'validation');
});

subs('scopes: subscribers:read cannot write, and another tenant does not see the subscriber', async ({ api, service }) => {
  const reader = (await makeKey(service, 'subs', 'tenant', ['subscribers:read'])).key;
  assert.is((await api.post('/v1/subscribers', reader, { externalId: 'x' })).body.error.code, 'missing_permission');
  assert.is((await api.get('/v1/subscribers/ada', reader)).status, 200);
  const other = (await makeKey(service, 'subs', 'tenant', ['*'], { tenant: 'other' })).key;
  assert.is((await api.get('/v1/subscribers/ada', other)).status, 404);
});

subs.run();
