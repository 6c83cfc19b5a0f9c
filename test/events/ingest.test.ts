import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { isoNow, setClockOffset } from '../../lib/clock.js';
import { partitionOf } from '../../lib/partition.js';
import { ingestEvents } from '../../streams/ingest.js';
import { client } from '../helpers/api.js';
import { bootstrapWorkspace, startTestService, type TestService } from '../helpers/service.js';

type Ctx = { service: TestService; api: ReturnType<typeof client>; key: string; clientKey: string; tenantId: string; workspaceId: string };
const ingest = suite<Ctx>('POST /v1/events');

ingest.before(async (ctx) => {
  ctx.service = await startTestService('ingest');
  ctx.api = client(ctx.service.url);
  const { keys, tenant } = await bootstrapWorkspace(ctx.service, 'ingest');
  ctx.tenantId = tenant.id;
  ctx.workspaceId = (await bootstrapWorkspace(ctx.service, 'ingest')).workspace.id;
  ctx.key = keys.tenant;
  ctx.clientKey = keys.client;
});
ingest.after(async (ctx) => ctx.service.stop());

const inboxLength = async (s: TestService) => {
  let n = 0;
  for (let p = 0; p < s.config.partitions; p++) n += await s.redis.xlen(s.keys.inbox(p));
  return n;
};

ingest('a bare event is stored and answered as a list of one, with every field of 2.4', async ({ api, key }) => {
  const res = await api.post('/v1/events', key, { externalId: 'bare-1', name: 'order.completed', data: { total: 42, items: [1, 2] }, timestamp: new Date(Date.now() - 86_400_000).toISOString() });
  assert.is(res.status, 202);
  const [event] = res.body.data.items;
  assert.match(event.id, /^evt_/);
  assert.is(event.sequence, 2, 'sequence 1 is the $subscriber.created written first');
  assert.is(event.externalId, 'bare-1');
  assert.is(event.name, 'order.completed');
  assert.is(event.source, 'server');
  assert.equal(event.data, { total: 42, items: [1, 2] });
  assert.is(event.runId, null);
  assert.is(event.status, 'accepted');
  assert.is(res.body.data.hasMore, false);
});

ingest('a batch answers in input order with per-subscriber sequences', async ({ api, key }) => {
  const events = Array.from({ length: 100 }, (_, i) => ({ externalId: `batch-${i % 7}`, name: 'page.viewed', data: { i } }));
  const res = await api.post('/v1/events', key, { events });
  assert.is(res.status, 202);
  assert.is(res.body.data.items.length, 100);
  const seen = new Map<string, number>();
  res.body.data.items.forEach((item: any, i: number) => {
    assert.equal(item.data, { i });
    assert.is(item.externalId, `batch-${i % 7}`);
    const last = seen.get(item.externalId) ?? 1;
    assert.is(item.sequence, last + 1);
    seen.set(item.externalId, item.sequence);
  });
});

ingest('an unknown externalId writes $subscriber.created exactly once', async ({ api, key, service }) => {
  const before = await inboxLength(service);
  await api.post('/v1/events', key, { events: [{ externalId: 'new-1', name: 'a' }, { externalId: 'new-1', name: 'b' }] });
  await api.post('/v1/events', key, { externalId: 'new-1', name: 'c' });
  assert.is(await inboxLength(service), before + 4);
});

ingest('an event without a timestamp takes the time of receipt: its receivedAt, which the $subscriber.created it made has too (it came a millisecond before it)', async ({ api, key, service, tenantId }) => {
  // (twenty times: the time taken at validation was a millisecond early about every other time)
  for (let i = 0; i < 20; i++) {
    const res = await api.post('/v1/events', key, { events: [{ externalId: `at-receipt-${i}`, name: 'a' }, { externalId: `at-receipt-${i}`, name: 'b', timestamp: new Date(Date.now() - 60_000).toISOString() }] });
    const [a, b] = res.body.data.items;
    assert.is(a.timestamp, a.receivedAt);
    assert.ok(b.timestamp < b.receivedAt, 'a timestamp given is kept');
    // the inbox: $subscriber.created, a, b, each with its timestamp (ms)
    const stored = (await service.redis.xrange(service.keys.inbox(partitionOf(tenantId, `at-receipt-${i}`, service.config.partitions)), '-', '+'))
      .map(([, f]) => Object.fromEntries(f.flatMap((v, j) => (j % 2 ? [] : [[v, f[j + 1]!]]))) as Record<string, string>)
      .filter((f) => f.t === tenantId && f.x === `at-receipt-${i}`);
    assert.equal(stored.map((f) => f.n), ['$subscriber.created', 'a', 'b']);
    const ts = stored.map((f) => Number(f.ts));
    assert.is(isoNow(ts[1]!), a.timestamp);
    assert.is(ts[0], ts[1], 'the subscriber was created when the event that made it happened');
  }
});

