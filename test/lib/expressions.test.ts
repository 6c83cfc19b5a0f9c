import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { DURATION_PATTERN, parseDuration } from '../../lib/durations.js';
import {
  MAX_DEPTH,
  MAX_ERRORS,
  MAX_EVENT_CONDITIONS,
  MAX_NODES,
  attributeValue,
  conditionKey,
  countMatches,
  dependencies,
  evaluate,
  eventConditions,
  matchesEvent,
  validateExpression,
  type EventCondition,
  type EventLike,
  type Expression,
  type Subject,
} from '../../lib/expressions.js';

type SubjectInit = Partial<Omit<Subject, 'count'>> & { counts?: Record<string, number>; count?: Subject['count'] };

function subject(init: SubjectInit = {}): Subject {
  return {
    subscriber: init.subscriber ?? {
      externalId: 'u-1', email: 'ada@example.com', phone: null, locale: 'en-GB', timezone: 'Europe/London', verified: true,
      createdAt: '2024-03-01T10:00:00.000Z',
      properties: { plan: 'pro', seats: 5, beta: false, nothing: null, tags: ['a', 'vip', 3], address: { city: 'Paris', zip: '75001' }, email: 'work@example.com' },
    },
    topics: init.topics ?? new Set(['news']),
    subscriptions: init.subscriptions ?? [],
    count: init.count ?? ((c: EventCondition) => init.counts?.[c.event] ?? 0),
    event: init.event,
  };
}

const attr = (attribute: string, op: Record<string, unknown>) => ({ attribute, ...op }) as Expression;
const is = (expr: Expression, s: Subject = subject()) => evaluate(expr, s);
const params = (value: unknown, options?: { eventProperties?: boolean }) => validateExpression(value, 'where', options).map((d) => d.param);

// ---------------------------------------------------------------------------------------------

const durations = suite('durations');

durations('units s, m, h and d give milliseconds', () => {
  assert.is(parseDuration('30s'), 30_000);
  assert.is(parseDuration('15m'), 900_000);
  assert.is(parseDuration('24h'), 86_400_000);
  assert.is(parseDuration('7d'), 604_800_000);
  assert.is(parseDuration('999999d'), 999_999 * 86_400_000);
});

durations('zero, decimals, spaces, signs, numbers and other units are not durations', () => {
  for (const bad of ['0s', '0m', '01m', '1.5h', ' 1h', '1h ', '1 h', '-1h', '+1h', '1w', '1', 'h', '', '1000000d', '1H']) {
    assert.is(parseDuration(bad), null, bad);
  }
  for (const bad of [60, null, undefined, {}, ['1h'], true]) assert.is(parseDuration(bad), null, String(bad));
});

durations('the pattern is usable as a JSON schema pattern', () => {
  assert.is(DURATION_PATTERN, '^[1-9][0-9]{0,5}[smhd]$');
  assert.ok(new RegExp(DURATION_PATTERN).test('90d'));
  assert.not.ok(new RegExp(DURATION_PATTERN).test('0d'));
});

durations.run();

// ---------------------------------------------------------------------------------------------

const names = suite('attribute names');

names('built-in names read the subscriber record', () => {
  const s = subject().subscriber;
  assert.is(attributeValue(s, 'externalId'), 'u-1');
  assert.is(attributeValue(s, 'email'), 'ada@example.com');
  assert.is(attributeValue(s, 'phone'), null);
  assert.is(attributeValue(s, 'verified'), true);
  assert.is(attributeValue(s, 'createdAt'), '2024-03-01T10:00:00.000Z');
  assert.is(attributeValue(s, 'locale'), 'en-GB');
  assert.is(attributeValue(s, 'timezone'), 'Europe/London');
});

names('any other name reads properties, properties.<path> reads them explicitly', () => {
  const s = subject().subscriber;
  assert.is(attributeValue(s, 'plan'), 'pro');
  assert.is(attributeValue(s, 'properties.plan'), 'pro');
  assert.is(attributeValue(s, 'properties.email'), 'work@example.com');
  // a bare `properties` is a property like any other name (docs/expressions.md): properties.properties
  assert.is(attributeValue(s, 'properties'), undefined);
  assert.is(attributeValue({ ...s, properties: { properties: 'x' } }, 'properties'), 'x');
  assert.ok(is(attr('properties', { eq: 'x' }), subject({ subscriber: { ...s, properties: { properties: 'x' } } })));
  assert.not.ok(is(attr('properties', { exists: true })), 'no property named properties: missing');
});

