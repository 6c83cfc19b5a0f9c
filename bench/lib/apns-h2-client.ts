import { connect, constants, type ClientHttp2Session } from 'node:http2';
import { createHistogram } from 'node:perf_hooks';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { buildApnsRequest, type PushContent } from '../../lib/apns-payload.js';
import { signProviderToken } from '../../test/helpers/apns-peer.js';
import { forkIpc, serveParent, tellParent, type IpcMessage } from './ipc-child.js';

/**
 * The ceiling of a push fan-out: a bare Node `http2` client, in a child process of its own, sending
 * `total` pushes to the APNs peer over ONE session (as node-apn does per tenant and environment)
 * with `concurrency` streams in flight, each with the payload and headers Herald sends
 * (lib/apns-payload.ts `buildApnsRequest`: one payload per delivery, its own apns-id, collapse id,
 * a provider token), and nothing else: no Redis, no limiter, no bookkeeping.
 */
export type H2LoadOptions = {
  port: number;
  ca: string;
  keyId: string;
  teamId: string;
  privateKeyPem: string;
  /** apns-topic (the bundle id) */
  topic: string;
  content: PushContent;
  messageId: string;
  total: number;
  concurrency: number;
  /** requests sent before measuring (not counted) */
  warmup?: number;
  /** per request, default 10 s */
  timeoutMs?: number;
};

export type H2LoadResult = {
  total: number;
  ok: number;
  statuses: Record<string, number>;
  errors: number;
  seconds: number;
  perSec: number;
  p50Ms: number;
  p99Ms: number;
};

const SCRIPT = fileURLToPath(import.meta.url);

/** Runs the bare client in a child process and returns its figures. */
export async function h2Load(options: H2LoadOptions): Promise<H2LoadResult> {
  const child = forkIpc(SCRIPT, ['--client']);
  try {
    await child.next('ready', 30_000);
    const reply = await child.request<IpcMessage & { result: H2LoadResult }>({ type: 'run', options }, 'result', (options.timeoutMs ?? 120_000) + 10_000);
    return reply.result;
  } finally {
    await child.stop();
  }
}

/** The device token of request (or subscriber) `i`: 64 hex digits. */
export const deviceToken = (i: number) => `f${i.toString(16).padStart(63, '0')}`;

async function run(o: H2LoadOptions): Promise<H2LoadResult> {
  const jwt = await signProviderToken({ keyId: o.keyId, teamId: o.teamId, privateKeyPem: o.privateKeyPem });
  const session: ClientHttp2Session = connect(`https://127.0.0.1:${o.port}`, { ca: o.ca });
  session.on('error', () => undefined);
  await new Promise<void>((done, fail) => {
    session.once('connect', () => done());
    session.once('error', fail);
  });
  const collapseId = o.content.collapseId ?? o.messageId;
  const content = { ...o.content, collapseId };
  const latency = createHistogram();
  const statuses: Record<string, number> = {};
  let errors = 0;
  let ok = 0;

  const one = (i: number, measured: boolean) => new Promise<void>((done) => {
    const deliveryId = `dlv_${i.toString(36).padStart(26, '0')}`;
    const request = buildApnsRequest(content, { messageId: o.messageId, deliveryId });
    const headers: Record<string, string | number> = {
      [constants.HTTP2_HEADER_METHOD]: 'POST',
      [constants.HTTP2_HEADER_PATH]: `/3/device/${deviceToken(i)}`,
      [constants.HTTP2_HEADER_SCHEME]: 'https',
      authorization: `bearer ${jwt}`,
      'apns-topic': o.topic,
      'apns-push-type': request.headers.pushType,
      'apns-priority': request.headers.priority,
      'apns-id': request.headers.apnsId,
    };
    if (request.headers.collapseId !== undefined) headers['apns-collapse-id'] = request.headers.collapseId;
    if (request.headers.expiration !== undefined) headers['apns-expiration'] = request.headers.expiration;
    const t0 = performance.now();
    const stream = session.request(headers);
    let status = 0;
    stream.on('response', (h) => {
      status = Number(h[constants.HTTP2_HEADER_STATUS]);
    });
    stream.on('data', () => undefined);
    stream.setTimeout(o.timeoutMs ?? 10_000, () => stream.close(constants.NGHTTP2_CANCEL));
    stream.once('close', () => {
      if (measured) {
        if (status === 0) errors++;
        else {
          statuses[status] = (statuses[status] ?? 0) + 1;
          if (status === 200) ok++;
        }
        latency.record(Math.max(1, Math.round((performance.now() - t0) * 1000)));
      }
      done();
    });
    stream.on('error', () => undefined);
    stream.end(JSON.stringify(request.payload));
  });

  const drive = async (from: number, count: number, measured: boolean) => {
    let next = from;
    const end = from + count;
    const lane = async () => {
      while (next < end) await one(next++, measured);
    };
    await Promise.all(Array.from({ length: Math.min(o.concurrency, count) }, lane));
  };
  const warmup = o.warmup ?? Math.min(5_000, o.total);
  await drive(10_000_000, warmup, false);
  const started = performance.now();
  await drive(0, o.total, true);
  const seconds = (performance.now() - started) / 1000;
  await new Promise<void>((done) => session.close(() => done()));
  const pct = (p: number) => (latency.count > 0 ? latency.percentile(p) / 1000 : 0);
  return { total: o.total, ok, statuses, errors, seconds, perSec: seconds > 0 ? ok / seconds : 0, p50Ms: pct(50), p99Ms: pct(99) };
}

if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href && process.argv[2] === '--client') {
  serveParent(async (message) => {
    if (message.type === 'run') tellParent({ type: 'result', result: await run(message.options as H2LoadOptions) });
  });
  tellParent({ type: 'ready' });
}
