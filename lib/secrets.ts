import { createHash, randomBytes, timingSafeEqual } from 'node:crypto';

/** Hex SHA-256 of `text`: how API keys are stored. */
export function sha256Hex(text: string): string {
  return createHash('sha256').update(text).digest('hex');
}

/** `bytes` random bytes in base64url (no padding). */
export function randomToken(bytes: number): string {
  return randomBytes(bytes).toString('base64url');
}

/** Constant-time equality of two strings (false on different lengths). */
export function safeEqual(a: string, b: string): boolean {
  const left = Buffer.from(a);
  const right = Buffer.from(b);
  return left.length === right.length && timingSafeEqual(left, right);
}
