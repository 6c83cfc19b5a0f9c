import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

/**
 * Test TLS material made at runtime with the `openssl` command-line tool: a throwaway CA and a
 * server certificate it signed for `localhost` and the IP 127.0.0.1 (both in subjectAltName).
 * Nothing is committed to the tree; the keys live only in this process (the temporary folder is
 * removed once the files are read back). Made once per process and cached.
 */
export type TestCertificates = {
  /** PEM of the CA that signed the server certificate: what a client passes as `ca`. */
  caPem: string;
  /** PEM (PKCS#8) of the server's private key. */
  keyPem: string;
  /** PEM of the server certificate (CN=localhost, SAN DNS:localhost, IP:127.0.0.1). */
  certPem: string;
};

let cached: TestCertificates | null = null;

export function makeTestCertificates(): TestCertificates {
  if (cached) return cached;
  const dir = mkdtempSync(join(tmpdir(), 'herald-test-tls-'));
  try {
    const file = (name: string) => join(dir, name);
    const serial = () => `0x${BigInt(Date.now()).toString(16)}${Math.floor(Math.random() * 0xffffff).toString(16).padStart(6, '0')}`;
    // P-256 keys: quick to generate and to handshake with.
    openssl(['genpkey', '-algorithm', 'EC', '-pkeyopt', 'ec_paramgen_curve:P-256', '-out', file('ca.key')]);
    openssl([
      'req', '-x509', '-new', '-key', file('ca.key'), '-sha256', '-days', '2', '-set_serial', serial(),
      '-subj', '/O=Herald tests/CN=Herald test CA',
      '-addext', 'basicConstraints=critical,CA:TRUE',
      '-addext', 'keyUsage=critical,keyCertSign,cRLSign',
      '-out', file('ca.pem'),
    ]);
    openssl(['genpkey', '-algorithm', 'EC', '-pkeyopt', 'ec_paramgen_curve:P-256', '-out', file('server.key')]);
    openssl(['req', '-new', '-key', file('server.key'), '-sha256', '-subj', '/O=Herald tests/CN=localhost', '-out', file('server.csr')]);
    writeFileSync(
      file('server.ext'),
      [
        'basicConstraints=critical,CA:FALSE',
        'keyUsage=critical,digitalSignature,keyEncipherment',
        'extendedKeyUsage=serverAuth',
        'subjectAltName=DNS:localhost,IP:127.0.0.1',
        '',
      ].join('\n'),
    );
    openssl([
      'x509', '-req', '-in', file('server.csr'), '-CA', file('ca.pem'), '-CAkey', file('ca.key'),
      '-set_serial', serial(), '-days', '2', '-sha256', '-extfile', file('server.ext'), '-out', file('server.pem'),
    ]);
    cached = {
      caPem: readFileSync(file('ca.pem'), 'utf8'),
      keyPem: readFileSync(file('server.key'), 'utf8'),
      certPem: readFileSync(file('server.pem'), 'utf8'),
    };
    return cached;
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

function openssl(args: string[]): void {
  try {
    execFileSync('openssl', args, { stdio: ['ignore', 'ignore', 'pipe'] });
  } catch (err) {
    const e = err as NodeJS.ErrnoException & { stderr?: Buffer };
    if (e.code === 'ENOENT') {
      throw new Error('test TLS certificates need the `openssl` command-line tool, which is not on PATH (Debian/Ubuntu: apt-get install openssl)');
    }
    const detail = e.stderr?.toString().trim() || e.message;
    throw new Error(`openssl ${args[0]} failed while making test TLS certificates: ${detail}`);
  }
}