ingest('a replayed id returns the original event as duplicate and stores nothing', async ({ api, key, service }) => {
  const first = await api.post('/v1/events', key, { externalId: 'dup-1', name: 'signup', id: 'client-1', data: { plan: 'pro' } });
  const before = await inboxLength(service);
  const again = await api.post('/v1/events', key, { events: [{ externalId: 'dup-1', name: 'signup', id: 'client-1', data: { plan: 'other' } }, { externalId: 'dup-2', name: 'x', id: 'client-1' }] });
  assert.is(again.status, 202);
  const [replayed, other] = again.body.data.items;
  const original = first.body.data.items[0];
  assert.is(replayed.status, 'duplicate');
  assert.equal({ ...replayed, status: 'accepted' }, original);
  assert.is(other.status, 'accepted', 'dedupe ids are per subscriber');
  assert.is(await inboxLength(service), before + 2, 'only dup-2 and its $subscriber.created');
});

ingest('the same id twice in one batch stores it once', async ({ api, key }) => {
  const res = await api.post('/v1/events', key, { events: [{ externalId: 'dup-3', name: 'x', id: 'same' }, { externalId: 'dup-3', name: 'x', id: 'same' }] });
  assert.equal(res.body.data.items.map((i: any) => i.status), ['accepted', 'duplicate']);
  assert.is(res.body.data.items[0].id, res.body.data.items[1].id);
});

ingest('dedupe ids holding | never make one subscriber\'s event a duplicate of another\'s', async ({ api, key, service, tenantId }) => {
  // externalId `a|b` with id `c` and externalId `a` with id `b|c`, in one partition: one dedupe field before
  const partitions = service.config.partitions;
  let suffix = 0;
  while (partitionOf(tenantId, `pipe|${suffix}`, partitions) !== partitionOf(tenantId, 'pipe', partitions)) suffix++;
  const first = await api.post('/v1/events', key, { externalId: `pipe|${suffix}`, name: 'first', id: 'r', data: { secret: 1 } });
  const second = await api.post('/v1/events', key, { externalId: 'pipe', name: 'second', id: `${suffix}|r` });
  assert.is(first.body.data.items[0].status, 'accepted');
  assert.is(second.body.data.items[0].status, 'accepted', 'another subscriber, another id');
  assert.is(second.body.data.items[0].name, 'second');
  assert.is.not(second.body.data.items[0].id, first.body.data.items[0].id);
  const replay = await api.post('/v1/events', key, { externalId: 'pipe', name: 'second', id: `${suffix}|r` });
  assert.equal([replay.body.data.items[0].status, replay.body.data.items[0].id], ['duplicate', second.body.data.items[0].id]);
  // an entry of the field's old form (tenant|externalId|id) still answers its own subscriber's replays, never another's
  const p = partitionOf(tenantId, 'pipe', partitions);
  const inboxId = (await service.redis.xrevrange(service.keys.inbox(p), '+', '-', 'COUNT', 1))[0]![0];
  await service.redis.hset(service.keys.dedupe(p), `${tenantId}|pipe|legacy-1`, `i${inboxId}`);
  const legacy = await api.post('/v1/events', key, { externalId: 'pipe', name: 'second', id: 'legacy-1' });
  assert.equal([legacy.body.data.items[0].status, legacy.body.data.items[0].id], ['duplicate', second.body.data.items[0].id]);
  await service.redis.hset(service.keys.dedupe(p), `${tenantId}|pipe|${suffix}|legacy-2`, `i${inboxId}`);
  const foreign = await api.post('/v1/events', key, { externalId: `pipe|${suffix}`, name: 'third', id: 'legacy-2' });
  assert.is(foreign.body.data.items[0].status, 'accepted', 'an old-form entry whose original is another subscriber\'s is not a duplicate');
});

