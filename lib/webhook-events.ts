/**
 * Which events an outbound webhook endpoint can subscribe to (spec 2.5, 6.2.2) and how its
 * `events` patterns match them.
 *
 * Two ledgers feed an endpoint: control-plane (audit) events named `resource.action`, and the
 * subscriber stream events (the caller's own names and the reserved `$…` names of spec 6.1).
 * Patterns are exact names, `prefix.*` (every name that starts with `prefix.`, in either
 * ledger) and `*` (every public event of both ledgers). Audit events of the private resources
 * `key`, `webhook` and `profile` are never delivered and cannot be asked for.
 */
import { ENGINE_EVENT_NAMES, SDK_EVENT_NAMES } from './event-names.js';
import type { ErrorDetail } from './errors.js';

/** Resources whose audit events are private (spec 6.2.2). */
export const PRIVATE_AUDIT_RESOURCES = ['key', 'webhook', 'profile'] as const;

export type CatalogEvent = { name: string; description: string | null };
export type CatalogGroup = { resource: string; source: 'audit' | 'stream'; pattern: string | null; events: CatalogEvent[] };

/**
 * The public audit events, by resource. Matching does not depend on this list (any audit
 * event outside the private resources is public); it is what the catalog route shows.
 * Add a line here when a control-plane write starts appending a new public audit event.
 */
export const PUBLIC_AUDIT_EVENTS: Record<string, CatalogEvent[]> = {
  tenant: [
    { name: 'tenant.created', description: 'A tenant was added to the workspace.' },
    { name: 'tenant.updated', description: 'A tenant\'s settings changed (with changes and previousAttributes).' },
    { name: 'tenant.identity_secret_rotated', description: 'A tenant\'s identity-verification secret was replaced (the secret is never in the event).' },
  ],
  subscriber: [
    { name: 'subscriber.created', description: 'A subscriber was created through the API (one created by its first event or registration has `$subscriber.created` on the stream instead).' },
    { name: 'subscriber.updated', description: 'A subscriber\'s attributes changed (with changes and previousAttributes).' },
    { name: 'subscriber.deleted', description: 'A subscriber was deleted.' },
  ],
  subscription: [
    { name: 'subscription.created', description: 'A device or address was registered.' },
    { name: 'subscription.updated', description: 'A subscription changed (with changes and previousAttributes), also when Herald turns it off for a token APNs declared dead (actor system).' },
    { name: 'subscription.deleted', description: 'A subscription was removed, or went with its deleted subscriber (one each, before that subscriber.deleted).' },
  ],
  apns: [
    { name: 'apns.updated', description: 'A tenant\'s APNs credentials were set or changed (never the key itself).' },
    { name: 'apns.deleted', description: 'A tenant\'s APNs credentials were removed.' },
  ],
  message: [
    { name: 'message.created', description: 'A message was accepted for sending, through the API or by a workflow run\'s send step (actor system).' },
    { name: 'message.canceled', description: 'A message was canceled while scheduled or queued, before any push of it went.' },
  ],
  topic: [
    { name: 'topic.created', description: 'A topic was created.' },
    { name: 'topic.updated', description: 'A topic changed (with changes and previousAttributes).' },
    { name: 'topic.deleted', description: 'A topic was deleted.' },
  ],
  segment: [
    { name: 'segment.created', description: 'A segment was created.' },
    { name: 'segment.updated', description: 'A segment changed (with changes and previousAttributes).' },
    { name: 'segment.deleted', description: 'A segment was deleted.' },
  ],
  workflow: [
    { name: 'workflow.created', description: 'A workflow was created.' },
    { name: 'workflow.updated', description: 'A workflow changed: renamed, enabled or disabled, or a new version (with changes and previousAttributes).' },
    { name: 'workflow.deleted', description: 'A workflow was deleted.' },
  ],
  source: [
    { name: 'source.created', description: 'A source (an inbound webhook URL turning another service\'s webhooks into events) was created; never its secret.' },
    { name: 'source.updated', description: 'A source changed (with changes and previousAttributes; a new secret shows as secretUpdatedAt).' },
    { name: 'source.deleted', description: 'A source was deleted.' },
  ],
};

const RESERVED_NAMES: readonly string[] = [...SDK_EVENT_NAMES, ...ENGINE_EVENT_NAMES];

/** A name or a name prefix in a pattern: an event name of spec 2.4, `$` allowed for the reserved ones. */
const NAME = /^\$?[a-z0-9][a-z0-9_.-]{0,99}$/;

/** The resource of an event name: what comes before its first dot (`$subscription` for `$subscription.muted`). */
export function resourceOf(name: string): string {
  const dot = name.indexOf('.');
  return dot < 0 ? name : name.slice(0, dot);
}

/** True for an audit event name nobody may receive (`key.created`, `webhook.disabled`, `profile.updated`). */
export function isPrivateAuditName(name: string): boolean {
  return (PRIVATE_AUDIT_RESOURCES as readonly string[]).includes(resourceOf(name)) && name.includes('.');
}

