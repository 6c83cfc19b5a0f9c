/**
 * Slugs of tenant resources addressed by slug in paths (topics; later segments and workflows):
 * spec 2.3 rule 3, 3 to 48 characters of lowercase letters and digits in groups joined by single
 * hyphens. Workspace and tenant slugs follow their own, older rule (docs/architecture.md).
 */
export const SLUG_PATTERN = '^[a-z0-9]+(?:-[a-z0-9]+)*$';
export const SLUG_MIN_LENGTH = 3;
export const SLUG_MAX_LENGTH = 48;

const SLUG = new RegExp(SLUG_PATTERN);

/** True when `value` is a well-formed resource slug (a malformed one in a path is simply not found). */
export function isSlug(value: unknown): value is string {
  return typeof value === 'string' && value.length >= SLUG_MIN_LENGTH && value.length <= SLUG_MAX_LENGTH && SLUG.test(value);
}
