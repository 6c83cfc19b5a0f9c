import { readFileSync } from 'node:fs';
import { createServer } from 'node:net';

/**
 * A port nothing listens on now, for a process the test spawns. Picked at random below the kernel's
 * ephemeral range: a port the kernel handed out for `listen(0)` and then freed could be handed to
 * another shard's process, or taken as the local end of an outbound connection, before ours binds it
 * (a CI run: a web process of another shard answered for ours).
 */
export async function freePort(): Promise<number> {
  const below = ephemeralLow();
  for (let attempt = 0; attempt < 100; attempt++) {
    const port = 10_000 + Math.floor(Math.random() * (below - 10_000));
    if (await canListen(port)) return port;
  }
  throw new Error(`no free port found in 10000-${below - 1} after 100 tries`);
}

function ephemeralLow(): number {
  try {
    const low = Number(readFileSync('/proc/sys/net/ipv4/ip_local_port_range', 'utf8').trim().split(/\s+/)[0]);
    return Number.isInteger(low) && low > 11_000 ? low : 32_768;
  } catch {
    return 32_768;
  }
}

function canListen(port: number): Promise<boolean> {
  return new Promise((done) => {
    const s = createServer();
    s.once('error', () => done(false));
    s.listen(port, '127.0.0.1', () => s.close(() => done(true)));
  });
}