names('dotted paths walk nested objects, and stop at missing parts, scalars and arrays', () => {
  const s = subject().subscriber;
  assert.is(attributeValue(s, 'address.city'), 'Paris');
  assert.is(attributeValue(s, 'properties.address.zip'), '75001');
  assert.is(attributeValue(s, 'address.country'), undefined);
  assert.is(attributeValue(s, 'missing.deeper.still'), undefined);
  assert.is(attributeValue(s, 'plan.length'), undefined);
  assert.is(attributeValue(s, 'tags.length'), undefined);
  assert.is(attributeValue(s, 'email.length'), undefined);
});

names('inherited object members are never read', () => {
  const s = subject().subscriber;
  assert.is(attributeValue(s, 'constructor'), undefined);
  assert.is(attributeValue(s, 'toString'), undefined);
  assert.is(attributeValue(s, 'address.hasOwnProperty'), undefined);
  assert.is(attributeValue({ externalId: 'x' }, 'plan'), undefined);
});

names.run();

// ---------------------------------------------------------------------------------------------

const ops = suite('attribute operators');

ops('eq is strict JSON equality of scalars', () => {
  assert.ok(is(attr('plan', { eq: 'pro' })));
  assert.not.ok(is(attr('plan', { eq: 'free' })));
  assert.ok(is(attr('seats', { eq: 5 })));
  assert.not.ok(is(attr('seats', { eq: '5' })));
  assert.ok(is(attr('beta', { eq: false })));
  assert.not.ok(is(attr('beta', { eq: 0 })));
  assert.ok(is(attr('nothing', { eq: null })));
  assert.not.ok(is(attr('missing', { eq: null })));
  assert.not.ok(is(attr('address', { eq: 'Paris' })));
  assert.ok(is(attr('verified', { eq: true })));
});

ops('ne is the negation of eq: true when missing or of another type', () => {
  assert.ok(is(attr('plan', { ne: 'free' })));
  assert.not.ok(is(attr('plan', { ne: 'pro' })));
  assert.ok(is(attr('missing', { ne: 'pro' })));
  assert.ok(is(attr('seats', { ne: '5' })));
  assert.not.ok(is(attr('nothing', { ne: null })));
  assert.ok(is(attr('plan', { ne: null })));
});

ops('gt, gte, lt and lte compare numbers numerically', () => {
  assert.ok(is(attr('seats', { gt: 4 })));
  assert.not.ok(is(attr('seats', { gt: 5 })));
  assert.ok(is(attr('seats', { gte: 5 })));
  assert.not.ok(is(attr('seats', { gte: 6 })));
  assert.ok(is(attr('seats', { lt: 10 })));
  assert.not.ok(is(attr('seats', { lt: 5 })));
  assert.ok(is(attr('seats', { lte: 5 })));
  assert.not.ok(is(attr('seats', { lte: 4.5 })));
});

ops('gt, gte, lt and lte compare strings lexicographically, so ISO dates compare', () => {
  assert.ok(is(attr('createdAt', { gte: '2024-01-01' })));
  assert.not.ok(is(attr('createdAt', { gte: '2024-06-01' })));
  assert.ok(is(attr('createdAt', { lt: '2024-03-02T00:00:00Z' })));
  assert.ok(is(attr('plan', { gt: 'free' })));
  assert.not.ok(is(attr('plan', { lte: 'free' })));
  assert.ok(is(attr('plan', { lte: 'pro' })));
});

ops('two date-times compare as instants, whatever their offsets and precision (probe EK: by their text, .000Z came before Z of the same second and offsets were never applied)', () => {
  // createdAt is 2024-03-01T10:00:00.000Z
  assert.ok(is(attr('createdAt', { gte: '2024-03-01T10:00:00Z' })), 'the same second, without milliseconds');
  assert.ok(is(attr('createdAt', { lte: '2024-03-01T10:00:00Z' })));
  assert.ok(is(attr('createdAt', { gte: '2024-03-01T10:30:00+01:00' })), '30 minutes before, written in +01:00');
  assert.not.ok(is(attr('createdAt', { gte: '2024-03-01T11:30:00+01:00' })), '30 minutes after, in +01:00');
  assert.ok(is(attr('createdAt', { lt: '2024-03-01T09:30:00-01:00' })), '30 minutes after, in -01:00');
  assert.ok(is(attr('createdAt', { gt: '2024-03-01T23:59:59.999+14:00' })), '0.001 s before, in +14:00');
  assert.not.ok(is(attr('createdAt', { gt: '2024-03-01T10:00:00.0001Z' })), 'precision beyond milliseconds is dropped, as stored');
  // text that is not a date-time with its offset still compares as text
  assert.ok(is(attr('createdAt', { lt: '2024-03-01T10:00:00.000Zz' })));
  assert.ok(is(attr('plan', { gt: '2024-03-01T10:00:00Z' })));
});

