import { METHODS, type IncomingMessage } from 'node:http';
import type { Duplex } from 'node:stream';
import type { Context, Next } from 'koa';
import { ApiError } from '../../lib/errors.js';
import { newRequestId } from '../../lib/ids.js';
import type { Logger } from '../../lib/log.js';
import { errorEnvelope, respondError } from '../envelope.js';
import { repeatsHeader } from '../params.js';
import { isRedisUnavailable } from '../../streams/redis.js';
import { CROSS_ORIGIN_HEADERS } from './cross-origin.js';

/** Turns what routing throws (http-errors shaped) into the service's errors; body errors are mapped where bodies are read (json-body.ts). */
function toApiError(err: unknown): ApiError | null {
  if (err instanceof ApiError) return err;
  const e = err as { status?: number; type?: string; expose?: boolean; message?: string };
  if (e?.status === 405) return new ApiError(405, 'method_not_allowed', 'Method not allowed on this path');
  if (e?.status === 404) return new ApiError(404, 'not_found', 'Not found');
  if (typeof e?.status === 'number' && e.status >= 400 && e.status < 500 && e.expose) return new ApiError(e.status, 'bad_request', e.message ?? 'Bad request');
  return null;
}

/**
 * RFC 9112 3.2: an HTTP/1.1 request carries exactly one `Host`. Node checks only its absence, and
 * answers that outside the envelope (probe M), so both are checked here.
 */
function hostProblem(req: IncomingMessage): string | null {
  if (req.headers.host === undefined) return req.httpVersionMajor === 1 && req.httpVersionMinor >= 1 ? 'An HTTP/1.1 request needs a Host header' : null;
  return repeatsHeader(req, 'host') ? 'Send one Host header, not several' : null;
}

/** The most of a body still to come after an early answer that is read (and dropped) so the client reads the answer. */
const LINGER_MAX_BYTES = 16 * 1024 * 1024;
/** How long the rest of such a body may take; then the connection is cut. */
const LINGER_MS = 10_000;
/**
 * Connections reading the rest of a body after its answer, with the app that answered
 * (answerUnparsedRequest must not answer that request again; a stop cuts its own app's).
 */
const lingering = new Map<Duplex, object>();

/**
 * Cuts `app`'s connections still reading the rest of a body already answered: the service is
 * stopping, and their answers are out (waiting for them held a stop for the whole grace, 5 s; probe CD).
 */
export function cutLingering(app: object): void {
  for (const [socket, owner] of lingering) if (owner === app) socket.destroy();
}

/**
 * An answer given before the request's body arrived whole (a 401 before it was read, a 413 found
 * while it streams in): the rest of the body is read and dropped, and the connection then serves
 * its next request. Closing at once, with bytes of the upload still arriving, reset the connection,
 * and a client still sending (Node's fetch, most HTTP clients) lost the answer to a network error
 * about half the time (probe CC: 10 of 20 4 MiB uploads answered 413 read `EPIPE`), which Part 7
 * tells it to retry: it uploaded megabytes again and again. A rest over LINGER_MAX_BYTES (declared
 * by `Content-Length`, or as it arrives) or slower than LINGER_MS closes the connection instead, as
 * before: it must not hold the process. Nothing of the rest is parsed as a next request either way.
 */
function readRestOf(ctx: Context): void {
  const req = ctx.req;
  const declared = Number(req.headers['content-length']);
  const socket = req.socket as Duplex | null;
  // a request already destroyed has no rest to read (and no socket): the connection closes
  if (declared > LINGER_MAX_BYTES || req.destroyed || !socket) return void ctx.set('Connection', 'close');
  lingering.set(socket, ctx.app);
  let seen = 0;
  const cut = () => socket.destroy();
  const timer = setTimeout(cut, LINGER_MS).unref();
  const count = (chunk: Buffer) => {
    seen += chunk.length;
    if (seen > LINGER_MAX_BYTES) cut();
  };
  // every listener goes with the rest: a keep-alive connection answering early again and again
  // gathered one socket 'close' listener (holding its request) per answer (probe DA)
  const done = () => {
    clearTimeout(timer);
    lingering.delete(socket);
    req.off('data', count);
    req.off('end', done);
    req.off('close', done);
    socket.off('close', done);
  };
  req.on('data', count);
  req.once('end', done);
  req.once('close', done);
  socket.once('close', done);
  // a compressed body was piped into its inflater, which stopped reading at the limit: the pipe would hold the rest back
  req.unpipe();
  req.resume();
}

/**
 * The outermost middleware: assigns the request id (also the `Request-Id` header), answers
 * unknown routes with 404 `not_found`, and turns every thrown error into the envelope. An answer
 * given before the request's body arrived whole reads the rest of it (`readRestOf`).
 * Unexpected errors answer 500 `internal` with a generic message; the real one is logged.
 */
export function envelopeErrors(log: Logger) {
  return async function envelope(ctx: Context, next: Next): Promise<void> {
    ctx.state.requestId = newRequestId();
    ctx.set('Request-Id', ctx.state.requestId);
    try {
      const host = hostProblem(ctx.req);
      if (host) throw new ApiError(400, 'bad_request', host, { param: 'Host' });
      await next();
      if (ctx.body === undefined && ctx.status === 404) throw new ApiError(404, 'not_found', `No route for ${ctx.method} ${ctx.path ?? ctx.url}`);
    } catch (err) {
      const known = toApiError(err);
      if (known) return respondError(ctx, known);
      const status = isRedisUnavailable(err) ? 503 : 500;
      // Redis down or slow is an expected outage (clients retry the 503): one line, not a stack per request (probe M)
      if (status === 503) log.warn('redis unavailable', { requestId: ctx.state.requestId, method: ctx.method, path: ctx.path, err: (err as Error).message });
      else log.error('unexpected error', { requestId: ctx.state.requestId, method: ctx.method, path: ctx.path, err });
      respondError(ctx, status === 503
        ? new ApiError(503, 'unavailable', 'The service is temporarily unavailable; retry later')
        : new ApiError(500, 'internal', 'Internal error; quote the request id when reporting it'));
    } finally {
      // Answered before the request's body arrived whole (a body over the limit found while it streams
      // in, a refusal before it was read): unread, the rest of it would stall the connection's next request
      if (!ctx.req.complete) readRestOf(ctx);
    }
  };
}

