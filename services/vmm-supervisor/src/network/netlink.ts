/**
 * A small NETLINK_ROUTE codec (rtnetlink(7)): the few messages slot setup needs, encoded to and
 * decoded from the kernel's wire form (host byte order: little-endian on every platform the
 * supervisor runs on). Pure: no sockets here; netlink-worker.ts sends what these functions
 * build. Messages:
 *
 *   RTM_NEWLINK  veth pair (name, peer name, peer's netns fd), link up, RTM_DELLINK by name
 *   RTM_NEWADDR  an IPv4 address with prefix length on an ifindex (create|replace)
 *   RTM_NEWROUTE an IPv4 default route via a gateway on an ifindex (create|replace)
 *   RTM_GETLINK / RTM_GETADDR dumps, decoded to {index, name, flags} / {index, address, prefixLen}
 *
 * Every request asks for an ACK (NLM_F_ACK); {@link parseReplies} turns the kernel's answer
 * into messages and the NLMSG_ERROR code (0: success; else a negative errno).
 */

/** Message types (linux/rtnetlink.h, linux/netlink.h). */
export const RTM = { NEWLINK: 16, DELLINK: 17, GETLINK: 18, NEWADDR: 20, DELADDR: 21, GETADDR: 22, NEWROUTE: 24, GETROUTE: 26 } as const;
/** NLMSG_ERROR (an ACK when its code is 0) and NLMSG_DONE (end of a dump). */
export const NLMSG_ERROR = 2;
export const NLMSG_DONE = 3;
/** Header flags. */
export const NLM_F = { REQUEST: 0x1, MULTI: 0x2, ACK: 0x4, DUMP: 0x300, REPLACE: 0x100, EXCL: 0x200, CREATE: 0x400 } as const;
/** IFLA_* link attributes used here. */
export const IFLA = { IFNAME: 3, LINKINFO: 18, NET_NS_FD: 28 } as const;
/** IFLA_INFO_* (nested in IFLA_LINKINFO) and VETH_INFO_PEER (nested in IFLA_INFO_DATA). */
export const IFLA_INFO = { KIND: 1, DATA: 2 } as const;
export const VETH_INFO_PEER = 1;
/** IFA_* address attributes. */
export const IFA = { ADDRESS: 1, LOCAL: 2 } as const;
/** RTA_* route attributes. */
export const RTA = { DST: 1, OIF: 4, GATEWAY: 5 } as const;
/** Link flag IFF_UP. */
export const IFF_UP = 0x1;
/** AF_INET and AF_UNSPEC. */
export const AF_INET = 2;
export const AF_UNSPEC = 0;

const NLMSG_HDRLEN = 16;
const IFINFOMSG_LEN = 16;
const IFADDRMSG_LEN = 8;
const RTMSG_LEN = 12;

const align4 = (n: number): number => (n + 3) & ~3;

/** An attribute before encoding: a type and its payload (bytes, or nested attributes). */
export interface Attr {
  type: number;
  value: Buffer | Attr[];
}

/** encodeAttrs lays attributes out as rtattrs (len u16, type u16, payload, padding to 4). */
export function encodeAttrs(attrs: Attr[]): Buffer {
  const parts: Buffer[] = [];
  for (const a of attrs) {
    const payload = Buffer.isBuffer(a.value) ? a.value : encodeAttrs(a.value);
    const head = Buffer.alloc(4);
    head.writeUInt16LE(4 + payload.length, 0);
    head.writeUInt16LE(a.type, 2);
    parts.push(head, payload, Buffer.alloc(align4(payload.length) - payload.length));
  }
  return Buffer.concat(parts);
}

/** strAttr is a NUL-terminated string attribute. */
export function strAttr(type: number, s: string): Attr {
  return { type, value: Buffer.from(`${s}\0`, 'latin1') };
}

/** u32Attr is a 32-bit unsigned attribute. */
export function u32Attr(type: number, v: number): Attr {
  const b = Buffer.alloc(4);
  b.writeUInt32LE(v >>> 0, 0);
  return { type, value: b };
}

