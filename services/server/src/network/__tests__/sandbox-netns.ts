/**
 * Test fixture: a "sandbox" as a network namespace with a veth to the host and an address from
 * a unique /24 of 10.211.192.0/19 (testkit claimTestSubnet), running (as a child node
 * process inside the netns) an HTTP server on 8080 (/echo: method, path, headers and body back
 * as JSON; /trickle: three chunks, each written when the test asks via /next; /headfirst: the
 * head at once, the body when asked via /next; /cut: 10 of 100 bytes, then the connection
 * closes), a WebSocket echo
 * on 8081 (text frames) and a TCP echo on 8082, plus a TCP echo on 127.0.0.1:8083 and an HTTP
 * server on 127.0.0.1:8084 only (for ForwardPort). stop() removes the process, veth, netns and lock even after a failure.
 */
import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { claimTestSubnet } from '@sandnode/testkit';

export interface SandboxNetns {
  name: string;
  /** the sandbox's address (10.209.<o>.2) */
  address: string;
  gateway: string;
  /** run argv inside the netns (a child process) */
  spawnInside(argv: string[]): ChildProcess;
  stop(): void;
}

const SERVER_JS = String.raw`
const http = require('node:http'); const net = require('node:net'); const crypto = require('node:crypto');
let pendingNext = [];
http.createServer((req, res) => {
  if (req.url.startsWith('/trickle')) {
    res.writeHead(200, { 'content-type': 'text/plain' });
    let n = 0; const step = () => { n++; res.write('chunk' + n + '\n'); if (n === 3) res.end(); else pendingNext.push(step); };
    step(); return;
  }
  if (req.url.startsWith('/headfirst')) { res.writeHead(200, { 'content-type': 'text/plain' }); res.flushHeaders(); pendingNext.push(() => res.end('body')); return; }
  if (req.url.startsWith('/cut')) { res.writeHead(200, { 'content-length': '100' }); res.write('0123456789', () => setTimeout(() => res.socket.destroy(), 50)); return; }
  if (req.url.startsWith('/next')) { const s = pendingNext.shift(); if (s) s(); res.end(s ? 'ok' : 'none'); return; }
  const body = []; req.on('data', (d) => body.push(d));
  req.on('end', () => { res.setHeader('content-type', 'application/json'); res.end(JSON.stringify({ method: req.method, url: req.url, headers: req.headers, body: Buffer.concat(body).toString() })); });
}).listen(8080, '0.0.0.0');
const ws = http.createServer((req, res) => { res.writeHead(426); res.end('websocket only'); });
ws.on('upgrade', (req, sock) => {
  const accept = crypto.createHash('sha1').update(req.headers['sec-websocket-key'] + '258EAFA5-E914-47DA-95CA-C5AB0DC85B11').digest('base64');
  sock.write('HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: ' + accept + '\r\n\r\n');
  let buf = Buffer.alloc(0);
  sock.on('data', (d) => { buf = Buffer.concat([buf, d]);
    for (;;) { if (buf.length < 2) return; let len = buf[1] & 127, off = 2; if (len === 126) { if (buf.length < 4) return; len = buf.readUInt16BE(2); off = 4; }
      if (buf.length < off + 4 + len) return; const mask = buf.subarray(off, off + 4); const p = Buffer.from(buf.subarray(off + 4, off + 4 + len));
      for (let i = 0; i < p.length; i++) p[i] ^= mask[i % 4]; const op = buf[0] & 15; buf = buf.subarray(off + 4 + len);
      if (op === 8) { sock.end(); return; }
      const head = p.length < 126 ? Buffer.from([0x81, p.length]) : Buffer.from([0x81, 126, p.length >> 8, p.length & 255]); sock.write(Buffer.concat([head, p])); } });
  sock.on('error', () => {});
});
ws.listen(8081, '0.0.0.0');
const echo = (s) => { s.on('error', () => {}); s.pipe(s); };
net.createServer(echo).listen(8082, '0.0.0.0');
http.createServer((req, res) => res.end('loopback http ' + req.url)).listen(8084, '127.0.0.1');
net.createServer(echo).listen(8083, '127.0.0.1', () => process.stdout.write('ready\n'));
`;

function ip(...args: string[]): void {
  execFileSync('ip', args, { stdio: 'pipe' });
}

/** startSandboxNetns makes the netns and starts its servers (resolves once they listen). */
export async function startSandboxNetns(): Promise<SandboxNetns & { dir: string }> {
  const tag = randomBytes(3).toString('hex');
  const name = `sning${tag}`;
  const hostIf = `sni${tag}h`;
  // the ingress tests' share of the test ranges (testkit claimTestSubnet: no other test gets it)
  const subnet = claimTestSubnet('10.211.192.0/19', 24);
  const gateway = subnet.host(1);
  const address = subnet.host(2);
  const dir = path.join(tmpdir(), `ingress-netns-${tag}`);
  const children: ChildProcess[] = [];
  const stop = () => {
    for (const c of children) if (c.exitCode === null) c.kill('SIGKILL');
    try {
      ip('link', 'del', hostIf);
    } catch {
      /* gone */
    }
    try {
      ip('netns', 'del', name);
    } catch {
      /* gone */
    }
    rmSync(dir, { recursive: true, force: true });
    subnet.release();
  };
  try {
    mkdirSync(dir, { recursive: true });
    writeFileSync(path.join(dir, 'servers.js'), SERVER_JS);
    ip('netns', 'add', name);
    ip('link', 'add', hostIf, 'type', 'veth', 'peer', 'name', 'eth0', 'netns', name);
    ip('addr', 'add', `${gateway}/30`, 'dev', hostIf);
    ip('link', 'set', hostIf, 'up');
    ip('-n', name, 'addr', 'add', `${address}/30`, 'dev', 'eth0');
    ip('-n', name, 'link', 'set', 'eth0', 'up');
    ip('-n', name, 'link', 'set', 'lo', 'up');
    ip('-n', name, 'route', 'add', 'default', 'via', gateway);
    const spawnInside = (argv: string[]) => {
      const c = spawn('ip', ['netns', 'exec', name, ...argv], { stdio: ['ignore', 'pipe', 'inherit'] });
      children.push(c);
      return c;
    };
    const srv = spawnInside([process.execPath, path.join(dir, 'servers.js')]);
    await new Promise<void>((resolve, reject) => {
      srv.stdout!.on('data', (d: Buffer) => d.toString().includes('ready') && resolve());
      srv.once('exit', (code) => reject(new Error(`the netns servers exited (${code})`)));
    });
    return { name, address, gateway, dir, spawnInside, stop };
  } catch (err) {
    stop();
    throw err;
  }
}
