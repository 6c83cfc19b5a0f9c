import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { formatPath, newRun, nextPath, onEvent, parsePath, startRun, stepAt, type EngineHost, type RunEvent } from '../../actors/workflow-engine.js';
import type { WorkflowDefinition } from '../../lib/workflow-definition.js';
import { streamLedgerJson, streamLedgerPayload } from '../../streams/stream-ledger.js';

const engine = suite('workflow engine paths and run payloads');

const def: WorkflowDefinition = {
  trigger: { event: 'go' },
  steps: [
    { type: 'sleep', duration: '1m' },
    { type: 'branch', if: { attribute: 'plan', eq: 'pro' }, then: [{ type: 'send', message: { title: 'a', body: 'b' } }, { type: 'sleep', duration: '1h' }], else: [{ type: 'exit' }] },
    { type: 'wait', event: 'opened', timeout: '1d', onTimeout: [{ type: 'send', message: { title: 'c', body: 'd' } }] },
  ],
};

engine('paths parse, print and lead to their steps', () => {
  const parts = parsePath('steps[1].then[1]');
  assert.equal(parts, [{ list: 'steps', index: 1 }, { list: 'then', index: 1 }]);
  assert.is(formatPath(parts), 'steps[1].then[1]');
  assert.equal(stepAt(def, parts), { type: 'sleep', duration: '1h' });
  assert.is(stepAt(def, parsePath('steps[9]')), null);
  assert.is(stepAt(def, parsePath('other[0]')), null);
  assert.is(stepAt(def, parsePath('steps[1].else[3]')), null);
});

engine('the next step leaves finished nested lists and ends after the last step', () => {
  const next = (path: string) => {
    const n = nextPath(def, parsePath(path));
    return n ? formatPath(n) : null;
  };
  assert.is(next('steps[0]'), 'steps[1]');
  assert.is(next('steps[1].then[0]'), 'steps[1].then[1]');
  assert.is(next('steps[1].then[1]'), 'steps[2]');
  assert.is(next('steps[1].else[0]'), 'steps[2]');
  assert.is(next('steps[2].onTimeout[0]'), null);
  assert.is(next('steps[2]'), null);
});

engine('webhook payloads of run events carry workflow and versionId (spec 6.1 rule 5); other events do not', () => {
  const fields = { t: 'tnt_1', w: 'ws_1', id: 'evt_1', q: '3', x: 'ann', u: 'sub_1', n: '$run.step', o: 'system', ts: '1700000000000', r: '1700000000000',
    d: JSON.stringify({ workflowId: 'wfl_1', workflow: 'welcome', versionId: 'wfv_1', version: 1, step: 'steps[0]' }), ru: 'run_1', m: '', st: 'steps[0]' };
  const object = (streamLedgerPayload(fields).data as any).object;
  assert.is(object.workflow, 'welcome');
  assert.is(object.versionId, 'wfv_1');
  assert.is(object.runId, 'run_1');
  assert.is(object.step, 'steps[0]');
  assert.equal(JSON.parse(streamLedgerJson(fields)), streamLedgerPayload(fields));
  const plain = (streamLedgerPayload({ ...fields, n: 'app.opened', ru: '', st: '', d: '{}' }).data as any).object;
  assert.not.ok('workflow' in plain);
  assert.not.ok('versionId' in plain);
});

/** An engine host that records what it emits, at 2026-01-01; `send` and `transient` as the test needs. */
function hostOf(emitted: RunEvent[], overrides: Partial<EngineHost> = {}): EngineHost {
  return {
    now: Date.parse('2026-01-01T00:00:00.000Z'),
    evaluate: () => true,
    send: async () => { throw new Error('no send here'); },
    transient: () => false,
    armTimer: () => 'timer',
    disarmTimer: () => {},
    emit: (event) => emitted.push(event),
    ...overrides,
  };
}

engine('a send that fails writes its $run.step (outcome failed) before $run.failed', async () => {
  const failing: WorkflowDefinition = { trigger: { event: 'go' }, steps: [{ type: 'send', name: 'hello', message: { title: 'a', body: 'b' } }, { type: 'exit' }] };
  const emitted: RunEvent[] = [];
  const host = hostOf(emitted, { send: async () => { throw new Error('no message'); } });
  const run = newRun('run_1', { id: 'wfl_1', slug: 'hello' }, { id: 'wfv_1', version: 1 }, 'ann', { id: 'evt_1', name: 'go', data: {} }, host.now, 0);
  await startRun(run, failing, host, { id: 'evt_1', name: 'go', data: {} });
  assert.is(run.status, 'failed');
  assert.is(run.reason, 'send_failed');
  assert.equal(run.history.map((h) => `${h.step}:${h.outcome}`), ['steps[0]:failed']);
  assert.equal(emitted.map((e) => e.name), ['$run.started', '$run.step', '$run.failed']);
  const step = emitted[1]!;
  assert.is(step.step, 'steps[0]');
  assert.is(step.messageId, '');
  assert.equal(step.data, { workflowId: 'wfl_1', workflow: 'hello', versionId: 'wfv_1', version: 1, step: 'steps[0]', name: 'hello', type: 'send', outcome: 'failed' });
  assert.is(emitted[2]!.data.reason, 'send_failed');
});

engine('a send that fails for a transient reason is thrown on: the run neither fails nor notes the step', async () => {
  const def: WorkflowDefinition = { trigger: { event: 'go' }, steps: [{ type: 'send', message: { title: 'a', body: 'b' } }] };
  const emitted: RunEvent[] = [];
  const unreachable = Object.assign(new Error('connect ECONNREFUSED 127.0.0.1:6379'), { code: 'ECONNREFUSED' });
  const host = hostOf(emitted, { send: async () => { throw unreachable; }, transient: (err) => err === unreachable });
  const run = newRun('run_1', { id: 'wfl_1', slug: 'hello' }, { id: 'wfv_1', version: 1 }, 'ann', { id: 'evt_1', name: 'go', data: {} }, host.now, 0);
  const thrown = await startRun(run, def, host, { id: 'evt_1', name: 'go', data: {} }).then(() => null, (err: unknown) => err);
  assert.is(thrown, unreachable);
  assert.is.not(run.status, 'failed');
  assert.equal(run.history, []);
});

engine('a wait ended by an event: its $run.step names the event, as its history item does (probe BI: webhook consumers could not tell which event resumed it)', async () => {
  const def: WorkflowDefinition = { trigger: { event: 'go' }, steps: [{ type: 'wait', event: 'reply', timeout: '1h' }, { type: 'exit' }] };
  const emitted: RunEvent[] = [];
  const host = hostOf(emitted);
  const run = newRun('run_1', { id: 'wfl_1', slug: 'ask' }, { id: 'wfv_1', version: 1 }, 'ann', { id: 'evt_1', name: 'go', data: {} }, host.now, 0);
  await startRun(run, def, host, { id: 'evt_1', name: 'go', data: {} });
  assert.is(run.status, 'waiting');
  assert.ok(await onEvent(run, def, host, { id: 'evt_2', name: 'reply', data: {} }, ''));
  const waited = emitted.find((e) => e.name === '$run.step' && e.data.type === 'wait' && e.data.outcome === 'event')!;
  assert.equal([waited.data.outcome, waited.data.eventId], ['event', 'evt_2']);
  assert.is(run.history.find((h) => h.outcome === 'event')!.eventId, 'evt_2');
});

engine.run();