ops('ordering a missing value or across types is false', () => {
  assert.not.ok(is(attr('missing', { gt: 0 })));
  assert.not.ok(is(attr('missing', { lt: 'z' })));
  assert.not.ok(is(attr('seats', { gt: '1' })));
  assert.not.ok(is(attr('plan', { lt: 100 })));
  assert.not.ok(is(attr('nothing', { lte: 0 })));
  assert.not.ok(is(attr('beta', { gte: 0 })));
});

ops('in and nin test membership of scalars; nin is true for a missing value', () => {
  assert.ok(is(attr('plan', { in: ['pro', 'team'] })));
  assert.not.ok(is(attr('plan', { in: ['free', 'team'] })));
  assert.not.ok(is(attr('seats', { in: ['5'] })));
  assert.ok(is(attr('nothing', { in: [null] })));
  assert.not.ok(is(attr('missing', { in: ['pro', null] })));
  assert.not.ok(is(attr('tags', { in: ['a'] })));
  assert.ok(is(attr('plan', { nin: ['free'] })));
  assert.not.ok(is(attr('plan', { nin: ['pro'] })));
  assert.ok(is(attr('missing', { nin: ['pro'] })));
});

ops('exists is true for a present, non-null value', () => {
  assert.ok(is(attr('plan', { exists: true })));
  assert.ok(is(attr('beta', { exists: true })));
  assert.not.ok(is(attr('nothing', { exists: true })));
  assert.not.ok(is(attr('missing', { exists: true })));
  assert.ok(is(attr('missing', { exists: false })));
  assert.ok(is(attr('phone', { exists: false })));
  assert.not.ok(is(attr('email', { exists: false })));
});

ops('contains finds a substring of a string or an equal element of an array', () => {
  assert.ok(is(attr('email', { contains: '@example.' })));
  assert.not.ok(is(attr('email', { contains: '@other.' })));
  assert.ok(is(attr('tags', { contains: 'vip' })));
  assert.ok(is(attr('tags', { contains: 3 })));
  assert.not.ok(is(attr('tags', { contains: 'vi' })));
  assert.not.ok(is(attr('tags', { contains: '3' })));
  assert.not.ok(is(attr('seats', { contains: 5 })));
  assert.not.ok(is(attr('plan', { contains: 5 })));
  assert.not.ok(is(attr('missing', { contains: 'a' })));
  assert.not.ok(is(attr('address', { contains: 'Paris' })));
});

ops('startsWith tests a string prefix', () => {
  assert.ok(is(attr('locale', { startsWith: 'en' })));
  assert.ok(is(attr('address.city', { startsWith: 'Par' })));
  assert.not.ok(is(attr('locale', { startsWith: 'fr' })));
  assert.not.ok(is(attr('seats', { startsWith: '5' })));
  assert.not.ok(is(attr('missing', { startsWith: '' })));
  assert.not.ok(is(attr('tags', { startsWith: 'a' })));
});

ops.run();

// ---------------------------------------------------------------------------------------------

const forms = suite('other conditions and combinators');

forms('all, any and not combine, nested', () => {
  const pro = attr('plan', { eq: 'pro' });
  const free = attr('plan', { eq: 'free' });
  assert.ok(is({ all: [pro, { topic: 'news' }] }));
  assert.not.ok(is({ all: [pro, free] }));
  assert.ok(is({ any: [free, pro] }));
  assert.not.ok(is({ any: [free, { topic: 'sports' }] }));
  assert.ok(is({ not: free }));
  assert.not.ok(is({ not: pro }));
  assert.ok(is({ all: [{ any: [free, { not: { not: pro } }] }, { not: { all: [pro, free] } }] }));
});

forms('all stops at the first false and any at the first true', () => {
  let calls = 0;
  const s = subject({ count: () => (calls++, 1) });
  assert.not.ok(is({ all: [attr('plan', { eq: 'free' }), { event: 'x' }] }, s));
  assert.ok(is({ any: [attr('plan', { eq: 'pro' }), { event: 'x' }] }, s));
  assert.is(calls, 0);
});

forms('a topic condition tests membership by slug', () => {
  assert.ok(is({ topic: 'news' }));
  assert.not.ok(is({ topic: 'sports' }));
  assert.not.ok(is({ topic: 'news' }, subject({ topics: new Set() })));
});

