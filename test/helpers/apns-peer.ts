/**
 * A local APNs peer: a real HTTP/2 TLS server speaking Apple's APNs provider API
 * (`POST /3/device/{token}` with token-based provider authentication), for tests and benchmarks.
 * The service is pointed at it through configuration exactly like production: host, port, CA.
 *
 * Pointing `@parse/node-apn` (v8.1.0) at the peer, from its source (lib/config.js, lib/client.js,
 * lib/credentials/ca/prepare.js):
 * - `address` is the host. The client calls `http2.connect(`https://${address}`, config)` with the
 *   whole provider config as the connect/TLS options. Passing any `address` other than
 *   'api.push.apple.com' also forces `production = false`; `production` only picks the default
 *   address, so it does not matter once `address` is set.
 * - `port` (default 443) is not put in the URL; it reaches `tls.connect` as the `port` key of
 *   those options, which overrides the URL's (default) port. So `port: peer.port` works.
 * - `ca` is a string/Buffer or an array of them (the typings only allow an array), each a PEM or
 *   a file name (read from disk when it is not PEM); it is passed on to `tls.connect` as `ca`.
 *   `rejectUnauthorized` (default true) is passed on too: keep it and give `ca: [peer.ca]`.
 * - `address: '127.0.0.1'` works: Node's http2 sends no SNI for an IP (no DEP0123 warning) and
 *   TLS checks the certificate's IP SAN. `address: 'localhost'` works too where localhost
 *   resolves to 127.0.0.1 (the peer listens on IPv4 only). Every other provider option is passed
 *   through to `http2.connect`/`tls.connect` as well (e.g. `servername`), though not typed.
 * - `token: { key, keyId, teamId }`: `key` is the .p8 PEM text (or a file name). node-apn signs
 *   an ES256 JWT with `iss` = teamId, header `kid` = keyId and `iat` = now, reuses it for 55
 *   minutes, and on `403 ExpiredProviderToken` makes a new one and retries.
 * - Retries: node-apn retries 408/429/500/502/503/504 (and 403 ExpiredProviderToken) on the same
 *   session up to `connectionRetryLimit` (default 3) more times, at once (it reads `Retry-After`
 *   by a capitalised name that HTTP/2 never delivers). `requestTimeout` defaults to 5000 ms.
 * - Results: `provider.send()` resolves `{ sent: [{ device, 'apns-id', 'apns-unique-id'? }],
 *   failed: [{ device, status, response: { reason, timestamp? }, 'apns-id'? }] }`; a 500
 *   InternalServerError or a transport failure lands in `failed` as `{ device, status?, error }`.
 */
import { createPrivateKey, createPublicKey, generateKeyPairSync, randomBytes, randomUUID, type JsonWebKey, type KeyObject } from 'node:crypto';
import { createSecureServer, type Http2Server, type Http2Session, type IncomingHttpHeaders, type ServerHttp2Stream } from 'node:http2';
import type { AddressInfo } from 'node:net';
import { SignJWT, jwtVerify } from 'jose';
import { makeTestCertificates } from './tls.js';

export const APNS_PUSH_TYPES = ['alert', 'background', 'voip', 'complication', 'fileprovider', 'mdm', 'liveactivity', 'location', 'pushtotalk'] as const;
export type ApnsPushType = (typeof APNS_PUSH_TYPES)[number];

/** The request headers a recorded request keeps (lowercased, only those the client sent). */
export const RECORDED_HEADERS = ['authorization', 'apns-topic', 'apns-push-type', 'apns-priority', 'apns-expiration', 'apns-collapse-id', 'apns-id'] as const;
export type RecordedHeaderName = (typeof RECORDED_HEADERS)[number];

export type RecordedRequest = {
  /** The device token from the path ('' when the path had none or was not /3/device/...). */
  token: string;
  method: string;
  path: string;
  headers: Partial<Record<RecordedHeaderName, string>>;
  /** The parsed JSON body; null when empty, too large or not JSON. */
  payload: unknown;
  /** The status the peer answered. */
  status: number;
  /** The `reason` of an error answer; null on 200. */
  reason: string | null;
  /** The `apns-id` the peer answered with. */
  apnsId: string;
  /** When the answer was decided (ms). */
  at: number;
};

