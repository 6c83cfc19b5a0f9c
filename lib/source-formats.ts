/**
 * Sources (docs/sources.md): how a delivery of another service's webhook is verified and read
 * into one event. Pure: no Redis, no HTTP; the route hands it the exact bytes and the headers.
 */
import { createHash, createHmac, randomBytes } from 'node:crypto';
import { now } from './clock.js';
import { codePoints } from './code-points.js';
import { safeEqual } from './secrets.js';
import { MAX_EVENT_DATA_BYTES, TIMESTAMP_MAX_AGE_MS, TIMESTAMP_MAX_AHEAD_MS } from './track-events.js';
import type { SourceFormat } from './source-limits.js';
import { TOLERANCE_SECONDS, newWebhookSecret, verifySignature } from './webhook-signing.js';
import { dateTimeMs } from './validator.js';

export const MAPPING_FIELDS = ['externalId', 'name', 'id', 'timestamp', 'data'] as const;
export type MappingField = (typeof MAPPING_FIELDS)[number];
/** Where each event field is read in the payload: a dot path, or null for the format's default. */
export type Mapping = Record<MappingField, string | null>;

/** Headers as Node gives them: lowercase names. */
export type Headers = Record<string, string | string[] | undefined>;

const header = (headers: Headers, name: string): string | null => {
  const v = headers[name];
  const s = Array.isArray(v) ? v[0] : v;
  return s === undefined || s === '' ? null : s;
};

/**
 * A Standard Webhooks header, `webhook-<part>`, or Svix's own name for it, `svix-<part>`: Svix signs
 * its customers' deliveries (Clerk, Resend) the same way under `svix-` names unless white-labelled.
 */
const standardHeader = (headers: Headers, part: 'id' | 'timestamp' | 'signature'): string | null =>
  header(headers, `webhook-${part}`) ?? header(headers, `svix-${part}`);

const hmacHex = (secret: string, text: Buffer | string, prefix = '') =>
  createHmac('sha256', Buffer.from(secret, 'utf8')).update(prefix).update(text).digest('hex');

/** The secret a new source gets when the create body has none; null when the format needs the provider's. */
export function generatedSecret(format: SourceFormat): string | null {
  if (format === 'standard-webhooks') return newWebhookSecret();
  if (format === 'github') return randomBytes(24).toString('hex');
  return null;
}

/** Why `secret` cannot be used with `format`, or null when it can. */
export function secretProblem(format: SourceFormat, secret: string): string | null {
  const base64 = /^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=|[A-Za-z0-9+/]{2,3})?$/;
  if (format === 'stripe') {
    // Stripe's endpoint secrets are whsec_…; an API key (sk_…, rk_…) pasted by mistake would never verify
    return /^whsec_[A-Za-z0-9]+$/.test(secret) ? null : 'must be the endpoint\'s signing secret as Stripe shows it (whsec_…), not an API key';
  }
  if (format !== 'standard-webhooks') return null;
  const encoded = secret.startsWith('whsec_') ? secret.slice('whsec_'.length) : '';
  if (encoded === '' || !base64.test(encoded)) return 'must be whsec_ followed by base64 (the Standard Webhooks secret format)';
  // the HMAC key is the decoded bytes: `whsec_q8` passed the 8 characters and was one byte, found
  // among 256 tries (probe BD); Standard Webhooks asks for 24 to 64, senders (Svix) use 24 or 32
  const bytes = Buffer.from(encoded, 'base64').length;
  return bytes >= MIN_STANDARD_SECRET_BYTES ? null : `must decode to at least ${MIN_STANDARD_SECRET_BYTES} bytes (this one is ${bytes}); the Standard Webhooks secret format asks for 24 to 64`;
}

/** Shortest HMAC key a standard-webhooks source takes, in decoded bytes. */
const MIN_STANDARD_SECRET_BYTES = 16;

export type Verdict =
  | { ok: true }
  | { ok: false; code: 'missing_authorization' | 'invalid_signature'; message: string };

/**
 * Whether a delivery carries a valid signature of `format` under one of `secrets`, over the exact
 * bytes `body`, at `nowSeconds`.
 */
