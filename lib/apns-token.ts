/**
 * An APNs device token (hex) in the one form Herald keeps: lowercase, without the spaces and angle
 * brackets of `NSData`'s description (`<a1b2c3d4 …>`), which some apps send. APNs reads the hex
 * either way, so `A1B2…` and `a1b2…` are one device. A token that is not hex once those are gone
 * (or would be shorter than 8) is kept as sent.
 */
export function apnsTokenForm(token: string): string {
  const hex = token.replace(/[\s<>]/g, '');
  return hex.length >= 8 && /^[0-9a-fA-F]+$/.test(hex) ? hex.toLowerCase() : token;
}