/** ipv4 is "a.b.c.d" as its 4 bytes (network order); throws on anything else. */
export function ipv4(addr: string): Buffer {
  const m = /^(\d{1,3})\.(\d{1,3})\.(\d{1,3})\.(\d{1,3})$/.exec(addr);
  const octets = m ? m.slice(1).map(Number) : [];
  if (octets.length !== 4 || octets.some((o) => o > 255)) throw new Error(`not an IPv4 address: ${JSON.stringify(addr)}`);
  return Buffer.from(octets);
}

/** ifnameOk: a Linux interface name (1..15 bytes, no '/', ':', space or NUL). */
export function ifnameOk(name: string): boolean {
  return /^[A-Za-z0-9_.-]{1,15}$/.test(name) && name !== '.' && name !== '..';
}

function checkIfname(name: string): string {
  if (!ifnameOk(name)) throw new Error(`not an interface name: ${JSON.stringify(name)}`);
  return name;
}

/** message frames a body as one netlink message (nlmsghdr: len, type, flags, seq, pid 0). */
export function message(type: number, flags: number, seq: number, body: Buffer): Buffer {
  const h = Buffer.alloc(NLMSG_HDRLEN);
  h.writeUInt32LE(NLMSG_HDRLEN + body.length, 0);
  h.writeUInt16LE(type, 4);
  h.writeUInt16LE(flags, 6);
  h.writeUInt32LE(seq >>> 0, 8);
  h.writeUInt32LE(0, 12);
  return Buffer.concat([h, body, Buffer.alloc(align4(body.length) - body.length)]);
}

/** ifinfomsg: family, type, index, flags, change. */
export function ifinfomsg(index: number, flags = 0, change = 0, family = AF_UNSPEC): Buffer {
  const b = Buffer.alloc(IFINFOMSG_LEN);
  b.writeUInt8(family, 0);
  b.writeUInt16LE(0, 2);
  b.writeInt32LE(index, 4);
  b.writeUInt32LE(flags >>> 0, 8);
  b.writeUInt32LE(change >>> 0, 12);
  return b;
}

/**
 * newVeth creates the veth pair `name` (in the socket's netns) <-> `peer`, the peer moved at
 * once to the netns whose fd is peerNsFd (-1: stays beside `name`). EEXIST if a name is taken.
 */
export function newVeth(seq: number, name: string, peer: string, peerNsFd: number): Buffer {
  const peerAttrs: Attr[] = [strAttr(IFLA.IFNAME, checkIfname(peer)), ...(peerNsFd >= 0 ? [u32Attr(IFLA.NET_NS_FD, peerNsFd)] : [])];
  const attrs: Attr[] = [
    strAttr(IFLA.IFNAME, checkIfname(name)),
    {
      type: IFLA.LINKINFO,
      value: [strAttr(IFLA_INFO.KIND, 'veth'), { type: IFLA_INFO.DATA, value: [{ type: VETH_INFO_PEER, value: Buffer.concat([ifinfomsg(0), encodeAttrs(peerAttrs)]) }] }],
    },
  ];
  return message(RTM.NEWLINK, NLM_F.REQUEST | NLM_F.ACK | NLM_F.CREATE | NLM_F.EXCL, seq, Buffer.concat([ifinfomsg(0), encodeAttrs(attrs)]));
}

/** setLinkUp brings the link named `name` up (RTM_NEWLINK without CREATE: ENODEV if it is not there). */
export function setLinkUp(seq: number, name: string): Buffer {
  return message(RTM.NEWLINK, NLM_F.REQUEST | NLM_F.ACK, seq, Buffer.concat([ifinfomsg(0, IFF_UP, IFF_UP), encodeAttrs([strAttr(IFLA.IFNAME, checkIfname(name))])]));
}

/** delLink deletes the link named `name` (a veth takes its peer along). ENODEV if it is not there. */
export function delLink(seq: number, name: string): Buffer {
  return message(RTM.DELLINK, NLM_F.REQUEST | NLM_F.ACK, seq, Buffer.concat([ifinfomsg(0), encodeAttrs([strAttr(IFLA.IFNAME, checkIfname(name))])]));
}

