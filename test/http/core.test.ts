import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { client } from '../helpers/api.js';
import { bootstrapWorkspace, startTestService, type TestService } from '../helpers/service.js';

const core = suite<{ service: TestService; api: ReturnType<typeof client>; keys: Record<string, string> }>('http core');

core.before(async (ctx) => {
  ctx.service = await startTestService('core', { HTTP_BODY_LIMIT_BYTES: '2048' });
  ctx.api = client(ctx.service.url);
  ctx.keys = (await bootstrapWorkspace(ctx.service, 'core')).keys;
});
core.after(async (ctx) => ctx.service.stop());

core('health answers without a credential, with redis latency and version', async ({ api }) => {
  const res = await api.get('/v1/health');
  assert.is(res.status, 200);
  assert.is(res.body.success, true);
  assert.is(res.body.error, null);
  assert.is(res.body.data.status, 'ok');
  assert.is(res.body.data.redis.reachable, true);
  assert.type(res.body.data.redis.latencyMs, 'number');
  assert.is(res.body.data.version, '0.1.0');
  assert.is(res.body.data.roles.web, 1);
});

core('an unknown route is 404 not_found in the envelope', async ({ api }) => {
  const res = await api.get('/v1/nothing-here');
  assert.is(res.status, 404);
  assert.is(res.body.success, false);
  assert.is(res.body.data, null);
  assert.is(res.body.error.code, 'not_found');
  assert.ok(res.body.metadata.timestamp);
  assert.is(res.headers.get('request-id'), res.body.metadata.requestId);
});

core('another method on a known path is 405 method_not_allowed in the envelope', async ({ api, keys }) => {
  const res = await api.call('PUT', '/v1/whoami', { key: keys.tenant, body: {} });
  assert.is(res.status, 405);
  assert.is(res.body.success, false);
  assert.is(res.body.error.code, 'method_not_allowed');
  assert.is(res.headers.get('request-id'), res.body.metadata.requestId);
});

core('a route with a path parameter gets it decoded, and a path of two segments below it is its own route', async ({ api, keys }) => {
  const externalId = 'user 1/ü';
  const created = await api.post('/v1/subscribers', keys.tenant, { externalId, properties: { plan: 'pro' } });
  assert.ok(created.status === 200 || created.status === 201, JSON.stringify(created.body.error));
  const res = await api.get(`/v1/subscribers/${encodeURIComponent(externalId)}`, keys.tenant);
  const subscriptions = await api.get(`/v1/subscribers/${encodeURIComponent(externalId)}/subscriptions`, keys.tenant);
  assert.is(subscriptions.status, 200);
  assert.equal(subscriptions.body.data.items, []);
  assert.is(res.status, 200);
  assert.is(res.body.data.externalId, externalId);
});

core('malformed JSON is 400 parse', async ({ api, keys }) => {
  const res = await api.call('DELETE', '/v1/workspaces/core/keys/key_x', { key: keys.workspace, raw: '{"a":' });
  assert.is(res.status, 400);
  assert.is(res.body.error.code, 'parse');
});

core('a body over the limit is 413 payload_too_large', async ({ api, keys }) => {
  const res = await api.call('DELETE', '/v1/workspaces/core/keys/key_x', { key: keys.workspace, raw: JSON.stringify({ pad: 'x'.repeat(5000) }) });
  assert.is(res.status, 413);
  assert.is(res.body.error.code, 'payload_too_large');
});

core('a body that is not JSON is 415 unsupported_media_type', async ({ api, keys }) => {
  const res = await api.call('DELETE', '/v1/workspaces/core/keys/key_x', { key: keys.workspace, raw: 'a=b', headers: { 'content-type': 'application/x-www-form-urlencoded' } });
  assert.is(res.status, 415);
  assert.is(res.body.error.code, 'unsupported_media_type');
});

core('the OpenAPI document is 3.0.x at version 1.0.0 and describes its own routes', async ({ service }) => {
  const res = await fetch(`${service.url}/v1/openapi.json`);
  assert.is(res.status, 200);
  const doc = (await res.json()) as any;
  assert.match(doc.openapi, /^3\.0\.\d+$/);
  assert.is(doc.info.version, '1.0.0');
  assert.ok(doc.paths['/v1/health'].get);
  assert.ok(doc.paths['/v1/workspaces/{workspaceSlug}/keys/{id}'].delete);
  assert.ok(doc.components.schemas.ErrorEnvelope);
});

core.run();
