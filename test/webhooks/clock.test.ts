import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { now, setClockOffset } from '../../lib/clock.js';
import { DISABLE_AFTER_MS } from '../../lib/webhook-policy.js';
import { MAX_RETIRED_SECRETS, newWebhookSecret, OLD_SECRET_VALIDITY_MS } from '../../lib/webhook-signing.js';
import { callScript } from '../../streams/lua-scripts.js';
import { client } from '../helpers/api.js';
import { bootstrapWorkspace, startTestService, type TestService } from '../helpers/service.js';
import { startReceiver, verifier, type Behaviour, type Receiver, type Received } from '../helpers/webhook-receiver.js';
import { waitFor } from '../helpers/wait.js';

/**
 * Rules that take days, with the service's clock moved (`setClockOffset`): the dispatcher runs in
 * this process so it sees the moved clock, and the receivers check the signature timestamp against
 * the same clock (a receiver whose clock agrees with the sender's).
 */
type Api = ReturnType<typeof client>;
type Ctx = { service: TestService; api: Api; receivers: Receiver[] };
type Workspace = Awaited<ReturnType<typeof bootstrapWorkspace>>;

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const wheOf = (eventId: string) => 'whe_' + eventId.slice('evt_'.length);

const clock = suite<Ctx>('webhook rules over days (moved clock)');

clock.before(async (ctx) => {
  ctx.service = await startTestService('wh-clock', { WEBHOOK_ALLOW_PRIVATE_NETWORKS: '127.0.0.0/8', WEBHOOK_RETRY_SCHEDULE: '1s', WEBHOOK_ATTEMPT_TIMEOUT_MS: '1000' }, ['web', 'worker', 'dispatcher']);
  ctx.api = client(ctx.service.url);
});
clock.before.each((ctx) => {
  ctx.receivers = [];
});
clock.after.each(async (ctx) => {
  setClockOffset(0);
  for (const r of ctx.receivers) await r.close();
});
clock.after(async (ctx) => ctx.service.stop());

async function receiver(ctx: Ctx, behaviour: Behaviour): Promise<Receiver> {
  const r = await startReceiver({ behaviour, clockMs: now });
  ctx.receivers.push(r);
  return r;
}

async function endpoint(ctx: Ctx, ws: Workspace, r: Receiver, events: string[]) {
  const res = await ctx.api.post(`/v1/workspaces/${ws.workspace.slug}/webhooks`, ws.keys.workspace, { url: `${r.url}/hook`, events });
  assert.is(res.status, 201, res.text);
  r.secrets.push(res.body.data.secret);
  return res.body.data as { id: string; secret: string };
}

async function track(ctx: Ctx, ws: Workspace, name: string) {
  const res = await ctx.api.post('/v1/events', ws.keys.tenant, { externalId: 'clock-1', name });
  assert.is(res.status, 202, res.text);
  return res.body.data.items.at(-1) as { id: string };
}

const getEndpoint = async (ctx: Ctx, ws: Workspace, id: string) => (await ctx.api.get(`/v1/workspaces/${ws.workspace.slug}/webhooks/${id}`, ws.keys.workspace)).body.data;

async function attemptsOf(ctx: Ctx, ws: Workspace, endpointId: string, eventId: string): Promise<any | null> {
  const list = (await ctx.api.get(`/v1/workspaces/${ws.workspace.slug}/webhooks/${endpointId}/deliveries`, ws.keys.workspace)).body.data.items as any[];
  const found = list.find((d) => d.eventId === eventId);
  if (!found) return null;
  return (await ctx.api.get(`/v1/workspaces/${ws.workspace.slug}/webhooks/${endpointId}/deliveries/${found.id}`, ws.keys.workspace)).body.data;
}

const waitAttempts = (ctx: Ctx, ws: Workspace, endpointId: string, eventId: string, n: number) =>
  waitFor(`${n} attempts of ${eventId}`, async () => {
    const d = await attemptsOf(ctx, ws, endpointId, eventId);
    return d && d.attempts.length >= n ? d : null;
  }, 10_000, 50);

