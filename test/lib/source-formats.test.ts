import { createHash } from 'node:crypto';
import { createHmac } from 'node:crypto';
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { setClockOffset } from '../../lib/clock.js';
import { eventNameOf, readDelivery, secretProblem, valueAt, verifyDelivery, type Mapping } from '../../lib/source-formats.js';
import { signPayload } from '../../lib/webhook-signing.js';

/** readDelivery of a payload sent as its JSON text. */
const readOf = (source: Parameters<typeof readDelivery>[0], payload: Record<string, unknown>, headers: Parameters<typeof readDelivery>[2]) => readDelivery(source, payload, headers, Buffer.from(JSON.stringify(payload)));

const formats = suite('source formats (pure)');
formats.after.each(() => setClockOffset(0));

const mapping = (m: Partial<Mapping> & { externalId: string }): Mapping => ({ name: null, id: null, timestamp: null, data: null, ...m });
const hex = (secret: string, text: string) => createHmac('sha256', secret).update(text).digest('hex');

formats('valueAt reads own keys and array indexes, nothing from the prototype', () => {
  const payload = { data: { object: { metadata: { userId: 'u1' } }, items: [{ id: 7 }] } };
  assert.is(valueAt(payload, 'data.object.metadata.userId'), 'u1');
  assert.is(valueAt(payload, 'data.items.0.id'), 7);
  assert.is(valueAt(payload, 'data.items.x'), undefined);
  assert.is(valueAt(payload, 'data.toString'), undefined);
  assert.is(valueAt(payload, 'data.object.metadata.userId.length'), undefined);
});

formats('event names: prefix, lowercase, other characters as _', () => {
  assert.is(eventNameOf('stripe.', 'invoice.payment_succeeded'), 'stripe.invoice.payment_succeeded');
  assert.is(eventNameOf('', 'User Created!'), 'user_created_');
});

