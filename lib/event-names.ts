/** Reserved names the SDK sends (spec 6.1). */
export const SDK_EVENT_NAMES = [
  '$app.installed', '$app.updated', '$app.opened', '$app.backgrounded', '$session.ended',
  '$notification.delivered', '$notification.opened', '$notification.dismissed',
  '$activity.started', '$activity.ended', '$activity.dismissed', '$activity.stale',
  '$local.scheduled', '$deeplink.opened', '$action.triggered', '$permission.changed', '$identify',
] as const;

/** Reserved names only the engine writes (spec 6.1). */
export const ENGINE_EVENT_NAMES = [
  '$subscriber.created', '$subscriber.updated', '$subscriber.deleted',
  '$subscription.registered', '$subscription.muted', '$subscription.unmuted', '$subscription.removed', '$subscription.invalidated',
  '$preferences.updated', '$run.started', '$run.step', '$run.completed', '$run.canceled', '$run.failed', '$send',
] as const;

export const EVENT_SOURCES = ['server', 'ios', 'android', 'web', 'system', 'webhook'] as const;
export type EventSource = (typeof EVENT_SOURCES)[number];
export const CLIENT_SOURCES = ['ios', 'android', 'web'] as const;

/** Caller-defined names: `[a-z0-9][a-z0-9_.-]{0,99}`. */
export const EVENT_NAME = /^[a-z0-9][a-z0-9_.-]{0,99}$/;

export function isReserved(name: string): boolean {
  return name.startsWith('$');
}

const RESERVED_NAMES: ReadonlySet<string> = new Set([...SDK_EVENT_NAMES, ...ENGINE_EVENT_NAMES]);

/** True for a `$` name that is none of the reserved ones of spec 6.1: no event can ever carry it. */
export function isUnknownReserved(name: string): boolean {
  return name.startsWith('$') && !RESERVED_NAMES.has(name);
}

/** What a definition naming such an event is told. */
export const UNKNOWN_RESERVED_MESSAGE = 'names no reserved event: names starting with $ are the reserved ones of the SDK and the engine';

export function isSdkName(name: string): boolean {
  return (SDK_EVENT_NAMES as readonly string[]).includes(name);
}
