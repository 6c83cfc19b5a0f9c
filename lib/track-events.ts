import { now } from './clock.js';
import { ApiError, validationError, type ErrorCode, type ErrorDetail } from './errors.js';
import { isReserved, isSdkName, type EventSource } from './event-names.js';
import { checkBody } from './validator.js';

export const MAX_EVENT_DATA_BYTES = 8 * 1024;
export const MAX_EVENTS_PER_CALL = 100;
export const TIMESTAMP_MAX_AGE_MS = 7 * 86_400_000;
export const TIMESTAMP_MAX_AHEAD_MS = 3_600_000;

/** An event ready for the ingest script: validated, with its data serialized once. */
export type NewEvent = {
  externalId: string;
  name: string;
  source: EventSource;
  timestampMs: number;
  /** `data` as JSON text, at most 8 KB */
  data: string;
  /** `data` itself, when the caller has it (the answer echoes it without parsing `data` again) */
  value?: Record<string, unknown>;
  callerId: string | null;
  runId: string | null;
  messageId: string | null;
  step: string | null;
};

type RawEvent = { externalId: string; name: string; data?: Record<string, unknown>; timestamp?: string; id?: string };

// When a batch fails for several reasons, the error code is the first of these that applies.
const PRIORITY: ErrorCode[] = ['validation', 'reserved_event', 'invalid_timestamp', 'event_data_too_large'];

/**
 * Checks the rules of spec 4.3 and Part 8 that a schema cannot say: reserved names (from the app,
 * only the SDK's own), the timestamp window and the 8 KB data limit. Collects every failing item,
 * then throws once, so a batch is accepted whole or not at all.
 */
function checkRules(events: RawEvent[], serialized: string[], paramOf: (i: number, field: string) => string, from: 'server' | 'app'): void {
  const found = new Map<ErrorCode, ErrorDetail[]>();
  const add = (code: ErrorCode, param: string, message: string) => found.set(code, [...(found.get(code) ?? []), { param, message }]);
  const at = now();
  events.forEach((event, i) => {
    if (isReserved(event.name)) {
      if (from === 'server') add('reserved_event', paramOf(i, 'name'), 'names beginning with $ are reserved for the SDK and the engine');
      else if (!isSdkName(event.name)) add('reserved_event', paramOf(i, 'name'), 'only the SDK\'s own reserved names may be sent from the app');
    }
    if (event.timestamp !== undefined) {
      const ms = Date.parse(event.timestamp);
      if (ms < at - TIMESTAMP_MAX_AGE_MS || ms > at + TIMESTAMP_MAX_AHEAD_MS) {
        add('invalid_timestamp', paramOf(i, 'timestamp'), 'must be at most 7 days in the past and at most 1 hour in the future');
      }
    }
    if (Buffer.byteLength(serialized[i]!) > MAX_EVENT_DATA_BYTES) {
      add('event_data_too_large', paramOf(i, 'data'), `must be at most ${MAX_EVENT_DATA_BYTES} bytes serialized`);
    }
  });
  if (found.size === 0) return;
  const code = PRIORITY.find((c) => found.has(c))!;
  const details = PRIORITY.flatMap((c) => found.get(c) ?? []);
  const err = validationError(details, code);
  throw new ApiError(400, code, err.message, { param: err.param, details });
}

/** Each event's `data` as JSON text (`{}` when absent), serialized once for the size rule and the store. */
const serialize = (events: RawEvent[]) => events.map((e) => (e.data === undefined ? '{}' : JSON.stringify(e.data)));

function toNewEvent(event: RawEvent, data: string, source: EventSource, externalId: string): NewEvent {
  return {
    externalId,
    name: event.name,
    source,
    timestampMs: event.timestamp === undefined ? now() : Date.parse(event.timestamp),
    data,
    value: event.data ?? {},
    callerId: event.id ?? null,
    runId: null,
    messageId: null,
    step: null,
  };
}

/** Reads the body of `POST /v1/events`: `{ events: [...] }` or one bare event. */
export function readServerEvents(body: unknown): NewEvent[] {
  const isBatch = typeof body === 'object' && body !== null && !Array.isArray(body) && 'events' in body;
  if (isBatch) {
    const { events } = checkBody<{ events: RawEvent[] }>('TrackEventsRequest', body);
    const data = serialize(events);
    checkRules(events, data, (i, f) => `events[${i}].${f}`, 'server');
    return events.map((e, i) => toNewEvent(e, data[i]!, 'server', e.externalId));
  }
  const event = checkBody<RawEvent>('TrackEvent', body);
  const data = serialize([event]);
  checkRules([event], data, (_i, f) => f, 'server');
  return [toNewEvent(event, data[0]!, 'server', event.externalId)];
}

export type ClientEventsBody = { externalId: string; identityHash?: string; source: 'ios' | 'android' | 'web'; events: Omit<RawEvent, 'externalId'>[] };

/** Reads the body of `POST /v1/client/events`. */
export function readClientEvents(body: unknown): { request: ClientEventsBody; events: NewEvent[] } {
  const request = checkBody<ClientEventsBody>('ClientEventsRequest', body);
  const events = request.events.map((e) => ({ ...e, externalId: request.externalId }));
  const data = serialize(events);
  checkRules(events, data, (i, f) => `events[${i}].${f}`, 'app');
  return { request, events: events.map((e, i) => toNewEvent(e, data[i]!, request.source, request.externalId)) };
}
