/**
 * Standard Webhooks signing (spec 6.2): `v1,<base64 HMAC-SHA256>` over `id.timestamp.body`,
 * keyed with the base64-decoded part of a `whsec_` secret.
 */
import { createHmac, randomBytes, timingSafeEqual } from 'node:crypto';

/** Largest accepted distance, either way, between a signature's timestamp and now (spec 8). */
export const TOLERANCE_SECONDS = 5 * 60;
/** How long a secret retired by a rotation keeps signing and verifying after it (spec 6.2.8). */
export const OLD_SECRET_VALIDITY_MS = 24 * 3600 * 1000;
/**
 * Most retired secrets an endpoint keeps (and signs with) at once: an 11th rotation within 24 hours
 * drops the oldest retired secret before its 24 hours are over.
 */
export const MAX_RETIRED_SECRETS = 10;
export const SECRET_PREFIX = 'whsec_';

const SECRET_BYTES = 24;
const SIGNATURE_VERSION = 'v1';
const BASE64 = /^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=|[A-Za-z0-9+/]{2,3})?$/;

export type WebhookHeaders = {
  'webhook-id': string;
  'webhook-timestamp': string;
  'webhook-signature': string;
};

export type SignatureHeaders = { id: string; timestamp: string; signature: string };

/** A new signing secret: `whsec_` and the base64 of 24 random bytes. */
export function newWebhookSecret(): string {
  return SECRET_PREFIX + randomBytes(SECRET_BYTES).toString('base64');
}

// Buffer.from(..., 'base64') skips characters it does not know, so a mangled secret would
// quietly sign with a different key; refuse it instead.
function secretKey(secret: string): Buffer {
  const encoded = secret.startsWith(SECRET_PREFIX) ? secret.slice(SECRET_PREFIX.length) : secret;
  if (encoded === '' || !BASE64.test(encoded)) throw new Error('webhook secret must be whsec_ followed by base64');
  return Buffer.from(encoded, 'base64');
}

function hmac(key: Buffer, id: string, timestamp: string, body: string | Uint8Array): string {
  return createHmac('sha256', key).update(`${id}.${timestamp}.`).update(body).digest('base64');
}

/**
 * The `webhook-signature` header value: one `v1,<signature>` per secret, space-separated.
 * Within 24 hours of rotations pass the current secret and the retired ones; receivers accept any.
 */
export function signPayload(secrets: string[], id: string, timestampSeconds: number, body: string | Uint8Array): string {
  if (secrets.length === 0) throw new Error('signPayload needs at least one secret');
  if (!Number.isSafeInteger(timestampSeconds)) throw new RangeError('timestampSeconds must be whole unix seconds');
  const timestamp = String(timestampSeconds);
  return secrets.map((secret) => `${SIGNATURE_VERSION},${hmac(secretKey(secret), id, timestamp, body)}`).join(' ');
}

/**
 * True when one of the header's `v1` signatures matches `body` under `secret` and the
 * timestamp is within `TOLERANCE_SECONDS` of `nowSeconds`. Pass the exact received bytes.
 */
export function verifySignature(
  secret: string,
  headers: SignatureHeaders,
  body: string | Uint8Array,
  nowSeconds: number,
): boolean {
  if (!/^\d{1,15}$/.test(headers.timestamp)) return false;
  const timestamp = Number(headers.timestamp);
  if (Math.abs(nowSeconds - timestamp) > TOLERANCE_SECONDS) return false;
  // Signed over the number the header holds, written without leading zeros (`0<t>` is signed as `<t>`), as the reference library does.
  const expected = Buffer.from(hmac(secretKey(secret), headers.id, String(timestamp), body));
  for (const part of headers.signature.split(' ')) {
    const comma = part.indexOf(',');
    if (comma < 0 || part.slice(0, comma) !== SIGNATURE_VERSION) continue;
    const candidate = Buffer.from(part.slice(comma + 1));
    if (candidate.length === expected.length && timingSafeEqual(candidate, expected)) return true;
  }
  return false;
}

/** The three delivery headers of spec 6.2.4 for one attempt sent at `nowSeconds`. */
export function webhookHeaders(secrets: string[], id: string, body: string | Uint8Array, nowSeconds: number): WebhookHeaders {
  return {
    'webhook-id': id,
    'webhook-timestamp': String(nowSeconds),
    'webhook-signature': signPayload(secrets, id, nowSeconds, body),
  };
}

/** A secret retired by a rotation: it keeps signing until `expiresAtMs` (rotation + 24 hours). */
export type RetiredSecret = { secret: string; expiresAtMs: number };

/**
 * The retired secrets of a stored endpoint, newest first: the JSON list `retiredSecrets`
 * (`[{ secret, expiresAt }]`, written by lua/rotateWebhookSecret), merged with the single
 * `previousSecret` of records rotated by an earlier version (retired at `rotatedAt`, so it expires
 * 24 hours later). Rotations keep `previousSecret` as the newest retired secret, so both agree.
 */
export function retiredSecretsOf(stored: { retiredSecrets?: string; previousSecret?: string; rotatedAt?: string }): RetiredSecret[] {
  const out: RetiredSecret[] = [];
  const raw = stored.retiredSecrets ? (JSON.parse(stored.retiredSecrets) as unknown) : [];
  // cjson writes an empty list as `{}`
  if (Array.isArray(raw)) for (const r of raw as { secret: string; expiresAt: number }[]) out.push({ secret: r.secret, expiresAtMs: Number(r.expiresAt) });
  if (stored.previousSecret && stored.rotatedAt && !out.some((r) => r.secret === stored.previousSecret)) {
    out.push({ secret: stored.previousSecret, expiresAtMs: Number(stored.rotatedAt) + OLD_SECRET_VALIDITY_MS });
  }
  return out.sort((a, b) => b.expiresAtMs - a.expiresAtMs);
}

/**
 * The secrets to sign with at `nowMs`: the current one first, then each retired one still inside
 * its window (`nowMs < expiresAtMs`), newest first, at most `MAX_RETIRED_SECRETS` of them.
 */
export function signingSecrets(current: string, retired: readonly RetiredSecret[], nowMs: number): string[] {
  const out = [current];
  for (const r of [...retired].sort((a, b) => b.expiresAtMs - a.expiresAtMs)) {
    if (out.length > MAX_RETIRED_SECRETS) break;
    if (nowMs < r.expiresAtMs && !out.includes(r.secret)) out.push(r.secret);
  }
  return out;
}
