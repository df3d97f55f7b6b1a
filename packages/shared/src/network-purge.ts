/**
 * purgeNodeNetwork removes everything the network of one node made on the host (`down --purge`,
 * test cleanup): its nftables table, its DOCKER-USER accept rules, every host iface named
 * sn<tag>v<n>, and every netns bind mount under <runDir>/netns. Only names of that tag are
 * touched. Never throws; returns what it removed. Run it with the node's supervisor stopped.
 * Synchronous host commands (no command helpers): usable from any process, tests included.
 */
import { execFileSync } from 'node:child_process';
import { existsSync, mkdirSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { ifacePrefix, makeLayout, slotOfIfname, tableName, type NetLayout } from './network-layout';

/** What purgeNodeNetwork removed. */
export interface PurgedNetwork {
  table: boolean;
  ifaces: string[];
  netns: number[];
}

function ok(cmd: string, args: string[]): boolean {
  try {
    execFileSync(cmd, args, { stdio: 'ignore' });
    return true;
  } catch {
    return false;
  }
}

/** The file in `<runDir>/netns/` naming the node's networkTag (the supervisor writes it at start). */
export const NETWORK_TAG_FILE = 'tag';

/** writeNetworkTagFile records layout's tag in `<runDir>/netns/tag` for {@link purgeNodeNetwork}. */
export function writeNetworkTagFile(layout: NetLayout): void {
  mkdirSync(layout.netnsDir, { recursive: true, mode: 0o755 });
  writeFileSync(path.join(layout.netnsDir, NETWORK_TAG_FILE), `${layout.tag}\n`, { mode: 0o644 });
}

/** recordedTag is the tag the supervisor recorded under runDir, if any (and well-formed). */
function recordedTag(runDir: string): string | undefined {
  try {
    const t = readFileSync(path.join(runDir, 'netns', NETWORK_TAG_FILE), 'utf8').trim();
    return /^[0-9a-z]{1,4}$/.test(t) ? t : undefined;
  } catch {
    return undefined;
  }
}

/**
 * purgeNodeNetwork: runDir is the node's run dir; tag its networkTag as the supervisor recorded
 * it in `<runDir>/netns/tag`, else opts.tag (its config's, or defaultNetworkTag of its state dir).
 */
export function purgeNodeNetwork(opts: { tag: string; runDir: string }): PurgedNetwork {
  const layout = makeLayout('10.209.0.0/16', recordedTag(opts.runDir) ?? opts.tag, opts.runDir);
  const out: PurgedNetwork = { table: ok('nft', ['delete', 'table', 'inet', tableName(layout)]), ifaces: [], netns: [] };
  for (const dir of ['-i', '-o']) while (ok('iptables', ['-w', '-D', 'DOCKER-USER', dir, `${ifacePrefix(layout)}+`, '-j', 'ACCEPT']));
  let names: string[] = [];
  try {
    names = (JSON.parse(execFileSync('ip', ['-j', 'link'], { stdio: ['ignore', 'pipe', 'ignore'] }).toString()) as { ifname: string }[]).map((l) => l.ifname);
  } catch {
    /* no ip */
  }
  for (const n of names) if (slotOfIfname(layout, n) !== undefined && ok('ip', ['link', 'del', n])) out.ifaces.push(n);
  const slots = existsSync(layout.netnsDir) ? readdirSync(layout.netnsDir).filter((n) => /^(0|[1-9]\d{0,5})$/.test(n)) : [];
  for (const s of slots.map(Number)) {
    const f = path.join(layout.netnsDir, String(s));
    // a bind mount of a namespace, or a file left by a crash: umount fails harmlessly on the latter
    ok('umount', [f]);
    rmSync(f, { force: true });
    out.netns.push(s);
  }
  return out;
}
