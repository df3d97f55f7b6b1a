/**
 * The node's DNS upstreams, as the resolver (forwarding a sandbox's query) and the egress proxy
 * (resolving an allowed name before connecting) use them: one query per fresh UDP socket (a
 * random source port and a random id, so an off-path spoofer must guess both), a timeout and
 * one retry on the next upstream, TCP when the client asked over TCP or the answer was
 * truncated. Queries go out from the host, so a stub on 127.0.0.53 (systemd-resolved) works.
 */
import dgram from 'node:dgram';
import { randomInt } from 'node:crypto';
import { readFileSync } from 'node:fs';
import net from 'node:net';
import dnsPacket from 'dns-packet';
import { InvalidArgumentError, parseIpv4 } from '@sandnode/shared';
import type { Destination } from './original-dst';

/** How long one upstream attempt may take, ms. */
export const DEFAULT_DNS_UPSTREAM_TIMEOUT_MS = 2000;
/** Attempts after the first (each on the next upstream). */
export const DEFAULT_DNS_RETRIES = 1;
/** Longest an answer the proxy resolved is reused, ms (the record's TTL when shorter). */
export const MAX_RESOLVE_CACHE_MS = 30_000;
const MAX_CACHE_ENTRIES = 4096;
const MAX_DNS_MESSAGE = 65535;

/**
 * resolvConfNameservers are the IPv4 `nameserver` lines of `file` as upstreams on port 53
 * (the server key dnsUpstreams defaults to these). Throws an Error naming the file when it
 * cannot be read or names none.
 */
export function resolvConfNameservers(file = '/etc/resolv.conf'): Destination[] {
  const text = readFileSync(file, 'utf8');
  const out = text
    .split('\n')
    .map((l) => /^\s*nameserver\s+(\S+)/.exec(l)?.[1])
    .filter((a): a is string => a !== undefined && parseIpv4(a) !== undefined)
    .map((address) => ({ address, port: 53 }));
  if (out.length === 0) throw new Error(`${file} names no IPv4 nameserver; set dnsUpstreams`);
  return out;
}

/**
 * parseDnsUpstreams reads the server key dnsUpstreams: entries "a.b.c.d" (port 53) or
 * "a.b.c.d:port". Throws InvalidArgumentError naming `field[i]` for anything else, or for an
 * empty list.
 */
export function parseDnsUpstreams(list: readonly string[], field = 'dnsUpstreams'): Destination[] {
  if (list.length === 0) throw new InvalidArgumentError(`${field}: at least one upstream (or leave it unset: /etc/resolv.conf)`);
  return list.map((e, i) => {
    const m = /^([\d.]+)(?::(\d{1,5}))?$/.exec(e);
    const port = m?.[2] === undefined ? 53 : Number(m[2]);
    if (!m || parseIpv4(m[1]!) === undefined || port < 1 || port > 65535) throw new InvalidArgumentError(`${field}[${i}]: "${e}" is not an IPv4 address[:port]`);
    return { address: m[1]!, port };
  });
}

/** Options of {@link UpstreamDns}. */
export interface UpstreamDnsOptions {
  /** where to forward, in order of preference (non-empty) */
  upstreams: Destination[];
  /** per attempt, ms (default DEFAULT_DNS_UPSTREAM_TIMEOUT_MS) */
  timeoutMs?: number;
  /** attempts after the first (default DEFAULT_DNS_RETRIES) */
  retries?: number;
}

/** Raised when no upstream answered in time (the resolver answers SERVFAIL). */
export class UpstreamTimeoutError extends Error {}

/** UpstreamDns sends DNS messages to the node's upstreams. */
export class UpstreamDns {
  private readonly upstreams: Destination[];
  private readonly timeoutMs: number;
  private readonly retries: number;
  private next = 0;
  private readonly cache = new Map<string, { addresses: string[]; until: number }>();

  constructor(opts: UpstreamDnsOptions) {
    if (opts.upstreams.length === 0) throw new Error('dnsUpstreams: at least one upstream');
    this.upstreams = opts.upstreams;
    this.timeoutMs = opts.timeoutMs ?? DEFAULT_DNS_UPSTREAM_TIMEOUT_MS;
    this.retries = opts.retries ?? DEFAULT_DNS_RETRIES;
  }

