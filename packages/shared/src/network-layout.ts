/**
 * Addresses and names of the node's network (docs/network.md "Addresses and names"): slot s is
 * the /30 at pool + 4*s (gateway +1, sandbox +2); the host side of its veth is `sn<tag>v<s>`,
 * its namespace `<runDir>/netns/<s>`, the node's table `inet sandnode-<tag>`. Pure.
 */
import { createHash } from 'node:crypto';
import path from 'node:path';
import { formatIpv4, parseCidr, type Cidr } from './egress-policy';

/** Prefix length of a slot. */
export const SLOT_PREFIX = 30;

/** NetLayout names everything of one node's network. */
export interface NetLayout {
  pool: Cidr;
  tag: string;
  /** Dir of the netns bind mounts, `<runDir>/netns`. */
  netnsDir: string;
}

/** SlotAddresses are one slot's names and addresses. */
export interface SlotAddresses {
  slot: number;
  hostIfname: string;
  netnsPath: string;
  gateway: string;
  address: string;
}

/** defaultNetworkTag is the first 4 hex digits of sha256(resolved stateDir). */
export function defaultNetworkTag(stateDir: string): string {
  return createHash('sha256').update(path.resolve(stateDir)).digest('hex').slice(0, 4);
}

/** makeLayout builds the layout of a pool ("10.209.0.0/16"; prefix <= 30). InvalidArgumentError for a bad pool. */
export function makeLayout(pool: string, tag: string, runDir: string): NetLayout {
  return { pool: parseCidr(pool, 'networkPool'), tag, netnsDir: path.join(path.resolve(runDir), 'netns') };
}

/** slotCount is how many /30 slots the pool holds (a /16: 16384). */
export function slotCount(l: NetLayout): number {
  return 2 ** (32 - l.pool.prefix) / 4;
}

/** tableName is the node's nftables table name (family inet). */
export function tableName(l: NetLayout): string {
  return `sandnode-${l.tag}`;
}

/** ifacePrefix is what every host veth name of the node starts with, `sn<tag>v`. */
export function ifacePrefix(l: NetLayout): string {
  return `sn${l.tag}v`;
}

/** slotAddresses are slot s's names and addresses (s in 0..slotCount-1). */
export function slotAddresses(l: NetLayout, s: number): SlotAddresses {
  const base = l.pool.base + 4 * s;
  return { slot: s, hostIfname: `${ifacePrefix(l)}${s}`, netnsPath: path.join(l.netnsDir, String(s)), gateway: formatIpv4(base + 1), address: formatIpv4(base + 2) };
}

/** slotOfIfname is the slot of a host veth name of this node, or undefined for any other name. */
export function slotOfIfname(l: NetLayout, name: string): number | undefined {
  const p = ifacePrefix(l);
  if (!name.startsWith(p)) return undefined;
  const rest = name.slice(p.length);
  return /^(0|[1-9]\d{0,5})$/.test(rest) ? Number(rest) : undefined;
}
