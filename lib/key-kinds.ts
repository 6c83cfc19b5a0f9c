/** The three API key kinds of spec 5.3 and the prefix each is presented under. */
export const KEY_KINDS = ['workspace', 'tenant', 'client'] as const;
export type KeyKind = (typeof KEY_KINDS)[number];

export const KEY_PREFIX: Record<KeyKind, string> = { workspace: 'svc_ws_', tenant: 'svc_tn_', client: 'svc_pk_' };

/** Hex characters after the prefix of every key (24 random bytes, streams/identity.ts `createApiKey`). */
export const KEY_SECRET_HEX = 48;
const KEY_SHAPE = new RegExp(`^svc_(?:ws|tn|pk)_[0-9a-f]{${KEY_SECRET_HEX}}$`);

/**
 * The kind a presented key claims through its prefix, or null for what is no key: an unknown
 * prefix, or anything but the 48 lowercase hex characters of a key after it. Nothing else is
 * hashed or remembered (probe BZ: 15 KB strings under a right prefix, each kept in the hash cache
 * of http/middleware/auth.ts, grew a web process by ~150 MB without any credential).
 */
export function kindOfPresentedKey(key: string): KeyKind | null {
  if (!KEY_SHAPE.test(key)) return null;
  for (const kind of KEY_KINDS) if (key.startsWith(KEY_PREFIX[kind])) return kind;
  return null;
}

/** Slugs of workspaces and tenants: lowercase letters, digits, `-` and `_`, starting with a letter or digit, 1 to 64 characters. */
const SLUG = /^[a-z0-9][a-z0-9_-]{0,63}$/;
export function isSlug(value: string): boolean {
  return SLUG.test(value);
}
