/**
 * The destination a sandbox meant, for a connection the kernel redirected to the egress proxy
 * (nftables `redirect to :port` in the node's prerouting chain): getsockopt(SOL_IP,
 * SO_ORIGINAL_DST) reads it from conntrack. Node has no binding, so it goes through the
 * project's one koffi libc loading (shared `libcSockopt`).
 */
import type net from 'node:net';
import { fdOfSocket, formatIpv4, libcSockopt } from '@sandnode/shared';

// linux/in.h, linux/netfilter_ipv4.h
const SOL_IP = 0;
const SO_ORIGINAL_DST = 80;
const AF_INET = 2;

/** An IPv4 address and TCP port. */
export interface Destination {
  address: string;
  port: number;
}

/**
 * originalDestination is where the sandbox's connection on `socket` was going before the
 * redirect. Throws an Error naming errno when there is none (ENOENT: not redirected; EBADF) or
 * koffi/libc do not load; callers refuse the connection.
 */
export function originalDestination(socket: net.Socket): Destination {
  const fd = fdOfSocket(socket);
  const { getsockopt, errno } = libcSockopt();
  const buf = Buffer.alloc(16); // struct sockaddr_in
  const len = [buf.length];
  if (getsockopt(fd, SOL_IP, SO_ORIGINAL_DST, buf, len) !== 0) throw new Error(`getsockopt(SO_ORIGINAL_DST) on fd ${fd} failed, errno ${errno()}`);
  if (buf.readUInt16LE(0) !== AF_INET) throw new Error(`SO_ORIGINAL_DST on fd ${fd}: not an IPv4 address`);
  return { port: buf.readUInt16BE(2), address: formatIpv4(buf.readUInt32BE(4)) };
}
