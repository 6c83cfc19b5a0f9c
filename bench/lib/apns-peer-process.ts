import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { startApnsPeer, type ApnsPeer } from '../../test/helpers/apns-peer.js';
import { forkIpc, serveParent, tellParent, type IpcMessage } from './ipc-child.js';

/**
 * The local APNs peer of test/helpers/apns-peer.ts (a real HTTP/2 TLS server speaking the APNs
 * provider API, checking the provider token, headers and payload of every request) in a child
 * process of its own, so that answering pushes does not share an event loop with the bench.
 * Nothing is recorded (`record: false`): only counts are kept.
 */
export type PeerProcessOptions = {
  keyId: string;
  teamId: string;
  /** SPKI PEM of the provider key */
  publicKeyPem: string;
  /** the app's bundle id */
  topic: string;
  maxConcurrentStreams?: number;
};

export type PeerStats = { received: number; accepted: number; rejected: number };

export type PeerProcess = {
  pid: number;
  host: '127.0.0.1';
  port: number;
  ca: string;
  /** a file holding `ca`, for APNS_CA_FILE */
  caFile: string;
  stats: () => Promise<PeerStats>;
  stop: () => Promise<void>;
};

const SCRIPT = fileURLToPath(import.meta.url);

export async function startApnsPeerProcess(options: PeerProcessOptions): Promise<PeerProcess> {
  const child = forkIpc(SCRIPT, ['--serve'], { HERALD_BENCH_PEER: JSON.stringify(options) });
  let ready: IpcMessage & { port: number; ca: string };
  try {
    ready = await child.next('ready', 30_000);
  } catch (err) {
    child.process.kill('SIGKILL');
    throw err;
  }
  const dir = mkdtempSync(join(tmpdir(), 'herald-bench-apns-'));
  const caFile = join(dir, 'ca.pem');
  writeFileSync(caFile, ready.ca);
  return {
    pid: child.process.pid!,
    host: '127.0.0.1',
    port: ready.port,
    ca: ready.ca,
    caFile,
    stats: async () => {
      const s = await child.request<IpcMessage & PeerStats>({ type: 'stats' }, 'stats', 10_000);
      return { received: s.received, accepted: s.accepted, rejected: s.rejected };
    },
    stop: async () => {
      await child.stop();
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

/** The child's side: `node --import tsx bench/lib/apns-peer-process.ts --serve` with HERALD_BENCH_PEER set. */
async function serve(): Promise<void> {
  const o = JSON.parse(process.env.HERALD_BENCH_PEER ?? '{}') as PeerProcessOptions;
  const peer: ApnsPeer = await startApnsPeer({
    keyId: o.keyId, teamId: o.teamId, publicKey: o.publicKeyPem, topic: o.topic, record: false, maxConcurrentStreams: o.maxConcurrentStreams ?? 1000,
  });
  serveParent((message) => {
    if (message.type === 'stats') tellParent({ type: 'stats', received: peer.received, accepted: peer.accepted, rejected: peer.rejected });
  }, () => peer.close());
  tellParent({ type: 'ready', port: peer.port, ca: peer.ca });
}

if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href && process.argv[2] === '--serve') await serve();