clock('three days of continuous failure disable the endpoint; its attempts then wait; re-enabling clears the streak and re-queues them', async (ctx) => {
  const ws = await bootstrapWorkspace(ctx.service, 'whc-disable');
  let status = 500;
  const r = await receiver(ctx, () => ({ status }));
  const e = await endpoint(ctx, ws, r, ['fail.*']);
  const one = wheOf((await track(ctx, ws, 'fail.one')).id);
  await waitAttempts(ctx, ws, e.id, one, 1);
  const started = (await getEndpoint(ctx, ws, e.id)).failingSince;
  assert.ok(started, 'the first failure starts the streak');

  setClockOffset(DISABLE_AFTER_MS - 60_000);
  await waitAttempts(ctx, ws, e.id, one, 2);
  let current = await getEndpoint(ctx, ws, e.id);
  assert.equal([current.enabled, current.failingSince], [true, started], 'one minute short of three days: still enabled');

  setClockOffset(DISABLE_AFTER_MS + 60_000);
  current = await waitFor('the endpoint to be disabled', async () => {
    const got = await getEndpoint(ctx, ws, e.id);
    return got.enabled ? null : got;
  });
  assert.ok(current.disabledAt);
  assert.is(current.failingSince, started);
  // the audit event follows the disabling (announceDisabled): wait for it rather than race it
  const audit = await waitFor('webhook.disabled in the ledger', async () =>
    (await ctx.service.redis.xrange(ctx.service.keys.ledger(ws.workspace.id), '-', '+')).map(([, f]) => JSON.parse(f[3]!)).find((p) => p.type === 'webhook.disabled') ?? null);
  assert.ok(audit, 'webhook.disabled is written to the ledger');
  assert.equal([audit.target.id, audit.actor.type, audit.data.object.enabled], [e.id, 'system', false]);
  await waitFor('the note the disabling wrote to be cleared once announced', async () => (await ctx.service.redis.hlen(ctx.service.keys.webhookUnannounced(ws.workspace.id))) === 0);

  const sent = r.requests.length;
  const two = wheOf((await track(ctx, ws, 'fail.two')).id);
  await sleep(1500);
  assert.is(r.requests.length, sent, 'a disabled endpoint is sent nothing: due attempts wait, new events make no delivery');
  const waiting = await attemptsOf(ctx, ws, e.id, one);
  assert.is(waiting.status, 'failed');
  assert.is(waiting.attempts.length, sent, 'waiting attempts are not consumed');
  // nothing is attempted while disabled: no next attempt time is shown, in the detail or the list (probe A1: a past one was)
  assert.is(waiting.nextAttemptAt, null);
  const listed = (await ctx.api.get(`/v1/workspaces/whc-disable/webhooks/${e.id}/deliveries`, ws.keys.workspace)).body.data.items;
  assert.equal(listed.filter((d: any) => d.status === 'failed').map((d: any) => d.nextAttemptAt), [null]);

  status = 204;
  const enabled = await ctx.api.patch(`/v1/workspaces/whc-disable/webhooks/${e.id}`, ws.keys.workspace, { enabled: true });
  assert.equal([enabled.body.data.enabled, enabled.body.data.failingSince, enabled.body.data.disabledAt], [true, null, null]);
  const requeued = await waitFor('the re-queued delivery to succeed', async () => {
    const d = await attemptsOf(ctx, ws, e.id, one);
    return d?.status === 'success' ? d : null;
  });
  assert.is(requeued.attemptCount, sent + 1);
  await sleep(500);
  assert.not.ok(r.requests.some((q) => q.id === two), 'an event from the disabled time is never delivered');
  assert.is(await attemptsOf(ctx, ws, e.id, two), null);
  for (const q of r.requests) assert.equal(q.failures, []);
});

