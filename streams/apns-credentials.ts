import { createHash, createPrivateKey, createPublicKey, randomBytes } from 'node:crypto';
import type { Redis } from 'ioredis';
import { isoNow } from '../lib/clock.js';
import { ApiError, validationError, type ErrorDetail } from '../lib/errors.js';
import { SecretBoxError, type SecretBox } from '../lib/secret-box.js';
import type { Tenant, Workspace, Writer } from './identity.js';
import { auditIntent, recordIntent, settleAudit, writeScope, type AuditDraft, type AuditScope } from './audit-outbox.js';
import type { Keys } from './keys.js';
import { diff } from './ledger.js';
import { callScript } from './lua-scripts.js';

/**
 * A tenant's APNs app credentials for token-based provider authentication: the .p8 signing key,
 * its Key ID, the Team ID and the app's bundle id (the `apns-topic`). One set per tenant, kept in
 * the hash `{t:<tenantId>}:apns`; the private key is sealed with lib/secret-box (bound to the
 * tenant, so a sealed key copied to another tenant does not open) and never leaves through the
 * API, the CLI or the audit log. `version` is a random token replaced on every write: the push
 * sender compares it to rebuild its APNs connection when the credentials change.
 */
export type ApnsCredentialsInput = { keyId: string; teamId: string; bundleId: string; privateKey: string };

/** The decrypted credentials, for the push sender only. */
export type ApnsCredentials = ApnsCredentialsInput & { version: string; configuredAt: string };

/** What callers may see: no private key, only the SHA-256 fingerprint of its public half. */
export type ApnsCredentialsView = { keyId: string; teamId: string; bundleId: string; keyFingerprint: string; configuredAt: string };

/** Audit event names (public: the payload is the view above, without any key material). */
export const APNS_AUDIT = { updated: 'apns.updated', deleted: 'apns.deleted' } as const;

