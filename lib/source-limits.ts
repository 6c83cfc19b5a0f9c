/**
 * The shapes and bounds of sources (docs/sources.md), in a module of their own with no imports:
 * the request schemas (lib/schemas/sources.ts) and the delivery reader (lib/source-formats.ts)
 * both use them, and the reader's imports lead back to the schemas.
 */

export const SOURCE_FORMATS = ['standard-webhooks', 'stripe', 'github'] as const;
export type SourceFormat = (typeof SOURCE_FORMATS)[number];

/**
 * A dot path into the payload: 1 to 10 keys of `[A-Za-z0-9_$-]`, at most 64 characters each, none
 * `__proto__` (no delivery may hold that key: one that does is refused whole, so such a path could
 * never match).
 */
export const MAPPING_PATH_PATTERN = '^(?!(?:[^.]*\\.)*__proto__(?:\\.|$))[A-Za-z0-9_$-]{1,64}(?:\\.[A-Za-z0-9_$-]{1,64}){0,9}$';
export const PROVIDER_PATTERN = '^[a-z0-9][a-z0-9_-]{0,39}$';
/** Largest inbound body read (the 8 KB `data` limit applies to the part the mapping keeps). */
export const MAX_INBOUND_BYTES = 256 * 1024;
/** Most sources one tenant may have. */
export const MAX_SOURCES_PER_TENANT = 100;

/** Why a verified inbound delivery is answered 200 `ignored` and nothing stored (docs/sources.md, Inbound). */
export const IGNORED_REASONS = ['disabled', 'no_external_id', 'no_name', 'loop'] as const;
