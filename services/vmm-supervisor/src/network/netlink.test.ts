/** Unit: the rtnetlink codec's wire form (byte by byte for the header and attributes) and its decoders. netlink.it.test.ts runs the same messages against the kernel. */
import * as nl from './netlink';

describe('netlink codec', () => {
  test('message: nlmsghdr (len, type, flags, seq, pid 0) then the body padded to 4', () => {
    const m = nl.message(nl.RTM.NEWLINK, nl.NLM_F.REQUEST | nl.NLM_F.ACK, 7, Buffer.from([1, 2, 3]));
    expect(m.length).toBe(20);
    expect(m.readUInt32LE(0)).toBe(19); // the unpadded length
    expect(m.readUInt16LE(4)).toBe(16);
    expect(m.readUInt16LE(6)).toBe(5);
    expect(m.readUInt32LE(8)).toBe(7);
    expect(m.readUInt32LE(12)).toBe(0);
    expect([...m.subarray(16)]).toEqual([1, 2, 3, 0]);
  });

  test('attributes: len includes the 4-byte head, payload padded; nested attributes inside', () => {
    const b = nl.encodeAttrs([nl.strAttr(3, 'eth0'), { type: 18, value: [nl.strAttr(1, 'veth')] }]);
    // "eth0\0": len 9, padded to 12; nested: head 4 + ("veth\0": 9 -> 12) = 16
    expect(b.length).toBe(12 + 4 + 12);
    expect(b.readUInt16LE(0)).toBe(9);
    expect(b.readUInt16LE(2)).toBe(3);
    expect(b.subarray(4, 9).toString('latin1')).toBe('eth0\0');
    expect(b.readUInt16LE(12)).toBe(16);
    expect(b.readUInt16LE(14)).toBe(18);
    expect(b.readUInt16LE(16)).toBe(9);
    const outer = nl.parseAttrs(b);
    expect(outer.get(3)!.toString('latin1')).toBe('eth0\0');
    expect(nl.parseAttrs(outer.get(18)!).get(1)!.toString('latin1')).toBe('veth\0');
  });

  test('newVeth: ifinfomsg, IFLA_IFNAME, IFLA_LINKINFO { KIND veth, DATA { PEER: ifinfomsg + IFNAME + NET_NS_FD } }, CREATE|EXCL|ACK', () => {
    const m = nl.parseMessages(nl.newVeth(9, 'eth0', 'snzzv3', 42))[0]!;
    expect(m.type).toBe(nl.RTM.NEWLINK);
    expect(m.flags).toBe(nl.NLM_F.REQUEST | nl.NLM_F.ACK | nl.NLM_F.CREATE | nl.NLM_F.EXCL);
    expect(m.seq).toBe(9);
    const top = nl.parseAttrs(m.body.subarray(16));
    expect(top.get(nl.IFLA.IFNAME)!.toString('latin1')).toBe('eth0\0');
    const info = nl.parseAttrs(top.get(nl.IFLA.LINKINFO)!);
    expect(info.get(nl.IFLA_INFO.KIND)!.toString('latin1')).toBe('veth\0');
    const peer = nl.parseAttrs(info.get(nl.IFLA_INFO.DATA)!).get(nl.VETH_INFO_PEER)!;
    const peerAttrs = nl.parseAttrs(peer.subarray(16));
    expect(peerAttrs.get(nl.IFLA.IFNAME)!.toString('latin1')).toBe('snzzv3\0');
    expect(peerAttrs.get(nl.IFLA.NET_NS_FD)!.readUInt32LE(0)).toBe(42);
    expect(nl.decodeLink(m.body)).toEqual({ index: 0, flags: 0, name: 'eth0', kind: 'veth' });
    // without a netns fd the peer has no NET_NS_FD
    const m2 = nl.parseMessages(nl.newVeth(1, 'a', 'b', -1))[0]!;
    const peer2 = nl.parseAttrs(
      nl
        .parseAttrs(nl.parseAttrs(nl.parseAttrs(m2.body.subarray(16)).get(nl.IFLA.LINKINFO)!).get(nl.IFLA_INFO.DATA)!)
        .get(nl.VETH_INFO_PEER)!
        .subarray(16),
    );
    expect(peer2.has(nl.IFLA.NET_NS_FD)).toBe(false);
  });

  test('newAddr and newDefaultRoute: ifaddrmsg / rtmsg fields, IPv4 bytes in network order, CREATE|REPLACE', () => {
    const a = nl.parseMessages(nl.newAddr(3, 17, '10.211.224.2', 30))[0]!;
    expect(a.type).toBe(nl.RTM.NEWADDR);
    expect(a.flags).toBe(nl.NLM_F.REQUEST | nl.NLM_F.ACK | nl.NLM_F.CREATE | nl.NLM_F.REPLACE);
    expect([...a.body.subarray(0, 8)]).toEqual([2, 30, 0, 0, 17, 0, 0, 0]);
    expect([...nl.parseAttrs(a.body.subarray(8)).get(nl.IFA.LOCAL)!]).toEqual([10, 211, 224, 2]);
    expect(nl.decodeAddr(a.body)).toEqual({ index: 17, prefixLen: 30, address: '10.211.224.2' });
    const r = nl.parseMessages(nl.newDefaultRoute(4, 17, '10.211.224.1'))[0]!;
    expect(r.type).toBe(nl.RTM.NEWROUTE);
    expect([...r.body.subarray(0, 8)]).toEqual([2, 0, 0, 0, 254, 3, 0, 1]);
    expect(nl.decodeRoute(r.body)).toEqual({ dstLen: 0, table: 254, gateway: '10.211.224.1', oif: 17 });
  });

  test('setLinkUp sets IFF_UP in flags and change; delLink is RTM_DELLINK by name', () => {
    const u = nl.parseMessages(nl.setLinkUp(1, 'lo'))[0]!;
    expect(u.body.readUInt32LE(8)).toBe(nl.IFF_UP);
    expect(u.body.readUInt32LE(12)).toBe(nl.IFF_UP);
    expect(u.flags & nl.NLM_F.CREATE).toBe(0);
    const d = nl.parseMessages(nl.delLink(2, 'snzzv3'))[0]!;
    expect(d.type).toBe(nl.RTM.DELLINK);
    expect(nl.decodeLink(d.body).name).toBe('snzzv3');
  });

  test('parseMessages splits several messages; errorCode reads an ACK (0) and an errno; a bad length throws', () => {
    const ack = Buffer.alloc(4);
    ack.writeInt32LE(0, 0);
    const err = Buffer.alloc(4);
    err.writeInt32LE(-17, 0);
    const both = Buffer.concat([nl.message(nl.NLMSG_ERROR, 0, 5, ack), nl.message(nl.NLMSG_ERROR, 0, 6, err), nl.message(nl.NLMSG_DONE, nl.NLM_F.MULTI, 6, Buffer.alloc(4))]);
    const ms = nl.parseMessages(both);
    expect(ms.map((m) => [m.type, m.seq])).toEqual([
      [2, 5],
      [2, 6],
      [3, 6],
    ]);
    expect(nl.errorCode(ms[0]!)).toBe(0);
    expect(nl.errorCode(ms[1]!)).toBe(-17);
    expect(() => nl.errorCode(ms[2]!)).toThrow(/not an error/);
    const bad = Buffer.from(both);
    bad.writeUInt32LE(9999, 0);
    expect(() => nl.parseMessages(bad)).toThrow(/does not fit/);
    const tiny = Buffer.from(both);
    tiny.writeUInt32LE(4, 0);
    expect(() => nl.parseMessages(tiny)).toThrow(/length 4/);
  });

  test('parseAttrs stops at a truncated attribute instead of reading past the buffer; NLA_F flag bits are masked', () => {
    const b = nl.encodeAttrs([nl.strAttr(3, 'x'), nl.strAttr(0x8000 | 18, 'y')]);
    const m = nl.parseAttrs(b);
    expect([...m.keys()]).toEqual([3, 18]);
    const cut = Buffer.from(b);
    cut.writeUInt16LE(200, 8); // the second one claims more than there is
    expect([...nl.parseAttrs(cut).keys()]).toEqual([3]);
  });

  test('bad names and addresses are refused before anything is sent', () => {
    for (const name of ['', 'a'.repeat(16), 'a/b', 'a b', '..', 'x:0', 'eth0\0']) expect(() => nl.delLink(1, name)).toThrow(/not an interface name/);
    for (const ip of ['10.0.0', '256.0.0.1', '1.2.3.4/30', ' 1.2.3.4', '::1']) expect(() => nl.newAddr(1, 1, ip, 30)).toThrow(/not an IPv4 address/);
    expect(() => nl.newAddr(1, 1, '10.0.0.1', 33)).toThrow(/prefix length/);
    expect(nl.ifnameOk('snzzv1023')).toBe(true);
  });
});