  /**
   * exchange forwards the DNS message `query` (wire format, any id) and resolves to the
   * upstream's answer carrying `query`'s id. `tcp`: ask over TCP (else UDP, and TCP again when
   * the UDP answer is truncated). Rejects with UpstreamTimeoutError when every attempt timed
   * out or failed.
   */
  async exchange(query: Buffer, tcp = false): Promise<Buffer> {
    const id = query.readUInt16BE(0);
    let last: unknown;
    for (let attempt = 0; attempt <= this.retries; attempt++) {
      const up = this.upstreams[this.next++ % this.upstreams.length]!;
      const wireId = randomInt(0, 65536);
      const q = Buffer.from(query);
      q.writeUInt16BE(wireId, 0);
      try {
        let answer = tcp ? await this.overTcp(up, q) : await this.overUdp(up, q, wireId);
        if (!tcp && (answer.readUInt16BE(2) & 0x0200) !== 0) answer = await this.overTcp(up, q); // TC bit
        if (answer.readUInt16BE(0) !== wireId) throw new Error('answer id does not match');
        const out = Buffer.from(answer);
        out.writeUInt16BE(id, 0);
        return out;
      } catch (err) {
        last = err;
      }
    }
    throw new UpstreamTimeoutError(`no DNS upstream answered (${(last as Error)?.message ?? 'timeout'})`);
  }

  /**
   * resolve4 is the IPv4 addresses of `name` (A records, CNAMEs followed by the upstream),
   * cached for the records' TTL (at most MAX_RESOLVE_CACHE_MS). Empty when the name has none
   * (NXDOMAIN, NODATA). Rejects with UpstreamTimeoutError when no upstream answered.
   */
  async resolve4(name: string): Promise<string[]> {
    const hit = this.cache.get(name);
    if (hit && hit.until > Date.now()) return hit.addresses;
    const q = dnsPacket.encode({ type: 'query', id: 0, flags: dnsPacket.RECURSION_DESIRED, questions: [{ type: 'A', name, class: 'IN' }] });
    const answer = dnsPacket.decode(await this.exchange(q));
    const records = (answer.answers ?? []).flatMap((a) => (a.type === 'A' ? [a] : []));
    const addresses = records.map((a) => a.data);
    const ttl = Math.min(MAX_RESOLVE_CACHE_MS, ...records.map((a) => (a.ttl ?? 0) * 1000));
    if (addresses.length > 0 && ttl > 0) {
      if (this.cache.size >= MAX_CACHE_ENTRIES) this.cache.delete(this.cache.keys().next().value!);
      this.cache.set(name, { addresses, until: Date.now() + ttl });
    }
    return addresses;
  }

  private overUdp(up: Destination, q: Buffer, wireId: number): Promise<Buffer> {
    return new Promise((resolve, reject) => {
      const sock = dgram.createSocket('udp4');
      let settled = false;
      const done = (err: Error | undefined, msg?: Buffer) => {
        if (settled) return;
        settled = true;
        clearTimeout(timer);
        sock.close();
        if (err) reject(err);
        else resolve(msg!);
      };
      const timer = setTimeout(() => done(new Error(`${up.address}:${up.port} timed out after ${this.timeoutMs} ms`)), this.timeoutMs);
      sock.on('error', (err) => done(err));
      sock.on('message', (msg, rinfo) => {
        // Only the upstream's answer to this query: anything else is ignored (spoofing, strays).
        if (rinfo.address !== up.address || rinfo.port !== up.port || msg.length < 12 || msg.readUInt16BE(0) !== wireId) return;
        done(undefined, msg);
      });
      sock.send(q, up.port, up.address, (err) => {
        if (err) done(err);
      });
    });
  }

  private overTcp(up: Destination, q: Buffer): Promise<Buffer> {
    return new Promise((resolve, reject) => {
      const sock = net.connect({ host: up.address, port: up.port });
      let buf = Buffer.alloc(0);
      let settled = false;
      const done = (err: Error | undefined, msg?: Buffer) => {
        if (settled) return;
        settled = true;
        clearTimeout(timer);
        sock.destroy();
        if (err) reject(err);
        else resolve(msg!);
      };
      const timer = setTimeout(() => done(new Error(`${up.address}:${up.port} (tcp) timed out after ${this.timeoutMs} ms`)), this.timeoutMs);
      sock.on('error', (err) => done(err));
      sock.on('close', () => done(new Error(`${up.address}:${up.port} (tcp) closed before answering`)));
      sock.on('data', (d) => {
        buf = Buffer.concat([buf, d]);
        if (buf.length > MAX_DNS_MESSAGE + 2) return done(new Error('answer too long'));
        if (buf.length >= 2 && buf.length >= 2 + buf.readUInt16BE(0)) done(undefined, buf.subarray(2, 2 + buf.readUInt16BE(0)));
      });
      const len = Buffer.alloc(2);
      len.writeUInt16BE(q.length);
      sock.write(Buffer.concat([len, q]));
    });
  }
}