export const APPLE_ID = /^[A-Z0-9]{10}$/;
export const BUNDLE_ID = /^[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+$/;
export const BUNDLE_ID_MAX_LENGTH = 155;
export const PRIVATE_KEY_MAX_LENGTH = 8192;

const sealContext = (tenantId: string) => `herald:apns:${tenantId}:privateKey`;

/** Why `pem` is not an Apple .p8 key (PKCS#8, EC P-256, unencrypted), or null when it is; `canonical` is its PKCS#8 PEM. */
export function checkApnsPrivateKey(pem: string): { problem: string; canonical: null; fingerprint: null } | { problem: null; canonical: string; fingerprint: string } {
  let key;
  try {
    key = createPrivateKey({ key: pem, format: 'pem' });
  } catch (err) {
    const encrypted = /ENCRYPTED/.test(pem) || /passphrase/i.test((err as Error).message);
    return { problem: encrypted ? 'is an encrypted key; give the unencrypted .p8 file Apple provides' : 'is not a PEM private key (give the whole .p8 file, BEGIN and END lines included)', canonical: null, fingerprint: null };
  }
  if (key.asymmetricKeyType !== 'ec' || key.asymmetricKeyDetails?.namedCurve !== 'prime256v1') {
    return { problem: `must be an EC P-256 key (an Apple .p8 key), got ${key.asymmetricKeyType === 'ec' ? `curve ${key.asymmetricKeyDetails?.namedCurve}` : key.asymmetricKeyType}`, canonical: null, fingerprint: null };
  }
  const canonical = key.export({ type: 'pkcs8', format: 'pem' }).toString();
  const spki = createPublicKey(key).export({ type: 'spki', format: 'der' });
  return { problem: null, canonical, fingerprint: 'sha256:' + createHash('sha256').update(spki).digest('hex') };
}

/**
 * Validates credentials as `PUT /v1/apps/apns` and `herald apns set` take them; throws 400
 * `validation` naming each bad field. Returns them normalised (the key as PKCS#8 PEM).
 */
export function validateApnsCredentials(input: ApnsCredentialsInput): ApnsCredentialsInput & { keyFingerprint: string } {
  const details: ErrorDetail[] = [];
  if (!APPLE_ID.test(input.keyId)) details.push({ param: 'keyId', message: 'must be the 10-character Key ID Apple shows for the key (A-Z, 0-9)' });
  if (!APPLE_ID.test(input.teamId)) details.push({ param: 'teamId', message: 'must be the 10-character Apple Developer Team ID (A-Z, 0-9)' });
  if (input.bundleId.length > BUNDLE_ID_MAX_LENGTH || !BUNDLE_ID.test(input.bundleId)) details.push({ param: 'bundleId', message: 'must be the app\'s bundle id in reverse-DNS form, e.g. com.example.app' });
  const key = input.privateKey.length > PRIVATE_KEY_MAX_LENGTH ? { problem: `is longer than ${PRIVATE_KEY_MAX_LENGTH} characters`, canonical: null, fingerprint: null } : checkApnsPrivateKey(input.privateKey);
  if (key.problem !== null) details.push({ param: 'privateKey', message: key.problem });
  if (details.length || key.problem !== null) throw validationError(details);
  return { keyId: input.keyId, teamId: input.teamId, bundleId: input.bundleId, privateKey: key.canonical, keyFingerprint: key.fingerprint };
}

/** The public fields of stored credentials, in the order lua/deleteApnsCredentials answers them. */
const VIEW_FIELDS = ['keyId', 'teamId', 'bundleId', 'keyFingerprint', 'configuredAt'] as const;

function viewOf(h: Record<string, string>): ApnsCredentialsView {
  return { keyId: h.keyId!, teamId: h.teamId!, bundleId: h.bundleId!, keyFingerprint: h.keyFingerprint!, configuredAt: h.configuredAt! };
}

const EMPTY_VIEW = { keyId: null, teamId: null, bundleId: null, keyFingerprint: null, configuredAt: null };
const ref = (r: { id: string; slug: string }) => ({ id: r.id, slug: r.slug });
const auditScope = (workspace: Workspace, tenant: Tenant, by: Writer): AuditScope => writeScope({ workspace: ref(workspace), tenant: ref(tenant) }, by);

/** The 503 answered when no encryption key is configured, so secrets cannot be stored. */
export function encryptionKeyMissing(): ApiError {
  return new ApiError(503, 'unavailable', 'Storing APNs credentials needs an encryption key: the operator must set HERALD_ENCRYPTION_KEY (32 bytes, e.g. `openssl rand -hex 32`)');
}

/**
 * Stores (or replaces) the tenant's APNs credentials after validating them, and audits
 * `apns.updated` with the changed public fields (from nulls on the first write). Sending the
 * stored credentials again is a no-op. Throws 503 `unavailable` when `box` is null
 * (no `HERALD_ENCRYPTION_KEY`), 400 `validation` for bad credentials.
 */
export async function setApnsCredentials(
  redis: Redis, keys: Keys, box: SecretBox | null, workspace: Workspace, tenant: Tenant, input: ApnsCredentialsInput, by: Writer,
): Promise<{ credentials: ApnsCredentialsView; created: boolean }> {
  const valid = validateApnsCredentials(input);
  if (!box) throw encryptionKeyMissing();
  const key = keys.apnsCredentials(tenant.id);
  const stored = await redis.hgetall(key);
  const before = stored.keyId ? viewOf(stored) : null;
  const view: ApnsCredentialsView = { keyId: valid.keyId, teamId: valid.teamId, bundleId: valid.bundleId, keyFingerprint: valid.keyFingerprint, configuredAt: isoNow() };
  const change = diff(before ?? EMPTY_VIEW, view)!;
  // The same credentials again change nothing (no write, no audit, connections kept), unless they
  // were sealed under another encryption key: storing them again is how an operator re-seals them.
  const same = before !== null && Object.keys(change.changes).every((field) => field === 'configuredAt');
  if (same && opens(box, stored.privateKey ?? '', tenant.id)) return { credentials: before, created: false };
  // the entry is decided now (a MULTI has no reply to decide it from) and recorded with the write
  const audited: UpdateInput = { tenantId: tenant.id, view, ...change };
  const intent = auditIntent(keys.tenantOutbox(tenant.id), 'apns.update', auditScope(workspace, tenant, by), audited);
  const multi = redis.multi()
    .del(key)
    .hset(key, { ...view, privateKey: box.seal(valid.privateKey, sealContext(tenant.id)), version: randomBytes(12).toString('hex') });
  const replies = (await recordIntent(multi, intent).exec()) ?? [];
  for (const [err] of replies) if (err) throw err;
  await settleAudit(redis, keys, intent, APNS_AUDITS['apns.update'](audited));
  return { credentials: view, created: before === null };
}

function opens(box: SecretBox, sealed: string, tenantId: string): boolean {
  try {
    box.open(sealed, sealContext(tenantId));
    return true;
  } catch {
    return false;
  }
}

/** The public view of the tenant's credentials, or null when none are configured. */
export async function describeApnsCredentials(redis: Redis, keys: Keys, tenantId: string): Promise<ApnsCredentialsView | null> {
  const h = await redis.hgetall(keys.apnsCredentials(tenantId));
  return h.keyId ? viewOf(h) : null;
}

/** The current credentials version (changes on every write), or null when none are configured. */
export async function apnsCredentialsVersion(redis: Redis, keys: Keys, tenantId: string): Promise<string | null> {
  return redis.hget(keys.apnsCredentials(tenantId), 'version');
}

/** Why stored credentials cannot be used (no key configured, or another key sealed them). */
export class ApnsCredentialsUnreadable extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'ApnsCredentialsUnreadable';
  }
}

