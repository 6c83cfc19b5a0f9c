/**
 * Characters of `value` counted as Unicode code points, the way ajv counts a body string's
 * `maxLength` (an emoji is one; a lone surrogate is one too). Every length rule of the API that a
 * schema does not check counts with this, so a value a body accepts is accepted everywhere.
 */
export function codePoints(value: string): number {
  let count = value.length;
  for (let i = 0; i < value.length; i++) {
    const unit = value.charCodeAt(i);
    if (unit >= 0xd800 && unit <= 0xdbff && i + 1 < value.length) {
      const next = value.charCodeAt(i + 1);
      if (next >= 0xdc00 && next <= 0xdfff) { count--; i++; }
    }
  }
  return count;
}
