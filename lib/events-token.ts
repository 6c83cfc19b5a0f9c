import { SignJWT, jwtVerify } from 'jose';
import { now } from './clock.js';

export const EVENTS_TOKEN_TTL_SECONDS = 3600;
const ISSUER = 'herald';
const AUDIENCE = 'herald:events';

/** `keyId`: the API key that minted the token; the token is honoured only while that key is (revoked or expired, its tokens stop too). */
export type EventsTokenClaims = { workspaceId: string; tenantId: string; keyId: string };

/** True when a bearer credential is a token (a JWT) rather than an API key. */
export function looksLikeToken(credential: string): boolean {
  return credential.startsWith('eyJ') && credential.split('.').length === 3;
}

/**
 * A short-lived HS256 JWT that reads one tenant's event catalog, volume, recent events and
 * timelines: an hour, or less when the minting key expires sooner (`keyExpiresAtMs`), so its `exp`
 * and `expiresAt` say when it stops being honoured.
 */
export async function signEventsToken(secret: Uint8Array, claims: EventsTokenClaims, keyExpiresAtMs: number | null = null): Promise<{ token: string; expiresAt: string }> {
  const iat = Math.floor(now() / 1000);
  const exp = Math.min(iat + EVENTS_TOKEN_TTL_SECONDS, keyExpiresAtMs === null ? Infinity : Math.floor(keyExpiresAtMs / 1000));
  const token = await new SignJWT({ wid: claims.workspaceId, key: claims.keyId, scope: 'events:read' })
    .setProtectedHeader({ alg: 'HS256', typ: 'JWT' })
    .setIssuer(ISSUER).setAudience(AUDIENCE).setSubject(claims.tenantId).setIssuedAt(iat).setExpirationTime(exp)
    .sign(secret);
  return { token, expiresAt: new Date(exp * 1000).toISOString() };
}

/** The claims of a valid events token and when it expires, or null when it is invalid or expired. */
export async function verifyEventsToken(secret: Uint8Array, token: string): Promise<(EventsTokenClaims & { expiresAt: string }) | null> {
  try {
    // valid for one hour (spec Part 8) whatever a token says of its own expiry: one signed with a leaked
    // secret to last longer is refused, and one issued in the future too
    const { payload } = await jwtVerify(token, secret, {
      issuer: ISSUER, audience: AUDIENCE, algorithms: ['HS256'], currentDate: new Date(now()), maxTokenAge: EVENTS_TOKEN_TTL_SECONDS, requiredClaims: ['iat', 'exp'],
    });
    if (typeof payload.sub !== 'string' || typeof payload.wid !== 'string' || typeof payload.key !== 'string' || payload.scope !== 'events:read' || typeof payload.exp !== 'number') return null;
    if (payload.exp - payload.iat! > EVENTS_TOKEN_TTL_SECONDS || payload.iat! * 1000 > now() + 60_000) return null;
    return { tenantId: payload.sub, workspaceId: payload.wid, keyId: payload.key, expiresAt: new Date(payload.exp * 1000).toISOString() };
  } catch {
    return null;
  }
}
