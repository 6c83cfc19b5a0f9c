import { createHash } from 'node:crypto';
import type { Context } from 'koa';
import type { Redis } from 'ioredis';
import { ApiError, validationError } from '../lib/errors.js';
import { isId, type IdKind } from '../lib/ids.js';
import { checkQuery, parseQuery } from '../lib/validator.js';
import { entriesAfter, type ScoredPosition } from '../streams/scored-index.js';

/** A page of a list (spec 2.2); `total` only on record lists. */
export type Page<T> = { items: T[]; hasMore: boolean; nextCursor: string | null; total?: number };
export type PageRequest = { limit: number; after: string | null };

/** Opaque cursor: base64url of a versioned position. Callers must not build or parse it. */
export function encodeCursor(position: string): string {
  return Buffer.from(JSON.stringify({ v: 1, p: position })).toString('base64url');
}

type CursorFields = { v?: number; p?: unknown; l?: unknown };

function parseCursor(cursor: string): CursorFields | null {
  try {
    const parsed = JSON.parse(Buffer.from(cursor, 'base64url').toString('utf8')) as CursorFields;
    return parsed !== null && typeof parsed === 'object' && parsed.v === 1 && typeof parsed.p === 'string' ? parsed : null;
  } catch {
    return null;
  }
}

/**
 * The list a request reads: its path (decoded: a client may encode an externalId's characters
 * either way; a trailing slash or none) in the credential's workspace and tenant, and, for a list
 * whose owner is a query parameter (a client's widgets, by `externalId`), that owner
 * (`pageRequest`'s `within`). A cursor carries its list's tag, so one list's cursor given to another
 * (another tenant's events, another subscriber's timeline or widgets, another endpoint's
 * deliveries) is refused instead of read as a position there. Filters are not part of it: a cursor
 * is a position in the list's order, which filters do not change.
 */
export function listTag(ctx: Context): string {
  // without a trailing slash: the router serves `/v1/topics/` as `/v1/topics`, so their cursors are one list's (probe T)
  let path = ctx.path.replace(/\/+$/, '');
  try {
    path = decodeURIComponent(path);
  } catch {
    // a malformed escape: the raw path, as the router matched it
  }
  const auth = ctx.state.auth as { workspace?: { id: string }; tenant?: { id: string } | null } | undefined;
  const within = (ctx.state as ListState).listWithin;
  const owner = within === undefined ? '' : `|${JSON.stringify(within)}`;
  return createHash('sha256').update(`${auth?.workspace?.id ?? ''}|${auth?.tenant?.id ?? ''}|${path}${owner}`).digest('base64url').slice(0, 12);
}

/** `cursor` (from `encodeCursor`) bound to the list `tag` names: what a list answer gives as `nextCursor`. */
export function bindCursor(cursor: string, tag: string): string {
  const fields = parseCursor(cursor);
  if (!fields) throw new Error('bindCursor: not a cursor of encodeCursor');
  return Buffer.from(JSON.stringify({ v: 1, p: fields.p, l: tag })).toString('base64url');
}

/**
 * The position `cursor` holds, when it was issued by the list `tag` names; 400 otherwise. A cursor
 * without a tag (issued before cursors carried one) is read as a position, as it was then.
 */
export function decodeCursor(cursor: string, tag: string): string {
  const fields = parseCursor(cursor);
  if (!fields || (fields.l !== undefined && fields.l !== tag)) throw badCursor();
  return fields.p as string;
}

/** 400 `validation` on `cursor`: the one answer for a cursor this service did not issue. */
export function badCursor(): ApiError {
  return new ApiError(400, 'validation', 'cursor: is not a cursor this service issued', { param: 'cursor', details: [{ param: 'cursor', message: 'is not a cursor this service issued' }] });
}

/**
 * The one `cursor` of a query string, decoded (null when absent or repeated: the query's check names
 * that). Only whether it reads as a cursor at all is checked beside the query's other problems: its
 * list's tag may depend on the query (`within`).
 */
function cursorGiven(querystring: string): string | null {
  const value = parseQuery(querystring).params.get('cursor');
  return typeof value === 'string' ? value : null;
}

/** What `listTag` reads of the request's state besides its credential. */
type ListState = { listWithin?: string };

/**
 * Reads `limit` (default 50, at most 100) and `cursor` from the query, validating the rest of
 * the query with schema `schemaName` (which must include the ListQuery properties). `within` names
 * the list's owner when a query parameter picks it (a client's widgets, by `externalId`): it is
 * part of the list's tag, so one owner's cursor is refused on another's list (probe BN).
 */
export function pageRequest<Q extends object = { limit?: number; cursor?: string }>(ctx: Context, schemaName = 'ListQuery', within?: (query: Q) => string): PageRequest & { query: Q } {
  let query: Q & { limit?: number; cursor?: string };
  try {
    query = checkQuery<Q & { limit?: number; cursor?: string }>(schemaName, ctx.querystring);
  } catch (err) {
    // a cursor this list did not issue is told beside the query's other problems (Part 7: details
    // list each failing field; probe BP: `?limit=0&cursor=bad` named only limit)
    const details = err instanceof ApiError ? err.details : null;
    const cursor = details && !details.some((d) => d.param === 'cursor') ? cursorGiven(ctx.querystring) : null;
    if (details && cursor !== null && parseCursor(cursor) === null) throw validationError([...details, ...badCursor().details!]);
    throw err;
  }
  if (within) (ctx.state as ListState).listWithin = within(query);
  return { limit: query.limit ?? 50, after: query.cursor ? decodeCursor(query.cursor, listTag(ctx)) : null, query };
}

