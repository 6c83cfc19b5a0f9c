/**
 * The partition of a subscriber: FNV-1a (32 bit) of `tenantId`, a NUL and `externalId`, modulo
 * the deployment's partition count. Every process computes the same answer.
 */
export function partitionOf(tenantId: string, externalId: string, partitions: number): number {
  let hash = 0x811c9dc5;
  const text = `${tenantId}\u0000${externalId}`;
  for (let i = 0; i < text.length; i++) {
    hash ^= text.charCodeAt(i);
    hash = Math.imul(hash, 0x01000193);
  }
  return (hash >>> 0) % partitions;
}