formats('a Standard Webhooks secret must be whsec_ and base64; other formats take any', () => {
  assert.is(secretProblem('standard-webhooks', 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw'), null);
  assert.ok(secretProblem('standard-webhooks', 'whsec_'));
  assert.ok(secretProblem('standard-webhooks', 'whsec_not base64!'));
  assert.ok(secretProblem('standard-webhooks', 'MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw'));
  // the key is the decoded bytes: at least 16 (probe BD: whsec_q8, one byte, was taken and forged in 172 tries)
  assert.match(secretProblem('standard-webhooks', 'whsec_q8') ?? '', /at least 16 bytes \(this one is 1\)/);
  assert.ok(secretProblem('standard-webhooks', `whsec_${Buffer.alloc(15, 7).toString('base64')}`));
  assert.is(secretProblem('standard-webhooks', `whsec_${Buffer.alloc(16, 7).toString('base64')}`), null);
  assert.is(secretProblem('github', 'anything-goes'), null);
});

formats('stripe: any v1 of the header verifies, within 5 minutes of its t', () => {
  const body = Buffer.from('{"id":"evt_1"}');
  const t = Math.floor(Date.now() / 1000);
  const good = hex('whsec_s', `${t}.${body}`);
  const header = (v: string, at = t) => ({ 'stripe-signature': `t=${at},v1=${'0'.repeat(64)},v1=${v},v0=zzz` });
  assert.equal(verifyDelivery('stripe', ['whsec_s'], header(good), body, t), { ok: true });
  assert.equal(verifyDelivery('stripe', ['other', 'whsec_s'], header(good), body, t), { ok: true }, 'a previous secret verifies too');
  assert.is(verifyDelivery('stripe', ['whsec_s'], header(good), body, t + 301).ok, false);
  assert.is(verifyDelivery('stripe', ['whsec_s'], header(hex('whsec_s', `${t}.x`)), body, t).ok, false);
  const missing = verifyDelivery('stripe', ['whsec_s'], {}, body, t);
  assert.is(missing.ok === false && missing.code, 'missing_authorization');
});

formats('dedupe keys: a long one by its digest, never equal to a short one, whatever the short one holds', () => {
  const source = { format: 'standard-webhooks' as const, mapping: mapping({ externalId: 'u', id: 'i' }), namePrefix: '' };
  const key = (i: string) => { const r = readOf(source, { type: 'x', u: 'u1', i }, {}); return r.kind === 'event' ? r.dedupeId : null; };
  const long = key('q'.repeat(300));
  assert.match(long!, /^#[0-9a-f]{64}$/);
  assert.is.not(key('q'.repeat(299) + 'r'), long, 'keys differing after 256 characters stay apart');
  assert.is.not(key(long!), long, 'a short key written like a digest is another key');
  assert.is.not(key(`sha256:${long!.slice(1)}`), long);
  assert.is(key('k'), '=k');
});

formats('standard-webhooks: a repeated webhook-signature header (Node joins the copies with ", ") verifies on any copy', () => {
  const body = Buffer.from('{"type":"x"}');
  const secret = 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw';
  const t = Math.floor(Date.now() / 1000);
  const good = signPayload([secret], 'msg_1', t, body);
  for (const signature of [`${good}, v1,bm90IGl0`, `v1,bm90IGl0, ${good}`]) {
    assert.equal(verifyDelivery('standard-webhooks', [secret], { 'webhook-id': 'msg_1', 'webhook-timestamp': String(t), 'webhook-signature': signature }, body, t), { ok: true }, signature);
  }
});

formats('a stripe secret must be whsec_ (an API key pasted by mistake would never verify)', () => {
  assert.is(secretProblem('stripe', 'whsec_abc123DEF'), null);
  assert.ok(secretProblem('stripe', 'sk_live_abc'));
  assert.ok(secretProblem('stripe', '        '));
});

formats('github: sha256= of the body; no header is missing_authorization', () => {
  const body = Buffer.from('{"action":"opened"}');
  assert.equal(verifyDelivery('github', ['s3cretvalue'], { 'x-hub-signature-256': `sha256=${hex('s3cretvalue', body.toString())}` }, body, 0), { ok: true });
  const bad = verifyDelivery('github', ['s3cretvalue'], { 'x-hub-signature-256': 'sha256=00' }, body, 0);
  assert.is(bad.ok === false && bad.code, 'invalid_signature');
});

formats('readDelivery: defaults by format, ignored and rejected readings', () => {
  const stripe = { format: 'stripe' as const, mapping: mapping({ externalId: 'data.object.metadata.userId', data: 'data.object' }), namePrefix: 'stripe.' };
  const created = Math.floor(Date.now() / 1000) - 60;
  const reading = readOf(stripe, { id: 'evt_9', type: 'invoice.paid', created, data: { object: { metadata: { userId: 42 }, amount: 5 } } }, {});
  assert.equal(reading, { kind: 'event', externalId: '42', name: 'stripe.invoice.paid', dedupeId: '=evt_9', timestampMs: created * 1000, data: '{"metadata":{"userId":42},"amount":5}' });
  assert.equal(readOf(stripe, { type: 'x', created, data: {} }, {}), { kind: 'ignored', reason: 'no_external_id' });
  // 256 characters are counted as a body's externalId is (an emoji is one), not as UTF-16 units
  const byId = (id: string) => readOf(stripe, { type: 'x', created, data: { object: { metadata: { userId: id } } } }, {});
  assert.is(byId('😀'.repeat(256)).kind, 'event');
  assert.equal(byId('😀'.repeat(257)), { kind: 'ignored', reason: 'no_external_id' });
  const old = readOf(stripe, { type: 'x', created: created - 8 * 86400, data: { object: { metadata: { userId: 'u' } } } }, {});
  assert.is(old.kind === 'rejected' && old.code, 'invalid_timestamp');
  const notObject = readOf({ ...stripe, mapping: mapping({ externalId: 'u', data: 'u' }) }, { u: 'x', type: 'y', created }, {});
  assert.is(notObject.kind === 'rejected' && notObject.param, 'data');

  const github = { format: 'github' as const, mapping: mapping({ externalId: 'sender.login' }), namePrefix: 'github.' };
  const gh = readOf(github, { action: 'opened', sender: { login: 'octocat' } }, { 'x-github-event': 'pull_request', 'x-github-delivery': 'd-1' });
  assert.ok(gh.kind === 'event' && gh.name === 'github.pull_request.opened');
  // the body's SHA-256, not the unsigned X-GitHub-Delivery
  assert.is(gh.kind === 'event' && gh.dedupeId, `#${createHash('sha256').update(JSON.stringify({ action: 'opened', sender: { login: 'octocat' } })).digest('hex')}`);
  assert.equal(readOf(github, { sender: { login: 'octocat' } }, {}), { kind: 'ignored', reason: 'no_name' });

  const sw = { format: 'standard-webhooks' as const, mapping: mapping({ externalId: 'data.id', timestamp: 'data.at' }), namePrefix: '' };
  const iso = new Date(Date.now() - 1000).toISOString();
  const r = readOf(sw, { type: 'user.created', data: { id: 'u1', at: iso } }, { 'webhook-id': 'msg_1' });
  assert.ok(r.kind === 'event' && r.name === 'user.created' && r.dedupeId === '=msg_1' && r.timestampMs === Date.parse(iso));
  const long = readOf(sw, { type: 'a'.repeat(120), data: { id: 'u1', at: iso } }, {});
  assert.is(long.kind === 'rejected' && long.param, 'name');
  const big = readOf(sw, { type: 'x', data: { id: 'u1', at: iso }, pad: 'p'.repeat(9000) }, {});
  assert.is(big.kind === 'rejected' && big.code, 'event_data_too_large');
});

formats.run();
