import { createServer, type IncomingHttpHeaders, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo, Socket } from 'node:net';
import { Webhook } from 'standardwebhooks';

/**
 * A webhook receiver for tests, as a customer would write one: a real HTTP server on 127.0.0.1
 * port 0 that verifies every request with the reference `standardwebhooks` package against each
 * secret it knows, records it, and answers as the test says (status, delay, hang, dropped socket).
 */
export type Received = {
  path: string;
  headers: IncomingHttpHeaders;
  /** the exact bytes received */
  raw: Buffer;
  body: any;
  id: string;
  timestamp: number;
  signatures: string[];
  /** which of the receiver's secrets `new Webhook(secret).verify(raw, headers)` accepted */
  verifiedBy: string[];
  /** verification errors per secret that did not verify */
  failures: string[];
  at: number;
};

export type Answer = { status?: number; body?: string; headers?: Record<string, string>; delayMs?: number; hang?: boolean; destroy?: boolean };
export type Behaviour = (request: Received, index: number) => Answer;

export type Receiver = {
  url: string;
  port: number;
  requests: Received[];
  /** the secrets every request is verified against */
  secrets: string[];
  behave(behaviour: Behaviour): void;
  /** requests whose webhook-id is `id` */
  withId(id: string): Received[];
  close(): Promise<void>;
};

const TOLERANCE_SECONDS = 5 * 60;

/**
 * The reference verifier. With `clockMs` (a test that moved the service's clock) the timestamp
 * tolerance is checked against that clock, as a receiver whose clock agrees with the sender's;
 * the signature check is the library's own.
 */
export function verifier(secret: string, clockMs?: () => number): Webhook {
  const webhook = new Webhook(secret);
  if (clockMs) {
    (webhook as unknown as { verifyTimestamp: (header: string) => Date }).verifyTimestamp = (header: string) => {
      const timestamp = parseInt(header, 10);
      const nowSeconds = Math.floor(clockMs() / 1000);
      if (Number.isNaN(timestamp) || Math.abs(nowSeconds - timestamp) > TOLERANCE_SECONDS) throw new Error(`timestamp ${header} is not within 5 minutes of ${nowSeconds}`);
      return new Date(timestamp * 1000);
    };
  }
  return webhook;
}

export async function startReceiver(options: { secrets?: string[]; behaviour?: Behaviour; clockMs?: () => number } = {}): Promise<Receiver> {
  const requests: Received[] = [];
  let behaviour: Behaviour = options.behaviour ?? (() => ({ status: 204 }));
  const sockets = new Set<Socket>();
  const timers = new Set<NodeJS.Timeout>();
  const receiver: Receiver = {
    url: '',
    port: 0,
    requests,
    secrets: options.secrets ?? [],
    behave: (b) => (behaviour = b),
    withId: (id) => requests.filter((r) => r.id === id),
    close: () => new Promise<void>((done) => {
      for (const t of timers) clearTimeout(t);
      server.close(() => done());
      for (const s of sockets) s.destroy();
    }),
  };

  const answer = (res: ServerResponse, a: Answer) => {
    if (a.destroy) return void res.socket?.destroy();
    if (a.hang) return;
    res.writeHead(a.status ?? 204, a.headers ?? {});
    res.end(a.body ?? '');
  };

  const server: Server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const raw = Buffer.concat(chunks);
      const headers: Record<string, string> = {};
      for (const [k, v] of Object.entries(req.headers)) if (typeof v === 'string') headers[k] = v;
      const verifiedBy: string[] = [];
      const failures: string[] = [];
      for (const secret of receiver.secrets) {
        try {
          verifier(secret, options.clockMs).verify(raw, headers);
          verifiedBy.push(secret);
        } catch (err) {
          failures.push(`${secret.slice(0, 10)}…: ${(err as Error).message}`);
        }
      }
      let body: unknown = null;
      try {
        body = JSON.parse(raw.toString('utf8'));
      } catch {
        body = null;
      }
      const received: Received = {
        path: req.url ?? '', headers: req.headers, raw, body,
        id: headers['webhook-id'] ?? '', timestamp: Number(headers['webhook-timestamp']), signatures: (headers['webhook-signature'] ?? '').split(' ').filter(Boolean),
        verifiedBy, failures, at: Date.now(),
      };
      requests.push(received);
      const a = behaviour(received, requests.length - 1);
      if (a.delayMs) {
        const timer = setTimeout(() => {
          timers.delete(timer);
          answer(res, a);
        }, a.delayMs);
        timers.add(timer);
      } else answer(res, a);
    });
  });
  server.on('connection', (s) => {
    sockets.add(s);
    s.on('close', () => sockets.delete(s));
  });
  await new Promise<void>((done) => server.listen(0, '127.0.0.1', () => done()));
  receiver.port = (server.address() as AddressInfo).port;
  receiver.url = `http://127.0.0.1:${receiver.port}`;
  return receiver;
}