export function verifyDelivery(format: SourceFormat, secrets: string[], headers: Headers, body: Buffer, nowSeconds: number): Verdict {
  const bad = (message: string): Verdict => ({ ok: false, code: 'invalid_signature', message });
  if (format === 'standard-webhooks') {
    const id = standardHeader(headers, 'id');
    const timestamp = standardHeader(headers, 'timestamp');
    // a sender repeating the header: Node joins the copies with ", " (the signatures are space-separated)
    const signature = standardHeader(headers, 'signature')?.replace(/,\s+/g, ' ') ?? null;
    if (!id || !timestamp || !signature) return { ok: false, code: 'missing_authorization', message: 'Send the webhook-id, webhook-timestamp and webhook-signature headers (Standard Webhooks; Svix\'s svix-id, svix-timestamp and svix-signature also do)' };
    if (secrets.some((s) => verifySignature(s, { id, timestamp, signature }, body, nowSeconds))) return { ok: true };
    return bad(`No webhook-signature matches the source's secret, or webhook-timestamp is more than ${TOLERANCE_SECONDS / 60} minutes off`);
  }
  if (format === 'stripe') {
    const value = header(headers, 'stripe-signature');
    if (!value) return { ok: false, code: 'missing_authorization', message: 'Send the Stripe-Signature header' };
    const parts = value.split(',').map((p) => p.trim().split('='));
    const t = parts.find(([k]) => k === 't')?.[1] ?? '';
    const signatures = parts.filter(([k]) => k === 'v1').map(([, v]) => v ?? '');
    if (!/^\d{1,15}$/.test(t) || Math.abs(nowSeconds - Number(t)) > TOLERANCE_SECONDS) return bad(`Stripe-Signature's timestamp is missing or more than ${TOLERANCE_SECONDS / 60} minutes off`);
    for (const secret of secrets) {
      const expected = hmacHex(secret, body, `${t}.`);
      if (signatures.some((s) => safeEqual(s, expected))) return { ok: true };
    }
    return bad('No v1 signature of Stripe-Signature matches the source\'s secret');
  }
  const value = header(headers, 'x-hub-signature-256');
  if (!value) return { ok: false, code: 'missing_authorization', message: 'Send the X-Hub-Signature-256 header' };
  for (const secret of secrets) if (safeEqual(value, `sha256=${hmacHex(secret, body)}`)) return { ok: true };
  return bad('X-Hub-Signature-256 does not match the source\'s secret');
}

/** The value at a dot path (`data.object.id`, `items.0.id`), or undefined. Own keys only. */
export function valueAt(payload: unknown, path: string): unknown {
  let value = payload;
  for (const key of path.split('.')) {
    if (value === null || typeof value !== 'object') return undefined;
    if (Array.isArray(value)) {
      if (!/^\d+$/.test(key)) return undefined;
      value = value[Number(key)];
    } else {
      if (!Object.hasOwn(value, key)) return undefined;
      value = (value as Record<string, unknown>)[key];
    }
  }
  return value;
}

const scalar = (v: unknown): string | null =>
  typeof v === 'string' && v !== '' ? v : typeof v === 'number' && Number.isSafeInteger(v) ? String(v) : null;

const text = (v: unknown): string | null => (typeof v === 'string' && v !== '' ? v : null);

/** An event name from a provider's name: prefixed, lowercased, other characters as `_`. */
export function eventNameOf(prefix: string, raw: string): string {
  return (prefix + raw).toLowerCase().replace(/[^a-z0-9_.-]/g, '_');
}

/**
 * A timestamp of a payload in ms: date-time text as `POST /v1/events` reads its `timestamp` (RFC 3339,
 * with its offset: `dateTimeMs`), or unix seconds (below 10^11) or milliseconds; null when it is
 * neither. Text without an offset is refused: `Date.parse` would read it in the server's own time zone.
 */
function timestampMsOf(v: unknown): number | null {
  // zero or below is unix time too, long past: the caller's range check refuses it as invalid_timestamp (probe DM)
  if (typeof v === 'number' && Number.isFinite(v)) return v < 1e11 ? Math.round(v * 1000) : Math.round(v);
  return typeof v === 'string' ? dateTimeMs(v) : null;
}

const EVENT_NAME = /^[a-z0-9][a-z0-9_.-]{0,99}$/;
/** Longest dedupe key stored as it is (after `=`); a longer one is stored as its SHA-256 (after `#`). */
const MAX_DEDUPE_KEY_LENGTH = 256;

const sha256Hex = (value: string | Buffer) => createHash('sha256').update(value).digest('hex');

/** A dedupe key as stored: `=` and the key, or `#` and the SHA-256 of one too long to keep (two keys that differ anywhere stay apart). */
const dedupeKey = (key: string | null): string | null => (key === null ? null : key.length > MAX_DEDUPE_KEY_LENGTH ? `#${sha256Hex(key)}` : `=${key}`);

