// What the senders of inbound webhooks do, for the tests of Sources (docs/sources.md): sign a
// delivery as Standard Webhooks (with the reference `standardwebhooks` package), Stripe and GitHub do.
import { createHmac, randomBytes, randomUUID } from 'node:crypto';
import { Webhook } from 'standardwebhooks';
import * as assert from 'uvu/assert';
import type { Reply } from '../helpers/api.js';

/** A Standard Webhooks secret: `whsec_` + base64 of random bytes. */
export const swSecret = (): string => 'whsec_' + randomBytes(24).toString('base64');

/** A Stripe endpoint signing secret as the dashboard shows it. */
export const stripeSecret = (): string => 'whsec_' + randomBytes(16).toString('hex');

/** The Standard Webhooks headers of `body`, signed by the reference implementation. */
export function swHeaders(secret: string, body: string, options: { id?: string; at?: Date } = {}): Record<string, string> {
  const id = options.id ?? `msg_${randomUUID()}`;
  const at = options.at ?? new Date();
  return {
    'webhook-id': id,
    'webhook-timestamp': String(Math.floor(at.getTime() / 1000)),
    'webhook-signature': new Webhook(secret).sign(id, at, body),
  };
}

/** The hex HMAC-SHA256 of `text` under the secret's UTF-8 bytes (Stripe's and GitHub's scheme). */
export const hexHmac = (secret: string, text: string | Uint8Array): string => createHmac('sha256', Buffer.from(secret, 'utf8')).update(text).digest('hex');

/** `Stripe-Signature: t=<secs>,v1=<hex>` of `body`; `extra` v1 values are put before the real one. */
export function stripeHeaders(secret: string, body: string, options: { t?: number; extra?: string[] } = {}): Record<string, string> {
  const t = options.t ?? Math.floor(Date.now() / 1000);
  const v1 = [...(options.extra ?? []), hexHmac(secret, `${t}.${body}`)].map((s) => `v1=${s}`).join(',');
  return { 'stripe-signature': `t=${t},${v1}` };
}

/** GitHub's headers of `body`: `X-Hub-Signature-256`, `X-GitHub-Event`, `X-GitHub-Delivery`. */
export function githubHeaders(secret: string, body: string | Uint8Array, event: string, delivery: string = randomUUID()): Record<string, string> {
  return {
    'x-hub-signature-256': `sha256=${hexHmac(secret, body)}`,
    'x-github-event': event,
    'x-github-delivery': delivery,
  };
}

/** The event of an inbound answer of `accepted` or `duplicate` (`data` is `{ status, reason, event }`). */
export function eventOf(res: Reply): any {
  const { event, reason } = res.body.data;
  assert.is(reason, null, 'a stored or duplicate delivery has no reason');
  assert.type(event, 'object');
  return event;
}

/** Asserts the answer is `status` with `error.code` = `code`. */
export function assertError(res: Reply, status: number, code: string, what = ''): void {
  assert.is(res.status, status, `${what} ${res.text.slice(0, 300)}`);
  assert.is(res.body.success, false);
  assert.is(res.body.data, null);
  assert.is(res.body.error.code, code, `${what} ${res.text.slice(0, 300)}`);
}

/** The params an error names: `error.param` and each of `error.details`. */
export function paramsOf(res: Reply): string[] {
  const error = res.body.error ?? {};
  return [error.param, ...((error.details ?? []) as { param: string }[]).map((d) => d.param)].filter((p): p is string => typeof p === 'string');
}

/** Asserts a 400 `validation` naming `param`. */
export function assertValidation(res: Reply, param: string, what = ''): void {
  assertError(res, 400, 'validation', what);
  assert.ok(paramsOf(res).includes(param), `${what}: ${param} in ${JSON.stringify(res.body.error)}`);
}

export const ISO = /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/;
export const ZERO_COUNTS = { accepted: 0, duplicate: 0, ignored: 0, rejected: 0 };