forms('a subscription condition needs one subscription matching every given field', () => {
  const subscriptions = [
    { channel: 'push', enabled: true, platform: 'ios', invalidated: true },
    { channel: 'push', enabled: false, platform: 'android', invalidated: false },
    { channel: 'email', enabled: true, platform: null, invalidated: false },
  ];
  const s = subject({ subscriptions });
  assert.ok(is({ subscription: {} }, s));
  assert.not.ok(is({ subscription: {} }, subject({ subscriptions: [] })));
  assert.ok(is({ subscription: { channel: 'push' } }, s));
  assert.ok(is({ subscription: { channel: 'email', enabled: true } }, s));
  assert.not.ok(is({ subscription: { channel: 'push', enabled: true } }, s), 'an invalidated subscription is not enabled');
  assert.ok(is({ subscription: { channel: 'push', enabled: false, platform: 'ios' } }, s), 'invalidated counts as disabled');
  assert.ok(is({ subscription: { platform: 'android', enabled: false } }, s));
  assert.not.ok(is({ subscription: { platform: 'android', enabled: true } }, s));
  assert.not.ok(is({ subscription: { channel: 'email', platform: 'ios' } }, s));
});

forms('an event condition compares the subject count with count, default at least one', () => {
  const s = subject({ counts: { 'order.completed': 2, 'app.opened': 0 } });
  assert.ok(is({ event: 'order.completed' }, s));
  assert.not.ok(is({ event: 'app.opened' }, s));
  assert.ok(is({ event: 'app.opened', count: { eq: 0 } }, s));
  assert.ok(is({ event: 'order.completed', count: { gte: 2 } }, s));
  assert.not.ok(is({ event: 'order.completed', count: { gte: 3 } }, s));
  assert.ok(is({ event: 'order.completed', count: { gt: 1, lt: 3 } }, s));
  assert.not.ok(is({ event: 'order.completed', count: { gt: 1, ne: 2 } }, s));
});

forms('the subject is asked for the count of the condition itself', () => {
  const seen: EventCondition[] = [];
  const cond: EventCondition = { event: 'order.completed', within: '30d', where: [{ property: 'total', gt: 50 }] };
  is({ all: [cond] }, subject({ count: (c) => (seen.push(c), 0) }));
  assert.is(seen[0], cond);
});

forms('countMatches checks every count comparison', () => {
  const c = (count?: EventCondition['count']) => ({ event: 'e', count });
  assert.ok(countMatches(c(), 1));
  assert.not.ok(countMatches(c(), 0));
  assert.ok(countMatches(c({ eq: 3 }), 3));
  assert.not.ok(countMatches(c({ eq: 3 }), 4));
  assert.ok(countMatches(c({ ne: 3 }), 4));
  assert.not.ok(countMatches(c({ ne: 3 }), 3));
  assert.ok(countMatches(c({ lte: 3 }), 3));
  assert.not.ok(countMatches(c({ lt: 3 }), 3));
  assert.ok(countMatches(c({ gte: 2, lte: 4 }), 2));
  assert.not.ok(countMatches(c({ gte: 2, lte: 4 }), 5));
  assert.ok(countMatches(c({ eq: 0 }), 0));
});

forms('a property condition tests the data of the event being handled, false without one', () => {
  const event: EventLike = { name: 'order.completed', data: { total: 80, items: ['book'], shipping: { country: 'FR' } } };
  assert.ok(is({ property: 'total', gt: 50 }, subject({ event })));
  assert.not.ok(is({ property: 'total', gt: 100 }, subject({ event })));
  assert.ok(is({ property: 'shipping.country', eq: 'FR' }, subject({ event })));
  assert.ok(is({ property: 'items', contains: 'book' }, subject({ event })));
  assert.ok(is({ property: 'coupon', exists: false }, subject({ event })));
  assert.not.ok(is({ property: 'total', exists: true }, subject()));
  assert.not.ok(is({ property: 'coupon', exists: false }, subject()));
});

forms('matchesEvent needs the name and every where filter', () => {
  const cond: EventCondition = { event: 'order.completed', where: [{ property: 'total', gt: 50 }, { property: 'shipping.country', in: ['FR', 'DE'] }] };
  assert.ok(matchesEvent(cond, { name: 'order.completed', data: { total: 51, shipping: { country: 'DE' } } }));
  assert.not.ok(matchesEvent(cond, { name: 'order.completed', data: { total: 50, shipping: { country: 'DE' } } }));
  assert.not.ok(matchesEvent(cond, { name: 'order.completed', data: { total: 51 } }));
  assert.not.ok(matchesEvent(cond, { name: 'order.created', data: { total: 51, shipping: { country: 'DE' } } }));
  assert.ok(matchesEvent({ event: '$app.opened' }, { name: '$app.opened', data: {} }));
  assert.not.ok(matchesEvent({ event: 'order.completed', where: [{ property: 'constructor', exists: true }] }, { name: 'order.completed', data: {} }));
});

forms.run();

// ---------------------------------------------------------------------------------------------

const valid = suite('validation: accepted expressions');

