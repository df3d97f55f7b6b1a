/**
 * Programs the network section (network.ts) runs inside a sandbox with the template's node, and
 * the nginx it runs on the host as the ingress's baseline.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync, mkdirSync, writeFileSync } from 'node:fs';
import net from 'node:net';
import path from 'node:path';

/** The port SANDBOX_SERVER listens on (every address of the sandbox). */
export const SANDBOX_PORT = 8080;

/**
 * SANDBOX_SERVER: GET /bytes/<n> streams n zero bytes (backpressure kept), any other GET
 * answers "ok" (2 bytes), an upgrade is answered 101 and the socket held open (as a WebSocket
 * server would) until the client closes it.
 */
export const SANDBOX_SERVER = String.raw`
const http = require('node:http');
const chunk = Buffer.alloc(65536);
const s = http.createServer((q, r) => {
  const m = /^\/bytes\/(\d+)$/.exec(q.url);
  if (!m) { r.writeHead(200, { 'content-length': 2 }); return r.end('ok'); }
  let left = Number(m[1]);
  r.writeHead(200, { 'content-type': 'application/octet-stream', 'content-length': left });
  const pump = () => {
    while (left > 0) {
      const n = Math.min(left, chunk.length);
      left -= n;
      if (!r.write(n === chunk.length ? chunk : chunk.subarray(0, n))) return r.once('drain', pump);
    }
    r.end();
  };
  pump();
});
s.keepAliveTimeout = 120000;
s.on('upgrade', (q, sock) => {
  sock.on('error', () => sock.destroy());
  sock.write('HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n');
});
s.listen(${SANDBOX_PORT}, '0.0.0.0');
`;

/**
 * EGRESS_CLIENT (argv: address, Host, download bytes, requests): downloads
 * http://<address>/bytes/<n> with that Host once, then sends the requests one at a time, each
 * on a new connection (the egress proxy decides per connection), after 10 warm-up ones; prints
 * {"mibPerS": number, "latencyMs": number[], "deniedStatus": number} where deniedStatus is the
 * status of one request with Host "denied.test" (403 through the proxy's block_all, 200 by NAT).
 */
export const EGRESS_CLIENT = String.raw`
const http = require('node:http');
const [addr, host, bytes, n] = process.argv.slice(2);
const get = (path, h) => new Promise((resolve, reject) => {
  const req = http.get({ host: addr, port: 80, path, headers: { host: h }, agent: false, timeout: 30000 }, (res) => {
    let got = 0;
    res.on('data', (c) => (got += c.length));
    res.on('end', () => resolve({ status: res.statusCode, got }));
  });
  req.on('error', reject);
  req.on('timeout', () => req.destroy(new Error('timeout')));
});
(async () => {
  const t0 = performance.now();
  const d = await get('/bytes/' + bytes, host);
  if (d.status !== 200 || d.got !== Number(bytes)) throw new Error('download got ' + d.status + ', ' + d.got + ' bytes');
  const mibPerS = Number(bytes) / 2 ** 20 / ((performance.now() - t0) / 1000);
  const latencyMs = [];
  for (let i = 0; i < Number(n) + 10; i++) {
    const t = performance.now();
    const r = await get('/', host);
    if (r.status !== 200) throw new Error('GET / got ' + r.status);
    if (i >= 10) latencyMs.push(performance.now() - t);
  }
  const deniedStatus = (await get('/', 'denied.test')).status;
  process.stdout.write(JSON.stringify({ mibPerS, latencyMs, deniedStatus }) + '\n');
})().catch((e) => { process.stderr.write(String(e && e.stack || e) + '\n'); process.exit(1); });
`;

/** freePort asks the kernel for a free TCP port on 127.0.0.1. */
export function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.on('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const port = (s.address() as net.AddressInfo).port;
      s.close(() => resolve(port));
    });
  });
}

/** The nginx binary of Debian's nginx / nginx-light package, or undefined when neither is installed. */
export function nginxBinary(): string | undefined {
  return ['/usr/sbin/nginx', '/usr/bin/nginx'].find((p) => existsSync(p));
}

/**
 * startNginx runs nginx (as root, one worker, no access log) in dir as a reverse proxy of
 * upstream ("address:port") on 127.0.0.1:port: HTTP/1.1 upstream keep-alive (64 idle),
 * no response buffering (it streams as the ingress does), WebSocket upgrades passed on.
 * Resolves once it accepts connections; stop() ends it (SIGTERM, waits for the exit).
 */
export async function startNginx(bin: string, dir: string, upstream: string, port: number): Promise<{ stop(): Promise<void> }> {
  for (const d of ['body', 'proxy', 'fastcgi', 'uwsgi', 'scgi']) mkdirSync(path.join(dir, d), { recursive: true });
  const conf = path.join(dir, 'nginx.conf');
  writeFileSync(
    conf,
    `user root;
worker_processes 1;
daemon off;
pid ${dir}/nginx.pid;
error_log ${dir}/error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path ${dir}/body;
  proxy_temp_path ${dir}/proxy;
  fastcgi_temp_path ${dir}/fastcgi;
  uwsgi_temp_path ${dir}/uwsgi;
  scgi_temp_path ${dir}/scgi;
  upstream sandbox { server ${upstream}; keepalive 64; }
  map $http_upgrade $connection_upgrade { default upgrade; '' ''; }
  server {
    listen 127.0.0.1:${port};
    location / {
      proxy_pass http://sandbox;
      proxy_http_version 1.1;
      proxy_set_header Upgrade $http_upgrade;
      proxy_set_header Connection $connection_upgrade;
      proxy_buffering off;
      proxy_read_timeout 300s;
    }
  }
}
`,
  );
  const child: ChildProcess = spawn(bin, ['-p', dir, '-c', conf], { stdio: ['ignore', 'ignore', 'pipe'] });
  let stderr = '';
  child.stderr!.on('data', (c: Buffer) => (stderr += c.toString()));
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
  const stop = async () => {
    if (child.exitCode === null && child.signalCode === null) child.kill('SIGTERM');
    await exited;
  };
  const deadline = Date.now() + 10_000;
  for (;;) {
    if (child.exitCode !== null) throw new Error(`nginx exited ${child.exitCode}: ${stderr.trim().slice(0, 300)}`);
    const up = await new Promise<boolean>((resolve) => {
      const s = net.connect(port, '127.0.0.1', () => {
        s.destroy();
        resolve(true);
      });
      s.on('error', () => resolve(false));
    });
    if (up) return { stop };
    if (Date.now() > deadline) {
      await stop();
      throw new Error(`nginx did not listen on 127.0.0.1:${port} within 10 s: ${stderr.trim().slice(0, 300)}`);
    }
    await new Promise((r) => setTimeout(r, 50));
  }
}