/** getLink asks for the link named `name` (one RTM_NEWLINK answer, or ENODEV). */
export function getLink(seq: number, name: string): Buffer {
  return message(RTM.GETLINK, NLM_F.REQUEST, seq, Buffer.concat([ifinfomsg(0), encodeAttrs([strAttr(IFLA.IFNAME, checkIfname(name))])]));
}

/** dumpLinks asks for every link of the socket's netns. */
export function dumpLinks(seq: number): Buffer {
  return message(RTM.GETLINK, NLM_F.REQUEST | NLM_F.DUMP, seq, ifinfomsg(0));
}

/** dumpAddrs asks for every IPv4 address of the socket's netns. */
export function dumpAddrs(seq: number): Buffer {
  const b = Buffer.alloc(IFADDRMSG_LEN);
  b.writeUInt8(AF_INET, 0);
  return message(RTM.GETADDR, NLM_F.REQUEST | NLM_F.DUMP, seq, b);
}

/** dumpRoutes asks for every IPv4 route of the socket's netns. */
export function dumpRoutes(seq: number): Buffer {
  const b = Buffer.alloc(RTMSG_LEN);
  b.writeUInt8(AF_INET, 0);
  return message(RTM.GETROUTE, NLM_F.REQUEST | NLM_F.DUMP, seq, b);
}

/** newAddr sets address/prefixLen on ifindex (create or replace: "ip addr replace"). */
export function newAddr(seq: number, index: number, address: string, prefixLen: number): Buffer {
  if (!Number.isInteger(prefixLen) || prefixLen < 0 || prefixLen > 32) throw new Error(`prefix length ${prefixLen} is not 0..32`);
  const b = Buffer.alloc(IFADDRMSG_LEN);
  b.writeUInt8(AF_INET, 0);
  b.writeUInt8(prefixLen, 1);
  b.writeUInt8(0, 2); // flags
  b.writeUInt8(0, 3); // scope universe
  b.writeUInt32LE(index >>> 0, 4);
  const ip = ipv4(address);
  return message(
    RTM.NEWADDR,
    NLM_F.REQUEST | NLM_F.ACK | NLM_F.CREATE | NLM_F.REPLACE,
    seq,
    Buffer.concat([
      b,
      encodeAttrs([
        { type: IFA.LOCAL, value: ip },
        { type: IFA.ADDRESS, value: ip },
      ]),
    ]),
  );
}

/** newDefaultRoute sets the main table's IPv4 default route via gateway on ifindex (create or replace). */
export function newDefaultRoute(seq: number, index: number, gateway: string): Buffer {
  const b = Buffer.alloc(RTMSG_LEN);
  b.writeUInt8(AF_INET, 0); // family
  b.writeUInt8(0, 1); // dst_len: default
  b.writeUInt8(254, 4); // table RT_TABLE_MAIN
  b.writeUInt8(3, 5); // protocol RTPROT_BOOT (what `ip route` uses)
  b.writeUInt8(0, 6); // scope universe
  b.writeUInt8(1, 7); // type RTN_UNICAST
  return message(RTM.NEWROUTE, NLM_F.REQUEST | NLM_F.ACK | NLM_F.CREATE | NLM_F.REPLACE, seq, Buffer.concat([b, encodeAttrs([{ type: RTA.GATEWAY, value: ipv4(gateway) }, u32Attr(RTA.OIF, index)])]));
}

/** A decoded netlink message: its header and body (after the header). */
export interface NlMessage {
  type: number;
  flags: number;
  seq: number;
  body: Buffer;
}

