import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { client } from '../helpers/api.js';
import { bootstrapWorkspace, startTestService, type TestService } from '../helpers/service.js';
import { waitFor } from '../helpers/wait.js';

// A retention shorter than the catalog's windows: the 7- and 30-day counts still count every event
// inside them (probe Y: daily buckets were kept retention + 2 days, so with EVENT_RETENTION_DAYS=1
// an event 5 days back was counted all time but in no 7-day or 30-day figure).

type Ctx = { service: TestService; api: ReturnType<typeof client>; key: string };
const short = suite<Ctx>('read models under a short retention');

const DAY = 86_400_000;
const ago = (ms: number) => new Date(Date.now() - ms).toISOString();

short.before(async (ctx) => {
  ctx.service = await startTestService('short-retention', { EVENT_RETENTION_DAYS: '1' }, ['web', 'worker']);
  ctx.api = client(ctx.service.url);
  ctx.key = (await bootstrapWorkspace(ctx.service, 'short')).keys.tenant;
});
short.after(async (ctx) => ctx.service.stop());

short('events up to 7 days back count in the 7- and 30-day windows, subscribers7d and the daily volume with a retention of 1 day', async ({ api, key }) => {
  const events = [0, 1, 2, 3, 4, 5, 6].map((d) => ({ externalId: `old-${d}`, name: 'ret.test', timestamp: ago(d * DAY + 60_000) }));
  assert.is((await api.post('/v1/events', key, { events })).status, 202);
  const entry = await waitFor('the catalog entry', async () => {
    const res = await api.get('/v1/events/names/ret.test', key);
    return res.status === 200 && res.body.data.entry.counts.allTime === 7 ? res.body.data.entry : null;
  });
  assert.equal([entry.counts.last7d, entry.counts.last30d, entry.subscribers7d], [7, 7, 7]);
  for (const range of ['7d', '30d']) {
    const volume = await api.get(`/v1/events/volume?range=${range}&name=ret.test`, key);
    assert.is(volume.body.data.buckets.reduce((n: number, b: { count: number }) => n + b.count, 0), 7, range);
  }
});

short.run();