/**
 * Overrides the answer to valid requests (those that pass every check Apple would make).
 * Rules are tried in the order they were added; a rule with `token` only matches that token.
 * A rule with `status` decides the answer; a rule with only `delayMs` delays the answer and lets
 * later rules (or the normal 200) decide it. A rule with `times` is removed after that many uses.
 */
export type ResponseRule = {
  token?: string;
  status?: number;
  /** The `reason` in the JSON body of a non-200 answer (default: Apple's reason for the status). */
  reason?: string;
  /** For 410: the `timestamp` (ms) in the body; defaults to now. */
  timestamp?: number;
  times?: number;
  delayMs?: number;
  /**
   * Answers the status's headers, then one byte of body every 200 ms and never ends the stream (a
   * broken or hostile peer: each byte resets a client's inactivity timeout).
   */
  trickle?: boolean;
};

export type ApnsPeerOptions = {
  /** Key ID of the provider signing key: the JWT header `kid` must equal it. */
  keyId: string;
  /** Team ID: the JWT claim `iss` must equal it. */
  teamId: string;
  /** The ES256 public key matching the provider's .p8 private key: KeyObject, PEM or JWK. */
  publicKey: KeyObject | string | JsonWebKey;
  /**
   * The app's bundle id (or several). When set, `apns-topic` must be it with the suffix Apple
   * requires for the push type (`.voip`, `.complication`, `.pushkit.fileprovider`,
   * `.push-type.liveactivity`, `.location-query`, `.voip-ptt`); mdm topics are not checked.
   */
  topic?: string | string[];
  /** Keep every request in `requests` (default true). Turn off for benchmarks. */
  record?: boolean;
  /** HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS advertised to clients (default 1000, as APNs does). */
  maxConcurrentStreams?: number;
  /** Answer with an `apns-unique-id` header on 200, as the sandbox does (default true). */
  uniqueId?: boolean;
  /** Port to listen on (default 0: any free port). */
  port?: number;
};

export type ApnsPeer = {
  host: '127.0.0.1';
  port: number;
  /** `https://127.0.0.1:<port>` */
  origin: string;
  /** PEM of the CA that signed the peer's certificate. */
  ca: string;
  /** Requests answered so far (empty when started with `record: false`). */
  readonly requests: RecordedRequest[];
  /** Streams received. */
  readonly received: number;
  /** Requests answered 200. */
  readonly accepted: number;
  /** Requests answered with an error status. */
  readonly rejected: number;
  /** HTTP/2 sessions (client connections) open now. */
  readonly openSessions: number;
  /** HTTP/2 sessions opened so far. */
  readonly sessionsOpened: number;
  respondWith(rule: ResponseRule): void;
  /** Forgets recorded requests, counters and rules. */
  reset(): void;
  close(): Promise<void>;
};

export type ProviderKey = {
  /** 10 characters, like the Key ID Apple shows next to a .p8 key. */
  keyId: string;
  /** 10 characters, like an Apple Developer Team ID. */
  teamId: string;
  /** PKCS#8 PEM: exactly what an Apple AuthKey_XXXXXXXXXX.p8 file holds. */
  privateKeyPem: string;
  publicKey: KeyObject;
};

/** A fresh provider signing key, like one downloaded from Apple (P-256, ES256). */
export function generateProviderKey(): ProviderKey {
  const { privateKey, publicKey } = generateKeyPairSync('ec', { namedCurve: 'prime256v1' });
  return {
    keyId: appleId(),
    teamId: appleId(),
    privateKeyPem: privateKey.export({ type: 'pkcs8', format: 'pem' }).toString(),
    publicKey,
  };
}

/** A provider token (JWT) as an APNs client makes one; `issuedAt` (unix seconds) defaults to now. */
export async function signProviderToken(key: Pick<ProviderKey, 'keyId' | 'teamId' | 'privateKeyPem'>, issuedAt?: number): Promise<string> {
  return new SignJWT({})
    .setProtectedHeader({ alg: 'ES256', kid: key.keyId })
    .setIssuer(key.teamId)
    .setIssuedAt(issuedAt ?? Math.floor(Date.now() / 1000))
    .sign(createPrivateKey(key.privateKeyPem));
}

