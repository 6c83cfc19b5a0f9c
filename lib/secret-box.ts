import { createCipheriv, createDecipheriv, randomBytes } from 'node:crypto';

/**
 * Encryption at rest: AES-256-GCM under one 32-byte key (`HERALD_ENCRYPTION_KEY`).
 *
 * A sealed value is `v1:<iv>:<tag>:<ciphertext>`, each part base64 (no padding stripped), with a
 * fresh 12-byte IV per value and a 16-byte tag. The version prefix lets a later format (another
 * cipher, a key id for rotation) live beside this one. An optional `context` string is bound in as
 * additional authenticated data: a value sealed for one record does not open under another's
 * context, so ciphertext copied between records (or tenants) is refused.
 */
export const SECRET_BOX_VERSION = 'v1';
export const ENCRYPTION_KEY_BYTES = 32;
const IV_BYTES = 12;
const TAG_BYTES = 16;
const ALGORITHM = 'aes-256-gcm';

/** A sealed value that cannot be opened: wrong key, wrong context, altered or malformed. */
export class SecretBoxError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'SecretBoxError';
  }
}

export type SecretBox = {
  /** Encrypts `plaintext` (UTF-8); `context` must be given again to open it. */
  seal(plaintext: string, context?: string): string;
  /** Decrypts a value made by `seal`; throws `SecretBoxError` when it cannot. */
  open(sealed: string, context?: string): string;
};

const HEX_KEY = /^[0-9a-fA-F]{64}$/;
const BASE64_KEY = /^[A-Za-z0-9+/_-]{43}=?$/;

/**
 * The 32 key bytes written as 64 hex characters or as base64 / base64url (43 characters, with or
 * without the one `=`); null for anything else. The caller words the error.
 */
export function parseEncryptionKey(raw: string): Buffer | null {
  const text = raw.trim();
  if (HEX_KEY.test(text)) return Buffer.from(text, 'hex');
  if (BASE64_KEY.test(text)) {
    const bytes = Buffer.from(text.replace(/-/g, '+').replace(/_/g, '/'), 'base64');
    return bytes.length === ENCRYPTION_KEY_BYTES ? bytes : null;
  }
  return null;
}

/** A box sealing and opening values under `key` (exactly 32 bytes). */
export function createSecretBox(key: Buffer): SecretBox {
  if (key.length !== ENCRYPTION_KEY_BYTES) throw new RangeError(`the encryption key must be ${ENCRYPTION_KEY_BYTES} bytes, got ${key.length}`);
  const secret = Buffer.from(key); // a copy: the caller's buffer may be reused
  return {
    seal(plaintext, context) {
      const iv = randomBytes(IV_BYTES);
      const cipher = createCipheriv(ALGORITHM, secret, iv, { authTagLength: TAG_BYTES });
      if (context !== undefined) cipher.setAAD(Buffer.from(context, 'utf8'));
      const data = Buffer.concat([cipher.update(plaintext, 'utf8'), cipher.final()]);
      return [SECRET_BOX_VERSION, iv.toString('base64'), cipher.getAuthTag().toString('base64'), data.toString('base64')].join(':');
    },
    open(sealed, context) {
      const parts = sealed.split(':');
      if (parts[0] !== SECRET_BOX_VERSION) throw new SecretBoxError(`unknown sealed-value format "${String(parts[0]).slice(0, 8)}" (expected ${SECRET_BOX_VERSION})`);
      if (parts.length !== 4) throw new SecretBoxError('malformed sealed value');
      const [iv, tag, data] = parts.slice(1).map((p) => Buffer.from(p, 'base64'));
      if (iv!.length !== IV_BYTES || tag!.length !== TAG_BYTES) throw new SecretBoxError('malformed sealed value');
      try {
        const decipher = createDecipheriv(ALGORITHM, secret, iv!, { authTagLength: TAG_BYTES });
        if (context !== undefined) decipher.setAAD(Buffer.from(context, 'utf8'));
        decipher.setAuthTag(tag!);
        return Buffer.concat([decipher.update(data!), decipher.final()]).toString('utf8');
      } catch {
        throw new SecretBoxError('the sealed value does not open with this key (another key, another record, or altered)');
      }
    },
  };
}