/**
 * The tenant's credentials with the private key decrypted, for the push sender; null when none
 * are configured. Throws `ApnsCredentialsUnreadable` when they exist but cannot be decrypted.
 */
export async function getApnsCredentials(redis: Redis, keys: Keys, box: SecretBox | null, tenantId: string): Promise<ApnsCredentials | null> {
  const h = await redis.hgetall(keys.apnsCredentials(tenantId));
  if (!h.keyId) return null;
  if (!box) throw new ApnsCredentialsUnreadable('APNs credentials are stored but HERALD_ENCRYPTION_KEY is not set in this process');
  let privateKey: string;
  try {
    privateKey = box.open(h.privateKey ?? '', sealContext(tenantId));
  } catch (err) {
    if (err instanceof SecretBoxError) throw new ApnsCredentialsUnreadable(`APNs credentials of tenant ${tenantId} do not decrypt with HERALD_ENCRYPTION_KEY: ${err.message}`);
    throw err;
  }
  return { keyId: h.keyId, teamId: h.teamId!, bundleId: h.bundleId!, privateKey, version: h.version!, configuredAt: h.configuredAt! };
}

/** Removes the tenant's credentials and audits `apns.deleted`; null when none were configured. */
export async function deleteApnsCredentials(redis: Redis, keys: Keys, workspace: Workspace, tenant: Tenant, by: Writer): Promise<ApnsCredentialsView | null> {
  const intent = auditIntent(keys.tenantOutbox(tenant.id), 'apns.delete', auditScope(workspace, tenant, by), tenant.id);
  // only the caller that actually removed the credentials gets them back, and audits it
  const reply = await callScript<DeleteReply>(redis, 'deleteApnsCredentials', [keys.apnsCredentials(tenant.id), intent.key], [intent.token, intent.json, ...VIEW_FIELDS]);
  if (reply[0] !== 1) return null;
  await settleAudit(redis, keys, intent, APNS_AUDITS['apns.delete'](tenant.id, reply));
  return deletedView(reply[1]!);
}

type UpdateInput = { tenantId: string; view: ApnsCredentialsView; changes: Record<string, unknown>; previousAttributes: Record<string, unknown> };
type DeleteReply = [number, string[]?];

const deletedView = (values: string[]): ApnsCredentialsView => viewOf(Object.fromEntries(VIEW_FIELDS.map((field, i) => [field, values[i]!])));
const target = (tenantId: string) => ({ type: 'apns_credentials', id: tenantId });

/**
 * The audit entries of credential writes (streams/audit-outbox.ts): an update's from what the writer
 * decided (its MULTI has no reply), a deletion's from its script's reply.
 */
export const APNS_AUDITS = {
  'apns.update': ({ tenantId, view, changes, previousAttributes }: UpdateInput): AuditDraft[] =>
    [{ type: APNS_AUDIT.updated, target: target(tenantId), object: { ...view }, changes, previousAttributes }],
  'apns.delete': (tenantId: string, reply: DeleteReply): AuditDraft[] =>
    (reply[0] === 1 ? [{ type: APNS_AUDIT.deleted, target: target(tenantId), object: { ...deletedView(reply[1]!) } }] : []),
};