const APPLE_ID_ALPHABET = 'ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789';
function appleId(): string {
  return Array.from(randomBytes(10), (b) => APPLE_ID_ALPHABET[b % APPLE_ID_ALPHABET.length]).join('');
}

const TOKEN_MAX_AGE_SECONDS = 3600;
/** Tolerated clock skew for an `iat` in the future. */
const TOKEN_FUTURE_SKEW_SECONDS = 60;
const MAX_PAYLOAD_BYTES = 4096;
const MAX_VOIP_PAYLOAD_BYTES = 5120;
const MAX_COLLAPSE_ID_BYTES = 64;
/** Body bytes kept beyond the limit are pointless: the answer is 413 either way. */
const MAX_BODY_KEPT = MAX_VOIP_PAYLOAD_BYTES + 1;
const JWT_CACHE_LIMIT = 10_000;

const TOPIC_SUFFIX: Record<ApnsPushType, string | null> = {
  alert: '',
  background: '',
  voip: '.voip',
  complication: '.complication',
  fileprovider: '.pushkit.fileprovider',
  mdm: null,
  liveactivity: '.push-type.liveactivity',
  location: '.location-query',
  pushtotalk: '.voip-ptt',
};
const PRIORITIES = new Set(['10', '5', '1']);
/** Device tokens: hex, an even number of digits from 64 to 200 (32 to 100 bytes). */
const HEX = /^[0-9a-fA-F]+$/;
const DIGITS = /^\d{1,12}$/;
const UUID = /^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$/;
const DEVICE_PATH = '/3/device/';

const DEFAULT_REASON: Record<number, string> = {
  400: 'BadDeviceToken',
  403: 'InvalidProviderToken',
  404: 'BadPath',
  405: 'MethodNotAllowed',
  410: 'Unregistered',
  413: 'PayloadTooLarge',
  429: 'TooManyRequests',
  500: 'InternalServerError',
  503: 'ServiceUnavailable',
};

/** A verified (or refused) provider token: `iat` when good, else the 403 reason. */
type TokenVerdict = { iat: number; reason: null } | { iat: 0; reason: string };

type Answer = { status: number; reason: string | null; timestamp?: number; delayMs: number; trickle?: boolean };
const OK: Answer = Object.freeze({ status: 200, reason: null, delayMs: 0 });
const INVALID_TOKEN: TokenVerdict = Object.freeze({ iat: 0, reason: 'InvalidProviderToken' });