valid('every form and operator is accepted', () => {
  const expr = {
    all: [
      { attribute: 'plan', eq: 'pro' }, { attribute: 'plan', ne: null }, { attribute: 'seats', gt: 1 }, { attribute: 'createdAt', gte: '2024-01-01' },
      { attribute: 'seats', lt: 10.5 }, { attribute: 'seats', lte: 10 }, { attribute: 'plan', in: ['a', 1, true, null] }, { attribute: 'plan', nin: ['x'] },
      { attribute: 'email', exists: true }, { attribute: 'tags', contains: 'vip' }, { attribute: 'tags', contains: 3 }, { attribute: 'locale', startsWith: 'en' },
      { attribute: 'properties.address.city', eq: 'Paris' }, { attribute: '$weird_name-1.x', exists: false },
      { any: [{ topic: 'news' }, { topic: 'product-updates' }] },
      { not: { subscription: { channel: 'push', enabled: true, platform: 'ios' } } },
      { subscription: {} },
      { event: 'order.completed', count: { gte: 2, lt: 1000000 }, within: '30d', where: [{ property: 'total', gt: 50 }, { property: 'coupon', exists: false }] },
      { event: '$app.opened', within: '1m' }, { event: 'signup', within: '90d', count: { eq: 0 } }, { event: 'x' },
    ],
  };
  assert.equal(validateExpression(expr, 'where'), []);
});

valid('a single condition at the top level is an expression', () => {
  assert.equal(validateExpression({ topic: 'news' }, 'where'), []);
  assert.equal(validateExpression({ attribute: 'plan', eq: 'pro' }, 'to.where'), []);
});

valid('property conditions are accepted with the eventProperties option', () => {
  assert.equal(validateExpression({ all: [{ property: 'total', gt: 50 }, { not: { property: 'x.y', in: [1, 2] } }] }, 'trigger.where', { eventProperties: true }), []);
});

valid('depth 8 and 100 nodes are within the bounds', () => {
  let deep: unknown = { topic: 'news' };
  for (let d = 1; d < MAX_DEPTH; d++) deep = { not: deep };
  assert.equal(validateExpression(deep, 'where'), []);
  const wide = { any: [{ all: Array.from({ length: 50 }, () => ({ topic: 'news' })) }, { all: Array.from({ length: 47 }, () => ({ topic: 'news' })) }] };
  assert.equal(validateExpression(wide, 'where'), []); // 1 + 2 + 97 = 100 nodes
});

valid('20 event conditions are within the bounds', () => {
  assert.equal(validateExpression({ any: Array.from({ length: MAX_EVENT_CONDITIONS }, (_, i) => ({ event: `e${i}` })) }, 'where'), []);
});

valid.run();

// ---------------------------------------------------------------------------------------------

const invalid = suite('validation: errors and their params');

invalid('a node of unknown shape names its own path', () => {
  const errors = validateExpression({ all: [{ topic: 'news' }, { topic: 'news' }, { topic: 'news' }, { foo: 1 }] }, 'where');
  assert.equal(errors.map((e) => e.param), ['where.all[3]']);
  assert.match(errors[0]!.message, /one of all, any, not, attribute, event, topic, subscription$/);
});

invalid('an event condition on a $ name that is none of the reserved ones is an error (no event can carry it), as in workflow triggers', () => {
  const errors = validateExpression({ any: [{ event: '$app.opened' }, { event: '$nope.nope', count: { gte: 1 } }, { event: '$send' }] }, 'where');
  assert.equal(errors.map((e) => e.param), ['where.any[1].event']);
  assert.match(errors[0]!.message, /^names no reserved event/);
});

invalid('an event condition on $subscriber.deleted is an error: a delete forgets the counters, no subscriber ever counts one (probe DE), as in workflow triggers', () => {
  const errors = validateExpression({ all: [{ event: '$subscriber.created' }, { not: { event: '$subscriber.deleted', count: { eq: 0 } } }] }, 'where');
  assert.equal(errors.map((e) => e.param), ['where.all[1].not.event']);
  assert.match(errors[0]!.message, /^cannot be \$subscriber\.deleted/);
});

invalid('a subscription field named like an Object.prototype member is an unknown field, not a crash (probe Q: 500)', () => {
  for (const key of ['constructor', 'toString', 'valueOf', 'hasOwnProperty', '__defineGetter__']) {
    assert.equal(validateExpression({ all: [{ topic: 'news' }, { subscription: { [key]: true } }] }, 'where'), [{ param: `where.all[1].subscription.${key}`, message: 'is not an allowed field' }], key);
  }
});

invalid('a non-object node is an error at its path', () => {
  assert.equal(params(null), ['where']);
  assert.equal(params('plan = pro'), ['where']);
  assert.equal(params([{ topic: 'news' }]), ['where']);
  assert.equal(params({ any: [1, { topic: 'news' }, []] }), ['where.any[0]', 'where.any[2]']);
});

