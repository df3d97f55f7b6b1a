/**
 * Host side of the node's network: the commands that make, check and remove slots (netns bind
 * mount, veth pair, addresses, routes), apply the nftables table and check the host at start.
 * On the spawn path each slot costs three process spawns (`unshare --net=<file> true`, one
 * host `ip -batch -`, one `nsenter --net=<file> ip -batch -`); makeSlot/removeSlot take the
 * in-process path (the network worker: rtnetlink, no process) when given a worker, and fall
 * back to the spawn path when the worker is broken. Both paths make the same host state, so
 * adoption and the orphan sweep treat them alike.
 * Errors: CommandError (the failing command and its stderr) from runCommand; WorkerCallError
 * (the failing step and errno) from the worker.
 */
import { existsSync, mkdirSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { CommandError, cidrsOverlap, parseCidr, type Logger, ifacePrefix, SLOT_PREFIX, tableName, type NetLayout, type SlotAddresses } from '@sandnode/shared';
import { runCommand as run } from '../drivers/command-runner';
import { isMountPoint } from '../drivers/mounts';
import { resolveExecutable } from '../drivers/binary';
import { slotSetups } from '../metrics';
import { failpoints, FAILPOINTS } from '../core/failpoints';
import { WorkerBrokenError, type NetWorker, type SlotSetupPath } from './net-worker';

const IP_FORWARD = '/proc/sys/net/ipv4/ip_forward';

/** netnsBatch is what `ip -batch -` runs inside a slot's namespace (addresses, lo, eth0, default route). */
export function netnsBatch(a: SlotAddresses, ifname = 'eth0'): string {
  return [`addr replace ${a.address}/${SLOT_PREFIX} dev ${ifname}`, 'link set lo up', `link set ${ifname} up`, `route replace default via ${a.gateway} dev ${ifname}`, ''].join('\n');
}

/** GuestMode: how the VM meets its netns: "veth" (runc: eth0 with the address) or "tap" (firecracker: tap0 bridged to eth0 in the netns, the address in the guest). */
export type GuestMode = 'veth' | 'tap';

/**
 * netnsTapBatch is what `ip -batch -` runs inside a firecracker VM's netns: a bridge br0 joining
 * the veth's eth0 and the VMM's tap0, no address (the guest holds the slot's address, its
 * default route is the host side: one L2 link from the guest to the host veth).
 */
export function netnsTapBatch(): string {
  return [
    'link add br0 type bridge',
    'link set eth0 master br0',
    'tuntap add dev tap0 mode tap',
    'link set tap0 master br0',
    'link set lo up',
    'link set eth0 up',
    'link set tap0 up',
    'link set br0 up',
    '',
  ].join('\n');
}

/** slotNetnsBatch is the netns batch of mode. */
export function slotNetnsBatch(a: SlotAddresses, mode: GuestMode): string {
  return mode === 'tap' ? netnsTapBatch() : netnsBatch(a);
}

/** hostBatch is what `ip -batch -` runs on the host for a slot: the veth pair (VM side into the netns), the gateway address, up. */
export function hostBatch(a: SlotAddresses, withLink = true): string {
  return [
    ...(withLink ? [`link add ${a.hostIfname} type veth peer name eth0 netns ${a.netnsPath}`] : []),
    `addr replace ${a.gateway}/${SLOT_PREFIX} dev ${a.hostIfname}`,
    `link set ${a.hostIfname} up`,
    '',
  ].join('\n');
}

/**
 * preflight checks the host for the network; returns why the network must be off, or undefined.
 * Sets net.ipv4.ip_forward to 1 if it is 0 (logged). The pool must not overlap any address or
 * route of the host that is not the node's own (interfaces sn<tag>v*).
 */
export async function preflight(layout: NetLayout, log: Logger): Promise<string | undefined> {
  for (const bin of ['nft', 'ip', 'unshare', 'nsenter']) {
    try {
      resolveExecutable(bin, 'network');
    } catch {
      return `${bin} not found in PATH`;
    }
  }
  try {
    if (readFileSync(IP_FORWARD, 'utf8').trim() !== '1') {
      writeFileSync(IP_FORWARD, '1\n');
      log.warn('net.ipv4.ip_forward was 0: the supervisor set it to 1 (sandbox traffic is forwarded)');
    }
  } catch (err) {
    return `cannot set net.ipv4.ip_forward: ${(err as Error).message}`;
  }
  const ours = ifacePrefix(layout);
  const routes = JSON.parse((await run('ip', ['-j', '-4', 'route', 'show', 'table', 'all'])).stdout || '[]') as { dst: string; dev?: string; type?: string }[];
  for (const r of routes) {
    if (r.dst === 'default' || (r.dev ?? '').startsWith(ours)) continue;
    const dst = r.dst.includes('/') ? r.dst : `${r.dst}/32`;
    let c;
    try {
      c = parseCidr(dst);
    } catch {
      continue; // host bits set (a local route names an address): checked through the addresses below
    }
    if (cidrsOverlap(c, layout.pool)) return `pool ${layout.pool.text} overlaps route ${r.dst}${r.dev ? ` dev ${r.dev}` : ''}`;
  }
  const links = JSON.parse((await run('ip', ['-j', '-4', 'addr'])).stdout || '[]') as { ifname: string; addr_info?: { local: string; prefixlen: number }[] }[];
  for (const l of links) {
    if (l.ifname.startsWith(ours)) continue;
    for (const ai of l.addr_info ?? []) {
      const c = parseCidr(`${ai.local}/32`);
      if (cidrsOverlap(c, layout.pool)) return `pool ${layout.pool.text} overlaps address ${ai.local}/${ai.prefixlen} dev ${l.ifname}`;
    }
  }
  return undefined;
}

/**
 * allowThroughDocker adds, when the host has Docker's DOCKER-USER chain (iptables FORWARD
 * policy DROP), `-i sn<tag>v+ -j ACCEPT` and `-o sn<tag>v+ -j ACCEPT` to it, once: otherwise
 * Docker's FORWARD drop would refuse every sandbox packet our own forward chain accepted (each
 * table's base chain must accept). Our table still decides. Returns whether it added a rule.
 */
export async function allowThroughDocker(layout: NetLayout, log: Logger): Promise<boolean> {
  try {
    resolveExecutable('iptables', 'network');
    await run('iptables', ['-w', '-n', '-L', 'DOCKER-USER']);
  } catch {
    return false; // no iptables or no Docker chain
  }
  let added = false;
  for (const dir of ['-i', '-o']) {
    const rule = ['DOCKER-USER', dir, `${ifacePrefix(layout)}+`, '-j', 'ACCEPT'];
    try {
      await run('iptables', ['-w', '-C', ...rule]);
    } catch {
      await run('iptables', ['-w', '-I', ...rule]);
      added = true;
    }
  }
  if (added) log.info({ chain: 'DOCKER-USER', ifaces: `${ifacePrefix(layout)}+` }, "Docker's FORWARD policy drops: accept rules for the sandbox ifaces added to DOCKER-USER");
  return added;
}

/** removeDockerAllow removes the rules allowThroughDocker added (tests; a node that is purged). Never throws. */
export async function removeDockerAllow(layout: NetLayout): Promise<void> {
  for (const dir of ['-i', '-o']) {
    try {
      await run('iptables', ['-w', '-D', 'DOCKER-USER', dir, `${ifacePrefix(layout)}+`, '-j', 'ACCEPT']);
    } catch {
      /* not there */
    }
  }
}

/** makeNetns creates the namespace bind mount at a.netnsPath (no-op if it is one already). */
export async function makeNetns(a: SlotAddresses): Promise<void> {
  if (isMountPoint(a.netnsPath)) return;
  mkdirSync(a.netnsPath.slice(0, a.netnsPath.lastIndexOf('/')), { recursive: true, mode: 0o755 });
  writeFileSync(a.netnsPath, '', { mode: 0o444 });
  await run('unshare', [`--net=${a.netnsPath}`, 'true']);
}

/** createSlot makes a slot from nothing: netns, veth pair, addresses, routes (3 spawns). Throws CommandError; the caller undoes with destroySlot. */
export async function createSlot(a: SlotAddresses, mode: GuestMode = 'veth'): Promise<void> {
  await makeNetns(a);
  failpoints.hit(FAILPOINTS.networkSlotHalfMade);
  await run('ip', ['-batch', '-'], { input: hostBatch(a) });
  await run('nsenter', [`--net=${a.netnsPath}`, 'sh', '-c', NETNS_SETUP], { input: slotNetnsBatch(a, mode) });
}

/**
 * makeSlot makes slot a from nothing like createSlot, through worker when one is given and the
 * mode is veth (tap mode needs /dev/net/tun ioctls: always spawned), else by spawning; counts
 * the path in sandnode_vmm_slot_setups_total and returns it. A broken worker (WorkerBrokenError)
 * falls back to spawning after removing what it may have made; a failed step throws
 * (WorkerCallError / CommandError) and the caller undoes with removeSlot.
 */
export async function makeSlot(a: SlotAddresses, mode: GuestMode, worker: NetWorker | undefined, log: Logger): Promise<SlotSetupPath> {
  if (worker && mode === 'veth' && !worker.broken) {
    mkdirSync(a.netnsPath.slice(0, a.netnsPath.lastIndexOf('/')), { recursive: true, mode: 0o755 });
    try {
      await worker.createSlot({ netnsPath: a.netnsPath, hostIfname: a.hostIfname, address: a.address, gateway: a.gateway, prefixLen: SLOT_PREFIX, existing: isMountPoint(a.netnsPath) }, () =>
        failpoints.hit(FAILPOINTS.networkSlotHalfMade),
      );
      slotSetups.inc({ path: 'netlink' });
      return 'netlink';
    } catch (err) {
      if (!(err instanceof WorkerBrokenError)) throw err;
      log.warn({ err, slot: a.slot }, 'network worker broken: slot setup falls back to spawning ip/nsenter');
      await destroySlot(a);
    }
  }
  await createSlot(a, mode);
  slotSetups.inc({ path: 'spawn' });
  return 'spawn';
}

/** removeSlot removes slot a like destroySlot, through worker when one is given and usable. Idempotent. */
export async function removeSlot(a: SlotAddresses, worker: NetWorker | undefined): Promise<void> {
  if (worker && !worker.broken) {
    try {
      await worker.destroySlot(a);
      return;
    } catch (err) {
      if (!(err instanceof WorkerBrokenError)) throw err;
    }
  }
  await destroySlot(a);
}

/** Run in a new slot netns before its ip batch: IPv6 off (IPv4 only: no link-local address either), then the batch from stdin. */
export const NETNS_SETUP = 'for f in all default; do echo 1 > /proc/sys/net/ipv6/conf/$f/disable_ipv6; done; exec ip -batch -';

/** destroySlot removes a slot's veth, netns mount and file. Idempotent; throws CommandError only for a failed umount. */
export async function destroySlot(a: SlotAddresses): Promise<void> {
  try {
    await run('ip', ['link', 'del', a.hostIfname]);
  } catch (err) {
    if (!(err instanceof CommandError) || !/Cannot find device|does not exist/.test(err.stderr)) throw err;
  }
  if (isMountPoint(a.netnsPath)) await run('umount', [a.netnsPath]);
  rmSync(a.netnsPath, { force: true });
}

/** HostLinks: the node's host veths now, by name, with their IPv4 addresses ("a.b.c.d/p") and whether they are up. */
export type HostLinks = Map<string, { addrs: string[]; up: boolean }>;

/** hostLinks lists the host ifaces whose names start with sn<tag>v (one spawn). */
export async function hostLinks(layout: NetLayout): Promise<HostLinks> {
  const p = ifacePrefix(layout);
  const links = JSON.parse((await run('ip', ['-j', '-4', 'addr'])).stdout || '[]') as { ifname: string; flags?: string[]; addr_info?: { local: string; prefixlen: number }[] }[];
  const all = JSON.parse((await run('ip', ['-j', 'link'])).stdout || '[]') as { ifname: string; flags?: string[] }[];
  const out: HostLinks = new Map();
  for (const l of all) if (l.ifname.startsWith(p)) out.set(l.ifname, { addrs: [], up: (l.flags ?? []).includes('UP') });
  for (const l of links) {
    const e = out.get(l.ifname);
    if (e) e.addrs = (l.addr_info ?? []).map((ai) => `${ai.local}/${ai.prefixlen}`);
  }
  return out;
}

/** netnsAddrs lists the IPv4 addresses of eth0 and whether a default route exists inside a slot's netns (one spawn). */
export async function netnsState(a: SlotAddresses): Promise<{ eth0: boolean; tap0: boolean; addrs: string[]; defaultRoute: boolean }> {
  const { stdout } = await run('nsenter', [
    `--net=${a.netnsPath}`,
    'sh',
    '-c',
    'ip -j -4 addr show dev eth0 2>/dev/null || echo "[]"; echo; ip -j -4 route show default; echo; ip -j link show dev tap0 2>/dev/null || echo "[]"',
  ]);
  const [addrText, routeText, tapText] = stdout.split('\n').filter((l) => l.trim().startsWith('['));
  const links = JSON.parse(addrText ?? '[]') as { addr_info?: { local: string; prefixlen: number }[] }[];
  const routes = JSON.parse(routeText ?? '[]') as unknown[];
  const tap = JSON.parse(tapText ?? '[]') as unknown[];
  return { eth0: links.length > 0, tap0: tap.length > 0, addrs: (links[0]?.addr_info ?? []).map((ai) => `${ai.local}/${ai.prefixlen}`), defaultRoute: routes.length > 0 };
}

/** netnsFiles lists the slot numbers that have a file in the netns dir. */
export function netnsFiles(layout: NetLayout): number[] {
  if (!existsSync(layout.netnsDir)) return [];
  return readdirSync(layout.netnsDir)
    .filter((n) => /^(0|[1-9]\d{0,5})$/.test(n))
    .map(Number);
}

/** applyNft runs `nft -f -` with text: one transaction (all or nothing). */
export async function applyNft(text: string): Promise<void> {
  await run('nft', ['-f', '-'], { input: text });
}

/** tableExists says whether the node's table is on the host. */
export async function tableExists(layout: NetLayout): Promise<boolean> {
  try {
    await run('nft', ['list', 'table', 'inet', tableName(layout)]);
    return true;
  } catch {
    return false;
  }
}

/** deleteTable removes the node's table (tests, purge). Never throws. */
export async function deleteTable(layout: NetLayout): Promise<void> {
  try {
    await run('nft', ['delete', 'table', 'inet', tableName(layout)]);
  } catch {
    /* not there */
  }
}
