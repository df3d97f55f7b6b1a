#!/usr/bin/env node
/**
 * bench-ingress: the ingress listener against a direct connection to the sandbox address, in the
 * same run. A "sandbox" netns (unique name, a /24 of 10.209.128.0/17) runs an HTTP server; the
 * ingress (services/server/dist, in its own process) forwards to it, and so does nginx (Debian's
 * package, one worker, keep-alive upstream) when it is installed. Measures, direct vs ingress
 * vs nginx: p50/p99 latency of small GETs on one keep-alive connection, requests/s with 32
 * concurrent keep-alive clients, the throughput of a 256 MiB download, and the same download
 * through a CONNECT tunnel of the ingress vs a raw connection (nginx has no CONNECT). Each round measures
 * all three in turn (the machine is shared: rounds show the spread), and the CPU time the
 * ingress and nginx processes used per request and per MiB (from /proc: what the proxy costs
 * whatever else runs). Prints one JSON line per round, then one with the medians.
 *
 * Usage (root; after `npx tsc -b services/server/tsconfig.build.json`):
 *   bash deploy/node-env.sh node services/server/scripts/bench-ingress.js [--requests N] [--rounds R]
 *
 * Engine: BENCH_INGRESS_ENGINE=raw (default) or node-http (config ingressEngine).
 * Profiling the ingress process: BENCH_INGRESS_NODE_ARGS='--cpu-prof --cpu-prof-dir=D' (node
 * flags), BENCH_INGRESS_PREFIX='strace -c -f -o F' (a command it runs under). The ingress exits
 * by itself when its stdin closes (so profiles and strace summaries are written); the other
 * children are killed.
 */
'use strict';
const { execFileSync, spawn } = require('node:child_process');
const { randomBytes } = require('node:crypto');
const { mkdirSync, rmSync, writeFileSync } = require('node:fs');
const http = require('node:http');
const os = require('node:os');
const path = require('node:path');

const DIST = path.resolve(__dirname, '..', 'dist');
const SHARED = path.resolve(__dirname, '..', '..', '..', 'packages', 'shared', 'dist', 'index.js');
const arg = (name, dflt) => (process.argv.includes(name) ? Number(process.argv[process.argv.indexOf(name) + 1]) || dflt : dflt);
const N = arg('--requests', 3000);
const ROUNDS = arg('--rounds', 1);
const BIG = 256 * 1024 * 1024;
const ID = 'sb-00000000000000cc';

const ip = (...a) => execFileSync('ip', a, { stdio: 'pipe' });

function lockSubnet() {
  mkdirSync('/tmp/sandnode-test-pools', { recursive: true });
  for (let i = 0; i < 200; i++) {
    const o = 128 + Math.floor(Math.random() * 128);
    const lock = `/tmp/sandnode-test-pools/10.209.${o}.0-24`;
    try {
      mkdirSync(lock);
    } catch {
      continue;
    }
    if (!execFileSync('ip', ['-4', '-o', 'addr'], { encoding: 'utf8' }).includes(` 10.209.${o}.`)) return { o, lock };
    rmSync(lock, { recursive: true, force: true });
  }
  throw new Error('no free /24');
}

const UPSTREAM = `
const http = require('node:http');
const small = Buffer.alloc(1024, 97);
const chunk = Buffer.alloc(1024 * 1024, 98);
http.createServer((req, res) => {
  if (req.url === '/big') {
    res.writeHead(200, { 'content-length': ${BIG} });
    let left = ${BIG};
    const go = () => { while (left > 0) { left -= chunk.length; if (!res.write(chunk)) return res.once('drain', go); } res.end(); };
    return go();
  }
  res.writeHead(200, { 'content-length': small.length }); res.end(small);
}).listen(8080, '0.0.0.0', () => process.stdout.write('ready\\n'));
`;

const INGRESS = (view) => `
const { createIngress } = require(${JSON.stringify(path.join(DIST, 'network/ingress.js'))});
const { MapNetworkDirectory } = require(${JSON.stringify(path.join(DIST, 'core/network-directory.js'))});
const { createLogger } = require(${JSON.stringify(SHARED)});
const dir = new MapNetworkDirectory(); dir.set(${JSON.stringify(view)});
const ing = createIngress({ engine: process.env.BENCH_INGRESS_ENGINE || 'raw', directory: dir, domain: 'localhost', log: createLogger('server', 'bench', 'silent') });
ing.server.listen(0, '127.0.0.1', () => process.stdout.write('port ' + ing.server.address().port + '\\n'));
process.stdin.resume();
process.stdin.on('end', () => process.exit(0));
`;

