import { createHash, createPrivateKey, createPublicKey, randomBytes } from 'node:crypto';
import type { Redis } from 'ioredis';
import { isoNow } from '../lib/clock.js';
import { codePoints } from '../lib/code-points.js';
import { ApiError, validationError, type ErrorDetail } from '../lib/errors.js';
import { SecretBoxError, type SecretBox } from '../lib/secret-box.js';
import type { Tenant, Workspace, Writer } from './identity.js';
import { auditIntent, settleAudit, writeScope, type AuditDraft, type AuditScope } from './audit-outbox.js';
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

/** What is wrong with the key, team and bundle ids of credentials (the key itself aside), one detail each. */
export function apnsIdProblems(input: Pick<ApnsCredentialsInput, 'keyId' | 'teamId' | 'bundleId'>): ErrorDetail[] {
  const details: ErrorDetail[] = [];
  if (!APPLE_ID.test(input.keyId)) details.push({ param: 'keyId', message: 'must be the 10-character Key ID Apple shows for the key (A-Z, 0-9)' });
  if (!APPLE_ID.test(input.teamId)) details.push({ param: 'teamId', message: 'must be the 10-character Apple Developer Team ID (A-Z, 0-9)' });
  if (input.bundleId.length > BUNDLE_ID_MAX_LENGTH || !BUNDLE_ID.test(input.bundleId)) details.push({ param: 'bundleId', message: 'must be the app\'s bundle id in reverse-DNS form, e.g. com.example.app' });
  return details;
}

/**
 * Validates credentials as `PUT /v1/apps/apns` and `herald apns set` take them; throws 400
 * `validation` naming each bad field. Returns them normalised (the key as PKCS#8 PEM).
 */
export function validateApnsCredentials(input: ApnsCredentialsInput): ApnsCredentialsInput & { keyFingerprint: string } {
  const details = apnsIdProblems(input);
  // characters (code points), as the document's maxLength counts them, not UTF-16 units (probe EO)
  const key = codePoints(input.privateKey) > PRIVATE_KEY_MAX_LENGTH ? { problem: `is longer than ${PRIVATE_KEY_MAX_LENGTH} characters`, canonical: null, fingerprint: null } : checkApnsPrivateKey(input.privateKey);
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
 *
 * What the write replaces (the entry's `previousAttributes`, `created`) and whether it is the same
 * as what is stored are decided in lua/setApnsCredentials, atomically with the write: of concurrent
 * writes, each reports the credentials it replaced itself. Only whether the stored sealed key opens
 * under this process's encryption key is checked before (it takes the key, which Redis never sees);
 * the script compares the sealed key it finds with the one checked.
 */
export async function setApnsCredentials(
  redis: Redis, keys: Keys, box: SecretBox | null, workspace: Workspace, tenant: Tenant, input: ApnsCredentialsInput, by: Writer,
): Promise<{ credentials: ApnsCredentialsView; created: boolean; changed: boolean }> {
  const valid = validateApnsCredentials(input);
  if (!box) throw encryptionKeyMissing();
  const key = keys.apnsCredentials(tenant.id);
  // The same credentials again change nothing (no write, no audit, connections kept), unless they
  // were sealed under another encryption key: storing them again is how an operator re-seals them.
  const sealed = await redis.hget(key, 'privateKey');
  const opened = sealed !== null && opens(box, sealed, tenant.id) ? sealed : '';
  const view: ApnsCredentialsView = { keyId: valid.keyId, teamId: valid.teamId, bundleId: valid.bundleId, keyFingerprint: valid.keyFingerprint, configuredAt: isoNow() };
  const audited: SetInput = { tenantId: tenant.id, view };
  const intent = auditIntent(keys.tenantOutbox(tenant.id), 'apns.set', auditScope(workspace, tenant, by), audited);
  const record = { ...view, privateKey: box.seal(valid.privateKey, sealContext(tenant.id)), version: randomBytes(12).toString('hex') };
  const reply = await callScript<SetReply>(redis, 'setApnsCredentials', [key, intent.key], [intent.token, intent.json, opened, VIEW_FIELDS.length, ...VIEW_FIELDS, ...Object.entries(record).flat()]);
  const before = previousView(reply);
  if (reply[0] !== 1) return { credentials: before!, created: false, changed: false };
  await settleAudit(redis, keys, intent, APNS_AUDITS['apns.set'](audited, reply));
  return { credentials: view, created: before === null, changed: true };
}

/** The credentials lua/setApnsCredentials found (and replaced, unless they were the same), or null when none were stored. */
const previousView = (reply: SetReply): ApnsCredentialsView | null => (reply[1]?.[0] ? deletedView(reply[1] as string[]) : null);

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

type SetInput = { tenantId: string; view: ApnsCredentialsView };
type SetReply = [number, (string | null)[]?];
/** The input of `apns.update`, the MULTI write of earlier versions: its entry decided before the write. */
type UpdateInput = SetInput & { changes: Record<string, unknown>; previousAttributes: Record<string, unknown> };
type DeleteReply = [number, string[]?];

const deletedView = (values: string[]): ApnsCredentialsView => viewOf(Object.fromEntries(VIEW_FIELDS.map((field, i) => [field, values[i]!])));
const target = (tenantId: string) => ({ type: 'apns_credentials', id: tenantId });

/**
 * The audit entries of credential writes (streams/audit-outbox.ts), from their scripts' replies: a
 * write's changes against the credentials it replaced, a deletion's the credentials it removed.
 * `apns.update` settles the intents that versions writing with a MULTI (their entry decided before
 * the write, from an earlier read) may have left in an outbox.
 */
export const APNS_AUDITS = {
  'apns.set': ({ tenantId, view }: SetInput, reply: SetReply): AuditDraft[] => {
    if (reply[0] !== 1) return [];
    // credentials re-sealed within the millisecond they were configured differ in nothing public
    const change = diff(previousView(reply) ?? EMPTY_VIEW, view) ?? { changes: {}, previousAttributes: {} };
    return [{ type: APNS_AUDIT.updated, target: target(tenantId), object: { ...view }, ...change }];
  },
  'apns.update': ({ tenantId, view, changes, previousAttributes }: UpdateInput): AuditDraft[] =>
    [{ type: APNS_AUDIT.updated, target: target(tenantId), object: { ...view }, changes, previousAttributes }],
  'apns.delete': (tenantId: string, reply: DeleteReply): AuditDraft[] =>
    (reply[0] === 1 ? [{ type: APNS_AUDIT.deleted, target: target(tenantId), object: { ...deletedView(reply[1]!) } }] : []),
};
