import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { ENGINE_EVENT_NAMES, SDK_EVENT_NAMES } from '../../lib/event-names.js';
import { checkPatterns, isDeliverable, isPrivateAuditName, matchesPatterns, normalizePatterns, patternProblem, webhookCatalog } from '../../lib/webhook-events.js';
import { deliveryKeepMs, DISABLE_AFTER_MS, leaseMsFor, MAX_ATTEMPTS, retryDelayMs, retrySpanMs } from '../../lib/webhook-policy.js';
import { loadConfig } from '../../lib/config.js';

const patterns = suite('webhook event patterns');

patterns('exact names, prefix.* and * are accepted, in either ledger', () => {
  for (const p of ['*', 'order.completed', 'order.*', 'subscriber.*', 'subscriber.created', 'tick', '$subscription.*', '$subscriber.created', '$run.*', 'a-b_c.d.*', 'order.', 'a.b.', `${'x'.repeat(99)}.*`, 'x'.repeat(100)]) {
    assert.is(patternProblem(p), null, p);
  }
});

patterns('malformed patterns are validation problems', () => {
  for (const p of ['', 'Order.created', '*.created', 'order.*.x', 'order..*', '.*', '**', 'a b', '$', '$nope', '$subscription.nope', '$nope.*', 'x'.repeat(101), `${'x'.repeat(100)}.*`]) {
    assert.is(patternProblem(p)?.kind, 'malformed', JSON.stringify(p));
  }
});

patterns('private audit names and patterns are invalid_event, other names of those words are not', () => {
  for (const p of ['key.*', 'key.created', 'webhook.*', 'webhook.disabled', 'profile.*', 'profile.updated']) assert.is(patternProblem(p)?.kind, 'private', p);
  for (const p of ['key', 'keys.*', 'webhooks.x', 'profiles.*']) assert.is(patternProblem(p), null, p);
});

patterns('checkPatterns: a malformed pattern makes the answer validation, naming every failing pattern with its index, private ones included (probe BJ)', () => {
  assert.equal(checkPatterns(['ok.*', 'key.*', 'Bad']), { code: 'validation', details: [{ param: 'events[1]', message: 'key.* events are private and cannot be subscribed' }, { param: 'events[2]', message: 'must be *, an event name, or an event name prefix followed by .*' }] });
  assert.equal(checkPatterns(['ok.*', 'key.*', 'webhook.created'])?.code, 'invalid_event');
  assert.equal(checkPatterns(['ok.*', 'key.*', 'webhook.created'])?.details.map((d) => d.param), ['events[1]', 'events[2]']);
  assert.is(checkPatterns(['*', 'order.*']), null);
  assert.equal(normalizePatterns(['a.*', 'b', 'a.*']), ['a.*', 'b']);
});

patterns('matching: exact, prefix.* (not the bare prefix), and *', () => {
  assert.ok(matchesPatterns(['order.completed'], 'order.completed'));
  assert.not.ok(matchesPatterns(['order.completed'], 'order.created'));
  assert.ok(matchesPatterns(['order.*'], 'order.created'));
  assert.ok(matchesPatterns(['order.*'], 'order.line.added'));
  assert.not.ok(matchesPatterns(['order.*'], 'order'));
  assert.not.ok(matchesPatterns(['order.*'], 'orders.created'));
  assert.ok(matchesPatterns(['$subscription.*'], '$subscription.muted'));
  assert.not.ok(matchesPatterns(['subscription.*'], '$subscription.muted'));
  assert.ok(matchesPatterns(['*'], 'anything'));
});

patterns('private audit events are never deliverable, even to *; stream events of any name are', () => {
  assert.ok(isPrivateAuditName('key.created'));
  assert.ok(isPrivateAuditName('webhook.disabled'));
  assert.not.ok(isPrivateAuditName('key'));
  assert.not.ok(isDeliverable('audit', 'key.created', ['*']));
  assert.not.ok(isDeliverable('audit', 'webhook.created', ['*', 'webhook.created']));
  assert.ok(isDeliverable('audit', 'tenant.created', ['*']));
  assert.ok(isDeliverable('stream', 'key.pressed', ['*']));
  assert.ok(isDeliverable('audit', 'subscriber.updated', ['subscriber.*']));
});

