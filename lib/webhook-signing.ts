/**
 * Standard Webhooks signing (spec 6.2): `v1,<base64 HMAC-SHA256>` over `id.timestamp.body`,
 * keyed with the base64-decoded part of a `whsec_` secret.
 */
import { createHmac, randomBytes, timingSafeEqual } from 'node:crypto';

/** Largest accepted distance, either way, between a signature's timestamp and now (spec 8). */
export const TOLERANCE_SECONDS = 5 * 60;
/** How long the previous secret keeps signing and verifying after a rotation (spec 6.2.8). */
export const OLD_SECRET_VALIDITY_MS = 24 * 3600 * 1000;
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
 * During a rotation pass the current and the previous secret; receivers accept either.
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
  // Signed over the number as written by a sender, as the reference library does.
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

/**
 * The secrets to sign with at `nowMs`: the current one, then the previous one while it is
 * younger than `OLD_SECRET_VALIDITY_MS` since the rotation.
 */
export function signingSecrets(current: string, previous: { secret: string; rotatedAtMs: number } | null, nowMs: number): string[] {
  if (previous && nowMs - previous.rotatedAtMs < OLD_SECRET_VALIDITY_MS) return [current, previous.secret];
  return [current];
}