/**
 * What a delivery turns into: one event to store, a reason to ignore it, or a rule it breaks. An
 * event's `dedupeId` is its dedupe key as stored, `=<key>` or `#<SHA-256 hex of a key over 256
 * characters, or of a GitHub delivery's body>`, or null for none.
 */
export type Reading =
  | { kind: 'event'; externalId: string; name: string; dedupeId: string | null; timestampMs: number; data: string }
  | { kind: 'ignored'; reason: 'no_external_id' | 'no_name' }
  | { kind: 'rejected'; code: 'validation' | 'invalid_timestamp' | 'event_data_too_large'; param: string; message: string };

/**
 * Reads a verified delivery's payload into an event, by the source's mapping and its format's
 * defaults (docs/sources.md, Mapping), checking the event rules of spec 4.3 and Part 8. `body` is
 * the delivery's exact bytes (a GitHub delivery's dedupe key is their SHA-256).
 */
export function readDelivery(source: { format: SourceFormat; mapping: Mapping; namePrefix: string }, payload: Record<string, unknown>, headers: Headers, body: Buffer): Reading {
  const { format, mapping } = source;
  const externalId = scalar(valueAt(payload, mapping.externalId!));
  if (externalId === null || codePoints(externalId) > 256) return { kind: 'ignored', reason: 'no_external_id' };

  let rawName: string | null;
  if (mapping.name) rawName = text(valueAt(payload, mapping.name));
  else if (format === 'github') {
    const event = header(headers, 'x-github-event');
    const action = text(payload.action);
    rawName = event && (action ? `${event}.${action}` : event);
  } else rawName = text(payload.type);
  if (rawName === null) return { kind: 'ignored', reason: 'no_name' };
  const name = eventNameOf(source.namePrefix, rawName);
  if (!EVENT_NAME.test(name)) return { kind: 'rejected', code: 'validation', param: 'name', message: `"${name.slice(0, 120)}" is not an event name: it must match [a-z0-9][a-z0-9_.-]{0,99}` };

  // GitHub signs the body alone: X-GitHub-Delivery (and X-GitHub-Event, the name) can be changed by
  // whoever saw one delivery, so its key is what the signature covers, the body's SHA-256
  const dedupeId = mapping.id ? dedupeKey(scalar(valueAt(payload, mapping.id)))
    : format === 'github' ? `#${sha256Hex(body)}`
      : dedupeKey(format === 'standard-webhooks' ? standardHeader(headers, 'id') : scalar(payload.id));

  const at = now();
  const timestampPath = mapping.timestamp ?? (format === 'stripe' ? 'created' : null);
  let timestampMs = at;
  const found = timestampPath ? valueAt(payload, timestampPath) : undefined;
  // absent (or null) in this delivery: the time of receipt, as an event posted without a timestamp
  if (timestampPath && found !== undefined && found !== null) {
    const ms = timestampMsOf(found);
    if (ms === null) return { kind: 'rejected', code: 'validation', param: 'timestamp', message: `the value at ${timestampPath} is not an ISO 8601 date-time nor unix seconds or milliseconds` };
    if (ms < at - TIMESTAMP_MAX_AGE_MS || ms > at + TIMESTAMP_MAX_AHEAD_MS) {
      return { kind: 'rejected', code: 'invalid_timestamp', param: 'timestamp', message: 'must be at most 7 days in the past and at most 1 hour in the future' };
    }
    timestampMs = ms;
  }

  // absent (or null) in this delivery: no data, as an event posted without any (probe BO: refused,
  // so a provider retried for days a delivery that could only be refused again)
  const mapped = mapping.data ? valueAt(payload, mapping.data) : payload;
  const value = mapped === undefined || mapped === null ? {} : mapped;
  if (typeof value !== 'object' || Array.isArray(value)) {
    return { kind: 'rejected', code: 'validation', param: 'data', message: `the value at ${mapping.data} must be a JSON object` };
  }
  const data = JSON.stringify(value);
  if (Buffer.byteLength(data) > MAX_EVENT_DATA_BYTES) {
    return { kind: 'rejected', code: 'event_data_too_large', param: 'data', message: `must be at most ${MAX_EVENT_DATA_BYTES} bytes serialized (map a smaller part of the payload with mapping.data)` };
  }
  return { kind: 'event', externalId, name, dedupeId, timestampMs, data };
}
