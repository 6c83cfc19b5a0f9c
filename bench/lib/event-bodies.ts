/**
 * Pre-generated request bodies for `POST /v1/events`, so the load generator only copies buffers.
 * Subscribers are `sub-<n>` for n below `subscribers`, visited in a seeded random order: the first
 * ceil(subscribers / batch) batch bodies name every subscriber once, the next ones again in the
 * same order, so a batch spans about as many partitions as a batch of real traffic would.
 */

/** A small deterministic PRNG (mulberry32), so two runs send the same bodies. */
export function prng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** 0…n-1 shuffled (Fisher–Yates with `random`). */
export function permutation(n: number, random: () => number): Uint32Array {
  const out = new Uint32Array(n);
  for (let i = 0; i < n; i++) out[i] = i;
  for (let i = n - 1; i > 0; i--) {
    const j = Math.floor(random() * (i + 1));
    const t = out[i]!;
    out[i] = out[j]!;
    out[j] = t;
  }
  return out;
}

export const externalIdOf = (n: number) => `sub-${n}`;

const NAMES = ['page.viewed', 'item.added', 'checkout.started', 'order.completed', 'app.opened', 'search.performed'];

export type EventShape = {
  /** distinct externalIds */
  subscribers: number;
  /** events per body; 0 means a bare event (the single-event body) */
  batch: number;
  /** how many bodies */
  bodies: number;
  /** bytes of filler in `data` (0: a small object of a few fields) */
  dataBytes?: number;
  /** a caller `id` on every event (unique per event in this set, prefixed with `idPrefix`) */
  callerIds?: boolean;
  idPrefix?: string;
  /** only the first `pool` subscribers of the order are named (default: all) */
  pool?: number;
  /** where in the subscriber order to start (to continue where another set stopped) */
  offset?: number;
  seed?: number;
};

export type EventBodies = {
  bodies: Buffer[];
  /** events in all the bodies */
  events: number;
  /** bytes of the largest body */
  maxBytes: number;
  /** the externalId of every event, in order */
  externalIds: string[];
};

/** The `data` of one event: a small object, or one with a filler string making its JSON `dataBytes` long. */
export function eventData(i: number, dataBytes = 0): Record<string, unknown> {
  const small = { plan: i % 3 === 0 ? 'pro' : 'free', n: i, ok: i % 2 === 0 };
  if (dataBytes <= 0) return small;
  const base = JSON.stringify({ ...small, pad: '' }).length;
  return { ...small, pad: 'x'.repeat(Math.max(0, dataBytes - base)) };
}

export function eventBodies(shape: EventShape): EventBodies {
  const order = permutation(shape.subscribers, prng(shape.seed ?? 42));
  const perBody = Math.max(1, shape.batch);
  const pool = Math.min(shape.pool ?? shape.subscribers, shape.subscribers);
  const bodies: Buffer[] = [];
  let k = shape.offset ?? 0;
  let events = 0;
  let maxBytes = 0;
  const externalIds: string[] = [];
  for (let b = 0; b < shape.bodies; b++) {
    const batch: Record<string, unknown>[] = [];
    for (let j = 0; j < perBody; j++, k++) {
      const externalId = externalIdOf(order[k % pool]!);
      externalIds.push(externalId);
      const event: Record<string, unknown> = {
        externalId,
        name: NAMES[k % NAMES.length],
        data: eventData(k, shape.dataBytes),
      };
      if (shape.callerIds) event.id = `${shape.idPrefix ?? 'c'}-${k}`;
      batch.push(event);
    }
    const body = Buffer.from(JSON.stringify(shape.batch === 0 ? batch[0] : { events: batch }));
    maxBytes = Math.max(maxBytes, body.length);
    bodies.push(body);
    events += batch.length;
  }
  return { bodies, events, maxBytes, externalIds };
}

/** Occurrences of `needle` in `text` (the answers' `"status":"accepted"` items). */
export function countOccurrences(text: string, needle: string): number {
  let n = 0;
  for (let at = text.indexOf(needle); at !== -1; at = text.indexOf(needle, at + needle.length)) n++;
  return n;
}
