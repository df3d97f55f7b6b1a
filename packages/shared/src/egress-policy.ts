/**
 * Egress policy of a sandbox (proto sandnode.common.v1.EgressPolicy, docs/network.md): the one
 * parser and the one evaluator that the server's API validation, egress proxy and resolver and
 * the vmm-supervisor's nftables rules all use, so that the kernel and the proxies never
 * disagree about what a policy means.
 *
 * Order of evaluation (as in E2B's network rules: allow wins over deny), for a connection to
 * address A with, for proxied TCP, the name N from the HTTP Host header or the TLS SNI:
 *   1. A in the node's always-denied ranges: refused, whatever the policy says;
 *   2. N matches an allowed domain, or A is in an allowed CIDR: allowed;
 *   3. block_all, or A in a denied CIDR: refused;
 *   4. otherwise allowed.
 */
import { InvalidArgumentError } from './errors';

/** Most entries of allow_out and of deny_out. */
export const MAX_POLICY_ENTRIES = 256;
/** Longest domain, bytes (RFC 1035 2.3.4, without the trailing dot). */
export const MAX_DOMAIN_BYTES = 253;

/**
 * Ranges every sandbox is refused unless the node's config says otherwise: "this network",
 * RFC 1918 private ranges, CGNAT (RFC 6598), loopback, link-local (incl. the cloud metadata
 * address 169.254.169.254), IETF protocol assignments, multicast and reserved. Not here: the
 * documentation and benchmark nets (192.0.2.0/24, 198.18.0.0/15, ...), which tests use as their
 * "internet". The node's own addresses and its sandbox pool are added by the supervisor.
 */
export const DEFAULT_ALWAYS_DENIED: readonly string[] = [
  '0.0.0.0/8',
  '10.0.0.0/8',
  '100.64.0.0/10',
  '127.0.0.0/8',
  '169.254.0.0/16',
  '172.16.0.0/12',
  '192.0.0.0/24',
  '192.168.0.0/16',
  '224.0.0.0/4',
  '240.0.0.0/4',
];

/** A policy as given on the wire (the generated EgressPolicy has this shape). */
export interface EgressPolicyInput {
  allowOut: string[];
  denyOut: string[];
  blockAll: boolean;
}

/** An IPv4 network: address as an unsigned 32-bit number and prefix length 0..32. */
export interface Cidr {
  /** network address, host bits zero */
  base: number;
  prefix: number;
  /** canonical text, "a.b.c.d/p" (a single address is "/32") */
  text: string;
}

/** A domain rule: `exact` matches the name itself, otherwise every name strictly below it. */
export interface DomainRule {
  domain: string;
  wildcard: boolean;
  /** canonical text: "example.com" or "*.example.com" */
  text: string;
}

/** A parsed, canonical policy. */
export interface EgressPolicy {
  allowCidrs: Cidr[];
  allowDomains: DomainRule[];
  denyCidrs: Cidr[];
  blockAll: boolean;
}

/** The verdict on one connection and the rule that decided it (for a 403 and the logs). */
export interface EgressVerdict {
  allowed: boolean;
  /** e.g. "always-denied 10.0.0.0/8", "allow_out *.example.com", "deny_out 1.2.3.0/24", "block_all", "default" */
  rule: string;
}

const IPV4 = /^(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)(\.(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)){3}$/;
const LABEL = /^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$/;

/** parseIpv4 returns the address as an unsigned 32-bit number, or undefined if `s` is not dotted-quad IPv4 (no leading zeros). */
export function parseIpv4(s: string): number | undefined {
  if (!IPV4.test(s)) return undefined;
  return s.split('.').reduce((n, part) => n * 256 + Number(part), 0);
}

/** formatIpv4 is the dotted-quad text of an unsigned 32-bit address. */
export function formatIpv4(n: number): string {
  return [n >>> 24, (n >>> 16) & 255, (n >>> 8) & 255, n & 255].join('.');
}

function mask(prefix: number): number {
  return prefix === 0 ? 0 : (0xffffffff << (32 - prefix)) >>> 0;
}

/**
 * parseCidr reads "a.b.c.d" (a /32) or "a.b.c.d/p". Throws InvalidArgumentError naming `field`
 * for anything else, including host bits set ("10.1.2.3/8": say 10.0.0.0/8) and IPv6 (not yet).
 */