ingest('a dedupe id is one subscriber\'s: once it is deleted, the same id is accepted and creates the subscriber again', async ({ api, key }) => {
  const first = await api.post('/v1/events', key, { externalId: 'gone-1', name: 'signup', id: 'once' });
  assert.is(first.body.data.items[0].status, 'accepted');
  assert.is((await api.del('/v1/subscribers/gone-1', key)).status, 200);
  const again = await api.post('/v1/events', key, { externalId: 'gone-1', name: 'signup', id: 'once' });
  assert.is(again.body.data.items[0].status, 'accepted', 'the deleted subscriber\'s event is not this one\'s duplicate');
  assert.is.not(again.body.data.items[0].id, first.body.data.items[0].id);
  assert.is((await api.get('/v1/subscribers/gone-1', key)).status, 200, 'the event created the subscriber again');
  const replay = await api.post('/v1/events', key, { externalId: 'gone-1', name: 'signup', id: 'once' });
  assert.equal([replay.body.data.items[0].status, replay.body.data.items[0].id], ['duplicate', again.body.data.items[0].id]);
});

ingest('the engine\'s own dedupe ids ($send once per message) and a caller\'s never match, whatever the caller sends', async ({ api, key, service, tenantId, workspaceId }) => {
  const scope = { workspaceId, tenantId, partitions: service.config.partitions, maxBacklog: 1_000_000 };
  const send = { externalId: 'ns-1', name: '$send', source: 'system' as const, timestampMs: Date.now(), data: '{}', callerId: '$send:msg_x', provider: null, runId: null, messageId: 'msg_x', step: null };
  await api.post('/v1/events', key, { externalId: 'ns-1', name: 'signup' });
  assert.is((await ingestEvents(service.redis, service.keys, scope, [send]))[0]!.status, 'accepted');
  const caller = await api.post('/v1/events', key, { externalId: 'ns-1', name: 'mine', id: '$send:msg_x' });
  assert.is(caller.body.data.items[0].status, 'accepted', 'a caller id equal to the engine\'s is another id');
  assert.is(caller.body.data.items[0].name, 'mine');
  // and the other way round: a caller's id first does not suppress the engine's event
  await api.post('/v1/events', key, { externalId: 'ns-1', name: 'mine', id: '$send:msg_y' });
  assert.is((await ingestEvents(service.redis, service.keys, scope, [{ ...send, callerId: '$send:msg_y', messageId: 'msg_y' }]))[0]!.status, 'accepted');
  // each still dedupes in its own namespace
  assert.is((await ingestEvents(service.redis, service.keys, scope, [send]))[0]!.status, 'duplicate');
  assert.is((await api.post('/v1/events', key, { externalId: 'ns-1', name: 'mine', id: '$send:msg_x' })).body.data.items[0].status, 'duplicate');
});

ingest('the engine\'s events never create a subscriber: a $send for one deleted since the fan-out read it is not stored, and the subscriber stays deleted (probe EG: it came back, listed, with a $subscriber.created)', async ({ api, key, service, tenantId, workspaceId }) => {
  const scope = { workspaceId, tenantId, partitions: service.config.partitions, maxBacklog: 1_000_000 };
  const send = (externalId: string, messageId: string) => ({ externalId, name: '$send', source: 'system' as const, timestampMs: Date.now(), data: '{}', callerId: `$send:${messageId}`, provider: null, runId: null, messageId, step: null });
  assert.is((await api.post('/v1/events', key, { externalId: 'gone-2', name: 'signup' })).status, 202);
  const before = await inboxLength(service);
  assert.is((await api.del('/v1/subscribers/gone-2', key)).status, 200);
  const deleted = await inboxLength(service);
  const [late, never] = await ingestEvents(service.redis, service.keys, scope, [send('gone-2', 'msg_late'), send('never-seen', 'msg_late')]);
  assert.equal([late!.status, never!.status], ['gone', 'gone']);
  assert.is(await inboxLength(service), deleted, 'nothing appended');
  assert.ok(deleted > before, 'the delete itself wrote its events');
  assert.is((await api.get('/v1/subscribers/gone-2', key)).status, 404, 'still deleted');
  assert.is((await api.get('/v1/subscribers/never-seen', key)).status, 404, 'and an unknown externalId is not made one');
  // a caller's event still creates the subscriber again
  assert.is((await api.post('/v1/events', key, { externalId: 'gone-2', name: 'back' })).body.data.items[0].status, 'accepted');
  assert.is((await api.get('/v1/subscribers/gone-2', key)).status, 200);
});

