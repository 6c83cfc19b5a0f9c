import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { client } from '../helpers/api.js';
import { bootstrapWorkspace, startTestService, type TestService } from '../helpers/service.js';

type Ctx = { service: TestService; api: ReturnType<typeof client>; tenantKey: string; clientKey: string };
const backlog = suite<Ctx>('ingest backlog (INBOX_MAX_BACKLOG)');

// Web role only: nothing drains the inbox, so it stays over the limit once filled.
backlog.before(async (ctx) => {
  ctx.service = await startTestService('backlog', { INBOX_MAX_BACKLOG: '100' });
  ctx.api = client(ctx.service.url);
  const { keys } = await bootstrapWorkspace(ctx.service, 'backlog');
  ctx.tenantKey = keys.tenant;
  ctx.clientKey = keys.client;
});
backlog.after(async (ctx) => ctx.service.stop());

backlog('every route that ingests answers 503 unavailable over the backlog, and the document declares it', async ({ api, service, tenantKey, clientKey }) => {
  const events = Array.from({ length: 100 }, (_, i) => ({ name: 'page.viewed', id: `fill-${i}` }));
  const filled = await api.post('/v1/client/events', clientKey, { externalId: 'busy-1', source: 'ios', events });
  assert.is(filled.status, 202);

  const answers = {
    'POST /v1/events': await api.post('/v1/events', tenantKey, { externalId: 'busy-1', name: 'page.viewed' }),
    'POST /v1/client/events': await api.post('/v1/client/events', clientKey, { externalId: 'busy-1', source: 'ios', events: [{ name: 'page.viewed' }] }),
    'POST /v1/client/identify': await api.post('/v1/client/identify', clientKey, { externalId: 'busy-1', source: 'ios' }),
  };
  const doc = (await (await fetch(`${service.url}/v1/openapi.json`)).json()) as any;
  for (const [operation, res] of Object.entries(answers)) {
    assert.is(res.status, 503, operation);
    assert.is(res.body.error.code, 'unavailable', operation);
    const [method, path] = operation.split(' ') as [string, string];
    assert.ok(doc.paths[path][method.toLowerCase()].responses['503'], `${operation} declares 503`);
  }
});

backlog.run();