invalid('two forms in one node are an error', () => {
  const errors = validateExpression({ attribute: 'plan', eq: 'pro', topic: 'news' }, 'where');
  assert.equal(errors.map((e) => e.param), ['where']);
  assert.match(errors[0]!.message, /found "attribute" and "topic"/);
});

invalid('all and any need 1 to 50 items, and no other keys', () => {
  assert.equal(params({ all: [] }), ['where.all']);
  assert.equal(params({ any: {} }), ['where.any']);
  assert.equal(params({ all: Array.from({ length: 51 }, () => ({ topic: 'news' })) }), ['where.all']);
  assert.equal(params({ all: [{ topic: 'news' }], name: 'x' }), ['where.name']);
  assert.equal(params({ not: { topic: 'news' }, extra: true }), ['where.extra']);
  assert.equal(params({ not: null }), ['where.not']);
});

invalid('an attribute needs a valid name and exactly one known operator', () => {
  assert.equal(params({ attribute: 'plan' }), ['where']);
  assert.equal(params({ attribute: 'plan', eq: 'a', ne: 'b' }), ['where']);
  // one problem, one detail: an unknown operator is the node's whole problem (probe BI: two details)
  const unknown = validateExpression({ attribute: 'plan', foo: 'a' }, 'where');
  assert.equal(unknown, [{ param: 'where.foo', message: 'unknown operator "foo"' }]);
  const none = validateExpression({ attribute: 'plan' }, 'where');
  assert.match(none[0]!.message, /^must have one operator of eq, ne, gt, gte, lt, lte, in, nin, exists, contains, startsWith$/);
  assert.equal(params({ attribute: '1plan', eq: 'a' }), ['where.attribute']);
  assert.equal(params({ attribute: 'a..b', eq: 'a' }), ['where.attribute']);
  assert.equal(params({ attribute: 'address.', eq: 'a' }), ['where.attribute']);
  assert.equal(params({ attribute: 'has space', eq: 'a' }), ['where.attribute']);
  assert.equal(params({ attribute: 7, eq: 'a' }), ['where.attribute']);
  assert.equal(params({ attribute: 'a'.repeat(129), eq: 'a' }), ['where.attribute']);
  assert.equal(params({ attribute: 'a'.repeat(128), eq: 'a' }), []);
});

invalid('operator values of the wrong type are errors at the operator', () => {
  assert.equal(params({ attribute: 'plan', eq: { a: 1 } }), ['where.eq']);
  assert.equal(params({ attribute: 'plan', ne: [1] }), ['where.ne']);
  assert.equal(params({ attribute: 'plan', gt: true }), ['where.gt']);
  assert.equal(params({ attribute: 'plan', gte: null }), ['where.gte']);
  assert.equal(params({ attribute: 'plan', lt: {} }), ['where.lt']);
  assert.equal(params({ attribute: 'plan', lte: [] }), ['where.lte']);
  assert.equal(params({ attribute: 'plan', in: 'pro' }), ['where.in']);
  assert.equal(params({ attribute: 'plan', in: [] }), ['where.in']);
  assert.equal(params({ attribute: 'plan', nin: Array.from({ length: 101 }, (_, i) => i) }), ['where.nin']);
  assert.equal(params({ attribute: 'plan', nin: Array.from({ length: 100 }, (_, i) => i) }), []);
  assert.equal(params({ attribute: 'plan', in: ['a', { b: 1 }, 'c', ['d']] }), ['where.in[1]', 'where.in[3]']);
  assert.equal(params({ attribute: 'plan', exists: 'yes' }), ['where.exists']);
  assert.equal(params({ attribute: 'plan', contains: {} }), ['where.contains']);
  assert.equal(params({ attribute: 'plan', startsWith: 1 }), ['where.startsWith']);
});

invalid('string values longer than 1,024 characters are errors', () => {
  const long = 'x'.repeat(1025);
  assert.equal(params({ attribute: 'plan', eq: 'x'.repeat(1024) }), []);
  assert.equal(params({ attribute: 'plan', eq: long }), ['where.eq']);
  assert.equal(params({ attribute: 'plan', gt: long }), ['where.gt']);
  assert.equal(params({ attribute: 'plan', in: ['a', long] }), ['where.in[1]']);
  assert.equal(params({ attribute: 'plan', startsWith: long }), ['where.startsWith']);
  assert.match(validateExpression({ attribute: 'plan', contains: long }, 'where')[0]!.message, /at most 1024 characters/);
  // characters are code points, as in every other limit: 1,024 emoji (2,048 UTF-16 units) pass, one more does not
  assert.equal(params({ attribute: 'plan', eq: '😀'.repeat(1024) }), []);
  assert.equal(params({ attribute: 'plan', eq: '😀'.repeat(1025) }), ['where.eq']);
});

