/**
 * Network test fixture: a unique tag and pool for the supervisor under test (a /28 of
 * 10.211.224.0/19 claimed with testkit claimTestSubnet, names sn<tag>*), a test "internet" host in a network namespace of its own
 * (198.19.<k>.2, reached from the host through a veth `tn<tag>i` with 198.19.<k>.1) serving a
 * TCP echo on port 7 and a greeting on port 5000, and cleanup of everything the suite or the
 * supervisor made with this tag (table, veths, DOCKER-USER rules). Never touches other names.
 */
import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { randomInt } from 'node:crypto';
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { claimTestSubnet, type Part, type TestSubnet } from '@sandnode/testkit';
import { VMM_PARTS } from './fixture';
import { purgeNodeNetwork } from '@sandnode/shared';

const onPath = (cmd: string) => (process.env.PATH ?? '').split(':').some((d) => d !== '' && existsSync(path.join(d, cmd)));

/** What the network suites need on top of VMM_PARTS (deploy/host-setup.sh installs them; CI fails without them). */
export const NET_PARTS: Part[] = [
  ...VMM_PARTS,
  { name: 'nftables (apt-get install nftables)', present: () => onPath('nft'), ciProvides: true },
  { name: 'iproute2 (apt-get install iproute2)', present: () => onPath('ip'), ciProvides: true },
  { name: 'iptables (apt-get install iptables)', present: () => onPath('iptables'), ciProvides: true },
];

/** The echo host's script: port 7 echoes, port 5000 greets; stats (connections, lines on port 7) go to statsFile. */
const SERVER = `
const net = require('node:net'); const fs = require('node:fs');
const statsFile = process.argv[1]; let conns = 0; let lines = 0;
const save = () => fs.writeFileSync(statsFile + '.tmp', JSON.stringify({ conns, lines })) || fs.renameSync(statsFile + '.tmp', statsFile);
net.createServer((s) => { conns++; save(); s.on('data', (d) => { lines += String(d).split('\\n').length - 1; save(); s.write(d); }); s.on('error', () => {}); }).listen(7, '0.0.0.0');
net.createServer((s) => { s.end('hello from the internet\\n'); s.on('error', () => {}); }).listen(5000, '0.0.0.0', save);
`;

/** NetFixture owns the names of one network suite. */
export class NetFixture {
  readonly tag: string;
  /** The supervisor's pool (a claimed /28 of 10.211.224.0/19: 4 slots). */
  readonly pool: string;
  /** The test host's /30 (CIDR). */
  readonly internetCidr: string;
  readonly internetHostSide: string;
  /** The test host's address. */
  readonly internet: string;
  readonly inetIf: string;
  readonly netnsFile: string;
  readonly statsFile: string;
  private server: ChildProcess | undefined;
  /** the claims of the pool and of the test host's /30 (testkit claimTestSubnet: no other test gets them) */
  private readonly claims: TestSubnet[];

  constructor(
    private readonly dir: string,
    /** The run dir of the supervisor under test (its netns mounts are purged). */
    private readonly runDir: string = path.join(dir, 'run'),
  ) {
    const alphabet = 'abcdefghijklmnopqrstuvwxyz';
    this.tag = `z${alphabet[randomInt(26)]}${alphabet[randomInt(26)]}${randomInt(10)}`;
    const pool = claimTestSubnet('10.211.224.0/19', 28); // 4 slots: the suite fills the pool
    const inet = claimTestSubnet('198.18.0.0/15', 30);
    this.claims = [pool, inet];
    this.pool = pool.cidr;
    this.internetCidr = inet.cidr;
    this.internetHostSide = inet.host(1);
    this.internet = inet.host(2);
    this.inetIf = `tn${this.tag}i`;
    this.netnsFile = path.join(dir, 'internet.netns');
    this.statsFile = path.join(dir, 'internet-stats.json');
  }

  /** env is the supervisor config of this fixture's network. */
  env(extra: Record<string, string> = {}): Record<string, string> {
    return { SANDNODE_VMM_SUPERVISOR_NETWORK: 'true', SANDNODE_VMM_SUPERVISOR_NETWORK_POOL: this.pool, SANDNODE_VMM_SUPERVISOR_NETWORK_TAG: this.tag, ...extra };
  }

  /** startInternet makes the test host's netns, veth and servers and waits until they listen. */
  async startInternet(): Promise<void> {
    writeFileSync(this.netnsFile, '');
    execFileSync('unshare', [`--net=${this.netnsFile}`, 'true']);
    execFileSync('ip', ['link', 'add', this.inetIf, 'type', 'veth', 'peer', 'name', 'eth0', 'netns', this.netnsFile]);
    execFileSync('ip', ['addr', 'add', `${this.internetHostSide}/30`, 'dev', this.inetIf]);
    execFileSync('ip', ['link', 'set', this.inetIf, 'up']);
    const ns = (args: string[]) => execFileSync('nsenter', [`--net=${this.netnsFile}`, ...args]);
    ns(['ip', 'addr', 'add', `${this.internet}/30`, 'dev', 'eth0']);
    ns(['ip', 'link', 'set', 'lo', 'up']);
    ns(['ip', 'link', 'set', 'eth0', 'up']);
    ns(['ip', 'route', 'add', 'default', 'via', this.internetHostSide]);
    this.server = spawn('nsenter', [`--net=${this.netnsFile}`, process.execPath, '-e', SERVER, this.statsFile], { stdio: 'ignore' });
    for (let i = 0; i < 200 && !existsSync(this.statsFile); i++) await new Promise((r) => setTimeout(r, 25));
  }

  /** stats are the echo host's counters. */
  stats(): { conns: number; lines: number } {
    return JSON.parse(readFileSync(this.statsFile, 'utf8')) as { conns: number; lines: number };
  }

  /** links lists the host ifaces of this fixture's supervisor (sn<tag>*). */
  links(): string[] {
    const all = JSON.parse(execFileSync('ip', ['-j', 'link']).toString()) as { ifname: string }[];
    return all.map((l) => l.ifname).filter((n) => n.startsWith(`sn${this.tag}`));
  }

  /** table is `nft list table inet sandnode-<tag>`, or '' when there is none. */
  table(): string {
    try {
      return execFileSync('nft', ['list', 'table', 'inet', `sandnode-${this.tag}`], { stdio: ['ignore', 'pipe', 'ignore'] }).toString();
    } catch {
      return '';
    }
  }

  /** cleanup removes the servers, the test host, the table, the DOCKER-USER rules and any sn<tag>* iface. Never throws. */
  cleanup(): void {
    const tryRun = (cmd: string, args: string[]) => {
      try {
        execFileSync(cmd, args, { stdio: 'ignore' });
      } catch {
        /* best effort */
      }
    };
    this.server?.kill('SIGKILL');
    tryRun('ip', ['link', 'del', this.inetIf]);
    tryRun('ip', ['link', 'del', `tn${this.tag}o`]);
    tryRun('umount', ['-l', this.netnsFile]);
    purgeNodeNetwork({ tag: this.tag, runDir: this.runDir });
    for (const c of this.claims) c.release();
  }
}