ingest('a batch with any invalid event is refused whole with details per item', async ({ api, key, service }) => {
  const before = await inboxLength(service);
  const events = [{ externalId: 'v1', name: 'ok' }, { externalId: 'v1', name: 'ok' }, { externalId: 'v1', name: 'ok' }, { externalId: 'v1', name: 'Bad Name' }, { externalId: '', name: 'ok' }];
  const res = await api.post('/v1/events', key, { events });
  assert.is(res.status, 400);
  assert.is(res.body.error.code, 'validation');
  const params = res.body.error.details.map((d: any) => d.param);
  assert.ok(params.includes('events[3].name'));
  assert.ok(params.includes('events[4].externalId'));
  // the name rule in words, its length bound included, not a raw regex (probe D1)
  assert.match(res.body.error.details.find((d: any) => d.param === 'events[3].name').message, /^must be 1 to 100 characters of a-z, 0-9/);
  assert.is(await inboxLength(service), before, 'nothing of the batch is stored');
});

ingest('a batch failing for several reasons names every failing item, in input order, under the first code', async ({ api, key, service }) => {
  const before = await inboxLength(service);
  const events = [
    { externalId: 'm1', name: 'ok' },
    { externalId: 'm1', name: '$app.opened' },
    { externalId: 'm1', name: 'ok', timestamp: '2000-01-01T00:00:00Z' },
    { externalId: 'm1', name: 'ok', data: { p: 'x'.repeat(9000) } },
    { externalId: 'm1', name: 'BAD' },
    { externalId: 'm1', name: 'ok', data: [] },
  ];
  const res = await api.post('/v1/events', key, { events });
  assert.is(res.status, 400);
  assert.is(res.body.error.code, 'validation');
  assert.equal(res.body.error.details.map((d: any) => d.param), ['events[1].name', 'events[2].timestamp', 'events[3].data', 'events[4].name', 'events[5].data']);
  assert.is(res.body.error.param, 'events[4].name', 'param names the first failure of the code answered');
  // without a validation failure the code is invalid_timestamp, and param its item, not the earlier data one
  const two = await api.post('/v1/events', key, { events: [events[3], events[2]] });
  assert.equal([two.body.error.code, two.body.error.param, two.body.error.details.length], ['invalid_timestamp', 'events[1].timestamp', 2]);
  assert.ok(two.body.error.message.startsWith('events[1].timestamp: '), two.body.error.message);
  assert.is(await inboxLength(service), before, 'nothing of the batch is stored');
});

ingest('an externalId of 256 characters outside the BMP is accepted and addressable by path; 257 is not (400 in a body, 404 in a path)', async ({ api, key }) => {
  const externalId = '😀'.repeat(256);
  assert.is((await api.post('/v1/events', key, { externalId, name: 'emoji.sent' })).status, 202);
  const path = `/v1/subscribers/${encodeURIComponent(externalId)}`;
  assert.is((await api.get(`${path}/timeline`, key)).status, 200);
  assert.is((await api.get(path, key)).body.data.externalId, externalId);
  const tooLong = await api.get(`/v1/subscribers/${encodeURIComponent(externalId + '😀')}/timeline`, key);
  assert.is(tooLong.status, 404, 'in a path, a malformed id (spec 2.3 rules 2 and 4)');
  assert.is(tooLong.body.error.code, 'not_found');
  assert.is((await api.post('/v1/events', key, { externalId: externalId + '😀', name: 'emoji.sent' })).status, 400);
});

