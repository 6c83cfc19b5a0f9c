/** The three API key kinds of spec 5.3 and the prefix each is presented under. */
export const KEY_KINDS = ['workspace', 'tenant', 'client'] as const;
export type KeyKind = (typeof KEY_KINDS)[number];

export const KEY_PREFIX: Record<KeyKind, string> = { workspace: 'svc_ws_', tenant: 'svc_tn_', client: 'svc_pk_' };

/** The kind a presented key claims through its prefix, or null for an unknown prefix. */
export function kindOfPresentedKey(key: string): KeyKind | null {
  for (const kind of KEY_KINDS) if (key.startsWith(KEY_PREFIX[kind])) return kind;
  return null;
}

/** Slugs of workspaces and tenants: lowercase letters, digits, `-` and `_`, starting with a letter or digit, 1 to 64 characters. */
const SLUG = /^[a-z0-9][a-z0-9_-]{0,63}$/;
export function isSlug(value: string): boolean {
  return SLUG.test(value);
}
