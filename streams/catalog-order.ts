import { randomBytes } from 'node:crypto';
import type { Redis } from 'ioredis';
import { now } from '../lib/clock.js';
import type { Keys } from './keys.js';

/**
 * The catalog's order as a page walk's first page saw it (docs/events.md, Catalog paging). The
 * catalog is ordered by counts that change all the time, so a cursor holding only the last entry's
 * place (keyset) skips a name that climbs past it between two pages and repeats one that falls back.
 * The first page of a catalog larger than one page therefore keeps the names after it, in order, as
 * a list of its own; the next pages read their names from it by offset and their counts fresh. The
 * walk lists the names as of its first page, each once.
 *
 * Bounded: only catalogs of at most MAX_NAMES names get one (a larger catalog pages by keyset, as
 * before); each lasts TTL_S seconds; a tenant keeps at most KEPT of them (the oldest go first). A
 * walk whose order is gone (expired or pushed out) goes on by keyset from its cursor's last entry.
 */
export const CATALOG_ORDER_MAX_NAMES = 10_000;
const TTL_S = 600;
const KEPT = 20;
const PUSH_CHUNK = 1_000;

/** Keeps `names` (the catalog after a first page, in order); resolves to the order's id. */
export async function keepCatalogOrder(redis: Redis, keys: Keys, tenantId: string, names: readonly string[]): Promise<string> {
  const id = randomBytes(9).toString('base64url');
  const key = keys.catalogOrder(tenantId, id);
  const index = keys.catalogOrders(tenantId);
  const writes = redis.multi();
  for (let i = 0; i < names.length; i += PUSH_CHUNK) writes.rpush(key, ...names.slice(i, i + PUSH_CHUNK));
  writes.expire(key, TTL_S);
  writes.zadd(index, now(), id);
  writes.zremrangebyscore(index, '-inf', now() - TTL_S * 1000);
  writes.expire(index, TTL_S);
  await writes.exec();
  // beyond KEPT, the oldest orders go (their walks go on by keyset)
  const surplus = await redis.zrange(index, 0, -(KEPT + 1));
  if (surplus.length) await redis.multi().del(...surplus.map((old) => keys.catalogOrder(tenantId, old))).zrem(index, ...surplus).exec();
  return id;
}

/** `count` names of the kept order `id` from `offset`, and how many it holds; null when it is gone. */
export async function readCatalogOrder(redis: Redis, keys: Keys, tenantId: string, id: string, offset: number, count: number): Promise<{ names: string[]; length: number } | null> {
  const key = keys.catalogOrder(tenantId, id);
  const [[e1, names], [e2, length]] = (await redis.multi().lrange(key, offset, offset + count - 1).llen(key).exec()) as [[Error | null, string[]], [Error | null, number]];
  if (e1 || e2) throw e1 ?? e2;
  return length === 0 ? null : { names, length };
}
