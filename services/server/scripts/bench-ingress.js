#!/usr/bin/env node
/**
 * bench-ingress: the ingress listener against a direct connection to the sandbox address, in the
 * same run. A "sandbox" netns (unique name, a /24 of 10.209.128.0/17) runs an HTTP server; the
 * ingress (services/server/dist, in its own process) forwards to it. Measures, direct vs ingress:
 * p50/p99 latency of small GETs on one keep-alive connection, requests/s with 32 concurrent
 * keep-alive clients, and the throughput of a 256 MiB download. Prints one JSON line.
 *
 * Usage (root; after `npx tsc -b services/server/tsconfig.build.json`):
 *   bash deploy/node-env.sh node services/server/scripts/bench-ingress.js [--requests N]
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
const N = Number(process.argv[process.argv.indexOf('--requests') + 1]) || 3000;
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
const ing = createIngress({ directory: dir, domain: 'localhost', log: createLogger('server', 'bench', 'silent') });
ing.server.listen(0, '127.0.0.1', () => process.stdout.write('port ' + ing.server.address().port + '\\n'));
`;

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

async function measure(name, host, port, hostHeader) {
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
  many.destroy();
  const t1 = process.hrtime.bigint();
  const bytes = await get(false, host, port, hostHeader, '/big');
  const s = Number(process.hrtime.bigint() - t1) / 1e9;
  return { name, p50Ms: +pct(lat, 50).toFixed(3), p99Ms: +pct(lat, 99).toFixed(3), rps: Math.round(rps), mibPerS: Math.round(bytes / 1048576 / s) };
}

async function main() {
  const tag = randomBytes(3).toString('hex');
  const ns = `snbench${tag}`;
  const hostIf = `snb${tag}h`;
  const { o, lock } = lockSubnet();
  const dir = path.join(os.tmpdir(), `bench-ingress-${tag}`);
  const kids = [];
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
    const ing = spawn(process.execPath, [path.join(dir, 'ingress.js')], { stdio: ['ignore', 'pipe', 'inherit'] });
    kids.push(ing);
    const port = Number((await waitLine(ing, /port (\d+)/))[1]);
    const direct = await measure('direct', view.address, 8080, `${view.address}:8080`);
    const viaIngress = await measure('ingress', '127.0.0.1', port, `8080-${ID}.localhost:${port}`);
    const out = {
      bench: 'ingress',
      requests: N,
      direct,
      ingress: viaIngress,
      addedP50Ms: +(viaIngress.p50Ms - direct.p50Ms).toFixed(3),
      rpsRatio: +(viaIngress.rps / direct.rps).toFixed(2),
      throughputRatio: +(viaIngress.mibPerS / direct.mibPerS).toFixed(2),
    };
    process.stdout.write(`${JSON.stringify(out)}\n`);
  } finally {
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