/** A cursor position that is not an id of `kind` was issued by another list (or forged): 400. */
function checkCursorId(kind: IdKind, member: string): void {
  if (!isId(kind, member)) throw badCursor();
}

/**
 * One page of ids of `kind` from a sorted set whose members all have score 0 and sort by id, so
 * that time-ordered ids come out newest first. `total` is the ZCARD of the same index. A cursor
 * holding anything but an id of `kind` (another list's) is 400.
 */
export async function pageIds(redis: Redis, index: string, page: PageRequest, kind: IdKind): Promise<{ ids: string[]; hasMore: boolean; nextCursor: string | null; total: number }> {
  if (page.after !== null) checkCursorId(kind, page.after);
  const max = page.after ? `(${page.after}` : '+';
  const [ids, total] = await Promise.all([
    redis.zrange(index, max, '-', 'BYLEX', 'REV', 'LIMIT', 0, page.limit + 1),
    redis.zcard(index),
  ]);
  const hasMore = ids.length > page.limit;
  const pageOfIds = ids.slice(0, page.limit);
  return { ids: pageOfIds, hasMore, nextCursor: hasMore ? encodeCursor(pageOfIds[pageOfIds.length - 1]!) : null, total };
}

/**
 * An index ordered by score instead of by id (streams/scored-index.ts): newest first by score,
 * equal scores by member; its cursors hold `<score>|<member>`. `unscored` places a cursor taken
 * from an entry that had no score yet, for an index that was ordered by id before: a bare member
 * (a cursor of the id-ordered list) or score 0 (an entry not yet given its score); it answers the
 * member's score now, or null when it cannot be placed (400, as a cursor this service did not issue).
 */
export type ScoredIndex = { unscored?: (member: string) => Promise<string | null> };

/** A scored-index cursor position `<score>|<member>` (400 for anything else). */
export function scoredCursor(after: string): ScoredPosition {
  const bar = after.indexOf('|');
  const score = after.slice(0, bar);
  if (bar < 1 || !/^\d+$/.test(score)) throw badCursor();
  return { score, member: after.slice(bar + 1) };
}

async function scoredPosition(after: string, scored: ScoredIndex): Promise<ScoredPosition> {
  const bar = after.indexOf('|');
  if ((bar < 0 || after.slice(0, bar) === '0') && scored.unscored) {
    const member = bar < 0 ? after : after.slice(bar + 1);
    const now = await scored.unscored(member);
    if (now !== null) return { score: now, member };
  }
  return scoredCursor(after);
}

/** One page of ids of `kind` from a score-ordered index (see `ScoredIndex`), newest first; `total` is its ZCARD. */
export async function pageScoredIds(redis: Redis, index: string, page: PageRequest, kind: IdKind, scored: ScoredIndex = {}): Promise<{ ids: string[]; hasMore: boolean; nextCursor: string | null; total: number }> {
  const after = page.after === null ? null : await scoredPosition(page.after, scored);
  if (after) checkCursorId(kind, after.member);
  const [entries, total] = await Promise.all([entriesAfter(redis, index, after, page.limit + 1), redis.zcard(index)]);
  const hasMore = entries.length > page.limit;
  const pageOf = entries.slice(0, page.limit);
  const last = pageOf[pageOf.length - 1];
  return { ids: pageOf.map(([member]) => member), hasMore, nextCursor: hasMore && last ? encodeCursor(`${last[1]}|${last[0]}`) : null, total };
}

/**
 * One page of a short list held whole in memory (bounded where it is stored, e.g. a subscriber's
 * at most 50 subscriptions), newest first by id; the cursor is the last id given, and must be an
 * id `isValid` accepts. `total` is the whole list's length.
 */
export function pageList<T extends { id: string }>(all: T[], page: PageRequest, isValid: (id: string) => boolean): Page<T> {
  if (page.after !== null && !isValid(page.after)) throw badCursor();
  const newest = [...all].sort((a, b) => (a.id < b.id ? 1 : a.id > b.id ? -1 : 0));
  const rest = page.after === null ? newest : newest.filter((x) => x.id < page.after!);
  const items = rest.slice(0, page.limit);
  const hasMore = rest.length > page.limit;
  return { items, hasMore, nextCursor: hasMore ? encodeCursor(items[items.length - 1]!.id) : null, total: all.length };
}

/**
 * Loads the records of a page of ids of `kind` (dropping ids whose record vanished) into a `Page`
 * with `total`; the index is ordered by id, or by score when `scored` is given.
 */
export async function pageRecords<T>(redis: Redis, index: string, page: PageRequest, kind: IdKind, load: (ids: string[]) => Promise<(T | null)[]>, scored?: ScoredIndex): Promise<Page<T>> {
  const { ids, hasMore, nextCursor, total } = scored ? await pageScoredIds(redis, index, page, kind, scored) : await pageIds(redis, index, page, kind);
  const items = (await load(ids)).filter((x): x is T => x !== null);
  return { items, hasMore, nextCursor, total };
}