const NGINX = (dir, address, port) => `
worker_processes 1;
daemon off;
pid ${dir}/nginx.pid;
error_log ${dir}/nginx-error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path ${dir}/nginx-body;
  proxy_temp_path ${dir}/nginx-proxy;
  fastcgi_temp_path ${dir}/nginx-fcgi;
  uwsgi_temp_path ${dir}/nginx-uwsgi;
  scgi_temp_path ${dir}/nginx-scgi;
  upstream sandbox { server ${address}:8080; keepalive 64; }
  server {
    listen 127.0.0.1:${port};
    location / {
      proxy_pass http://sandbox;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_max_temp_file_size 0;
    }
  }
}
`;

function hasNginx() {
  try {
    execFileSync('nginx', ['-v'], { stdio: 'ignore' });
    return true;
  } catch {
    return false;
  }
}

function freePort() {
  return new Promise((resolve, reject) => {
    const s = require('node:net').createServer();
    s.once('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

async function waitPort(port) {
  for (let i = 0; i < 100; i++) {
    const ok = await new Promise((resolve) => {
      const c = require('node:net').connect(port, '127.0.0.1', () => (c.destroy(), resolve(true)));
      c.once('error', () => resolve(false));
    });
    if (ok) return;
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error(`nothing listens on 127.0.0.1:${port}`);
}

const median = (xs) => xs.slice().sort((a, b) => a - b)[Math.floor(xs.length / 2)];

function waitLine(child, re) {
  return new Promise((resolve, reject) => {
    let buf = '';
    child.stdout.on('data', (d) => {
      buf += d;
      const m = re.exec(buf);
      if (m) resolve(m);
    });
    child.once('exit', (c) => reject(new Error(`child exited ${c}`)));
  });
}

function get(agent, host, port, hostHeader, p) {
  return new Promise((resolve, reject) => {
    const req = http.request({ host, port, path: p, agent, headers: { host: hostHeader } }, (res) => {
      let n = 0;
      res.on('data', (d) => (n += d.length));
      res.on('end', () => (res.statusCode === 200 ? resolve(n) : reject(new Error(`status ${res.statusCode}`))));
    });
    req.on('error', reject);
    req.end();
  });
}

const pct = (xs, p) => xs.slice().sort((a, b) => a - b)[Math.min(xs.length - 1, Math.floor((p / 100) * xs.length))];

/** cpuMs: user+system CPU time of the processes `pids` (and their children's threads), ms; the proxy's work whatever else runs on the machine. */
function cpuMs(pids) {
  const tck = 100; // USER_HZ: /proc/<pid>/stat counts clock ticks
  let t = 0;
  for (const pid of pids) {
    const f = require('node:fs').readFileSync(`/proc/${pid}/stat`, 'utf8');
    const fields = f.slice(f.lastIndexOf(')') + 2).split(' ');
    t += Number(fields[11]) + Number(fields[12]); // utime, stime
  }
  return (t * 1000) / tck;
}

/**
 * rawDownload: GET /big over a raw TCP connection to host:port (through the ingress: a CONNECT
 * tunnel first, `connectHost` naming the sandbox port); MiB/s of the whole response and the
 * CPU ms per MiB of `pids`.
 */
function rawDownload(host, port, connectHost, pids) {
  const net = require('node:net');
  return new Promise((resolve, reject) => {
    const c0 = cpuMs(pids);
    const t0 = process.hrtime.bigint();
    const s = net.connect(port, host);
    let tunnelled = !connectHost;
    let n = 0;
    let head = '';
    s.on('connect', () => {
      if (connectHost) s.write(`CONNECT ${connectHost} HTTP/1.1\r\nHost: ${connectHost}\r\n\r\n`);
      else s.write('GET /big HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n');
    });
    s.on('data', (d) => {
      if (!tunnelled) {
        head += d.toString('latin1');
        if (!head.includes('\r\n\r\n')) return;
        if (!head.startsWith('HTTP/1.1 200')) return reject(new Error(`CONNECT answered ${head.split('\r\n')[0]}`));
        tunnelled = true;
        return s.write('GET /big HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n');
      }
      n += d.length;
      if (n >= BIG) {
        const sec = Number(process.hrtime.bigint() - t0) / 1e9;
        const c1 = cpuMs(pids);
        s.destroy();
        resolve({ mibPerS: Math.round(n / 1048576 / sec), cpuMsPerMiB: pids.length ? +((c1 - c0) / (n / 1048576)).toFixed(3) : undefined });
      }
    });
    s.on('error', reject);
  });
}

async function measure(name, host, port, hostHeader, pids = []) {
  const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
  for (let i = 0; i < 200; i++) await get(agent, host, port, hostHeader, '/'); // warm up
  const lat = [];
  for (let i = 0; i < N; i++) {
    const t = process.hrtime.bigint();
    await get(agent, host, port, hostHeader, '/');
    lat.push(Number(process.hrtime.bigint() - t) / 1e6);
  }
  agent.destroy();
  const many = new http.Agent({ keepAlive: true, maxSockets: 32 });
  const c0 = cpuMs(pids);
  const t0 = Date.now();
  let done = 0;
  await Promise.all(
    Array.from({ length: 32 }, async () => {
      while (done < N * 2) {
        done++;
        await get(many, host, port, hostHeader, '/');
      }
    }),
  );
  const rps = (done / (Date.now() - t0)) * 1000;
  const c1 = cpuMs(pids);
  many.destroy();
  const t1 = process.hrtime.bigint();
  const bytes = await get(false, host, port, hostHeader, '/big');
  const s = Number(process.hrtime.bigint() - t1) / 1e9;
  const c2 = cpuMs(pids);
  const out = { name, p50Ms: +pct(lat, 50).toFixed(3), p99Ms: +pct(lat, 99).toFixed(3), rps: Math.round(rps), mibPerS: Math.round(bytes / 1048576 / s) };
  // the proxy's own CPU (user+sys, 10 ms ticks): per request of the requests/s phase and per MiB of the download
  if (pids.length) Object.assign(out, { cpuUsPerRequest: Math.round(((c1 - c0) * 1000) / done), cpuMsPerMiB: +((c2 - c1) / (bytes / 1048576)).toFixed(3) });
  return out;
}

async function main() {
  const tag = randomBytes(3).toString('hex');
  const ns = `snbench${tag}`;
  const hostIf = `snb${tag}h`;
  const { o, lock } = lockSubnet();
  const dir = path.join(os.tmpdir(), `bench-ingress-${tag}`);
  const kids = [];
  let ingress;
  let nginx;
  let nginxPids = [];
  try {
    mkdirSync(dir, { recursive: true });
    writeFileSync(path.join(dir, 'up.js'), UPSTREAM);
    ip('netns', 'add', ns);
    ip('link', 'add', hostIf, 'type', 'veth', 'peer', 'name', 'eth0', 'netns', ns);
    ip('addr', 'add', `10.209.${o}.1/30`, 'dev', hostIf);
    ip('link', 'set', hostIf, 'up');
    ip('-n', ns, 'addr', 'add', `10.209.${o}.2/30`, 'dev', 'eth0');
    ip('-n', ns, 'link', 'set', 'eth0', 'up');
    ip('-n', ns, 'link', 'set', 'lo', 'up');
    const up = spawn('ip', ['netns', 'exec', ns, process.execPath, path.join(dir, 'up.js')], { stdio: ['ignore', 'pipe', 'inherit'] });
    kids.push(up);
    await waitLine(up, /ready/);
    const view = { sandboxId: ID, state: 'RUNNING', slot: 0, address: `10.209.${o}.2`, gateway: `10.209.${o}.1`, policy: {}, public: true, accessTokenSha256: '', poddAddress: '' };
    writeFileSync(path.join(dir, 'ingress.js'), INGRESS(view));
    // BENCH_INGRESS_PREFIX: a command line the ingress process runs under (`strace -c -f -o F`), BENCH_INGRESS_NODE_ARGS: node flags (`--cpu-prof`)
    const prefix = (process.env.BENCH_INGRESS_PREFIX ?? '').split(' ').filter(Boolean);
    const nodeArgs = (process.env.BENCH_INGRESS_NODE_ARGS ?? '').split(' ').filter(Boolean);
    const argv = [...prefix, process.execPath, ...nodeArgs, path.join(dir, 'ingress.js')];
    const ing = spawn(argv[0], argv.slice(1), { stdio: ['pipe', 'pipe', 'inherit'] });
    ingress = ing;
    const port = Number((await waitLine(ing, /port (\d+)/))[1]);
    let nginxPort;
    if (hasNginx()) {
      nginxPort = await freePort();
      writeFileSync(path.join(dir, 'nginx.conf'), NGINX(dir, view.address, nginxPort));
      const ng = spawn('nginx', ['-c', path.join(dir, 'nginx.conf')], { stdio: ['ignore', 'ignore', 'inherit'] });
      nginx = ng;
      await waitPort(nginxPort);
      nginxPids = [ng.pid, ...require('node:fs').readFileSync(`/proc/${ng.pid}/task/${ng.pid}/children`, 'utf8').trim().split(/\s+/).filter(Boolean).map(Number)];
    }
    const rounds = [];
    for (let r = 1; r <= ROUNDS; r++) {
      const direct = await measure('direct', view.address, 8080, `${view.address}:8080`);
      const viaIngress = await measure('ingress', '127.0.0.1', port, `8080-${ID}.localhost:${port}`, prefix.length ? [] : [ing.pid]);
      const tunnelDirect = await rawDownload(view.address, 8080, undefined, []);
      const tunnelIngress = await rawDownload('127.0.0.1', port, `8080-${ID}.localhost:${port}`, prefix.length ? [] : [ing.pid]);
      const viaNginx = nginxPort ? await measure('nginx', '127.0.0.1', nginxPort, `${view.address}:8080`, nginxPids) : undefined;
      const out = {
        bench: 'ingress',
        round: r,
        requests: N,
        direct,
        ingress: viaIngress,
        nginx: viaNginx,
        addedP50Ms: +(viaIngress.p50Ms - direct.p50Ms).toFixed(3),
        rpsRatio: +(viaIngress.rps / direct.rps).toFixed(2),
        throughputRatio: +(viaIngress.mibPerS / direct.mibPerS).toFixed(2),
        vsNginxRps: viaNginx ? +(viaIngress.rps / viaNginx.rps).toFixed(2) : undefined,
        vsNginxThroughput: viaNginx ? +(viaIngress.mibPerS / viaNginx.mibPerS).toFixed(2) : undefined,
        tunnel: { directMibPerS: tunnelDirect.mibPerS, ingressMibPerS: tunnelIngress.mibPerS, ingressCpuMsPerMiB: tunnelIngress.cpuMsPerMiB },
        tunnelThroughputRatio: +(tunnelIngress.mibPerS / tunnelDirect.mibPerS).toFixed(2),
        ingressCpuUsPerRequest: viaIngress.cpuUsPerRequest,
        ingressCpuMsPerMiB: viaIngress.cpuMsPerMiB,
        tunnelCpuMsPerMiB: tunnelIngress.cpuMsPerMiB,
        nginxCpuUsPerRequest: viaNginx?.cpuUsPerRequest,
        nginxCpuMsPerMiB: viaNginx?.cpuMsPerMiB,
      };
      rounds.push(out);
      process.stdout.write(`${JSON.stringify(out)}\n`);
    }
    if (ROUNDS > 1) {
      const keys = [
        'addedP50Ms',
        'rpsRatio',
        'throughputRatio',
        'tunnelThroughputRatio',
        'vsNginxRps',
        'vsNginxThroughput',
        'ingressCpuUsPerRequest',
        'ingressCpuMsPerMiB',
        'tunnelCpuMsPerMiB',
        'nginxCpuUsPerRequest',
        'nginxCpuMsPerMiB',
      ];
      const med = { bench: 'ingress', rounds: ROUNDS, median: {}, range: {} };
      for (const k of keys) {
        const xs = rounds.map((o) => o[k]).filter((x) => x !== undefined);
        if (!xs.length) continue;
        med.median[k] = median(xs);
        med.range[k] = [Math.min(...xs), Math.max(...xs)];
      }
      process.stdout.write(`${JSON.stringify(med)}\n`);
    }
  } finally {
    if (ingress && ingress.exitCode === null) {
      const exited = new Promise((resolve) => ingress.once('exit', resolve));
      ingress.stdin.end();
      await Promise.race([exited, new Promise((resolve) => setTimeout(resolve, 5000))]);
      ingress.kill('SIGKILL');
    }
    if (nginx && nginx.exitCode === null) {
      // SIGTERM: the master stops its workers, then exits (SIGKILL would leave the workers running)
      const exited = new Promise((resolve) => nginx.once('exit', resolve));
      nginx.kill('SIGTERM');
      await Promise.race([exited, new Promise((resolve) => setTimeout(resolve, 5000))]);
      for (const pid of nginxPids) {
        try {
          process.kill(pid, 'SIGKILL');
        } catch {
          /* gone */
        }
      }
    }
    for (const k of kids) k.kill('SIGKILL');
    try {
      ip('link', 'del', hostIf);
    } catch {
      /* gone */
    }
    try {
      ip('netns', 'del', ns);
    } catch {
      /* gone */
    }
    rmSync(dir, { recursive: true, force: true });
    rmSync(lock, { recursive: true, force: true });
  }
}

main().catch((err) => {
  process.stderr.write(`bench-ingress: ${err.stack}\n`);
  process.exit(1);
});