/** parseMessages splits a received datagram into messages; throws on a malformed length. */
export function parseMessages(buf: Buffer): NlMessage[] {
  const out: NlMessage[] = [];
  let off = 0;
  while (off + NLMSG_HDRLEN <= buf.length) {
    const len = buf.readUInt32LE(off);
    if (len < NLMSG_HDRLEN || off + len > buf.length) throw new Error(`netlink: message length ${len} at ${off} does not fit the ${buf.length}-byte datagram`);
    out.push({ type: buf.readUInt16LE(off + 4), flags: buf.readUInt16LE(off + 6), seq: buf.readUInt32LE(off + 8), body: buf.subarray(off + NLMSG_HDRLEN, off + len) });
    off += align4(len);
  }
  return out;
}

/** errorCode is an NLMSG_ERROR message's code: 0 (ACK) or a negative errno. */
export function errorCode(m: NlMessage): number {
  if (m.type !== NLMSG_ERROR || m.body.length < 4) throw new Error('netlink: not an error message');
  return m.body.readInt32LE(0);
}

/** parseAttrs reads rtattrs from buf into a map type -> payload (the last one wins; NLA_F_* flag bits masked off). */
export function parseAttrs(buf: Buffer): Map<number, Buffer> {
  const out = new Map<number, Buffer>();
  let off = 0;
  while (off + 4 <= buf.length) {
    const len = buf.readUInt16LE(off);
    if (len < 4 || off + len > buf.length) break;
    out.set(buf.readUInt16LE(off + 2) & 0x3fff, buf.subarray(off + 4, off + len));
    off += align4(len);
  }
  return out;
}

const cstr = (b: Buffer | undefined): string => {
  if (!b) return '';
  const z = b.indexOf(0);
  return b.subarray(0, z < 0 ? b.length : z).toString('latin1');
};

/** LinkInfo is a decoded RTM_NEWLINK. */
export interface LinkInfo {
  index: number;
  name: string;
  flags: number;
  /** IFLA_LINKINFO's kind ("veth", "bridge", ...), '' if none. */
  kind: string;
}

/** decodeLink reads an RTM_NEWLINK body. */
export function decodeLink(body: Buffer): LinkInfo {
  if (body.length < IFINFOMSG_LEN) throw new Error('netlink: short ifinfomsg');
  const attrs = parseAttrs(body.subarray(IFINFOMSG_LEN));
  const li = attrs.get(IFLA.LINKINFO);
  return { index: body.readInt32LE(4), flags: body.readUInt32LE(8), name: cstr(attrs.get(IFLA.IFNAME)), kind: li ? cstr(parseAttrs(li).get(IFLA_INFO.KIND)) : '' };
}

/** AddrInfo is a decoded RTM_NEWADDR (IPv4). */
export interface AddrInfo {
  index: number;
  prefixLen: number;
  /** "a.b.c.d" (IFA_LOCAL, else IFA_ADDRESS). */
  address: string;
}

/** decodeAddr reads an RTM_NEWADDR body. */
export function decodeAddr(body: Buffer): AddrInfo {
  if (body.length < IFADDRMSG_LEN) throw new Error('netlink: short ifaddrmsg');
  const attrs = parseAttrs(body.subarray(IFADDRMSG_LEN));
  const ip = attrs.get(IFA.LOCAL) ?? attrs.get(IFA.ADDRESS);
  return { index: body.readUInt32LE(4), prefixLen: body.readUInt8(1), address: ip && ip.length === 4 ? [...ip].join('.') : '' };
}

/** RouteInfo is a decoded RTM_NEWROUTE (IPv4). */
export interface RouteInfo {
  dstLen: number;
  table: number;
  /** "a.b.c.d" or '' (no gateway). */
  gateway: string;
  oif: number;
}

/** decodeRoute reads an RTM_NEWROUTE body. */
export function decodeRoute(body: Buffer): RouteInfo {
  if (body.length < RTMSG_LEN) throw new Error('netlink: short rtmsg');
  const attrs = parseAttrs(body.subarray(RTMSG_LEN));
  const gw = attrs.get(RTA.GATEWAY);
  const oif = attrs.get(RTA.OIF);
  return { dstLen: body.readUInt8(1), table: body.readUInt8(4), gateway: gw && gw.length === 4 ? [...gw].join('.') : '', oif: oif && oif.length >= 4 ? oif.readUInt32LE(0) : 0 };
}
