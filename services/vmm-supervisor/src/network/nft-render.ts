/**
 * The node's nftables table as text for `nft -f -` (docs/network.md "nftables table"). Pure:
 * no host access; net-host.ts applies what these functions return, each in one transaction.
 *
 *   guard (filter, prerouting, raw): from a sandbox iface only IPv4 from the slot's own address
 *     (anti-spoof for every path: forward, the DNS and proxy ports, which tell sandboxes apart
 *     by source address)
 *   prerouting (nat, dstnat): udp/tcp 53 -> dnsPort; TCP to @proxied from @proxy_ifaces (slots
 *     whose policy has domain rules) -> egressProxyPort
 *   input: to dnsPort/egressProxyPort only from a sandbox iface; from a sandbox iface: established/related, dnsPort, egressProxyPort; else refuse
 *   forward: from a sandbox iface: vmap @slots (jump slot-<n>), else refuse (reserved slots);
 *     to a sandbox iface: established/related, else drop
 *   slot-<n>: saddr check, always-denied -> refuse, allow CIDRs accept, block_all -> refuse,
 *     deny CIDRs -> refuse, accept
 *   refuse: TCP reset, else ICMP admin-prohibited
 *   output (filter): to a sandbox iface from a socket of a user other than root -> refuse (a
 *     local user of the host reaches a sandbox only through the ingress and its access token;
 *     the server, root, dials sandboxes; kernel-made packets and replies of listeners pass)
 *   postrouting (nat, srcnat): saddr in pool, oif not a sandbox iface -> masquerade
 */
import { hasDomainRules, ifacePrefix, slotAddresses, tableName, type Cidr, type EgressPolicy, type NetLayout } from '@sandnode/shared';

/** The node-wide settings the table is made from. */
export interface NftSettings {
  layout: NetLayout;
  dnsPort: number;
  egressProxyPort: number;
  proxiedPorts: number[];
  /** The always-denied ranges, the pool included. */
  alwaysDenied: Cidr[];
}

/** NftSlot is one slot the table knows: in use (policy) or reserved/spare (policy undefined: every forward refused). */
export interface NftSlot {
  slot: number;
  policy: EgressPolicy | undefined;
}

/** slotChain is the name of slot s's chain. */
export function slotChain(s: number): string {
  return `slot-${s}`;
}

function set(items: string[]): string {
  return items.length ? `{ ${items.join(', ')} }` : '';
}

/** slotRules are the rules of slot s's chain (one per line) for policy p. */
export function slotRules(cfg: NftSettings, s: number, p: EgressPolicy): string[] {
  const a = slotAddresses(cfg.layout, s);
  const rules = [`ip saddr != ${a.address} drop`];
  if (cfg.alwaysDenied.length) rules.push('ip daddr @always_denied jump refuse');
  if (p.allowCidrs.length) rules.push(`ip daddr ${set(p.allowCidrs.map((c) => c.text))} accept`);
  if (p.blockAll) rules.push('jump refuse');
  else if (p.denyCidrs.length) rules.push(`ip daddr ${set(p.denyCidrs.map((c) => c.text))} jump refuse`);
  rules.push('accept');
  return rules;
}

function chainBlock(name: string, lines: string[], hook?: string): string {
  const body = [...(hook ? [hook] : []), ...lines].map((l) => `    ${l}`).join('\n');
  return `  chain ${name} {\n${body}\n  }`;
}

/** elementLines re-fill the table's slot sets from slots (flush + add, for one transaction). */
function elementLines(cfg: NftSettings, slots: NftSlot[]): string[] {
  const t = `inet ${tableName(cfg.layout)}`;
  const inUse = slots.filter((s) => s.policy !== undefined);
  // only slots in use: from a spare's or reserved slot's iface the guard drops everything
  const src = inUse.map((s) => slotAddresses(cfg.layout, s.slot)).map((a) => `"${a.hostIfname}" . ${a.address}`);
  const vmap = inUse.map((s) => `"${slotAddresses(cfg.layout, s.slot).hostIfname}" : jump ${slotChain(s.slot)}`);
  const proxy = inUse.filter((s) => hasDomainRules(s.policy!)).map((s) => `"${slotAddresses(cfg.layout, s.slot).hostIfname}"`);
  const out = [`flush map ${t} slots`, `flush set ${t} slot_src`, `flush set ${t} proxy_ifaces`];
  if (src.length) out.push(`add element ${t} slot_src ${set(src)}`);
  if (vmap.length) out.push(`add element ${t} slots ${set(vmap)}`);
  if (proxy.length) out.push(`add element ${t} proxy_ifaces ${set(proxy)}`);
  return out;
}

/**
 * renderTable is the whole table for slots, replacing whatever table of that name exists
 * (`table` + `delete table` + the new one: one transaction, nothing else on the host touched).
 */
