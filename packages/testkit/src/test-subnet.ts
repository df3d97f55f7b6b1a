/**
 * Unique test subnets on a machine shared by several jest workers and helpers: a claim is a
 * directory `/tmp/sandnode-test-nets/<base>_<prefix>` made with mkdir (atomic) holding the
 * claimer's pid and what it made with the subnet (TestSubnet.own); a claim whose pid is dead
 * is stale: what it owned (netns, links, nft tables of a killed jest worker) is removed and the
 * subnet taken over. Subnets that overlap an address already on the host are skipped.
 */
import { execFileSync } from 'node:child_process';
import { mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { cidrsOverlap, formatIpv4, parseCidr, type Cidr } from '@sandnode/shared';

const CLAIMS = '/tmp/sandnode-test-nets';

/** A claimed subnet: its network address and prefix; release() gives it back (idempotent). */
export interface TestSubnet {
  /** the network, e.g. "198.18.4.20/30" */
  cidr: string;
  /** the network address as an unsigned 32-bit number */
  base: number;
  prefix: number;
  /** host address n of the subnet (n = 1: the first), dotted quad */
  host(n: number): string;
  /** own records a netns, link or inet nft table made for this subnet, removed if this process dies before release */
  own(kind: 'netns' | 'link' | 'nft', name: string): void;
  release(): void;
}

/** removeOwned deletes what a dead claimer recorded in `dir` (best effort). */
function removeOwned(dir: string): void {
  let owned: { kind: string; name: string }[] = [];
  try {
    owned = JSON.parse(readFileSync(path.join(dir, 'owned.json'), 'utf8')) as typeof owned;
  } catch {
    return;
  }
  for (const { kind, name } of owned) {
    if (!/^sn[a-z0-9]+$/.test(name)) continue; // only sandnode test names
    const argv = kind === 'netns' ? ['ip', 'netns', 'del', name] : kind === 'link' ? ['ip', 'link', 'del', name] : ['nft', 'delete', 'table', 'inet', name];
    try {
      execFileSync(argv[0]!, argv.slice(1), { stdio: 'ignore' });
    } catch {
      /* gone already */
    }
  }
}

function hostCidrs(): Cidr[] {
  const out = execFileSync('ip', ['-o', '-4', 'addr', 'show'], { encoding: 'utf8' });
  return [...out.matchAll(/inet (\d+\.\d+\.\d+\.\d+)\/(\d+)/g)].map((m) => {
    const a = parseCidr(m[1]!);
    const p = Number(m[2]);
    const mask = p === 0 ? 0 : (0xffffffff << (32 - p)) >>> 0;
    return { base: (a.base & mask) >>> 0, prefix: p, text: `${m[1]}/${p}` };
  });
}

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'EPERM';
  }
}

/**
 * claimTestSubnet picks a random free /`prefix` inside `within` (e.g. "198.18.0.0/15", 30) and
 * claims it for this process. Throws an Error after 64 tries without a free one.
 */
export function claimTestSubnet(within: string, prefix: number): TestSubnet {
  const outer = parseCidr(within);
  if (prefix < outer.prefix || prefix > 32) throw new Error(`claimTestSubnet: /${prefix} does not fit in ${within}`);
  const count = 2 ** (prefix - outer.prefix);
  mkdirSync(CLAIMS, { recursive: true });
  for (let attempt = 0; attempt < 64; attempt++) {
    const base = (outer.base + Math.floor(Math.random() * count) * 2 ** (32 - prefix)) >>> 0;
    const cidr: Cidr = { base, prefix, text: `${formatIpv4(base)}/${prefix}` };
    if (hostCidrs().some((h) => cidrsOverlap(h, cidr))) continue;
    const dir = path.join(CLAIMS, `${formatIpv4(base)}_${prefix}`);
    try {
      mkdirSync(dir);
    } catch {
      let pid: number;
      try {
        pid = Number(readFileSync(path.join(dir, 'pid'), 'utf8'));
      } catch {
        continue; // being claimed right now
      }
      if (pid > 0 && alive(pid)) continue;
      removeOwned(dir); // stale: its claimer died; remove what it left
      rmSync(dir, { recursive: true, force: true });
      try {
        mkdirSync(dir);
      } catch {
        continue;
      }
    }
    writeFileSync(path.join(dir, 'pid'), String(process.pid));
    let released = false;
    const owned: { kind: string; name: string }[] = [];
    return {
      cidr: cidr.text,
      base,
      prefix,
      host: (n) => formatIpv4((base + n) >>> 0),
      own: (kind, name) => {
        owned.push({ kind, name });
        if (!released) writeFileSync(path.join(dir, 'owned.json'), JSON.stringify(owned));
      },
      release: () => {
        if (released) return;
        released = true;
        rmSync(dir, { recursive: true, force: true });
      },
    };
  }
  throw new Error(`claimTestSubnet: no free /${prefix} in ${within} after 64 tries`);
}

/** randomTag is `n` random hex digits, for unique netns/link/table names. */
export function randomTag(n = 6): string {
  return Array.from({ length: n }, () => Math.floor(Math.random() * 16).toString(16)).join('');
}