export function parseCidr(s: string, field = 'cidr'): Cidr {
  const [addr, len, extra] = s.split('/');
  const base = parseIpv4(addr ?? '');
  if (base === undefined || extra !== undefined) {
    if (s.includes(':')) throw new InvalidArgumentError(`${field}: "${s}" is IPv6; sandbox networking is IPv4 only`);
    throw new InvalidArgumentError(`${field}: "${s}" is not an IPv4 address or CIDR`);
  }
  let prefix = 32;
  if (len !== undefined) {
    if (!/^(3[0-2]|[12]?\d)$/.test(len)) throw new InvalidArgumentError(`${field}: "${s}" has a bad prefix length (0..32)`);
    prefix = Number(len);
  }
  if ((base & ~mask(prefix)) >>> 0 !== 0) {
    throw new InvalidArgumentError(`${field}: "${s}" has host bits set; the network is ${formatIpv4((base & mask(prefix)) >>> 0)}/${prefix}`);
  }
  return { base, prefix, text: `${formatIpv4(base)}/${prefix}` };
}

/** cidrContains says whether address `a` (unsigned 32-bit) is in `c`. */
export function cidrContains(c: Cidr, a: number): boolean {
  return (a & mask(c.prefix)) >>> 0 === c.base;
}

/** cidrsOverlap says whether two networks share an address. */
export function cidrsOverlap(a: Cidr, b: Cidr): boolean {
  const p = Math.min(a.prefix, b.prefix);
  return (a.base & mask(p)) >>> 0 === (b.base & mask(p)) >>> 0;
}

/**
 * parseDomainRule reads "example.com" or "*.example.com" (case-insensitive, one trailing dot
 * allowed). Throws InvalidArgumentError naming `field` for anything else: IP-like names, empty
 * labels, a "*" anywhere but as the whole first label, a single-label wildcard ("*.com" is
 * allowed; "*" alone is not: that is the default policy, or block_all false).
 */
export function parseDomainRule(s: string, field = 'domain'): DomainRule {
  let d = s.toLowerCase();
  if (d.endsWith('.')) d = d.slice(0, -1);
  const wildcard = d.startsWith('*.');
  if (wildcard) d = d.slice(2);
  const bad = (why: string) => new InvalidArgumentError(`${field}: "${s}" is not a domain (${why})`);
  if (d.length === 0 || Buffer.byteLength(d) > MAX_DOMAIN_BYTES) throw bad(`1..${MAX_DOMAIN_BYTES} bytes`);
  const labels = d.split('.');
  if (!labels.every((l) => LABEL.test(l))) throw bad('labels of a-z, 0-9 and inner "-", 1..63 each');
  if (/^\d+$/.test(labels[labels.length - 1]!)) throw bad('an all-numeric top label; give an address as an address');
  return { domain: d, wildcard, text: wildcard ? `*.${d}` : d };
}

/** normalizeName lower-cases a Host/SNI/DNS name and drops a trailing dot and a port; undefined if it is not a name. */
export function normalizeName(name: string): string | undefined {
  let n = name.trim().toLowerCase();
  if (n.startsWith('[')) return undefined; // IPv6 literal
  n = n.replace(/:\d+$/, '');
  if (n.endsWith('.')) n = n.slice(0, -1);
  if (n.length === 0 || Buffer.byteLength(n) > MAX_DOMAIN_BYTES) return undefined;
  if (!n.split('.').every((l) => LABEL.test(l) || /^[a-z0-9_-]{1,63}$/.test(l))) return undefined;
  return n;
}

/** domainMatches says whether canonical name `name` is matched by `rule`. */
export function domainMatches(rule: DomainRule, name: string): boolean {
  if (!rule.wildcard) return name === rule.domain;
  return name.endsWith(`.${rule.domain}`);
}

/**
 * parseEgressPolicy validates and canonicalises a wire policy (undefined: the default, internet
 * allowed). Duplicates are removed and entries sorted, so equal policies compare equal.
 * Throws InvalidArgumentError naming the field (`${field}.allow_out[3]`).
 */
export function parseEgressPolicy(p: EgressPolicyInput | undefined, field = 'egress'): EgressPolicy {
  const out: EgressPolicy = { allowCidrs: [], allowDomains: [], denyCidrs: [], blockAll: p?.blockAll ?? false };
  if (!p) return out;
  for (const [name, list] of [
    ['allow_out', p.allowOut],
    ['deny_out', p.denyOut],
  ] as const) {
    if (list.length > MAX_POLICY_ENTRIES) throw new InvalidArgumentError(`${field}.${name}: ${list.length} entries; at most ${MAX_POLICY_ENTRIES}`);
  }
  p.allowOut.forEach((e, i) => {
    const f = `${field}.allow_out[${i}]`;
    if (typeof e !== 'string' || e.length === 0) throw new InvalidArgumentError(`${f}: empty`);
    if (/^[\d./]+$/.test(e)) out.allowCidrs.push(parseCidr(e, f));
    else if (e.includes(':')) parseCidr(e, f);
    else out.allowDomains.push(parseDomainRule(e, f));
  });
  p.denyOut.forEach((e, i) => {
    const f = `${field}.deny_out[${i}]`;
    if (typeof e !== 'string' || e.length === 0) throw new InvalidArgumentError(`${f}: empty`);
    if (!/^[\d./]+$/.test(e) && !e.includes(':')) throw new InvalidArgumentError(`${f}: "${e}" is a domain; deny_out takes addresses and CIDRs (refuse names with block_all and allow_out)`);
    out.denyCidrs.push(parseCidr(e, f));
  });
  const uniq = <T extends { text: string }>(xs: T[]) => [...new Map(xs.map((x) => [x.text, x])).values()].sort((a, b) => (a.text < b.text ? -1 : a.text > b.text ? 1 : 0));
  out.allowCidrs = uniq(out.allowCidrs);
  out.allowDomains = uniq(out.allowDomains);
  out.denyCidrs = uniq(out.denyCidrs);
  return out;
}

