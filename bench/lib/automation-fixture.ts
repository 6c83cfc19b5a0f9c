import type { Redis } from 'ioredis';
import type { Expression } from '../../lib/expressions.js';
import type { Keys } from '../../streams/keys.js';
import type { TenantScope } from '../../streams/subscriber-writes.js';
import { upsertSubscriber, type Attributes } from '../../streams/subscribers.js';
import { registerSubscription, type RegisterInput } from '../../streams/subscriptions.js';
import { addTopicMembers, type TopicRef } from '../../streams/topic-members.js';
import { deviceToken } from './apns-h2-client.js';
import { externalIdOf, permutation, prng } from './event-bodies.js';
import { pool } from './push-fixture.js';

/**
 * The audience and event load of the automation benches (`segments`, `workflows`): subscribers
 * `sub-<n>` with attributes, devices and topic memberships written straight through the product's
 * library functions (`upsertSubscriber`, `registerSubscription`, `addTopicMembers`: the same
 * records, inbox events and indexes as `POST /v1/subscribers`, `POST …/subscriptions` and
 * `POST /v1/topics/{slug}/members`, without HTTP), and event bodies whose names and `data` the
 * segments of `SEGMENTS` test. Everything is a deterministic function of n, so two tenants given
 * the same range get exactly the same data.
 */

/** A well-mixed 32-bit hash of n (one mulberry32 step), for attributes that do not follow n's residues. */
export function hashOf(n: number, salt = 0): number {
  return Math.floor(prng((Math.imul(n, 0x9e3779b1) ^ Math.imul(salt + 1, 0x85ebca6b)) >>> 0)() * 4294967296);
}

const PLANS = ['free', 'free', 'pro', 'team'] as const;
const COUNTRIES = ['FR', 'DE', 'US', 'ES', 'IT', 'GB', 'US', 'BR'] as const;
const LOCALES = ['fr-FR', 'en-US', 'de-DE', 'en-GB', 'es-ES'] as const;

/** The attributes of subscriber n: built-ins (email for half, locale) and `properties` plan, score, country, age. */
export function attributesOf(n: number): Attributes {
  const h = hashOf(n);
  return {
    email: h % 2 === 0 ? `sub-${n}@example.com` : null,
    locale: LOCALES[(h >>> 3) % LOCALES.length]!,
    properties: {
      plan: PLANS[(h >>> 6) % PLANS.length]!,
      score: (h >>> 9) % 100,
      country: COUNTRIES[(h >>> 16) % COUNTRIES.length]!,
      age: 18 + ((h >>> 19) % 60),
    },
  };
}

/** The subscriptions of subscriber n: 30 % one push device (2/3 iOS, 1/3 Android), 10 % an email address, the rest none. */
export function subscriptionsOf(n: number): RegisterInput[] {
  const h = hashOf(n, 1) % 10;
  if (h < 3) return [h < 2 ? { channel: 'push', token: deviceToken(n), platform: 'ios', environment: 'production' } : { channel: 'push', token: `fcm-bench-${n}`, platform: 'android' }];
  if (h === 3) return [{ channel: 'email', address: `sub-${n}@example.com` }];
  return [];
}

/** Topic slugs of the fixture and who joins them: `news` 40 %, `vip` 10 %. */
export const TOPICS = { news: (n: number) => hashOf(n, 2) % 5 < 2, vip: (n: number) => hashOf(n, 3) % 10 === 0 } as const;

/**
 * The 20 segments of the `segments` bench: attribute eq/in/gt/startsWith/exists, event counts with
 * and without windows and property filters, topic membership, subscription conditions, and
 * all/any/not combinations. Nine distinct kept event conditions in all.
 */
export const SEGMENTS: { slug: string; where: Expression }[] = [
  { slug: 'plan-pro', where: { attribute: 'plan', eq: 'pro' } },
  { slug: 'paid-plans', where: { attribute: 'plan', in: ['pro', 'team'] } },
  { slug: 'high-score', where: { attribute: 'score', gt: 70 } },
  { slug: 'french', where: { attribute: 'locale', startsWith: 'fr' } },
  { slug: 'has-email', where: { attribute: 'email', exists: true } },
  { slug: 'eu-over-30', where: { all: [{ attribute: 'country', in: ['FR', 'DE', 'ES', 'IT'] }, { attribute: 'age', gte: 30 }] } },
  { slug: 'active-week', where: { event: 'app.opened', count: { gte: 2 }, within: '7d' } },
  { slug: 'buyers', where: { event: 'order.completed' } },
  { slug: 'big-spenders', where: { all: [{ attribute: 'plan', in: ['pro', 'team'] }, { event: 'order.completed', count: { gte: 1 }, within: '30d', where: [{ property: 'total', gt: 100 }] }] } },
  { slug: 'never-bought', where: { event: 'order.completed', count: { eq: 0 } } },
  { slug: 'searched-today', where: { event: 'search.performed', within: '24h' } },
  { slug: 'cart-abandoners', where: { all: [{ event: 'checkout.started', within: '1d' }, { not: { event: 'order.completed', within: '1d' } }] } },
  { slug: 'news-readers', where: { topic: 'news' } },
  { slug: 'vip-or-pro', where: { any: [{ topic: 'vip' }, { attribute: 'plan', eq: 'pro' }] } },
  { slug: 'push-enabled', where: { subscription: { channel: 'push', enabled: true } } },
  { slug: 'ios-users', where: { subscription: { platform: 'ios' } } },
  { slug: 'unreachable', where: { not: { subscription: {} } } },
  { slug: 'engaged-pros', where: { all: [{ attribute: 'plan', eq: 'pro' }, { event: 'app.opened', count: { gte: 3 }, within: '30d' }, { subscription: { channel: 'push', enabled: true } }] } },
  { slug: 'book-lovers', where: { event: 'item.added', count: { gte: 2 }, where: [{ property: 'category', eq: 'books' }] } },
  { slug: 'mixed', where: { any: [{ all: [{ attribute: 'score', gte: 50 }, { topic: 'news' }] }, { not: { any: [{ attribute: 'country', eq: 'US' }, { attribute: 'age', lt: 25 }] } }] } },
];