export async function startApnsPeer(options: ApnsPeerOptions): Promise<ApnsPeer> {
  const { caPem, keyPem, certPem } = makeTestCertificates();
  const publicKey = toPublicKey(options.publicKey);
  const topics = options.topic === undefined ? null : Array.isArray(options.topic) ? options.topic : [options.topic];
  // The topics accepted for each push type (null: any topic).
  const topicsByType = new Map<string, Set<string> | null>(
    APNS_PUSH_TYPES.map((type) => {
      const suffix = TOPIC_SUFFIX[type];
      return [type, topics && suffix !== null ? new Set(topics.map((t) => t + suffix)) : null];
    }),
  );
  const record = options.record ?? true;
  const uniqueId = options.uniqueId ?? true;
  const maxConcurrentStreams = options.maxConcurrentStreams ?? 1000;

  const requests: RecordedRequest[] = [];
  let rules: ResponseRule[] = [];
  let received = 0;
  let accepted = 0;
  let rejected = 0;
  let sessionsOpened = 0;
  let closed = false;
  const verdicts = new Map<string, TokenVerdict>();
  const pending = new Map<string, Promise<TokenVerdict>>();
  const sessions = new Set<Http2Session>();
  const timers = new Set<NodeJS.Timeout>();

  async function verify(jwt: string): Promise<TokenVerdict> {
    let verdict: TokenVerdict;
    try {
      const { payload, protectedHeader } = await jwtVerify(jwt, publicKey, { algorithms: ['ES256'], issuer: options.teamId });
      if (protectedHeader.kid !== options.keyId || typeof payload.iat !== 'number') verdict = INVALID_TOKEN;
      else if (payload.iat > Date.now() / 1000 + TOKEN_FUTURE_SKEW_SECONDS) verdict = INVALID_TOKEN;
      else verdict = { iat: payload.iat, reason: null };
    } catch {
      verdict = INVALID_TOKEN;
    }
    if (verdicts.size >= JWT_CACHE_LIMIT) verdicts.clear();
    verdicts.set(jwt, verdict);
    return verdict;
  }

  /** The 403 reason for this authorization header, or null when it is good. */
  function authReason(verdict: TokenVerdict): string | null {
    if (verdict.reason) return verdict.reason;
    return Date.now() / 1000 - verdict.iat > TOKEN_MAX_AGE_SECONDS ? 'ExpiredProviderToken' : null;
  }

  /** Every check but the provider token, in the order the answer reports the first failure. */
  function checkRequest(token: string, headers: IncomingHttpHeaders, body: Buffer | null, size: number): { status: number; reason: string } | null {
    if (token === '') return { status: 400, reason: 'MissingDeviceToken' };
    if (token.length < 64 || token.length > 200 || token.length % 2 !== 0 || !HEX.test(token)) return { status: 400, reason: 'BadDeviceToken' };

    const pushTypeHeader = headers['apns-push-type'];
    const pushType = pushTypeHeader === undefined ? 'alert' : pushTypeHeader;
    const allowedTopics = typeof pushType === 'string' ? topicsByType.get(pushType) : undefined;
    if (allowedTopics === undefined) return { status: 400, reason: 'InvalidPushType' };

    const topic = headers['apns-topic'];
    if (typeof topic !== 'string' || topic === '') return { status: 400, reason: 'MissingTopic' };
    if (allowedTopics && !allowedTopics.has(topic)) return { status: 400, reason: 'BadTopic' };

    const priority = headers['apns-priority'];
    if (priority !== undefined && (typeof priority !== 'string' || !PRIORITIES.has(priority))) return { status: 400, reason: 'BadPriority' };

    const expiration = headers['apns-expiration'];
    if (expiration !== undefined && (typeof expiration !== 'string' || !DIGITS.test(expiration))) return { status: 400, reason: 'BadExpirationDate' };

    const collapseId = headers['apns-collapse-id'];
    if (collapseId !== undefined && (typeof collapseId !== 'string' || Buffer.byteLength(collapseId) > MAX_COLLAPSE_ID_BYTES)) return { status: 400, reason: 'BadCollapseId' };

    const apnsId = headers['apns-id'];
    if (apnsId !== undefined && (typeof apnsId !== 'string' || !UUID.test(apnsId))) return { status: 400, reason: 'BadMessageId' };

    if (size === 0) return { status: 400, reason: 'PayloadEmpty' };
    if (size > (pushType === 'voip' ? MAX_VOIP_PAYLOAD_BYTES : MAX_PAYLOAD_BYTES)) return { status: 413, reason: 'PayloadTooLarge' };
    if (body === null) return { status: 400, reason: 'BadPayload' };
    return null;
  }

  /** The rules' answer for a valid request to `token` (consumes the rules it uses). */
  function ruleAnswer(token: string): Answer | null {
    let delayMs = 0;
    for (let i = 0; i < rules.length; i++) {
      const rule = rules[i]!;
      if (rule.token !== undefined && rule.token.toLowerCase() !== token.toLowerCase()) continue;
      if (rule.times !== undefined && --rule.times <= 0) rules.splice(i--, 1);
      delayMs += rule.delayMs ?? 0;
      if (rule.status !== undefined && rule.status !== 200) {
        const reason = rule.reason ?? DEFAULT_REASON[rule.status] ?? 'InternalServerError';
        return { status: rule.status, reason, timestamp: rule.status === 410 ? (rule.timestamp ?? Date.now()) : rule.timestamp, delayMs, trickle: rule.trickle };
      }
      if (rule.status === 200) return { status: 200, reason: null, delayMs };
    }
    return delayMs > 0 ? { status: 200, reason: null, delayMs } : null;
  }

  function send(stream: ServerHttp2Stream, answer: Answer, apnsId: string): void {
    if (stream.destroyed || stream.closed) return;
    if (answer.status === 200) {
      const out: Record<string, string | number> = { ':status': 200, 'apns-id': apnsId };
      if (uniqueId) out['apns-unique-id'] = randomUUID();
      stream.respond(out, { endStream: true });
      return;
    }
    const body: { reason: string | null; timestamp?: number } = { reason: answer.reason };
    if (answer.timestamp !== undefined) body.timestamp = answer.timestamp;
    stream.respond({ ':status': answer.status, 'apns-id': apnsId, 'content-type': 'application/json; charset=utf-8' });
    if (answer.trickle) {
      const drip = setInterval(() => {
        if (stream.destroyed || stream.closed || closed) {
          clearInterval(drip);
          timers.delete(drip as unknown as NodeJS.Timeout);
        } else stream.write(' ');
      }, 200);
      timers.add(drip as unknown as NodeJS.Timeout);
      return;
    }
    stream.end(JSON.stringify(body));
  }

  /** Answers a request whose body has been read, once its provider token is judged. */
  function decide(stream: ServerHttp2Stream, headers: IncomingHttpHeaders, chunks: Buffer[], size: number, token: string, early: Answer | null, verdict: TokenVerdict | null): void {
    let answer = early;
    let payload: unknown = null;
    if (!answer) {
      const auth = verdict ? authReason(verdict) : 'MissingProviderToken';
      if (auth) answer = { status: 403, reason: auth, delayMs: 0 };
    }
    if (!answer) {
      // Parse only bodies within the limits: the answer is 413 otherwise.
      let body: Buffer | null = null;
      if (size > 0 && size <= MAX_VOIP_PAYLOAD_BYTES) {
        const raw = chunks.length === 1 ? chunks[0]! : Buffer.concat(chunks);
        try {
          payload = JSON.parse(raw.toString('utf8'));
          body = raw;
        } catch {
          payload = null;
        }
      }
      const bad = checkRequest(token, headers, body, size);
      if (bad) answer = { status: bad.status, reason: bad.reason, delayMs: 0 };
      else answer = (rules.length > 0 ? ruleAnswer(token) : null) ?? OK;
    } else if (record && size > 0 && size <= MAX_VOIP_PAYLOAD_BYTES) {
      try {
        payload = JSON.parse(Buffer.concat(chunks).toString('utf8'));
      } catch {
        payload = null;
      }
    }

    const requestId = headers['apns-id'];
    const apnsId = typeof requestId === 'string' && UUID.test(requestId) ? requestId.toLowerCase() : randomUUID();
    if (answer.status === 200) accepted++;
    else rejected++;
    if (record) {
      const kept: Partial<Record<RecordedHeaderName, string>> = {};
      for (const name of RECORDED_HEADERS) {
        const value = headers[name];
        if (typeof value === 'string') kept[name] = value;
      }
      const method = String(headers[':method']);
      const path = String(headers[':path'] ?? '');
      requests.push({ token, method, path, headers: kept, payload, status: answer.status, reason: answer.reason, apnsId, at: Date.now() });
    }
    if (answer.delayMs > 0) {
      const final = answer;
      const timer = setTimeout(() => {
        timers.delete(timer);
        send(stream, final, apnsId);
      }, final.delayMs);
      timers.add(timer);
    } else send(stream, answer, apnsId);
  }

  // The last provider token seen: clients reuse one token for up to an hour.
  let lastJwt = '';
  let lastVerdict: TokenVerdict | null = null;

  function finish(stream: ServerHttp2Stream, headers: IncomingHttpHeaders, chunks: Buffer[], size: number): void {
    const path = headers[':path'];
    if (typeof path !== 'string' || !path.startsWith(DEVICE_PATH) || path.indexOf('/', DEVICE_PATH.length) !== -1 || path.includes('?')) {
      return decide(stream, headers, chunks, size, '', { status: 404, reason: 'BadPath', delayMs: 0 }, null);
    }
    const token = path.slice(DEVICE_PATH.length);
    if (headers[':method'] !== 'POST') return decide(stream, headers, chunks, size, token, { status: 405, reason: 'MethodNotAllowed', delayMs: 0 }, null);

    const authorization = headers.authorization;
    if (typeof authorization !== 'string' || authorization.length <= 7) return decide(stream, headers, chunks, size, token, null, null);
    if (authorization.slice(0, 7).toLowerCase() !== 'bearer ') return decide(stream, headers, chunks, size, token, null, INVALID_TOKEN);
    const jwt = authorization.slice(7).trim();
    if (jwt === '') return decide(stream, headers, chunks, size, token, null, null);
    if (jwt === lastJwt && lastVerdict) return decide(stream, headers, chunks, size, token, null, lastVerdict);
    const known = verdicts.get(jwt);
    if (known) {
      lastJwt = jwt;
      lastVerdict = known;
      return decide(stream, headers, chunks, size, token, null, known);
    }
    // Clients send many requests with a new token at once: verify it once.
    let verifying = pending.get(jwt);
    if (!verifying) {
      verifying = verify(jwt).finally(() => pending.delete(jwt));
      pending.set(jwt, verifying);
    }
    verifying.then(
      (verdict) => decide(stream, headers, chunks, size, token, null, verdict),
      () => decide(stream, headers, chunks, size, token, null, INVALID_TOKEN),
    );
  }

  const server: Http2Server = createSecureServer({
    key: keyPem,
    cert: certPem,
    allowHTTP1: false,
    settings: { maxConcurrentStreams },
    peerMaxConcurrentStreams: maxConcurrentStreams,
    maxSessionMemory: 64,
  });

  server.on('session', (session: Http2Session) => {
    if (closed) return void session.destroy();
    sessions.add(session);
    sessionsOpened++;
    session.on('close', () => sessions.delete(session));
    session.on('error', () => {});
  });
  server.on('sessionError', () => {});
  server.on('stream', (stream: ServerHttp2Stream, headers: IncomingHttpHeaders) => {
    received++;
    const chunks: Buffer[] = [];
    let size = 0;
    stream.on('error', () => {});
    stream.on('data', (chunk: Buffer) => {
      size += chunk.length;
      if (size <= MAX_BODY_KEPT) chunks.push(chunk);
    });
    // a stream its sender cut off (connection lost with the body half sent: a killed dispatcher) also
    // ends, aborted; APNs never gets it as a request, so it is neither answered nor recorded
    stream.on('end', () => {
      if (!stream.aborted) finish(stream, headers, chunks, size);
    });
  });

  await new Promise<void>((done, fail) => {
    server.once('error', fail);
    server.listen(options.port ?? 0, '127.0.0.1', () => {
      server.off('error', fail);
      done();
    });
  });
  const port = (server.address() as AddressInfo).port;

  return {
    host: '127.0.0.1',
    port,
    origin: `https://127.0.0.1:${port}`,
    ca: caPem,
    requests,
    get received() {
      return received;
    },
    get accepted() {
      return accepted;
    },
    get rejected() {
      return rejected;
    },
    get openSessions() {
      return sessions.size;
    },
    get sessionsOpened() {
      return sessionsOpened;
    },
    respondWith(rule: ResponseRule) {
      if (rule.times !== undefined && rule.times <= 0) return;
      rules.push({ ...rule });
    },
    reset() {
      requests.length = 0;
      rules = [];
      received = 0;
      accepted = 0;
      rejected = 0;
      sessionsOpened = 0;
    },
    close() {
      if (closed) return Promise.resolve();
      closed = true;
      for (const timer of timers) clearTimeout(timer);
      timers.clear();
      return new Promise<void>((done) => {
        server.close(() => done());
        for (const session of sessions) session.destroy();
      });
    },
  };
}

function toPublicKey(key: KeyObject | string | JsonWebKey): KeyObject {
  if (typeof key === 'string') return createPublicKey(key);
  if (isKeyObject(key)) return key.type === 'public' ? key : createPublicKey(key);
  return createPublicKey({ key, format: 'jwk' });
}

function isKeyObject(key: KeyObject | JsonWebKey): key is KeyObject {
  return typeof (key as KeyObject).export === 'function' && typeof (key as KeyObject).type === 'string';
}