export function renderTable(cfg: NftSettings, slots: NftSlot[]): string {
  const name = tableName(cfg.layout);
  const sb = `"${ifacePrefix(cfg.layout)}*"`;
  const chains = [
    chainBlock('refuse', ['meta l4proto tcp reject with tcp reset', 'reject with icmpx admin-prohibited']),
    chainBlock('guard', [`iifname ${sb} meta nfproto != ipv4 drop`, `iifname ${sb} iifname . ip saddr != @slot_src drop`], 'type filter hook prerouting priority raw; policy accept;'),
    chainBlock(
      'prerouting',
      [
        `iifname ${sb} meta l4proto { tcp, udp } th dport 53 redirect to :${cfg.dnsPort}`,
        ...(cfg.proxiedPorts.length ? [`iifname @proxy_ifaces tcp dport @proxied redirect to :${cfg.egressProxyPort}`] : []),
      ],
      'type nat hook prerouting priority dstnat; policy accept;',
    ),
    chainBlock(
      'input',
      [
        // the proxy and resolver ports are the sandboxes' alone: nothing else on or off the host reaches them
        `iifname != ${sb} meta l4proto { tcp, udp } th dport { ${cfg.dnsPort}, ${cfg.egressProxyPort} } drop`,
        `iifname != ${sb} accept`,
        'ct state established,related accept',
        `meta l4proto { tcp, udp } th dport ${cfg.dnsPort} accept`,
        `tcp dport ${cfg.egressProxyPort} accept`,
        // any other port of the host: refused at once (a reset), never left to time out
        'jump refuse',
      ],
      'type filter hook input priority filter; policy accept;',
    ),
    chainBlock(
      'forward',
      [`iifname ${sb} iifname vmap @slots`, `iifname ${sb} jump refuse`, `oifname ${sb} ct state established,related accept`, `oifname ${sb} drop`],
      'type filter hook forward priority filter; policy accept;',
    ),
    chainBlock('output', [`oifname ${sb} meta skuid != 0 jump refuse`], 'type filter hook output priority filter; policy accept;'),
    chainBlock('postrouting', [`ip saddr ${cfg.layout.pool.text} oifname != ${sb} masquerade`], 'type nat hook postrouting priority srcnat; policy accept;'),
    ...slots.filter((s) => s.policy !== undefined).map((s) => chainBlock(slotChain(s.slot), slotRules(cfg, s.slot, s.policy!))),
  ];
  const sets = [
    `  set always_denied {\n    type ipv4_addr; flags interval; auto-merge;${cfg.alwaysDenied.length ? `\n    elements = ${set(cfg.alwaysDenied.map((c) => c.text))}` : ''}\n  }`,
    `  set proxied {\n    type inet_service;${cfg.proxiedPorts.length ? `\n    elements = ${set(cfg.proxiedPorts.map(String))}` : ''}\n  }`,
    '  set proxy_ifaces {\n    type ifname;\n  }',
    '  set slot_src {\n    type ifname . ipv4_addr;\n  }',
    '  map slots {\n    type ifname : verdict;\n  }',
  ];
  return [`table inet ${name} {}`, `delete table inet ${name}`, `table inet ${name} {`, ...sets, ...chains, '}', ...elementLines(cfg, slots), ''].join('\n');
}

/**
 * renderSlotDelta is one transaction that takes slot s from policy `before` to `after`
 * (undefined: not in use, nothing from its iface passes): its chain flushed and refilled, and
 * only its own elements added or deleted, so a change costs the same whatever the number of
 * slots. '' when there is nothing to change. Deleting an element that is not there fails the
 * whole transaction (nothing changed): the caller then renders the whole table.
 */
export function renderSlotDelta(cfg: NftSettings, s: number, before: EgressPolicy | undefined, after: EgressPolicy | undefined): string {
  const t = `inet ${tableName(cfg.layout)}`;
  const chain = slotChain(s);
  const a = slotAddresses(cfg.layout, s);
  const ifn = `"${a.hostIfname}"`;
  const proxyBefore = before !== undefined && hasDomainRules(before);
  const proxyAfter = after !== undefined && hasDomainRules(after);
  const lines: string[] = [];
  if (after) {
    lines.push(`add chain ${t} ${chain}`, `flush chain ${t} ${chain}`, `table ${t} {`, chainBlock(chain, slotRules(cfg, s, after)), '}');
    if (!before) lines.push(`add element ${t} slot_src { ${ifn} . ${a.address} }`, `add element ${t} slots { ${ifn} : jump ${chain} }`);
    if (proxyAfter && !proxyBefore) lines.push(`add element ${t} proxy_ifaces { ${ifn} }`);
    if (!proxyAfter && proxyBefore) lines.push(`delete element ${t} proxy_ifaces { ${ifn} }`);
  } else if (before) {
    lines.push(`delete element ${t} slots { ${ifn} }`, `delete element ${t} slot_src { ${ifn} . ${a.address} }`);
    if (proxyBefore) lines.push(`delete element ${t} proxy_ifaces { ${ifn} }`);
    lines.push(`flush chain ${t} ${chain}`, `delete chain ${t} ${chain}`);
  }
  return lines.length ? [...lines, ''].join('\n') : '';
}