/**
 * The HTTP server's `clientError` listener: a request Node cannot parse (headers over its 16 KB
 * limit, a malformed request line or header) never reaches Koa, and Node's own answer is a bare
 * 400 or 431 without a body. It is answered here as any malformed request is (spec Part 7): 400
 * `bad_request` in the envelope, with a `Request-Id`, and the connection closed. A method name
 * Node's parser does not know (`FOO`, or `patch`: names are case-sensitive) is 501
 * `not_implemented` (RFC 9110 15.6.2), naming the method (probe FE: 400 "not well-formed HTTP").
 * Requests pipelined before it on the connection, whole and still being answered, get their answers
 * first, in order: the refusal waits for them (at most PIPELINED_ANSWERS_WAIT_MS), then ends the
 * connection (it was written at once, ahead of theirs, and the connection's end lost them).
 */
export function answerUnparsedRequest(err: NodeJS.ErrnoException & { rawPacket?: Buffer }, socket: Duplex): void {
  if (refusing.has(socket)) return; // the parser fails again on each later chunk
  if (err.code === 'ECONNRESET' || !socket.writable || lingering.has(socket)) return void socket.destroy();
  refusing.add(socket);
  const limit = setTimeout(() => socket.destroy(), PIPELINED_ANSWERS_WAIT_MS).unref();
  const next = () => {
    const pending = answering(socket);
    // a whole request before it still being answered: its answer goes first
    if (pending?.req?.complete && !socket.destroyed) return void pending.once('close', () => setImmediate(next));
    clearTimeout(limit);
    // the answer of a request whose own body is what failed to arrive (a request timeout) is this
    // refusal, unless it began (it cannot be finished whole then)
    if (socket.writable && !pending?.headersSent) refuse(err, socket);
    else socket.destroy();
  };
  next();
}

/** The most a malformed request's refusal waits for the answers to requests pipelined before it. */
const PIPELINED_ANSWERS_WAIT_MS = 30_000;
/** Connections whose malformed request's refusal is waiting for the answers before it. */
const refusing = new WeakSet<Duplex>();

type Answer = { headersSent?: boolean; req?: { complete?: boolean }; once(event: 'close', listener: () => void): void };
/** The answer being written on `socket` (Node assigns the next pipelined one as each finishes), if any. */
function answering(socket: Duplex): Answer | undefined {
  return (socket as Duplex & { _httpMessage?: Answer | null })._httpMessage ?? undefined;
}

function refuse(err: NodeJS.ErrnoException & { rawPacket?: Buffer }, socket: Duplex): void {
  const [param, message] = err.code === 'HPE_HEADER_OVERFLOW'
    ? ['headers', 'The request line and headers are larger than 16 KB']
    : err.code === 'ERR_HTTP_REQUEST_TIMEOUT'
      ? ['request', 'The request did not arrive whole in time']
      : ['request', 'The request is not well-formed HTTP'];
  const error = (err.code === 'HPE_INVALID_METHOD' && unknownMethod(err.rawPacket, (err as { bytesParsed?: number }).bytesParsed)) || new ApiError(400, 'bad_request', message, { param });
  const requestId = newRequestId();
  const body = JSON.stringify(errorEnvelope(error, requestId));
  const cors = Object.entries(CROSS_ORIGIN_HEADERS).map(([name, value]) => `${name}: ${value}\r\n`).join('');
  const reason = error.status === 501 ? 'Not Implemented' : 'Bad Request';
  socket.end(`HTTP/1.1 ${error.status} ${reason}\r\nContent-Type: application/json; charset=utf-8\r\nContent-Length: ${Buffer.byteLength(body)}\r\nRequest-Id: ${requestId}\r\n${cors}Connection: close\r\n\r\n${body}`);
}

/** A request line whose method is a token (RFC 9110 5.6.2: `FOO`, `patch`), with a target and an HTTP version; another is malformed. */
const REQUEST_LINE = /^([!#$%&'*+.^_`|~0-9A-Za-z-]{1,32}) \S+ HTTP\/\d\.\d\r?\n/;

/**
 * 501 for a well-formed request line whose method Node does not know (null for a malformed line): the
 * capitals when those are a method. The line is the one where the parser stopped (`bytesParsed` into
 * the socket's chunk): a chunk may hold requests before it, pipelined (probe FG: the 501 named their GET).
 */
function unknownMethod(packet: Buffer | undefined, parsed: number | undefined): ApiError | null {
  if (!packet || parsed === undefined || parsed < 0 || parsed > packet.length) return null;
  const start = parsed === 0 ? 0 : packet.lastIndexOf(0x0a, parsed - 1) + 1; // (a negative offset would count from the end)
  const name = REQUEST_LINE.exec(packet.subarray(start, start + 8192).toString('latin1'))?.[1];
  if (name === undefined) return null;
  const upper = name.toUpperCase();
  const hint = upper !== name && METHODS.includes(upper) ? `; method names are case-sensitive: ${upper}` : '';
  return new ApiError(501, 'not_implemented', `The method ${name} is not one this service knows${hint}`, { param: 'method' });
}
