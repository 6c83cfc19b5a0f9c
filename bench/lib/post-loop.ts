// A bare node:http client as a child process (the baseline of `npm run bench -- webhooks`):
// `node --import tsx bench/lib/post-loop.ts <url> <count> <concurrency> <body file>` POSTs the body
// `count` times over keep-alive connections, `concurrency` at a time, each with its own webhook-id
// (`whe_base<n>`), then exits. The receiver measures the rate, as it does for the dispatcher.
import { readFileSync } from 'node:fs';
import { Agent, request } from 'node:http';

const [url, countText, concurrencyText, bodyFile] = process.argv.slice(2);
const target = new URL(url!);
if (target.hostname !== '127.0.0.1') throw new Error('post-loop only targets 127.0.0.1');
const count = Number(countText);
const concurrency = Number(concurrencyText);
const body = readFileSync(bodyFile!);
const agent = new Agent({ keepAlive: true, maxSockets: concurrency });
let next = 0;

const one = (n: number) => new Promise<void>((done) => {
  const req = request({
    host: target.hostname, port: target.port, path: target.pathname, method: 'POST', agent,
    headers: { 'content-type': 'application/json', 'content-length': body.length, 'webhook-id': `whe_base${n}`, 'webhook-timestamp': '0', 'webhook-signature': 'v1,x' },
  }, (res) => {
    res.resume();
    res.on('end', () => done());
  });
  req.on('error', () => done());
  req.end(body);
});

await Promise.all(Array.from({ length: concurrency }, async () => {
  while (next < count) await one(next++);
}));
agent.destroy();
const cpu = process.cpuUsage();
process.stderr.write(`cpu_us=${cpu.user + cpu.system}\n`);
