import { now } from './clock.js';
import { ApiError, type ErrorCode, type ErrorDetail } from './errors.js';
import { isReserved, isSdkName, type EventSource } from './event-names.js';
import { bodyProblems } from './validator.js';

export const MAX_EVENT_DATA_BYTES = 8 * 1024;
export const MAX_EVENTS_PER_CALL = 100;
/**
 * The body a backend's event batch may need (`POST /v1/events`), read whatever
 * `HTTP_BODY_LIMIT_BYTES` says: 100 events of 8 KB data each, sent with every non-ASCII character
 * escaped as JSON allows (`\u00e9`, Python's `json.dumps` by default), is up to three times 800 KB,
 * plus ids and names of 256 characters escaped as well. A batch the spec allows got 413 under the
 * 1 MiB default, and clients are told to drop a batch refused with a 4xx (probe DH).
 */
export const EVENT_BATCH_BODY_BYTES = 4 * 1024 * 1024;
export const TIMESTAMP_MAX_AGE_MS = 7 * 86_400_000;
export const TIMESTAMP_MAX_AHEAD_MS = 3_600_000;

/** An event ready for the ingest script: validated, with its data serialized once. */
export type NewEvent = {
  externalId: string;
  name: string;
  source: EventSource;
  /** null: the time of receipt (the ingest's `receivedAt`, which a new subscriber's `$subscriber.created` takes too) */
  timestampMs: number | null;
  /** `data` as JSON text, at most 8 KB */
  data: string;
  /** `data` itself, when the caller has it (the answer echoes it without parsing `data` again) */
  value?: Record<string, unknown>;
  callerId: string | null;
  /** the other service a Source turned this event's webhook into it from (source `webhook`); null otherwise */
  provider: string | null;
  runId: string | null;
  messageId: string | null;
  step: string | null;
  /**
   * An engine event (source `system`): the id of the subscriber it is about, as the engine read it.
   * Another one by then (deleted, and perhaps created again under the externalId) or none makes it
   * `gone`, not stored (lua/ingestEvents); left out, whichever exists.
   */
  subscriberId?: string;
};

type RawEvent = { externalId: string; name: string; data?: Record<string, unknown>; timestamp?: string; id?: string };

// When a batch fails for several reasons, the error code is the first of these that applies.
const PRIORITY: ErrorCode[] = ['validation', 'reserved_event', 'invalid_timestamp', 'event_data_too_large'];

/** `data` as JSON text (`{}` when absent), serialized once for the size rule and the store; null when it is not an object. */
function serializeData(event: unknown): string | null {
  const data = (event as { data?: unknown } | null)?.data;
  if (data === undefined) return '{}';
  return data !== null && typeof data === 'object' && !Array.isArray(data) ? JSON.stringify(data) : null;
}

/**
 * Checks a batch: the schema `schema`, then the rules of spec 4.3 and Part 8 that a schema cannot
 * say (reserved names (from the app, only the SDK's own), the timestamp window, the 8 KB data
 * limit) on every item whose field is well-formed, so `details` names every failing item whatever
 * its reason. Throws once, so a batch is accepted whole or not at all; returns each event's data
 * serialized.
 */
function checkBatch(schema: string, body: unknown, events: unknown[], paramOf: (i: number, field: string) => string, from: 'server' | 'app'): string[] {
  const found = new Map<ErrorCode, ErrorDetail[]>();
  const add = (code: ErrorCode, param: string, message: string) => {
    const list = found.get(code);
    if (list) list.push({ param, message });
    else found.set(code, [{ param, message }]);
  };
  const malformed = new Set<string>();
  for (const detail of bodyProblems(schema, body)) {
    add('validation', detail.param, detail.message);
    malformed.add(detail.param);
  }
  // a batch over the limit is refused for that alone (the schema's detail): its items are not read
  if (events.length > MAX_EVENTS_PER_CALL && found.size > 0) events = [];
  const at = now();
  const serialized = events.map((event, i) => {
    const { name, timestamp } = (event ?? {}) as { name?: unknown; timestamp?: unknown };
    if (typeof name === 'string' && isReserved(name)) {
      if (from === 'server') add('reserved_event', paramOf(i, 'name'), 'names beginning with $ are reserved for the SDK and the engine');
      else if (!isSdkName(name)) add('reserved_event', paramOf(i, 'name'), 'only the SDK\'s own reserved names may be sent from the app');
    }
    // a timestamp that is not a date-time (`2026-02-30T00:00:00Z`) has its one detail already
    if (typeof timestamp === 'string' && !malformed.has(paramOf(i, 'timestamp'))) {
      const ms = Date.parse(timestamp);
      if (ms < at - TIMESTAMP_MAX_AGE_MS || ms > at + TIMESTAMP_MAX_AHEAD_MS) {
        add('invalid_timestamp', paramOf(i, 'timestamp'), 'must be at most 7 days in the past and at most 1 hour in the future');
      }
    }
    const data = serializeData(event);
    if (data !== null && Buffer.byteLength(data) > MAX_EVENT_DATA_BYTES) {
      add('event_data_too_large', paramOf(i, 'data'), `must be at most ${MAX_EVENT_DATA_BYTES} bytes serialized`);
    }
    return data ?? '{}';
  });
  if (found.size === 0) return serialized;
  const code = PRIORITY.find((c) => found.has(c))!;
  const byItem = (a: ErrorDetail, b: ErrorDetail) => itemIndex(a.param) - itemIndex(b.param);
  const details = PRIORITY.flatMap((c) => found.get(c) ?? []).sort(byItem);
  // `param` and the message name the first failure of the code answered, not of another reason
  const first = [...found.get(code)!].sort(byItem)[0]!;
  const more = details.length > 1 ? ` (${details.length} failures in details)` : '';
  throw new ApiError(400, code, `${first.param}: ${first.message}${more}`, { param: first.param, details });
}