clock('the disable clock runs from the endpoint\'s first failure, across deliveries; a success restarts it', async (ctx) => {
  const ws = await bootstrapWorkspace(ctx.service, 'whc-streak');
  const failing = await receiver(ctx, () => ({ status: 500 }));
  const flaky = await receiver(ctx, (_req, i) => ({ status: i === 1 ? 204 : 500 })); // fails, recovers, fails again
  const e1 = await endpoint(ctx, ws, failing, ['streak.*']);
  const e2 = await endpoint(ctx, ws, flaky, ['reset.*']);
  const a = wheOf((await track(ctx, ws, 'streak.a')).id);
  const reset = wheOf((await track(ctx, ws, 'reset.one')).id);
  await waitAttempts(ctx, ws, e1.id, a, 1);
  const streakStart = Date.parse((await getEndpoint(ctx, ws, e1.id)).failingSince);
  const recovered = await waitFor('reset.one to fail then succeed', async () => {
    const d = await attemptsOf(ctx, ws, e2.id, reset);
    return d?.status === 'success' ? d : null;
  });
  assert.equal(recovered.attempts.map((x: any) => x.statusCode), [500, 204]);
  assert.is((await getEndpoint(ctx, ws, e2.id)).failingSince, null, 'any success resets the streak');

  setClockOffset(2 * 86_400_000);
  const b = wheOf((await track(ctx, ws, 'streak.b')).id);
  const bFirst = await waitAttempts(ctx, ws, e1.id, b, 1);
  assert.ok(Date.parse(bFirst.attempts[0].startedAt) - streakStart >= 2 * 86_400_000 - 60_000, 'streak.b first failed two days into the streak');

  setClockOffset(DISABLE_AFTER_MS + 60_000);
  // e2 fails again, three days after its first failure, but after a success
  const late = wheOf((await track(ctx, ws, 'reset.two')).id);
  await waitFor('e1 disabled', async () => !(await getEndpoint(ctx, ws, e1.id)).enabled);
  const d1 = await getEndpoint(ctx, ws, e1.id);
  assert.is(Date.parse(d1.failingSince), streakStart, 'disabled by the streak begun with streak.a, one day after streak.b\'s first failure');
  await waitAttempts(ctx, ws, e2.id, late, 1);
  const d2 = await getEndpoint(ctx, ws, e2.id);
  assert.is(d2.enabled, true, 'e2\'s streak restarted at its success');
  assert.ok(Date.parse(d2.failingSince) > now() - 60_000, 'e2\'s new streak starts now');
});

clock('after a rotation both secrets sign every request for 24 hours, each verifies alone; then only the new one', async (ctx) => {
  const ws = await bootstrapWorkspace(ctx.service, 'whc-rotate');
  const r = await receiver(ctx, () => ({ status: 204 }));
  const e = await endpoint(ctx, ws, r, ['rot.*']);
  const oldSecret = e.secret;
  await track(ctx, ws, 'rot.one');
  await waitFor('rot.one', async () => r.requests.length === 1);
  assert.equal([r.requests[0]!.signatures.length, r.requests[0]!.verifiedBy], [1, [oldSecret]]);

  const rotated = await ctx.api.post(`/v1/workspaces/whc-rotate/webhooks/${e.id}/rotate`, ws.keys.workspace);
  const newSecret = rotated.body.data.secret as string;
  r.secrets.push(newSecret);
  await track(ctx, ws, 'rot.two');
  await waitFor('rot.two', async () => r.requests.length === 2);
  const during = r.requests[1]!;
  assert.is(during.signatures.length, 2, 'two signatures during the window');
  assert.equal(during.verifiedBy.sort(), [oldSecret, newSecret].sort(), 'a receiver holding either secret verifies it');
  const headers = { 'webhook-id': during.id, 'webhook-timestamp': String(during.timestamp) };
  assert.ok(verifier(newSecret, now).verify(during.raw, { ...headers, 'webhook-signature': during.signatures[0]! }), 'the new secret signs first');
  assert.ok(verifier(oldSecret, now).verify(during.raw, { ...headers, 'webhook-signature': during.signatures[1]! }));

  setClockOffset(OLD_SECRET_VALIDITY_MS - 60_000);
  await track(ctx, ws, 'rot.three');
  await waitFor('rot.three', async () => r.requests.length === 3);
  assert.is(r.requests[2]!.signatures.length, 2, 'still two just before 24 hours');

  setClockOffset(OLD_SECRET_VALIDITY_MS + 60_000);
  await track(ctx, ws, 'rot.four');
  await waitFor('rot.four', async () => r.requests.length === 4);
  const after = r.requests[3]!;
  assert.is(after.signatures.length, 1, 'one signature after the window');
  assert.equal(after.verifiedBy, [newSecret]);
  assert.match(after.failures.join(), /No matching signature/, 'the old secret no longer verifies');
});

const HOUR = 3_600_000;