ingest('every bound of 4.3 and Part 8 is a clear error', async ({ api, key }) => {
  const cases: [unknown, string, string][] = [
    [{ externalId: 'x', name: '$app.opened' }, 'reserved_event', 'name'],
    [{ externalId: 'x', name: '$Foo' }, 'reserved_event', 'name'],
    [{ externalId: 'x', name: '$' }, 'reserved_event', 'name'],
    // any `$` name is reserved_event, whatever its length or characters (not validation)
    [{ externalId: 'x', name: '$' + 'a'.repeat(300) }, 'reserved_event', 'name'],
    [{ externalId: 'x', name: '$a\nb' }, 'reserved_event', 'name'],
    [{ events: [{ externalId: 'x', name: 'ok' }, { externalId: 'x', name: '$custom' }] }, 'reserved_event', 'events[1].name'],
    [{ externalId: 'x', name: 'ok', timestamp: new Date(Date.now() - 8 * 86_400_000).toISOString() }, 'invalid_timestamp', 'timestamp'],
    [{ externalId: 'x', name: 'ok', timestamp: new Date(Date.now() + 2 * 3_600_000).toISOString() }, 'invalid_timestamp', 'timestamp'],
    [{ externalId: 'x', name: 'ok', data: { pad: 'x'.repeat(8 * 1024) } }, 'event_data_too_large', 'data'],
    [{ externalId: 'x', name: 'ok', data: [1, 2] }, 'validation', 'data'],
    [{ externalId: 'x', name: 'ok', data: 'text' }, 'validation', 'data'],
    [{ externalId: 'x'.repeat(257), name: 'ok' }, 'validation', 'externalId'],
    [{ externalId: 'x', name: 'a'.repeat(101) }, 'validation', 'name'],
    [{ externalId: 'x', name: '-leading' }, 'validation', 'name'],
    [{ externalId: 'x', name: 'ok', timestamp: 'yesterday' }, 'validation', 'timestamp'],
    [{ externalId: 'x', name: 'ok', extra: 1 }, 'validation', 'extra'],
    [{ name: 'ok' }, 'validation', 'externalId'],
    [{ events: [] }, 'validation', 'events'],
    [{ events: Array.from({ length: 101 }, () => ({ externalId: 'x', name: 'ok' })) }, 'validation', 'events'],
  ];
  for (const [body, code, param] of cases) {
    const res = await api.post('/v1/events', key, body);
    assert.is(res.status, 400, JSON.stringify(body).slice(0, 80));
    assert.is(res.body.error.code, code, JSON.stringify(body).slice(0, 80));
    assert.ok(res.body.error.details.some((d: any) => d.param === param), `${param} in ${JSON.stringify(res.body.error.details)}`);
  }
});

ingest('a timestamp of a form the service cannot read is a validation error, and the read models stay readable', async ({ api, key }) => {
  // RFC 3339 forms ajv's date-time accepts and Date.parse does not: their NaN was stored and broke every read of the tenant
  const day = new Date().toISOString().slice(0, 10);
  const time = new Date().toISOString().slice(11, 19);
  for (const timestamp of [`${day}T${time}+00`, `${day}T23:59:60Z`]) {
    const res = await api.post('/v1/events', key, { externalId: 'unreadable-ts', name: 'ok', timestamp });
    assert.is(res.status, 400, timestamp);
    assert.is(res.body.error.code, 'validation', timestamp);
    assert.is(res.body.error.param, 'timestamp');
  }
  const read = await api.get('/v1/events?after=' + encodeURIComponent(`${day}T${time}+00`), key);
  assert.is(read.status, 400, 'the same rule holds for the after filter');
  assert.is((await api.get('/v1/events', key)).status, 200);
  assert.is((await api.get('/v1/events/names', key)).status, 200);
});

ingest('a timestamp that is not a date-time has one detail (its format), not a second about the window', async ({ api, key }) => {
  const bare = await api.post('/v1/events', key, { externalId: 'impossible-ts', name: 'ok', timestamp: '2026-02-30T00:00:00Z' });
  assert.is(bare.status, 400);
  assert.is(bare.body.error.code, 'validation');
  assert.equal(bare.body.error.details.map((d: any) => d.param), ['timestamp']);
  const far = new Date(Date.now() - 30 * 86_400_000).toISOString();
  const batch = await api.post('/v1/events', key, { events: [
    { externalId: 'impossible-ts', name: 'ok', timestamp: '2026-13-01T00:00:00Z' },
    { externalId: 'impossible-ts', name: 'ok', timestamp: far },
  ] });
  assert.is(batch.status, 400);
  assert.is(batch.body.error.code, 'validation');
  assert.equal(batch.body.error.details.map((d: any) => d.param), ['events[0].timestamp', 'events[1].timestamp'], 'the well-formed one is still checked against the window');
});

ingest('timestamps at the edges of the window are accepted', async ({ api, key }) => {
  const old = new Date(Date.now() - 7 * 86_400_000 + 60_000).toISOString();
  const ahead = new Date(Date.now() + 3_600_000 - 60_000).toISOString();
  const res = await api.post('/v1/events', key, { events: [{ externalId: 'edge', name: 'ok', timestamp: old }, { externalId: 'edge', name: 'ok', timestamp: ahead }] });
  assert.is(res.status, 202);
  assert.is(res.body.data.items[0].timestamp, old);
});

