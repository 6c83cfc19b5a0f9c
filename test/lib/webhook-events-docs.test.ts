import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { PUBLIC_AUDIT_EVENTS } from '../../lib/webhook-events.js';

test('docs/webhooks.md lists exactly the public audit events the catalog route shows, in its order', () => {
  const doc = readFileSync(join(import.meta.dirname, '..', '..', 'docs', 'webhooks.md'), 'utf8');
  const listed = [...doc.matchAll(/^\| `([a-z]+\.[a-z_]+)` \| /gm)].map((m) => m[1]);
  assert.equal(listed, Object.values(PUBLIC_AUDIT_EVENTS).flat().map((e) => e.name));
});

test.run();