/** Asserts that `q` carries one signature per secret of `order` (in that order) and that each verifies alone. */
function assertSignedBy(q: Received, order: string[], label: string) {
  assert.is(q.signatures.length, order.length, `${label}: ${order.length} signatures`);
  const headers = { 'webhook-id': q.id, 'webhook-timestamp': String(q.timestamp) };
  order.forEach((secret, i) => assert.ok(verifier(secret, now).verify(q.raw, { ...headers, 'webhook-signature': q.signatures[i]! }), `${label}: signature ${i} is by secret ${i}`));
  assert.equal([...q.verifiedBy].sort(), [...order].sort(), `${label}: the reference verifier accepts each of them`);
}

clock('two rotations within 24 hours: each retired secret signs first sends, retries and replays for 24 hours from the rotation that retired it', async (ctx) => {
  const ws = await bootstrapWorkspace(ctx.service, 'whc-rotate2');
  const slug = ws.workspace.slug;
  // the first attempt of each rot2.retry event fails, so it is retried (schedule 1s)
  const r = await receiver(ctx, (q) => ({ status: q.body?.type === 'rot2.retry' && r.withId(q.id).length === 1 ? 500 : 204 }));
  const e = await endpoint(ctx, ws, r, ['rot2.*']);
  const s1 = e.secret;
  const rotate = async () => {
    const res = await ctx.api.post(`/v1/workspaces/${slug}/webhooks/${e.id}/rotate`, ws.keys.workspace);
    assert.is(res.status, 200, res.text);
    r.secrets.push(res.body.data.secret);
    return res.body.data as { secret: string; secretRotatedAt: string };
  };
  const deliver = async (name: string, n = 1) => {
    const id = wheOf((await track(ctx, ws, name)).id);
    await waitFor(`${n} request(s) of ${name}`, async () => r.withId(id).length >= n);
    return { id, requests: r.withId(id) };
  };

  const s2 = (await rotate()).secret;
  setClockOffset(6 * HOUR);
  const second = await rotate();
  const s3 = second.secret;
  assert.is((await getEndpoint(ctx, ws, e.id)).secretRotatedAt, second.secretRotatedAt, 'secretRotatedAt is the last rotation');

  assertSignedBy((await deliver('rot2.first')).requests[0]!, [s3, s2, s1], 'a first send after the second rotation');
  const retried = await deliver('rot2.retry', 2);
  assertSignedBy(retried.requests[1]!, [s3, s2, s1], 'a retry');
  const d = await attemptsOf(ctx, ws, e.id, retried.id);
  const replay = await ctx.api.post(`/v1/workspaces/${slug}/webhooks/${e.id}/deliveries/${d.id}/replay`, ws.keys.workspace);
  assert.is(replay.status, 202, replay.text);
  await waitFor('the replay', async () => r.withId(retried.id).length === 3);
  assertSignedBy(r.withId(retried.id)[2]!, [s3, s2, s1], 'a replay');

  setClockOffset(OLD_SECRET_VALIDITY_MS - 60_000);
  assertSignedBy((await deliver('rot2.before')).requests[0]!, [s3, s2, s1], 'one minute before the first rotation\'s 24 hours');

  setClockOffset(OLD_SECRET_VALIDITY_MS + 60_000);
  const late = (await deliver('rot2.late')).requests[0]!;
  assertSignedBy(late, [s3, s2], 'after the first rotation\'s 24 hours');
  assert.match(late.failures.join(), /No matching signature/, 'the original secret no longer verifies');

  setClockOffset(6 * HOUR + OLD_SECRET_VALIDITY_MS + 60_000);
  const last = (await deliver('rot2.last')).requests[0]!;
  assertSignedBy(last, [s3], 'after the second rotation\'s 24 hours');
  assert.is(last.failures.length, 2);

  // a rotation drops the expired ones from the record
  const s4 = (await rotate()).secret;
  const stored = JSON.parse((await ctx.service.redis.hget(ctx.service.keys.webhookEndpoint(ws.workspace.id, e.id), 'retiredSecrets'))!);
  assert.equal(stored.map((x: any) => x.secret), [s3]);
  assertSignedBy((await deliver('rot2.after')).requests[0]!, [s4, s3], 'after a third rotation');
});