ingest('data of exactly 8 KB serialized is accepted', async ({ api, key }) => {
  const pad = 'x'.repeat(8 * 1024 - JSON.stringify({ p: '' }).length);
  const res = await api.post('/v1/events', key, { externalId: 'big', name: 'ok', data: { p: pad } });
  assert.is(res.status, 202);
});

ingest('a body nesting arrays and objects deeper than 64 levels is 400 validation naming where, on every route (a few thousand levels of brackets answered 500)', async ({ api, key, clientKey }) => {
  const nested = (levels: number) => '['.repeat(levels) + ']'.repeat(levels);
  const deep = nested(5000); // 10 KB, far below the body limit
  const cases: [string, string, string, string][] = [
    ['/v1/events', key, `{"externalId":"deep-1","name":"deep.ev","data":{"a":${deep}}}`, 'data.a'],
    ['/v1/events', key, `{"events":[{"externalId":"deep-1","name":"deep.ev","data":{"a":${deep}}}]}`, 'events[0].data.a'],
    ['/v1/client/events', clientKey, `{"externalId":"deep-1","source":"ios","events":[{"name":"deep.ev","data":{"a":${deep}}}]}`, 'events[0].data.a'],
    ['/v1/messages', key, `{"to":"deep-1","title":"t","body":"b","data":{"a":${deep}}}`, 'data.a'],
    ['/v1/subscribers', key, `{"externalId":"deep-1","properties":{"a":${deep}}}`, 'properties.a'],
    ['/v1/client/identify', clientKey, `{"externalId":"deep-1","attributes":{"properties":{"a":${deep}}}}`, 'attributes.properties.a'],
    ['/v1/client/widgets', clientKey, `{"externalId":"deep-1","kind":"k","configuration":{"a":${deep}}}`, 'configuration.a'],
    ['/v1/events', key, deep, '[0][0]'],
  ];
  for (const [path, credential, raw, param] of cases) {
    const res = await api.call('POST', path, { key: credential, raw });
    assert.is(res.status, 400, `${path} ${param}`);
    assert.is(res.body.error.code, 'validation');
    assert.ok(res.body.error.param.startsWith(param), `${path}: ${res.body.error.param.slice(0, 60)}`);
    assert.match(res.body.error.details[0].message, /deeper than 64 levels/);
  }
  assert.is((await api.get('/v1/subscribers/deep-1', key)).status, 404, 'nothing was stored');
  // 64 levels in all is fine: the bare event is level 1, data level 2, then 62 more
  const ok = await api.call('POST', '/v1/events', { key, raw: `{"externalId":"deep-2","name":"deep.ev","data":{"a":${nested(62)}}}` });
  assert.is(ok.status, 202);
  const over = await api.call('POST', '/v1/events', { key, raw: `{"externalId":"deep-2","name":"deep.ev","data":{"a":${nested(63)}}}` });
  assert.is(over.status, 400);
  assert.is(over.body.error.param, `data.a${'[0]'.repeat(62)}`);
});

ingest('the timestamp window follows the service clock', async ({ api, key }) => {
  setClockOffset(-10 * 86_400_000);
  try {
    const res = await api.post('/v1/events', key, { externalId: 'clock', name: 'ok', timestamp: new Date(Date.now() - 9 * 86_400_000).toISOString() });
    assert.is(res.status, 400, 'nine days back is a day ahead of a clock set ten days back');
  } finally {
    setClockOffset(0);
  }
});

ingest('client events accept only the SDK reserved names and a client source', async ({ api, clientKey }) => {
  const ok = await api.post('/v1/client/events', clientKey, { externalId: 'app-1', source: 'ios', events: [{ name: '$app.opened' }, { name: 'screen.viewed', data: { screen: 'home' } }] });
  assert.is(ok.status, 202);
  assert.equal(ok.body.data.items.map((i: any) => i.source), ['ios', 'ios']);
  const engine = await api.post('/v1/client/events', clientKey, { externalId: 'app-1', source: 'ios', events: [{ name: '$subscriber.created' }] });
  assert.is(engine.body.error.code, 'reserved_event');
  assert.is(engine.body.error.details[0].param, 'events[0].name');
  const source = await api.post('/v1/client/events', clientKey, { externalId: 'app-1', source: 'server', events: [{ name: 'x' }] });
  assert.is(source.body.error.code, 'validation');
  assert.is(source.body.error.details[0].param, 'source');
});

ingest.run();
