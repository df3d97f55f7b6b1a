/**
 * A test "internet" for network tests (issue 12 §5): a network namespace of its own, joined to
 * the host by a veth pair with a unique /30 of 198.18.0.0/15 (the benchmark net, not in the
 * always-denied ranges), in which one child node process serves
 *   - HTTP on :80 and HTTPS on :443 (self-signed, one cert for every name; SNI is echoed),
 *     both answering a JSON echo {method, path, host, sni, remote}, and GET /bytes/<n> with n
 *     zero bytes (for throughput);
 *   - DNS on udp/tcp :53: A records for its names, NXDOMAIN for anything else;
 *   - a TCP echo on :7.
 * The host reaches it directly (connected route); inside, its default route is the host, so
 * replies to sandboxes NATed or routed by the host go back. stop() removes the process, the
 * veth and the netns (also after a failed start: startTestInternet cleans up before it throws).
 *
 *   const net = await startTestInternet({ records: { 'meta.test': '169.254.169.254' } });
 *   // net.address, net.names.allowed ("allowed.test") → net.address, net.dns = {address, port: 53}
 *   await net.stop();
 */
import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { readFileSync, rmSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { makeTempDir } from './temp-dir';
import { CHILD_SOURCE } from './test-internet-child';
import { claimTestSubnet, randomTag } from './test-subnet';

/** How long the servers in the netns may take to listen, ms. */
const READY_MS = 15_000;

/** Options of {@link startTestInternet}. */
export interface TestInternetOptions {
  /** more A records the DNS server answers (name → IPv4), e.g. a name resolving to 10.0.0.1 */
  records?: Record<string, string>;
}

/** A running test internet. */
export interface TestInternet {
  /** the namespace's name (`snti<tag>`) */
  netns: string;
  /** the host's end of the veth (`snti<tag>h`) and its address */
  hostIface: string;
  hostAddress: string;
  /** the test internet's address: every server listens here */
  address: string;
  /** the /30, e.g. "198.18.7.4/30" */
  cidr: string;
  ports: { http: 80; https: 443; dns: 53; echo: 7 };
  /** two names the DNS server answers with `address` (for an allowed and a refused rule) */
  names: { allowed: string; denied: string };
  /** every A record the DNS server answers (names above, plus options.records) */
  records: Record<string, string>;
  /** PEM of the self-signed certificate (trust it, or skip verification) */
  certPem: string;
  /** the DNS server as an upstream */
  dns: { address: string; port: number };
  /** stop kills the servers and removes the veth and the netns; idempotent, never throws */
  stop(): Promise<void>;
}

function ip(...args: string[]): void {
  execFileSync('ip', args, { stdio: ['ignore', 'ignore', 'pipe'] });
}

/**
 * linkNetns makes netns and a veth pair into it: `hostIface` on the host with hostAddress/30,
 * `peer` in netns with address/30 and a default route via hostAddress, lo up. Throws (ip's
 * stderr) at the first step that fails; the caller owns (and removes) netns and hostIface.
 */
export function linkNetns(l: { netns: string; hostIface: string; peer: string; hostAddress: string; address: string }): void {
  ip('netns', 'add', l.netns);
  ip('link', 'add', l.hostIface, 'type', 'veth', 'peer', 'name', l.peer);
  ip('link', 'set', l.peer, 'netns', l.netns);
  ip('addr', 'add', `${l.hostAddress}/30`, 'dev', l.hostIface);
  ip('link', 'set', l.hostIface, 'up');
  ip('-n', l.netns, 'addr', 'add', `${l.address}/30`, 'dev', l.peer);
  ip('-n', l.netns, 'link', 'set', l.peer, 'up');
  ip('-n', l.netns, 'link', 'set', 'lo', 'up');
  ip('-n', l.netns, 'route', 'add', 'default', 'via', l.hostAddress);
}

function quiet(f: () => void): void {
  try {
    f();
  } catch {
    /* already gone */
  }
}

/** startTestInternet makes the namespace, veth and servers; throws (after cleaning up) when any step fails. Needs root. */
export async function startTestInternet(opts: TestInternetOptions = {}): Promise<TestInternet> {
  const tag = randomTag(6);
  const netns = `snti${tag}`;
  const hostIface = `snti${tag}h`;
  const peer = `snti${tag}n`;
  const subnet = claimTestSubnet('198.18.0.0/15', 30);
  const dir = makeTempDir('test-internet');
  const hostAddress = subnet.host(1);
  const address = subnet.host(2);
  let child: ChildProcess | undefined;
  let stopped = false;
  const stop = async () => {
    if (stopped) return;
    stopped = true;
    if (child && child.exitCode === null && child.signalCode === null) {
      const exited = new Promise((resolve) => child!.once('exit', resolve));
      child.kill('SIGKILL');
      await exited;
    }
    quiet(() => {
      const pids = execFileSync('ip', ['netns', 'pids', netns], { encoding: 'utf8' }).split('\n').filter(Boolean);
      for (const p of pids) quiet(() => process.kill(Number(p), 'SIGKILL'));
    });
    quiet(() => ip('link', 'del', hostIface));
    quiet(() => ip('netns', 'del', netns));
    rmSync(dir, { recursive: true, force: true });
    subnet.release();
  };
  try {
    const names = { allowed: 'allowed.test', denied: 'denied.test' };
    const records: Record<string, string> = { [names.allowed]: address, [names.denied]: address, ...(opts.records ?? {}) };
    const cert = path.join(dir, 'cert.pem');
    const key = path.join(dir, 'key.pem');
    execFileSync(
      'openssl',
      [
        'req',
        '-x509',
        '-newkey',
        'ec',
        '-pkeyopt',
        'ec_paramgen_curve:prime256v1',
        '-nodes',
        '-days',
        '2',
        '-subj',
        `/CN=${names.allowed}`,
        '-addext',
        `subjectAltName=DNS:${names.allowed},DNS:${names.denied}`,
        '-keyout',
        key,
        '-out',
        cert,
      ],
      { stdio: 'ignore' },
    );
    subnet.own('netns', netns);
    subnet.own('link', hostIface);
    linkNetns({ netns, hostIface, peer, hostAddress, address });
    const script = path.join(dir, 'servers.js');
    writeFileSync(script, CHILD_SOURCE);
    child = spawn('ip', ['netns', 'exec', netns, process.execPath, script], {
      stdio: ['pipe', 'pipe', 'pipe'],
      env: { ...process.env, TI_ADDR: address, TI_CERT: cert, TI_KEY: key, TI_RECORDS: JSON.stringify(records), TI_DNS_PACKET: require.resolve('dns-packet') },
    });
    await waitReady(child);
    return {
      netns,
      hostIface,
      hostAddress,
      address,
      cidr: subnet.cidr,
      ports: { http: 80, https: 443, dns: 53, echo: 7 },
      names,
      records,
      certPem: readFileSync(cert, 'utf8'),
      dns: { address, port: 53 },
      stop,
    };
  } catch (err) {
    await stop();
    throw err;
  }
}

function waitReady(child: ChildProcess): Promise<void> {
  return new Promise((resolve, reject) => {
    let out = '';
    let errText = '';
    const timer = setTimeout(() => reject(new Error(`test internet: servers not ready after ${READY_MS} ms: ${errText}`)), READY_MS);
    child.stderr!.on('data', (d: Buffer) => (errText = (errText + d.toString()).slice(-2000)));
    child.stdout!.on('data', (d: Buffer) => {
      out += d.toString();
      if (out.includes('ready\n')) {
        clearTimeout(timer);
        resolve();
      }
    });
    child.once('exit', (code, signal) => {
      clearTimeout(timer);
      reject(new Error(`test internet: servers exited (${code ?? signal}): ${errText}`));
    });
  });
}