/** The item a detail names (`events[3].name` → 3; -1 for the request itself), to list details in input order. */
function itemIndex(param: string): number {
  const match = /^events\[(\d+)\]/.exec(param);
  return match ? Number(match[1]) : -1;
}

function toNewEvent(event: RawEvent, data: string, source: EventSource, externalId: string): NewEvent {
  return {
    externalId,
    name: event.name,
    source,
    // without a timestamp: the time of receipt, taken when the ingest stores it (taken here, it came a
    // millisecond or so before the `$subscriber.created` it made, probe C of session 62)
    timestampMs: event.timestamp === undefined ? null : Date.parse(event.timestamp),
    data,
    value: event.data ?? {},
    callerId: event.id ?? null,
    provider: null,
    runId: null,
    messageId: null,
    step: null,
  };
}

/** Reads the body of `POST /v1/events`: `{ events: [...] }` or one bare event. */
export function readServerEvents(body: unknown): NewEvent[] {
  const isBatch = typeof body === 'object' && body !== null && !Array.isArray(body) && 'events' in body;
  if (isBatch) {
    const raw = (body as { events: unknown }).events;
    const events = (Array.isArray(raw) ? raw : []) as RawEvent[];
    const data = checkBatch('TrackEventsRequest', body, events, (i, f) => `events[${i}].${f}`, 'server');
    return events.map((e, i) => toNewEvent(e, data[i]!, 'server', e.externalId));
  }
  const event = body as RawEvent;
  const data = checkBatch('TrackEvent', body, [event], (_i, f) => f, 'server');
  return [toNewEvent(event, data[0]!, 'server', event.externalId)];
}

export type ClientEventsBody = { externalId: string; identityHash?: string; source: 'ios' | 'android' | 'web'; events: Omit<RawEvent, 'externalId'>[] };

/** Reads the body of `POST /v1/client/events`. */
export function readClientEvents(body: unknown): { request: ClientEventsBody; events: NewEvent[] } {
  const raw = (body as { events?: unknown } | null)?.events;
  const items = (Array.isArray(raw) ? raw : []) as RawEvent[];
  const data = checkBatch('ClientEventsRequest', body, items, (i, f) => `events[${i}].${f}`, 'app');
  const request = body as ClientEventsBody;
  return { request, events: items.map((e, i) => toNewEvent(e, data[i]!, request.source, request.externalId)) };
}

/**
 * An app's own `$identify` events (POST /v1/client/events) carry what the call proved, not what the
 * app wrote: `verified` is whether this call's identityHash was valid, `merged` false (a tracked
 * event merges nothing). Else a client key could write a `$identify` indistinguishable from the one
 * identify writes, `verified: true` without any hash (probe DD), and a workflow trigger or segment
 * filtering on it would trust it. 400 `event_data_too_large` when the two fields take the data over
 * the limit.
 */
export function settleAppIdentify(events: NewEvent[], verified: boolean): void {
  const over: ErrorDetail[] = [];
  events.forEach((event, i) => {
    if (event.name !== '$identify') return;
    const value = { ...(event.value ?? JSON.parse(event.data) as Record<string, unknown>), verified, merged: false };
    const data = JSON.stringify(value);
    if (Buffer.byteLength(data) > MAX_EVENT_DATA_BYTES) over.push({ param: `events[${i}].data`, message: `must be at most ${MAX_EVENT_DATA_BYTES} bytes serialized with the verified and merged fields Herald sets on an app's $identify` });
    event.value = value;
    event.data = data;
  });
  if (over.length) throw new ApiError(400, 'event_data_too_large', `${over[0]!.param}: ${over[0]!.message}`, { param: over[0]!.param, details: over });
}
