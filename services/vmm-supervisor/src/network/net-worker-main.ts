/**
 * The network worker thread (node:worker_threads; started by net-worker.ts): slot setup and
 * nftables changes in-process, without a process per step. It calls libc through koffi on its
 * own OS thread, so `unshare(CLONE_NEWNET)` and `setns` move only this thread between
 * namespaces (the rest of the supervisor stays in the host's netns), and rtnetlink through a
 * NETLINK_ROUTE socket with the messages of netlink.ts; nftables changes run through
 * libnftables' `nft_run_cmd_from_buffer` (one buffer = one batch = one transaction, like
 * `nft -f`). Requests are served one at a time; every request that leaves the host netns goes
 * back to it before it answers, and a worker that cannot go back exits (the caller then uses
 * the spawn path), so no request ever runs in a slot's namespace by mistake.
 *
 * Protocol: parent -> {id, op, args}; worker -> {id, ok: true, result} | {id, ok: false, error,
 * errno, step}. Ops: slotNetns + slotHost (a veth-mode slot), destroySlot, nft, links.
 */
import { parentPort } from 'node:worker_threads';
import type * as Koffi from 'koffi' with { 'resolution-mode': 'import' };
import * as nl from './netlink';
import { nftRun } from './nft-lib';

const koffi = require('koffi') as typeof Koffi;

const CLONE_NEWNET = 0x40000000;
const MS_BIND = 4096;
const O_WRONLY = 0o1;
const O_CREAT = 0o100;
const O_NOFOLLOW = 0o400000;
const O_CLOEXEC = 0o2000000;
const O_RDONLY = 0;
const AF_NETLINK = 16;
const SOCK_RAW = 3;
const SOCK_CLOEXEC = 0o2000000;
const NETLINK_ROUTE = 0;
const SOL_SOCKET = 1;
const SO_RCVTIMEO = 20;
const UMOUNT_NOFOLLOW = 8;
const ERRNO = { ENOENT: 2, ENODEV: 19, EINVAL: 22 };

const libc = koffi.load('libc.so.6');
const c = {
  unshare: libc.func('int unshare(int flags)') as (f: number) => number,
  setns: libc.func('int setns(int fd, int nstype)') as (fd: number, t: number) => number,
  mount: libc.func('int mount(const char *src, const char *dst, const char *fstype, unsigned long flags, const void *data)') as (s: string, d: string, t: null, f: number, x: null) => number,
  umount2: libc.func('int umount2(const char *target, int flags)') as (t: string, f: number) => number,
  open: libc.func('int open(const char *path, int flags, int mode)') as (p: string, f: number, m: number) => number,
  close: libc.func('int close(int fd)') as (fd: number) => number,
  write: libc.func('long write(int fd, const void *buf, size_t n)') as (fd: number, b: Buffer, n: number) => number,
  unlink: libc.func('int unlink(const char *path)') as (p: string) => number,
  socket: libc.func('int socket(int domain, int type, int proto)') as (d: number, t: number, p: number) => number,
  setsockopt: libc.func('int setsockopt(int fd, int level, int name, const void *val, unsigned int len)') as (fd: number, l: number, n: number, v: Buffer, len: number) => number,
  send: libc.func('long send(int fd, const void *buf, size_t n, int flags)') as (fd: number, b: Buffer, n: number, f: number) => number,
  recv: libc.func('long recv(int fd, void *buf, size_t n, int flags)') as (fd: number, b: Buffer, n: number, f: number) => number,
};

/** A failed step: its name and errno (0: not a system call). */
class StepError extends Error {
  constructor(
    readonly step: string,
    readonly errno: number,
    detail = '',
  ) {
    super(`${step}: ${detail || `errno ${errno}`}`);
  }
}

function sys(step: string, r: number): number {
  if (r < 0) throw new StepError(step, koffi.errno());
  return r;
}

/** The host netns of this thread when it started (every request returns to it). */
const hostNs = sys('open host netns', c.open('/proc/thread-self/ns/net', O_RDONLY | O_CLOEXEC, 0));

/** Rtnl is one NETLINK_ROUTE socket in the netns of the thread when it was opened. */
class Rtnl {
  private readonly fd: number;
  private seq = 1;
  private readonly buf = Buffer.alloc(64 * 1024);

