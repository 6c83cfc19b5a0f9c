import type { Redis } from 'ioredis';
import type { Keys } from '../streams/keys.js';
import type { StreamEntry } from '../streams/stream-consumer.js';

/**
 * What a timer's subscriber still has waiting in its partition's event inbox: the last sequence
 * issued to it, the last one applied, and its engine range (sequences `lua/commitAutomation`
 * issued one after the other with nothing from elsewhere between them, all of one run or none).
 */
export type Backlog = { sequence: number; applied: number; engineFrom: number; engineTo: number; engineRun: string };

/**
 * Whether a fired timer may be handled ahead of the events its subscriber has waiting in the event
 * inbox (read from the timer inbox `{pN}:tin`), with the same outcome as in order:
 * - nothing waits (every sequence issued is applied): yes;
 * - a run's timer, when everything waiting is that run's own engine events (`$run.*` it emitted
 *   itself, which a run never reacts to): yes;
 * - otherwise (an event from a backend, a client or another run is waiting, which could cancel the
 *   run, end its wait or change a segment): no, it goes to the event inbox behind them.
 */
export function timerMayGoFirst(member: string, b: Backlog): boolean {
  if (b.sequence <= b.applied) return true;
  if (!member.startsWith('run|')) return false;
  const runId = member.split('|')[3]?.split('~')[0];
  return Boolean(runId) && b.engineRun === runId && b.sequence === b.engineTo && b.applied >= b.engineFrom - 1;
}

const num = (v: string | null | undefined) => Number(v ?? 0) || 0;

/**
 * Of a batch read from partition `p`'s timer inbox, appends to the event inbox (behind the events
 * that must come first) every timer that may not go first, and returns the entries to handle now.
 * Called with the partition's event batches held off (actors/subscriber-actor.ts), so what is
 * applied is also handled by the automation step, unless `eventsOwed`: an event batch of the
 * partition may have been applied without its automation step (it failed after `applyEvents`, or a
 * worker died there and this one has not handled the entries it left pending yet), so the applied
 * sequences say nothing and every timer goes to the event inbox, behind that batch. A worker killed
 * after moving a timer and before acking it moves it again: a timer its run no longer waits for is
 * ignored (workflow-engine onTimer), a segment timer only re-checks membership.
 */
export async function orderTimers(redis: Redis, keys: Keys, p: number, entries: StreamEntry[], eventsOwed = false): Promise<StreamEntry[]> {
  const goesFirst = eventsOwed ? (entry: StreamEntry) => entry.fields.k !== 'timer' : await backlogRule(redis, keys, p, entries);
  if (!goesFirst) return entries;
  const now: StreamEntry[] = [];
  const later: StreamEntry[] = [];
  for (const entry of entries) (goesFirst(entry) ? now : later).push(entry);
  await Promise.all(later.map(({ fields }) => redis.xadd(keys.inbox(p), '*', ...Object.entries(fields).flat())));
  return now;
}

/** Which entries of a timer batch may go first by their subscribers' backlogs (`timerMayGoFirst`); null when no entry is a subscriber's timer. */
async function backlogRule(redis: Redis, keys: Keys, p: number, entries: StreamEntry[]): Promise<((entry: StreamEntry) => boolean) | null> {
  const subs = [...new Set(entries.filter(({ fields }) => fields.k === 'timer' && fields.t && fields.x !== undefined).map(({ fields }) => `${fields.t}|${fields.x}`))];
  if (subs.length === 0) return null;
  const [sequences, applied, ranges] = await Promise.all([
    redis.hmget(keys.sequences(p), ...subs),
    redis.hmget(keys.applied(p), ...subs),
    Promise.all(subs.map((s) => {
      const bar = s.indexOf('|');
      return redis.hmget(keys.automation(p, s.slice(0, bar), s.slice(bar + 1)), 'ea', 'eb', 'er');
    })),
  ]);
  const backlogs = new Map<string, Backlog>(subs.map((s, i) => [s, {
    sequence: num(sequences[i]), applied: num(applied[i]),
    engineFrom: num(ranges[i]![0]), engineTo: num(ranges[i]![1]), engineRun: ranges[i]![2] ?? '',
  }]));
  return ({ fields }) => {
    const backlog = fields.k === 'timer' ? backlogs.get(`${fields.t}|${fields.x}`) : undefined;
    return !backlog || timerMayGoFirst(fields.tm ?? '', backlog);
  };
}