const CATEGORIES = ['books', 'games', 'music', 'food'] as const;

/** Event k of a load: a name the segments count (or not: page.viewed) and the `data` their filters read. */
export function automationEvent(k: number): { name: string; data: Record<string, unknown> } {
  const h = hashOf(k, 7);
  switch (hashOf(k, 8) % 8) {
    case 0: case 1: return { name: 'app.opened', data: { screen: 'home' } };
    case 2: return { name: 'order.completed', data: { total: 5 + (h % 200), currency: 'EUR' } };
    case 3: case 4: return { name: 'item.added', data: { category: CATEGORIES[h % CATEGORIES.length]!, price: 1 + (h % 50) } };
    case 5: return { name: 'checkout.started', data: { items: 1 + (h % 5) } };
    case 6: return { name: 'search.performed', data: { query: `q${h % 50}` } };
    default: return { name: 'page.viewed', data: { path: `/p/${h % 100}` } };
  }
}

/**
 * `POST /v1/events` bodies of `batch` events over subscribers 0…subscribers-1 in a seeded random
 * order (each subscriber once per pass, like bench/lib/event-bodies.ts), event k being
 * `automationEvent(offset + k)`, or `name` with `data` `{ k }` for every event when given.
 */
export function automationBodies(options: { subscribers: number; events: number; batch?: number; offset?: number; seed?: number; name?: string }): { bodies: Buffer[]; events: number } {
  const order = permutation(options.subscribers, prng(options.seed ?? 11));
  const batch = options.batch ?? 100;
  const offset = options.offset ?? 0;
  const bodies: Buffer[] = [];
  for (let i = 0; i < options.events; i += batch) {
    const events: Record<string, unknown>[] = [];
    for (let k = offset + i; k < offset + Math.min(options.events, i + batch); k++) {
      const externalId = externalIdOf(order[k % options.subscribers]!);
      events.push(options.name ? { externalId, name: options.name, data: { k } } : { externalId, ...automationEvent(k) });
    }
    bodies.push(Buffer.from(JSON.stringify({ events })));
  }
  return { bodies, events: options.events };
}

/** What `createAudience` wrote. */
export type AudienceStats = { subscribers: number; subscriptions: number; topicMembers: Record<string, number>; seconds: number };

/**
 * Subscribers `sub-<from>` … `sub-<to - 1>` of one tenant with `attributesOf(n)` (upsertSubscriber:
 * created with `$subscriber.created`), their `subscriptionsOf(n)` (registerSubscription), then their
 * topic memberships (addTopicMembers, 1,000 per call) for the topics given by slug. `concurrency`
 * subscribers at a time. The worker applies the engine events they append like any others.
 */
export async function createAudience(
  redis: Redis, keys: Keys, scope: TenantScope, range: { from: number; to: number }, topics: Partial<Record<keyof typeof TOPICS, TopicRef>>,
  options: { concurrency?: number; attributes?: boolean; subscriptions?: boolean; onProgress?: (done: number) => void } = {},
): Promise<AudienceStats> {
  const t0 = performance.now();
  let subscriptions = 0;
  await pool(range.from, range.to, options.concurrency ?? 64, async (n) => {
    const x = externalIdOf(n);
    await upsertSubscriber(redis, keys, scope, x, options.attributes === false ? {} : attributesOf(n));
    if (options.subscriptions === false) return;
    for (const s of subscriptionsOf(n)) {
      await registerSubscription(redis, keys, scope, x, s);
      subscriptions++;
    }
  }, options.onProgress);
  const topicMembers: Record<string, number> = {};
  for (const [slug, ref] of Object.entries(topics) as [keyof typeof TOPICS, TopicRef][]) {
    const ids: string[] = [];
    for (let n = range.from; n < range.to; n++) if (TOPICS[slug](n)) ids.push(externalIdOf(n));
    topicMembers[slug] = ids.length;
    const chunks = Math.ceil(ids.length / 1000);
    await pool(0, chunks, 4, (c) => addTopicMembers(redis, keys, scope, ref, ids.slice(c * 1000, (c + 1) * 1000)));
  }
  return { subscribers: range.to - range.from, subscriptions, topicMembers, seconds: (performance.now() - t0) / 1000 };
}

/** Percentile p (0…100) of an ascending array (nearest rank), NaN when empty. */
export function percentile(sorted: ArrayLike<number>, p: number): number {
  if (sorted.length === 0) return Number.NaN;
  return sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1))]!;
}

/** The tenant-plane JSON call of the benches: `{ status, data, error }` of the envelope. */
export async function api<T = unknown>(url: string, key: string, method: string, path: string, body?: unknown): Promise<{ status: number; data: T; error?: unknown }> {
  const res = await fetch(`${url}${path}`, {
    method,
    headers: { authorization: `Bearer ${key}`, ...(body === undefined ? {} : { 'content-type': 'application/json' }) },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await res.text();
  let json: { data?: T; error?: unknown } = {};
  try {
    json = JSON.parse(text);
  } catch {
    // not JSON: reported through status
  }
  return { status: res.status, data: json.data as T, error: json.error ?? (res.ok ? undefined : text.slice(0, 300)) };
}