  constructor() {
    this.fd = sys('netlink socket', c.socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_ROUTE));
    const tv = Buffer.alloc(16);
    tv.writeBigInt64LE(5n, 0); // 5 s: the kernel answers at once; a hang is a bug, not a wait
    sys('netlink SO_RCVTIMEO', c.setsockopt(this.fd, SOL_SOCKET, SO_RCVTIMEO, tv, 16));
  }

  close(): void {
    c.close(this.fd);
  }

  /** request sends msg (built with seq) and returns its answers; throws StepError for a NLMSG_ERROR code, ok lists the errnos that count as success. */
  request(step: string, build: (seq: number) => Buffer, ok: number[] = []): nl.NlMessage[] {
    const seq = this.seq++;
    const msg = build(seq);
    if (c.send(this.fd, msg, msg.length, 0) !== msg.length) throw new StepError(`${step} (send)`, koffi.errno());
    const out: nl.NlMessage[] = [];
    for (;;) {
      const n = c.recv(this.fd, this.buf, this.buf.length, 0);
      if (n < 0) throw new StepError(`${step} (recv)`, koffi.errno());
      for (const m of nl.parseMessages(Buffer.from(this.buf.subarray(0, n)))) {
        if (m.seq !== seq) continue; // a late answer of an earlier request
        if (m.type === nl.NLMSG_ERROR) {
          const code = nl.errorCode(m);
          if (code === 0 || ok.includes(-code)) return out;
          throw new StepError(step, -code);
        }
        if (m.type === nl.NLMSG_DONE) return out;
        out.push(m);
        if ((m.flags & nl.NLM_F.MULTI) === 0) return out; // a single answer (getLink) without ACK
      }
    }
  }

  index(name: string): number {
    const [m] = this.request(`get link ${name}`, (s) => nl.getLink(s, name));
    if (!m) throw new StepError(`get link ${name}`, ERRNO.ENODEV);
    return nl.decodeLink(m.body).index;
  }
}

let host: Rtnl | undefined;
const hostRtnl = (): Rtnl => (host ??= new Rtnl());

function writeFile(step: string, p: string, text: string): void {
  const fd = sys(step, c.open(p, O_WRONLY | O_CLOEXEC | O_NOFOLLOW, 0));
  try {
    const b = Buffer.from(text);
    if (c.write(fd, b, b.length) !== b.length) throw new StepError(step, koffi.errno());
  } finally {
    c.close(fd);
  }
}

/** backHome moves this thread to the host netns; when it cannot, the worker ends (the caller falls back to spawning). */
function backHome(): void {
  if (c.setns(hostNs, CLONE_NEWNET) !== 0) {
    const errno = koffi.errno();
    parentPort?.postMessage({ fatal: `setns back to the host netns failed: errno ${errno}` });
    process.exit(1); // ends this worker thread only
  }
}

/** SlotArgs: what createSlot needs of a slot (SlotAddresses' fields). */
interface SlotArgs {
  netnsPath: string;
  hostIfname: string;
  address: string;
  gateway: string;
  prefixLen: number;
  /** The netns file is a bind mount already: enter it instead of making one. */
  existing: boolean;
}

/**
 * slotNetns + slotHost (two requests, so that a failpoint can stop between them): the netns (unshare + bind mount on netnsPath, or setns into the existing one),
 * IPv6 off in it, lo up, the veth pair eth0 <-> hostIfname (the host end moved to the host
 * netns in the same message), address/prefixLen + default route via gateway on eth0, then on
 * the host gateway/prefixLen on hostIfname and up. The caller undoes a failure with destroySlot.
 */
