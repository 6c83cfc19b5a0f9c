import type { Redis } from 'ioredis';
import { isoNow, now } from '../lib/clock.js';
import { ApiError } from '../lib/errors.js';
import type { EventSource } from '../lib/event-names.js';
import { newId } from '../lib/ids.js';
import { partitionOf } from '../lib/partition.js';
import type { NewEvent } from '../lib/track-events.js';
import type { Keys } from './keys.js';
import { callScript } from './lua-scripts.js';

/** A stored event (spec 2.4). */
export type StoredEvent = {
  id: string;
  sequence: number;
  externalId: string;
  name: string;
  source: EventSource;
  timestamp: string;
  receivedAt: string;
  data: Record<string, unknown>;
  runId: string | null;
  messageId: string | null;
  step: string | null;
};
export type IngestedEvent = StoredEvent & { status: 'accepted' | 'duplicate' };
export type Scope = { workspaceId: string; tenantId: string; partitions: number; maxBacklog: number };

type ScriptItem = [1, number, string, number] | [2, string];

const orNull = (s: string | undefined) => (s ? s : null);

function fromOriginal(externalId: string, original: string): StoredEvent {
  const cut = original.indexOf('\n');
  const meta = JSON.parse(original.slice(0, cut)) as Record<string, string | number>;
  return {
    id: String(meta.id), sequence: Number(meta.q), externalId, name: String(meta.n), source: meta.o as EventSource,
    timestamp: isoNow(Number(meta.ts)), receivedAt: isoNow(Number(meta.r)), data: JSON.parse(original.slice(cut + 1)),
    runId: orNull(meta.ru as string), messageId: orNull(meta.m as string), step: orNull(meta.st as string),
  };
}

/**
 * Appends `events` of one tenant: one `ingestEvents` call per partition touched, all in one
 * pipeline (one round trip however many subscribers the batch spans). Answers in input order.
 * Atomic per partition; a batch spanning partitions that fails midway is made safe to retry by
 * the caller's `id`s.
 */
export async function ingestEvents(redis: Redis, keys: Keys, scope: Scope, events: NewEvent[]): Promise<IngestedEvent[]> {
  const receivedMs = now();
  const groups = new Map<number, number[]>();
  events.forEach((event, i) => {
    const p = partitionOf(scope.tenantId, event.externalId, scope.partitions);
    const group = groups.get(p);
    if (group) group.push(i);
    else groups.set(p, [i]);
  });
  const ids = events.map(() => newId('event', receivedMs));
  // One partition (a single event, or one subscriber's batch): a plain script call; an ioredis
  // pipeline costs more to set up than it saves for one command.
  const calls: { keys: string[]; args: (string | number)[] }[] = [];
  for (const [p, indexes] of groups) {
    const args: (string | number)[] = [scope.tenantId, scope.workspaceId, receivedMs, scope.maxBacklog, keys.partitionBase(p), isoNow(receivedMs), indexes.length];
    for (const i of indexes) {
      const e = events[i]!;
      args.push(ids[i]!, newId('event', receivedMs), newId('subscriber', receivedMs), e.externalId, e.name, e.source, e.timestampMs, e.data, e.callerId ?? '', e.runId ?? '', e.messageId ?? '', e.step ?? '');
    }
    calls.push({ keys: [keys.inbox(p), keys.sequences(p), keys.subscribers(p), keys.dedupe(p), keys.dedupeAge(p)], args });
  }
  let replies: [Error | null, unknown][];
  if (calls.length === 1) {
    replies = [[null, await callScript<unknown>(redis, 'ingestEvents', calls[0]!.keys, calls[0]!.args)]];
  } else {
    const pipeline = redis.pipeline();
    for (const call of calls) callScript(pipeline, 'ingestEvents', call.keys, call.args);
    replies = ((await pipeline.exec()) ?? []) as [Error | null, unknown][];
  }
  const out: IngestedEvent[] = new Array(events.length);
  let g = 0;
  for (const indexes of groups.values()) {
    const [err, reply] = replies[g++]!;
    if (err) throw err;
    const items = reply as ScriptItem[] | [-1];
    if (items[0] === -1) throw new ApiError(503, 'unavailable', 'Event processing is behind; retry the request later');
    indexes.forEach((i, k) => {
      const item = items[k] as ScriptItem;
      const e = events[i]!;
      if (item[0] === 2) {
        out[i] = { ...fromOriginal(e.externalId, item[1]), status: 'duplicate' };
        return;
      }
      out[i] = {
        id: ids[i]!, sequence: item[1], externalId: e.externalId, name: e.name, source: e.source,
        timestamp: isoNow(e.timestampMs), receivedAt: isoNow(receivedMs), data: e.value ?? JSON.parse(e.data),
        runId: e.runId, messageId: e.messageId, step: e.step, status: 'accepted',
      };
    });
  }
  return out;
}