invalid('event conditions check name, count, window and where', () => {
  assert.equal(params({ event: 'Order Completed' }), ['where.event']);
  assert.equal(params({ event: '' }), ['where.event']);
  assert.equal(params({ event: 'e', count: 2 }), ['where.count']);
  assert.equal(params({ event: 'e', count: {} }), ['where.count']);
  assert.equal(params({ event: 'e', count: { gte: -1 } }), ['where.count.gte']);
  assert.equal(params({ event: 'e', count: { gte: 1.5 } }), ['where.count.gte']);
  assert.equal(params({ event: 'e', count: { lte: 1_000_001 } }), ['where.count.lte']);
  assert.equal(params({ event: 'e', count: { in: [1] } }), ['where.count.in']);
  assert.equal(params({ event: 'e', within: '30' }), ['where.within']);
  assert.equal(params({ event: 'e', where: [] }), ['where.where']);
  assert.equal(params({ event: 'e', where: Array.from({ length: 11 }, () => ({ property: 'a', exists: true })) }), ['where.where']);
  assert.equal(params({ event: 'e', where: [{ property: 'a', exists: true }, { total: 1 }, { property: 'b', bad: 1 }] }), ['where.where[1]', 'where.where[2].bad']);
  assert.equal(params({ event: 'e', times: 2 }), ['where.times']);
});

invalid('windows must be from 1m to 90d', () => {
  const msg = (within: string) => validateExpression({ event: 'e', within }, 'where').map((e) => e.message);
  assert.equal(msg('91d'), ['must be a duration from 1m to 90d, at most 6 digits, like 30m, 24h or 7d']);
  assert.equal(msg('0s'), ['must be a duration from 1m to 90d, at most 6 digits, like 30m, 24h or 7d']);
  assert.equal(msg('59s'), ['must be a duration from 1m to 90d, at most 6 digits, like 30m, 24h or 7d']);
  assert.equal(msg('2161h'), ['must be a duration from 1m to 90d, at most 6 digits, like 30m, 24h or 7d']);
  assert.equal(msg('60s'), []);
  assert.equal(msg('2160h'), []);
});

invalid('nested errors carry the full path from the given root', () => {
  const value = {
    any: [
      { event: 'order.completed', where: [{ property: 'total', gt: 50 }, { property: 'total', gt: 'a', lt: 'b' }] },
      { all: [{ topic: 'news' }, { topic: 'News!' }, { event: 'e', count: { gte: 'two' } }] },
      { not: { subscription: { channel: 'sms', enabled: 'yes', platform: 'web', device: 'x' } } },
      { subscription: 'push' },
    ],
  };
  assert.equal(params(value), [
    'where.any[0].where[1]',
    'where.any[1].all[1].topic',
    'where.any[1].all[2].count.gte',
    'where.any[2].not.subscription.channel',
    'where.any[2].not.subscription.enabled',
    'where.any[2].not.subscription.platform',
    'where.any[2].not.subscription.device',
    'where.any[3].subscription',
  ]);
  assert.equal(validateExpression({ all: [{ topic: 'x', extra: 1 }] }, 'segment.where').map((e) => e.param), ['segment.where.all[0].extra', 'segment.where.all[0].topic']);
});

invalid('property conditions need the eventProperties option', () => {
  const errors = validateExpression({ all: [{ property: 'total', gt: 50 }] }, 'where');
  assert.equal(errors.map((e) => e.param), ['where.all[0]']);
  assert.match(errors[0]!.message, /only allowed in workflow triggers, waits and branches/);
  assert.equal(params({ property: 'total', gt: 50, eq: 1 }, { eventProperties: true }), ['where']);
  assert.equal(params({ property: 'total bad', gt: 50 }, { eventProperties: true }), ['where.property']);
  assert.match(validateExpression({ foo: 1 }, 'where', { eventProperties: true })[0]!.message, /subscription, property$/);
});

invalid('depth 9 is an error, reported once', () => {
  let deep: unknown = { topic: 'news' };
  for (let d = 1; d < MAX_DEPTH + 1; d++) deep = { not: deep };
  const errors = validateExpression(deep, 'where');
  assert.equal(errors, [{ param: `where${'.not'.repeat(8)}`, message: 'expression is nested deeper than 8 levels' }]);
  const twice = { all: [deep, deep] };
  assert.is(validateExpression(twice, 'where').length, 1);
});

invalid('a cyclic value (not JSON) is stopped by the depth bound', () => {
  const cyclic: Record<string, unknown> = {};
  cyclic.not = cyclic;
  assert.equal(params(cyclic), [`where${'.not'.repeat(8)}`]);
});

