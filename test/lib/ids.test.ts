import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { derivedId, derivedIdAlong, isId, newId, newRequestId } from '../../lib/ids.js';

const ids = suite('ids (spec 2.3): prefix, time, random; sorted by creation');

ids('ids of one millisecond increase strictly and keep their shape; a later millisecond sorts after', () => {
  const ms = 1_790_000_000_000;
  let previous = '';
  for (let i = 0; i < 200_000; i++) {
    const id = newId('event', ms);
    assert.ok(id > previous, `${id} after ${previous}`);
    previous = id;
  }
  assert.ok(isId('event', previous));
  assert.is(previous.length, 'evt_'.length + 26);
  const later = newId('event', ms + 1);
  assert.ok(later > previous);
  assert.ok(newId('subscriber', ms - 5).startsWith('sub_'), 'an earlier millisecond (a moved clock) starts afresh');
});

ids('two processes\' ids of one millisecond differ (random part); derived ids repeat for one seed', () => {
  const seen = new Set(Array.from({ length: 1_000 }, (_, i) => newId('message', 1_790_000_000_000 + (i % 3))));
  assert.is(seen.size, 1_000);
  assert.is(derivedId('delivery', 5, 'msg_x|scr_y'), derivedId('delivery', 5, 'msg_x|scr_y'));
  assert.is.not(derivedId('delivery', 5, 'msg_x|scr_y'), derivedId('delivery', 5, 'msg_x|scr_z'));
  assert.ok(isId('request', newRequestId()));
  assert.not.ok(isId('event', 'evt_ILOU'));
});

ids('derivedIdAlong: same inputs, same id; within one millisecond the ids of one seed sort as the ids they follow; seeds apart', () => {
  const at = Date.UTC(2026, 10, 28);
  const events = Array.from({ length: 50 }, () => newId('event', at));
  const runs = events.map((e) => derivedIdAlong('run', at, 'event', e, 'wf_a'));
  assert.ok(runs.every((r) => isId('run', r)));
  assert.equal(runs, events.map((e) => derivedIdAlong('run', at, 'event', e, 'wf_a')), 'deterministic');
  assert.equal([...runs].sort(), runs, 'in the events\' order');
  assert.is(new Set(runs).size, 50);
  const other = events.map((e) => derivedIdAlong('run', at, 'event', e, 'wf_b'));
  assert.ok(other.every((r, i) => r !== runs[i]), 'another seed, other ids');
  assert.is(derivedIdAlong('run', at, 'event', 'not-an-id', 'wf_a'), derivedId('run', at, 'wf_a|not-an-id'));
});

ids.run();
