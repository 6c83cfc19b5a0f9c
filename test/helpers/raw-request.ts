import { connect } from 'node:net';

export type RawAnswer = { status: number; headers: Record<string, string>; body: string; text: string };

/**
 * Writes `bytes` (a whole request, as it goes on the wire) to the server of `url` on a new
 * connection, and reads what comes back until the server closes it: for requests `fetch` cannot
 * make (a header on two lines, no Host, bytes outside latin1's printable range). Send
 * `Connection: close` unless the server closes by itself. `headers` keeps the last line of a name.
 */
export function rawRequest(url: string, bytes: string | Buffer): Promise<RawAnswer> {
  const { hostname, port } = new URL(url);
  return new Promise((resolve, reject) => {
    const socket = connect(Number(port), hostname, () => socket.write(bytes));
    let text = '';
    socket.on('data', (chunk) => (text += chunk));
    socket.on('error', reject);
    socket.on('close', () => {
      const cut = text.indexOf('\r\n\r\n');
      const [statusLine = '', ...lines] = (cut < 0 ? text : text.slice(0, cut)).split('\r\n');
      const headers = Object.fromEntries(lines.map((l) => [l.slice(0, l.indexOf(':')).toLowerCase(), l.slice(l.indexOf(':') + 1).trim()]));
      resolve({ status: Number(statusLine.split(' ')[1]), headers, body: cut < 0 ? '' : text.slice(cut + 4), text });
    });
  });
}