invalid('more than 100 nodes is an error', () => {
  const items = (n: number) => Array.from({ length: n }, () => ({ topic: 'news' }));
  assert.equal(validateExpression({ any: [{ all: items(50) }, { all: items(47) }] }, 'where'), []); // 1 + 2 + 97 = 100
  const errors = validateExpression({ any: [{ all: items(50) }, { all: items(48) }] }, 'where'); // 101
  assert.equal(errors, [{ param: 'where', message: `expression has more than ${MAX_NODES} nodes` }]);
});

invalid('more than 20 event conditions is an error', () => {
  const errors = validateExpression({ any: Array.from({ length: 21 }, (_, i) => ({ event: `e${i}` })) }, 'where');
  assert.equal(errors, [{ param: 'where', message: 'expression has more than 20 event conditions' }]);
});

invalid('more than 16 KB serialized is an error', () => {
  const big = { any: Array.from({ length: 17 }, () => ({ attribute: 'plan', in: ['x'.repeat(1000)] })) };
  const errors = validateExpression(big, 'where');
  assert.equal(errors.map((e) => e.param), ['where']);
  assert.match(errors[0]!.message, /16 KB/);
});

invalid('errors are collected, at most 20', () => {
  const bad = { all: Array.from({ length: 30 }, () => ({ attribute: 'plan', eq: {} })) };
  const errors = validateExpression(bad, 'where');
  assert.is(errors.length, MAX_ERRORS);
  assert.is(errors[0]!.param, 'where.all[0].eq');
  assert.is(errors[19]!.param, 'where.all[19].eq');
});

invalid.run();

// ---------------------------------------------------------------------------------------------

const analysis = suite('analysis: event conditions, keys and dependencies');

analysis('eventConditions lists event conditions depth first, duplicates kept', () => {
  const a = { event: 'a' };
  const b = { event: 'b', within: '1h' };
  const expr: Expression = { all: [a, { any: [{ not: b }, { topic: 'news' }, a] }, { attribute: 'plan', eq: 'x' }] };
  const found = eventConditions(expr);
  assert.is(found.length, 3);
  assert.is(found[0], a);
  assert.is(found[1], b);
  assert.is(found[2], a);
  assert.equal(eventConditions({ topic: 'news' }), []);
  assert.equal(eventConditions(a), [a]);
});

analysis('conditionKey ignores key order, filter order and count', () => {
  const one: EventCondition = { event: 'order.completed', within: '30d', count: { gte: 2 }, where: [{ property: 'total', gt: 50 }, { property: 'currency', in: ['EUR', 'USD'] }] };
  const two = JSON.parse('{"where":[{"in":["EUR","USD"],"property":"currency"},{"gt":50,"property":"total"}],"count":{"lte":9},"within":"30d","event":"order.completed"}') as EventCondition;
  assert.match(conditionKey(one), /^[0-9a-f]{16}$/);
  assert.is(conditionKey(one), conditionKey(two));
  assert.is(conditionKey(one), conditionKey({ ...one }), 'stable across objects');
});

analysis('conditionKey differs by name, where and bucket width, and is shared within a width', () => {
  const base: EventCondition = { event: 'order.completed', within: '30d', where: [{ property: 'total', gt: 50 }] };
  const key = conditionKey(base);
  assert.is.not(conditionKey({ ...base, event: 'order.created' }), key);
  assert.is.not(conditionKey({ ...base, where: [{ property: 'total', gt: 51 }] }), key);
  assert.is.not(conditionKey({ ...base, where: [{ property: 'total', gte: 50 }] }), key);
  assert.is.not(conditionKey({ ...base, where: undefined }), key);
  assert.is.not(conditionKey({ ...base, within: '7d' }), key);
  assert.is.not(conditionKey({ ...base, within: undefined }), key);
  assert.is(conditionKey({ ...base, within: '20d' }), key, '20d and 30d both have 6h buckets');
  assert.is(conditionKey({ event: 'x' }), conditionKey({ event: 'x', where: [] }));
});

analysis('dependencies name the kinds of state read', () => {
  assert.equal(dependencies({ attribute: 'plan', eq: 'pro' }), { attributes: true, topics: false, subscriptions: false, events: [], eventProperties: false });
  assert.equal(dependencies({ topic: 'news' }), { attributes: false, topics: true, subscriptions: false, events: [], eventProperties: false });
  const expr: Expression = {
    any: [
      { event: 'a', within: '1h' }, { not: { event: 'b' } }, { event: 'a', count: { gte: 3 } },
      { all: [{ subscription: {} }, { property: 'total', gt: 1 }] },
    ],
  };
  assert.equal(dependencies(expr), { attributes: false, topics: false, subscriptions: true, events: ['a', 'b'], eventProperties: true });
});

analysis.run();