/** formatEgressPolicy is the canonical wire form of a parsed policy (allow_out: CIDRs then domains). */
export function formatEgressPolicy(p: EgressPolicy): EgressPolicyInput {
  return {
    allowOut: [...p.allowCidrs.map((c) => c.text), ...p.allowDomains.map((d) => d.text)],
    denyOut: p.denyCidrs.map((c) => c.text),
    blockAll: p.blockAll,
  };
}

/** hasDomainRules says whether the policy needs the egress proxy (TCP to the proxied ports is redirected to it). */
export function hasDomainRules(p: EgressPolicy): boolean {
  return p.allowDomains.length > 0;
}

/** parseCidrList parses a config list of CIDRs (e.g. the always-denied ranges), naming `field`. */
export function parseCidrList(list: readonly string[], field: string): Cidr[] {
  return list.map((e, i) => parseCidr(e, `${field}[${i}]`));
}

/**
 * unreachableAllows lists the allow_out CIDRs of `p` that lie wholly inside one of the node's
 * always-denied ranges (rule 1 of evaluateEgress denies every address of them, so the entry can
 * never allow anything): `[{ allow, deniedBy }]` as CIDR texts, in p's order. A CIDR that only
 * overlaps a range (0.0.0.0/0, say) is not listed: its other addresses are reachable.
 */
export function unreachableAllows(p: EgressPolicy, alwaysDenied: readonly Cidr[]): { allow: string; deniedBy: string }[] {
  const out: { allow: string; deniedBy: string }[] = [];
  for (const a of p.allowCidrs) {
    const d = alwaysDenied.find((c) => c.prefix <= a.prefix && cidrsOverlap(c, a));
    if (d) out.push({ allow: a.text, deniedBy: d.text });
  }
  return out;
}

/**
 * evaluateEgress decides a connection to `address` (dotted quad) with, for proxied TCP, the
 * name read from Host/SNI (undefined when there is none or it is not a name). `alwaysDenied`
 * are the node's ranges (rule 1).
 */
export function evaluateEgress(p: EgressPolicy, alwaysDenied: readonly Cidr[], address: string, name?: string): EgressVerdict {
  const a = parseIpv4(address);
  if (a === undefined) return { allowed: false, rule: `not an IPv4 address: ${address}` };
  const denied = alwaysDenied.find((c) => cidrContains(c, a));
  if (denied) return { allowed: false, rule: `always-denied ${denied.text}` };
  const n = name === undefined ? undefined : normalizeName(name);
  if (n !== undefined) {
    const d = p.allowDomains.find((r) => domainMatches(r, n));
    if (d) return { allowed: true, rule: `allow_out ${d.text}` };
  }
  const allow = p.allowCidrs.find((c) => cidrContains(c, a));
  if (allow) return { allowed: true, rule: `allow_out ${allow.text}` };
  if (p.blockAll) return { allowed: false, rule: 'block_all' };
  const deny = p.denyCidrs.find((c) => cidrContains(c, a));
  if (deny) return { allowed: false, rule: `deny_out ${deny.text}` };
  return { allowed: true, rule: 'default' };
}

/**
 * nameAllowed says whether the sandbox's resolver answers `name`: with block_all only names
 * of allow_out's domains; otherwise every name (addresses are checked when it connects).
 */
export function nameAllowed(p: EgressPolicy, name: string): EgressVerdict {
  const n = normalizeName(name);
  if (n === undefined) return { allowed: false, rule: `not a name: ${name}` };
  const d = p.allowDomains.find((r) => domainMatches(r, n));
  if (d) return { allowed: true, rule: `allow_out ${d.text}` };
  if (p.blockAll) return { allowed: false, rule: 'block_all' };
  return { allowed: true, rule: 'default' };
}