clock(`at most ${MAX_RETIRED_SECRETS} retired secrets are kept: a further rotation within 24 hours ends the oldest early`, async (ctx) => {
  const ws = await bootstrapWorkspace(ctx.service, 'whc-rotate-many');
  const r = await receiver(ctx, () => ({ status: 204 }));
  const e = await endpoint(ctx, ws, r, ['many.*']);
  for (let i = 0; i < MAX_RETIRED_SECRETS + 1; i++) {
    const res = await ctx.api.post(`/v1/workspaces/${ws.workspace.slug}/webhooks/${e.id}/rotate`, ws.keys.workspace);
    r.secrets.push(res.body.data.secret);
  }
  const id = wheOf((await track(ctx, ws, 'many.one')).id);
  await waitFor('many.one', async () => r.withId(id).length === 1);
  const q = r.withId(id)[0]!;
  assertSignedBy(q, [...r.secrets].reverse().slice(0, MAX_RETIRED_SECRETS + 1), 'the current secret and the newest retired ones');
  assert.not.ok(q.verifiedBy.includes(e.secret), 'the first secret ended early');
});

clock('rotations within one millisecond keep their order: the newest retired secrets sign, newest first, and the oldest ends', async (ctx) => {
  const ws = await bootstrapWorkspace(ctx.service, 'whc-rotate-same-ms');
  const r = await receiver(ctx, () => ({ status: 204 }));
  const e = await endpoint(ctx, ws, r, ['tie.*']);
  // the script as rotateSecret calls it, every time with the same millisecond: equal expiresAt throughout
  const at = now();
  for (let i = 0; i < MAX_RETIRED_SECRETS + 1; i++) {
    const secret = newWebhookSecret();
    await callScript(ctx.service.redis, 'rotateWebhookSecret', [ctx.service.keys.webhookEndpoint(ws.workspace.id, e.id), ctx.service.keys.webhookVersion(ws.workspace.id)],
      [secret, at, new Date(at).toISOString(), OLD_SECRET_VALIDITY_MS, MAX_RETIRED_SECRETS]);
    r.secrets.push(secret);
  }
  const stored = JSON.parse((await ctx.service.redis.hget(ctx.service.keys.webhookEndpoint(ws.workspace.id, e.id), 'retiredSecrets'))!);
  const newestFirst = [...r.secrets].reverse();
  assert.equal(stored.map((x: any) => x.secret), newestFirst.slice(1, MAX_RETIRED_SECRETS + 1), 'stored newest first, the first secret dropped');
  const id = wheOf((await track(ctx, ws, 'tie.one')).id);
  await waitFor('tie.one', async () => r.withId(id).length === 1);
  assertSignedBy(r.withId(id)[0]!, newestFirst.slice(0, MAX_RETIRED_SECRETS + 1), 'signed by the current secret and the ten newest retired ones');
});

clock('an endpoint rotated by the earlier version (previousSecret, rotatedAt) keeps its previous secret for its 24 hours, across a new rotation', async (ctx) => {
  const ws = await bootstrapWorkspace(ctx.service, 'whc-rotate-legacy');
  const r = await receiver(ctx, () => ({ status: 204 }));
  const e = await endpoint(ctx, ws, r, ['legacy.*']);
  const key = ctx.service.keys.webhookEndpoint(ws.workspace.id, e.id);
  // the record as the earlier version's rotation left it, 12 hours ago: no retiredSecrets field
  const sA = e.secret;
  const sB = newWebhookSecret();
  r.secrets.push(sB);
  await ctx.service.redis.hdel(key, 'retiredSecrets');
  await ctx.service.redis.hset(key, 'secret', sB, 'previousSecret', sA, 'rotatedAt', String(now() - 12 * HOUR));
  await ctx.service.redis.incr(ctx.service.keys.webhookVersion(ws.workspace.id));
  const deliver = async (name: string) => {
    const id = wheOf((await track(ctx, ws, name)).id);
    await waitFor(name, async () => r.withId(id).length === 1);
    return r.withId(id)[0]!;
  };
  assertSignedBy(await deliver('legacy.read'), [sB, sA], 'a stored previous secret signs as a retired one');

  const rotated = await ctx.api.post(`/v1/workspaces/${ws.workspace.slug}/webhooks/${e.id}/rotate`, ws.keys.workspace);
  const sC = rotated.body.data.secret as string;
  r.secrets.push(sC);
  assertSignedBy(await deliver('legacy.rotated'), [sC, sB, sA], 'after a rotation by this version, the earlier previous secret still signs');

  setClockOffset(12 * HOUR + 60_000);
  assertSignedBy(await deliver('legacy.late'), [sC, sB], 'the earlier previous secret ends 24 hours after its own rotation');
});

clock.run();