function slotNetns(a: SlotArgs): void {
  let nsFd = -1;
  if (a.existing) {
    nsFd = sys(`open ${a.netnsPath}`, c.open(a.netnsPath, O_RDONLY | O_CLOEXEC | O_NOFOLLOW, 0));
  } else {
    c.close(sys(`create ${a.netnsPath}`, c.open(a.netnsPath, O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0o444)));
  }
  try {
    if (nsFd >= 0) sys('setns slot netns', c.setns(nsFd, CLONE_NEWNET));
    else sys('unshare netns', c.unshare(CLONE_NEWNET));
    try {
      if (nsFd < 0) sys(`bind netns on ${a.netnsPath}`, c.mount('/proc/thread-self/ns/net', a.netnsPath, null, MS_BIND, null));
      for (const f of ['all', 'default']) writeFile(`disable ipv6 (${f})`, `/proc/sys/net/ipv6/conf/${f}/disable_ipv6`, '1\n');
      const r = new Rtnl();
      try {
        r.request('lo up', (s) => nl.setLinkUp(s, 'lo'));
        r.request(`veth eth0 <-> ${a.hostIfname}`, (s) => nl.newVeth(s, 'eth0', a.hostIfname, hostNs));
        const eth0 = r.index('eth0');
        r.request('eth0 address', (s) => nl.newAddr(s, eth0, a.address, a.prefixLen));
        r.request('eth0 up', (s) => nl.setLinkUp(s, 'eth0'));
        r.request('default route', (s) => nl.newDefaultRoute(s, eth0, a.gateway));
      } finally {
        r.close();
      }
    } finally {
      backHome();
    }
  } finally {
    if (nsFd >= 0) c.close(nsFd);
  }
}

function slotHost(a: SlotArgs): void {
  const h = hostRtnl();
  const idx = h.index(a.hostIfname);
  h.request(`${a.hostIfname} address`, (s) => nl.newAddr(s, idx, a.gateway, a.prefixLen));
  h.request(`${a.hostIfname} up`, (s) => nl.setLinkUp(s, a.hostIfname));
}

/** destroySlot: the host veth (its peer goes with it), the netns bind mount, the file. Each step tolerates "already gone". */
function destroySlot(a: { netnsPath: string; hostIfname: string }): void {
  hostRtnl().request(`delete ${a.hostIfname}`, (s) => nl.delLink(s, a.hostIfname), [ERRNO.ENODEV]);
  if (c.umount2(a.netnsPath, UMOUNT_NOFOLLOW) !== 0) {
    const e = koffi.errno();
    if (e !== ERRNO.EINVAL && e !== ERRNO.ENOENT) throw new StepError(`umount ${a.netnsPath}`, e);
  }
  if (c.unlink(a.netnsPath) !== 0 && koffi.errno() !== ERRNO.ENOENT) throw new StepError(`unlink ${a.netnsPath}`, koffi.errno());
}

/** links lists the host's links whose name starts with prefix, with their IPv4 addresses ("a.b.c.d/p") and up flag. */
function links(prefix: string): { name: string; up: boolean; addrs: string[] }[] {
  const h = hostRtnl();
  const byIndex = new Map<number, { name: string; up: boolean; addrs: string[] }>();
  for (const m of h.request('dump links', (s) => nl.dumpLinks(s))) {
    if (m.type !== nl.RTM.NEWLINK) continue;
    const l = nl.decodeLink(m.body);
    if (l.name.startsWith(prefix)) byIndex.set(l.index, { name: l.name, up: (l.flags & nl.IFF_UP) !== 0, addrs: [] });
  }
  for (const m of h.request('dump addresses', (s) => nl.dumpAddrs(s))) {
    if (m.type !== nl.RTM.NEWADDR) continue;
    const a = nl.decodeAddr(m.body);
    byIndex.get(a.index)?.addrs.push(`${a.address}/${a.prefixLen}`);
  }
  return [...byIndex.values()];
}

parentPort?.on('message', (m: { id: number; op: string; args: unknown }) => {
  try {
    let result: unknown;
    if (m.op === 'slotNetns') slotNetns(m.args as SlotArgs);
    else if (m.op === 'slotHost') slotHost(m.args as SlotArgs);
    else if (m.op === 'destroySlot') destroySlot(m.args as { netnsPath: string; hostIfname: string });
    else if (m.op === 'nft') result = nftRun(m.args as string);
    else if (m.op === 'links') result = links(m.args as string);
    else throw new StepError(`unknown op ${m.op}`, 0);
    parentPort?.postMessage({ id: m.id, ok: true, result });
  } catch (err) {
    const e = err as StepError;
    parentPort?.postMessage({ id: m.id, ok: false, error: e.message, errno: e.errno ?? 0, step: e.step ?? '' });
  }
});
