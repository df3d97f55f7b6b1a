import { parseCidrList, parseEgressPolicy, makeLayout, slotAddresses, slotCount, slotOfIfname, defaultNetworkTag } from '@sandnode/shared';
import { renderSlotDelta, renderTable, slotRules, type NftSettings } from './nft-render';
import { hostBatch, netnsBatch, netnsTapBatch } from './net-host';
import { changeError, oneLine } from './nft-session';

const layout = makeLayout('10.209.0.0/16', 'ab12', '/run/sn');
const cfg: NftSettings = { layout, dnsPort: 15053, egressProxyPort: 15080, proxiedPorts: [80, 443], alwaysDenied: parseCidrList(['10.0.0.0/8', '169.254.0.0/16', '10.209.0.0/16'], 'd') };
const open = parseEgressPolicy(undefined);

describe('layout', () => {
  test('slot s is the /30 at pool + 4s: gateway +1, sandbox +2; names carry the tag', () => {
    expect(slotAddresses(layout, 0)).toEqual({ slot: 0, hostIfname: 'snab12v0', netnsPath: '/run/sn/netns/0', gateway: '10.209.0.1', address: '10.209.0.2' });
    expect(slotAddresses(layout, 7)).toMatchObject({ hostIfname: 'snab12v7', gateway: '10.209.0.29', address: '10.209.0.30' });
    expect(slotAddresses(layout, 16383)).toMatchObject({ gateway: '10.209.255.253', address: '10.209.255.254', hostIfname: 'snab12v16383' });
    expect(slotAddresses(layout, 16383).hostIfname.length).toBeLessThanOrEqual(15);
    expect(slotCount(layout)).toBe(16384);
    expect(slotCount(makeLayout('10.209.128.0/24', 'x', '/r'))).toBe(64);
  });
  test('slotOfIfname knows only this node names', () => {
    expect(slotOfIfname(layout, 'snab12v12')).toBe(12);
    for (const n of ['snab12v', 'snab12v01', 'snab13v1', 'eth0', 'snab12v1x']) expect(slotOfIfname(layout, n)).toBeUndefined();
  });
  test('the default tag is 4 hex digits of sha256 of the resolved state dir', () => {
    expect(defaultNetworkTag('/var/lib/sandnode')).toMatch(/^[0-9a-f]{4}$/);
    expect(defaultNetworkTag('/var/lib/sandnode')).toBe(defaultNetworkTag('/var/lib/../lib/sandnode'));
    expect(defaultNetworkTag('/a')).not.toBe(defaultNetworkTag('/b'));
  });
});

