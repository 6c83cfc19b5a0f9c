import { createHmac } from 'node:crypto';
import { safeEqual } from './secrets.js';

/** The identityHash of an externalId: hex HMAC-SHA256 of the externalId (UTF-8) under the tenant's identity secret. */
export function identityHash(secret: string, externalId: string): string {
  return createHmac('sha256', secret).update(externalId, 'utf8').digest('hex');
}

/** Constant-time check of a presented identityHash (case-insensitive hex). */
export function verifyIdentityHash(secret: string, externalId: string, presented: string): boolean {
  return safeEqual(identityHash(secret, externalId), presented.toLowerCase());
}
