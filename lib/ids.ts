import { createHash, randomBytes } from 'node:crypto';
import { now } from './clock.js';

/** Every id prefix of spec 2.3 plus the internal ones. */
export const ID_PREFIX = {
  workspace: 'ws_',
  tenant: 'tnt_',
  key: 'key_',
  subscriber: 'sub_',
  subscription: 'scr_',
  topic: 'tpc_',
  message: 'msg_',
  delivery: 'dlv_',
  event: 'evt_',
  webhookEvent: 'whe_',
  webhookEndpoint: 'whk_',
  webhookDelivery: 'whd_',
  widget: 'wdg_',
  segment: 'seg_',
  workflow: 'wfl_',
  workflowVersion: 'wfv_',
  run: 'run_',
  source: 'src_',
  request: 'req_',
} as const;
export type IdKind = keyof typeof ID_PREFIX;

const ALPHABET = '0123456789abcdefghjkmnpqrstvwxyz'; // Crockford base32, sorts like the numbers it encodes
const TIME_CHARS = 10;
const RANDOM_CHARS = 16;
const BODY = new RegExp(`^[${ALPHABET}]{${TIME_CHARS + RANDOM_CHARS}}$`);

function encodeTime(ms: number): string {
  let out = '';
  let rest = ms;
  for (let i = 0; i < TIME_CHARS; i++) {
    out = ALPHABET[rest % 32] + out;
    rest = Math.floor(rest / 32);
  }
  return out;
}

// Random bytes come from a pool refilled 4 KB at a time: ids are made on every request and event.
const POOL_SIZE = 4096;
let pool = randomBytes(POOL_SIZE);
let poolAt = 0;

function randomPart(): string {
  if (poolAt + RANDOM_CHARS > POOL_SIZE) {
    pool = randomBytes(POOL_SIZE);
    poolAt = 0;
  }
  let out = '';
  for (let i = 0; i < RANDOM_CHARS; i++) out += ALPHABET[pool[poolAt++]! & 31];
  return out;
}

/** `part` plus one in base 32 (the random part overflowing is astronomically unlikely: it wraps). */
function increment(part: string): string {
  const chars = part.split('');
  for (let i = chars.length - 1; i >= 0; i--) {
    const v = ALPHABET.indexOf(chars[i]!);
    if (v < 31) {
      chars[i] = ALPHABET[v + 1]!;
      return chars.join('');
    }
    chars[i] = ALPHABET[0]!;
  }
  return chars.join('');
}

// The random part is a head of 10 characters and a tail of 6 kept as a number, so the ids of one
// millisecond increase by adding one to the tail (6 characters to encode, instead of a string
// increment of 16 and the time again): ingest makes three ids per event. A new millisecond draws a
// new head and a tail below 2^29, which leaves 2^29 increments before the tail carries into the head.
const TAIL_CHARS = 6;
const TAIL_LIMIT = 32 ** TAIL_CHARS;
let lastMs = -1;
let lastTime = '';
let head = '';
let tail = 0;

function encodeTail(n: number): string {
  let out = '';
  for (let i = 0; i < TAIL_CHARS; i++) {
    out = ALPHABET[n % 32] + out;
    n = Math.floor(n / 32);
  }
  return out;
}

/**
 * A new id of `kind`: prefix, then the creation time and 80 bits in base32 (random when the
 * millisecond starts, then counting up), so ids of one kind sort by creation time. Callers must
 * treat ids as opaque.
 */
export function newId(kind: IdKind, atMs: number = now()): string {
  // Monotonic within one millisecond; any other time (later, or earlier because the clock moved
  // back, as tests do with setClockOffset) starts that millisecond afresh.
  if (atMs === lastMs) {
    tail += 1;
    if (tail === TAIL_LIMIT) {
      head = increment(head);
      tail = 0;
    }
  } else {
    lastMs = atMs;
    lastTime = encodeTime(atMs);
    const random = randomPart();
    head = random.slice(0, RANDOM_CHARS - TAIL_CHARS);
    tail = 0;
    for (let i = RANDOM_CHARS - TAIL_CHARS; i < RANDOM_CHARS; i++) tail = tail * 32 + ALPHABET.indexOf(random[i]!);
    tail %= TAIL_LIMIT / 2;
  }
  return ID_PREFIX[kind] + lastTime + head + encodeTail(tail);
}

/** A request id (`req_`): an id like any other, made the same cheap way. */
export function newRequestId(): string {
  return newId('request');
}

/** True when `value` has the shape of an id of `kind` (it may still not exist). */
export function isId(kind: IdKind, value: unknown): value is string {
  if (typeof value !== 'string') return false;
  const prefix = ID_PREFIX[kind];
  return value.startsWith(prefix) && BODY.test(value.slice(prefix.length));
}

/** The time (ms) an id of `kind` carries (its creation, or a derived id's `atMs`); null when `value` is not one. */
export function idTimeMs(kind: IdKind, value: unknown): number | null {
  if (!isId(kind, value)) return null;
  let ms = 0;
  for (const c of value.slice(ID_PREFIX[kind].length, ID_PREFIX[kind].length + TIME_CHARS)) ms = ms * 32 + ALPHABET.indexOf(c);
  return ms;
}

/**
 * An id of `kind` derived from `seed` (same seed, same id): for records a retried step must find
 * again instead of creating twice (deliveries of a message). Sorts by `atMs` like other ids.
 */
export function derivedId(kind: IdKind, atMs: number, seed: string): string {
  return ID_PREFIX[kind] + encodeTime(atMs) + digestChars(seed, RANDOM_CHARS);
}

/**
 * An id of `kind` derived from `seed` and the id `along` of another kind (same inputs, same id),
 * at `atMs`, whose ids of one seed sort as their `along`s do within a millisecond: the random head
 * is derived from the seed and `along`'s head, and `along`'s tail (which counts up within a
 * millisecond of one process) is kept. For records made one per (seed, along) that lists show
 * newest first by id, such as a workflow's runs, one per trigger event: the runs of one batch of
 * events list in the events' order. `along` not an id of `alongKind`: as `derivedId`.
 */
export function derivedIdAlong(kind: IdKind, atMs: number, alongKind: IdKind, along: string, seed: string): string {
  if (!isId(alongKind, along)) return derivedId(kind, atMs, `${seed}|${along}`);
  const cut = along.length - TAIL_CHARS;
  return ID_PREFIX[kind] + encodeTime(atMs) + digestChars(`${seed}|${along.slice(0, cut)}`, RANDOM_CHARS - TAIL_CHARS) + along.slice(cut);
}

function digestChars(seed: string, count: number): string {
  const digest = createHash('sha256').update(seed).digest();
  let out = '';
  for (let i = 0; i < count; i++) out += ALPHABET[digest[i]! & 31];
  return out;
}
