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

/**
 * The text of at most the first `maxBytes` bytes of the UTF-8 `bytes`, cut back to the last whole
 * character: a cut through a multi-byte character would decode as U+FFFD, a character the sender
 * never sent, and a longer text than `maxBytes` once encoded again. Bytes that are not UTF-8 in the
 * kept part decode as U+FFFD as usual.
 */
export function utf8Prefix(bytes: Uint8Array, maxBytes: number): string {
  let end = Math.min(bytes.length, maxBytes);
  if (end < bytes.length) {
    // step back over the continuation bytes (10xxxxxx) to the lead byte of the character cut through
    let lead = end;
    while (lead > 0 && end - lead < 4 && (bytes[lead]! & 0xc0) === 0x80) lead--;
    if ((bytes[end]! & 0xc0) === 0x80 && (bytes[lead]! & 0xc0) !== 0x80) end = lead;
  }
  return Buffer.from(bytes.buffer, bytes.byteOffset, end).toString('utf8');
}