/** The problems of one pattern: `malformed` (400 validation) or `private` (400 invalid_event), else null. */
export function patternProblem(pattern: string): { kind: 'malformed' | 'private'; message: string } | null {
  if (pattern === '*') return null;
  const wildcard = pattern.endsWith('.*');
  const stem = wildcard ? pattern.slice(0, -2) : pattern;
  // an exact name may end in a dot (spec 2.4 allows it, so ingest takes `order.`); a prefix may not (`order..*`)
  if (!NAME.test(stem) || (wildcard && stem.endsWith('.'))) {
    return { kind: 'malformed', message: 'must be *, an event name, or an event name prefix followed by .*' };
  }
  // a prefix is followed by a dot in every name it matches, and a name is at most 100 characters:
  // one of 100 could match nothing (probe DR: it was taken, and its endpoint received nothing)
  if (wildcard && !stem.startsWith('$') && stem.length > 99) {
    return { kind: 'malformed', message: 'a prefix before .* is at most 99 characters (an event name is at most 100)' };
  }
  if (stem.startsWith('$')) {
    const known = wildcard ? RESERVED_NAMES.some((n) => n.startsWith(stem + '.')) : RESERVED_NAMES.includes(stem);
    return known ? null : { kind: 'malformed', message: 'names no reserved event (the catalog lists the $ names)' };
  }
  if ((PRIVATE_AUDIT_RESOURCES as readonly string[]).includes(resourceOf(stem)) && pattern.includes('.')) {
    return { kind: 'private', message: `${resourceOf(stem)}.* events are private and cannot be subscribed` };
  }
  return null;
}

/**
 * Checks an endpoint's `events`: with a malformed pattern the answer is `validation`, its details
 * naming every failing pattern, private ones included (probe BJ: they went unnamed until the
 * malformed one was fixed); with only private ones, `invalid_event`; else none. `param` is `events[i]`.
 */
export function checkPatterns(patterns: string[]): { code: 'validation' | 'invalid_event'; details: ErrorDetail[] } | null {
  const details: ErrorDetail[] = [];
  let malformed = false;
  patterns.forEach((pattern, i) => {
    const problem = patternProblem(pattern);
    if (!problem) return;
    malformed ||= problem.kind === 'malformed';
    details.push({ param: `events[${i}]`, message: problem.message });
  });
  if (details.length === 0) return null;
  return { code: malformed ? 'validation' : 'invalid_event', details };
}

/** The patterns as stored: duplicates dropped, order kept. */
export function normalizePatterns(patterns: string[]): string[] {
  return [...new Set(patterns)];
}

/** True when `name` matches one of `patterns` (exact, `prefix.*` or `*`). */
export function matchesPatterns(patterns: readonly string[], name: string): boolean {
  for (const pattern of patterns) {
    if (pattern === '*' || pattern === name) return true;
    if (pattern.endsWith('.*') && name.startsWith(pattern.slice(0, -1))) return true;
  }
  return false;
}

/**
 * True when an event of `source` named `name` can reach an endpoint with `patterns`: private
 * audit events never do; every other event does when a pattern matches its name.
 */
export function isDeliverable(source: 'audit' | 'stream', name: string, patterns: readonly string[]): boolean {
  if (source === 'audit' && isPrivateAuditName(name)) return false;
  return matchesPatterns(patterns, name);
}

function groupByResource(names: Iterable<string>, source: 'audit' | 'stream', describe: (name: string) => string | null): CatalogGroup[] {
  const groups = new Map<string, CatalogGroup>();
  for (const name of names) {
    const resource = resourceOf(name);
    let group = groups.get(resource);
    if (!group) groups.set(resource, (group = { resource, source, pattern: null, events: [] }));
    if (name.includes('.')) group.pattern = `${resource}.*`;
    if (!group.events.some((e) => e.name === name)) group.events.push({ name, description: describe(name) });
  }
  return [...groups.values()];
}

/**
 * The catalog of spec 4.6: public audit events by resource, then the reserved stream events
 * by resource, then `callerNames` (the stream event names the workspace's tenants have seen)
 * grouped by their first segment. It lists only what an endpoint's `events` can name: a caller's
 * name that no pattern may name (`key.pressed`, `webhook.received`, `profile.viewed`: the words
 * of the private audit resources) reaches `*` only and is left out, and so is its group's pattern.
 */
export function webhookCatalog(callerNames: string[]): CatalogGroup[] {
  const audit: CatalogGroup[] = Object.entries(PUBLIC_AUDIT_EVENTS).map(([resource, events]) => ({ resource, source: 'audit', pattern: `${resource}.*`, events }));
  const reserved = groupByResource(RESERVED_NAMES, 'stream', (name) => (SDK_EVENT_NAMES as readonly string[]).includes(name) ? 'Sent by the SDK.' : 'Written by the engine.');
  const own = groupByResource([...callerNames].filter((n) => !n.startsWith('$') && patternProblem(n) === null).sort(), 'stream', () => null);
  return [...audit, ...reserved, ...own];
}