describe('nft rendering', () => {
  test('slot chain: anti-spoof, always-denied, allow CIDRs, block_all, deny, default accept', () => {
    expect(slotRules(cfg, 7, open)).toEqual(['ip saddr != 10.209.0.30 drop', 'ip daddr @always_denied jump refuse', 'accept']);
    const p = parseEgressPolicy({ allowOut: ['198.51.100.0/24', '1.2.3.4', 'example.com'], denyOut: ['8.8.8.8'], blockAll: true });
    expect(slotRules(cfg, 7, p)).toEqual(['ip saddr != 10.209.0.30 drop', 'ip daddr @always_denied jump refuse', 'ip daddr { 1.2.3.4/32, 198.51.100.0/24 } accept', 'jump refuse', 'accept']);
    const d = parseEgressPolicy({ allowOut: [], denyOut: ['8.8.8.0/24'], blockAll: false });
    expect(slotRules(cfg, 0, d)).toEqual(['ip saddr != 10.209.0.2 drop', 'ip daddr @always_denied jump refuse', 'ip daddr { 8.8.8.0/24 } jump refuse', 'accept']);
  });

  test('the whole table replaces only itself in one transaction, and has every chain of docs/network.md', () => {
    const text = renderTable(cfg, [
      { slot: 0, policy: open },
      { slot: 3, policy: parseEgressPolicy({ allowOut: ['*.example.com'], denyOut: [], blockAll: true }) },
      { slot: 5, policy: undefined },
    ]);
    const lines = text.split('\n');
    expect(lines.slice(0, 3)).toEqual(['table inet sandnode-ab12 {}', 'delete table inet sandnode-ab12', 'table inet sandnode-ab12 {']);
    expect(text).not.toMatch(/flush ruleset|delete table (?!inet sandnode-ab12)/);
    expect(text).toContain('type filter hook prerouting priority raw; policy accept;');
    expect(text).toContain('iifname "snab12v*" iifname . ip saddr != @slot_src drop');
    expect(text).toContain('iifname "snab12v*" meta l4proto { tcp, udp } th dport 53 redirect to :15053');
    expect(text).toContain('iifname @proxy_ifaces tcp dport @proxied redirect to :15080');
    expect(text).toContain('iifname "snab12v*" iifname vmap @slots');
    expect(text).toContain('oifname "snab12v*" ct state established,related accept');
    expect(text).toContain('ip saddr 10.209.0.0/16 oifname != "snab12v*" masquerade');
    expect(text).toContain('meta l4proto tcp reject with tcp reset');
    expect(text).toContain('chain slot-0 {');
    expect(text).toContain('chain slot-3 {');
    expect(text).not.toContain('chain slot-5 {'); // reserved/spare: no chain, every forward refused
    expect(text).toContain('add element inet sandnode-ab12 slots { "snab12v0" : jump slot-0, "snab12v3" : jump slot-3 }');
    expect(text).toContain('add element inet sandnode-ab12 slot_src { "snab12v0" . 10.209.0.2, "snab12v3" . 10.209.0.14 }');
    expect(text).toContain('add element inet sandnode-ab12 proxy_ifaces { "snab12v3" }'); // only the slot with domain rules
    expect(text).toContain('elements = { 10.0.0.0/8, 169.254.0.0/16, 10.209.0.0/16 }');
  });

  test('a slot change is one transaction of its own chain and elements only, whatever the number of slots', () => {
    const block = parseEgressPolicy({ allowOut: [], denyOut: [], blockAll: true });
    const dom = parseEgressPolicy({ allowOut: ['example.com'], denyOut: [], blockAll: true });
    const take = renderSlotDelta(cfg, 3, undefined, block).split('\n');
    expect(take.slice(0, 3)).toEqual(['add chain inet sandnode-ab12 slot-3', 'flush chain inet sandnode-ab12 slot-3', 'table inet sandnode-ab12 {']);
    // the chain exists before an element jumps to it
    expect(take.indexOf('    jump refuse')).toBeLessThan(take.indexOf('add element inet sandnode-ab12 slots { "snab12v3" : jump slot-3 }'));
    expect(take).toContain('add element inet sandnode-ab12 slot_src { "snab12v3" . 10.209.0.14 }');
    expect(take.join('\n')).not.toContain('proxy_ifaces');
    // a policy change: the chain and, only when the need for the proxy changes, proxy_ifaces
    const upd = renderSlotDelta(cfg, 3, block, dom);
    expect(upd).not.toContain('slot_src');
    expect(upd).toContain('add element inet sandnode-ab12 proxy_ifaces { "snab12v3" }');
    expect(renderSlotDelta(cfg, 3, dom, block)).toContain('delete element inet sandnode-ab12 proxy_ifaces { "snab12v3" }');
    // out of use: its elements go before its chain
    const del = renderSlotDelta(cfg, 3, dom, undefined).split('\n');
    expect(del).toEqual([
      'delete element inet sandnode-ab12 slots { "snab12v3" }',
      'delete element inet sandnode-ab12 slot_src { "snab12v3" . 10.209.0.14 }',
      'delete element inet sandnode-ab12 proxy_ifaces { "snab12v3" }',
      'flush chain inet sandnode-ab12 slot-3',
      'delete chain inet sandnode-ab12 slot-3',
      '',
    ]);
    expect(renderSlotDelta(cfg, 3, undefined, undefined)).toBe('');
  });

  test('ip batches: 3 spawns per slot, the VM side made inside the netns', () => {
    const a = slotAddresses(layout, 1);
    expect(hostBatch(a)).toBe('link add snab12v1 type veth peer name eth0 netns /run/sn/netns/1\naddr replace 10.209.0.5/30 dev snab12v1\nlink set snab12v1 up\n');
    expect(hostBatch(a, false)).not.toContain('link add');
    expect(netnsBatch(a)).toBe('addr replace 10.209.0.6/30 dev eth0\nlink set lo up\nlink set eth0 up\nroute replace default via 10.209.0.5 dev eth0\n');
    expect(netnsTapBatch()).toContain('tuntap add dev tap0 mode tap');
    expect(netnsTapBatch()).not.toContain('addr');
  });
});

describe('nft session lines', () => {
  test('a script becomes one line (one batch: one transaction) that nft still parses', () => {
    expect(oneLine('table inet t {\n  chain c {\n    accept\n  }\n}\nflush set inet t s\n')).toBe('table inet t {; chain c {; accept; }; }; flush set inet t s');
  });
  test("a change's error is every Error: line before the sync command's own", () => {
    const sync = 'Error: No such file or directory\nlist set inet t sync-3\n                ^^^^^^\n';
    expect(changeError(`   ^^^\n${sync}`)).toBeUndefined();
    expect(changeError(`Error: syntax error, unexpected foo\nfoo; bar\n^^^\n${sync}`)).toBe('Error: syntax error, unexpected foo\nfoo; bar\n^^^');
  });
});