patterns('the catalog groups public audit events, reserved names and the caller\'s names by resource', () => {
  const groups = webhookCatalog(['order.completed', 'order.created', 'tick', '$app.opened']);
  const byResource = new Map(groups.map((g) => [`${g.source}:${g.resource}`, g]));
  assert.equal(byResource.get('audit:subscriber')!.events.map((e) => e.name), ['subscriber.created', 'subscriber.updated', 'subscriber.deleted']);
  assert.is(byResource.get('audit:subscriber')!.pattern, 'subscriber.*');
  assert.not.ok([...byResource.keys()].some((k) => /^audit:(key|webhook|profile)$/.test(k)));
  assert.equal(byResource.get('stream:$subscription')!.events.map((e) => e.name), ENGINE_EVENT_NAMES.filter((n) => n.startsWith('$subscription.')));
  const reserved = groups.filter((g) => g.source === 'stream' && g.resource.startsWith('$')).flatMap((g) => g.events.map((e) => e.name));
  assert.equal(reserved.sort(), [...SDK_EVENT_NAMES, ...ENGINE_EVENT_NAMES].sort());
  assert.equal(byResource.get('stream:order')!.events.map((e) => e.name), ['order.completed', 'order.created']);
  assert.equal(byResource.get('stream:tick'), { resource: 'tick', source: 'stream', pattern: null, events: [{ name: 'tick', description: null }] });
});

patterns.run();

const policy = suite('webhook retry policy');

policy('the default schedule gives ten attempts over about 66 hours, the last delay repeating', () => {
  const schedule = loadConfig({}, {}).webhookRetryScheduleMs;
  const delays = Array.from({ length: MAX_ATTEMPTS - 1 }, (_, i) => retryDelayMs(schedule, i + 1));
  const h = 3_600_000;
  assert.equal(delays, [5 * 60_000, 30 * 60_000, 2 * h, 5 * h, 10 * h, 12 * h, 12 * h, 12 * h, 12 * h]);
  const total = delays.reduce((a, b) => a + b, 0);
  assert.is(total, 65 * h + 35 * 60_000);
  assert.ok(total < DISABLE_AFTER_MS, 'one delivery exhausts before three days: the disable clock is the endpoint\'s streak');
});

policy('a delivery is kept the retention after its last scheduled attempt: the default schedule spans 65 h 35 min', () => {
  const schedule = loadConfig({}, {}).webhookRetryScheduleMs;
  assert.is(retrySpanMs(schedule), (65 * 60 + 35) * 60_000);
  assert.is(deliveryKeepMs(86_400_000, schedule), 86_400_000 + (65 * 60 + 35) * 60_000);
  assert.is(retrySpanMs([1_000]), 9_000, 'nine delays between ten attempts');
});

policy('a short schedule from WEBHOOK_RETRY_SCHEDULE repeats its last delay', () => {
  const schedule = loadConfig({ WEBHOOK_RETRY_SCHEDULE: '1s,2s' }, {}).webhookRetryScheduleMs;
  assert.equal([1, 2, 3, 9].map((n) => retryDelayMs(schedule, n)), [1000, 2000, 2000, 2000]);
});

policy('the lease outlives an attempt that waited a whole timeout in its queue', () => {
  assert.is(leaseMsFor(30_000), 90_000);
  assert.ok(leaseMsFor(30_000) - 30_000 > 30_000 + 1_000);
  assert.is(loadConfig({}, {}).webhookAttemptTimeoutMs, 30_000);
  assert.throws(() => loadConfig({ WEBHOOK_ATTEMPT_TIMEOUT_MS: '31000' }, {}), /WEBHOOK_ATTEMPT_TIMEOUT_MS/);
});

policy.run();
