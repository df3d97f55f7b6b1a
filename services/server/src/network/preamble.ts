/**
 * The first bytes of a proxied TCP connection, read before anything is sent upstream: a TLS
 * ClientHello (its server_name extension, RFC 6066 §3) or an HTTP/1.x request line and its Host
 * header. Pure functions over a buffer that never throw: every malformed input is a verdict.
 *
 * parsePreamble is called each time more bytes arrive; it answers `more` while the buffer is a
 * valid prefix, and the caller bounds the wait (bytes and time, see egress-proxy.ts).
 */

/** Most bytes read before a decision; a longer preamble is refused. */
export const MAX_PREAMBLE_BYTES = 16 * 1024;

/** What the first bytes of a connection are. */
export type Preamble =
  /** a valid prefix so far: wait for more bytes */
  | { kind: 'more' }
  /** a TLS ClientHello; `sni` is its host_name (undefined when it has none) */
  | { kind: 'tls'; sni: string | undefined }
  /** an HTTP/1.x request head; `host` from the Host header (or the absolute-form target) */
  | { kind: 'http'; method: string; target: string; host: string | undefined }
  /** neither TLS nor HTTP (another protocol): decided by address only */
  | { kind: 'other' }
  /** TLS or HTTP, but malformed (or over MAX_PREAMBLE_BYTES): refused */
  | { kind: 'invalid'; why: string };

const TLS_HANDSHAKE = 0x16;
const CLIENT_HELLO = 1;
const EXT_SERVER_NAME = 0;

/** parsePreamble classifies the first bytes `buf` of a connection (never throws). */
export function parsePreamble(buf: Buffer): Preamble {
  if (buf.length === 0) return { kind: 'more' };
  if (buf[0] === TLS_HANDSHAKE) return parseClientHello(buf);
  if (isTokenChar(buf[0]!)) return parseHttpHead(buf);
  return { kind: 'other' };
}

/**
 * parseClientHello reads TLS records (type 22) from `buf` and the ClientHello they carry (it
 * may span records). `more` while incomplete.
 */
export function parseClientHello(buf: Buffer): Preamble {
  // Reassemble the handshake message from consecutive records.
  const parts: Buffer[] = [];
  let have = 0;
  let off = 0;
  let need = -1; // handshake message length incl. its 4-byte header, once known
  for (;;) {
    if (off + 5 > buf.length) return tooLong(buf) ?? { kind: 'more' };
    if (buf[off] !== TLS_HANDSHAKE) return { kind: 'invalid', why: 'TLS record is not a handshake' };
    if (buf[off + 1] !== 3) return { kind: 'invalid', why: 'TLS record version is not 3.x' };
    const len = buf.readUInt16BE(off + 3);
    if (len === 0 || len > 16384) return { kind: 'invalid', why: 'TLS record length out of range' };
    const recEnd = off + 5 + len;
    const avail = Math.min(recEnd, buf.length);
    parts.push(buf.subarray(off + 5, avail));
    have += avail - off - 5;
    if (need < 0 && have >= 4) {
      const head = Buffer.concat(parts);
      if (head[0] !== CLIENT_HELLO) return { kind: 'invalid', why: 'first handshake message is not a ClientHello' };
      need = 4 + head.readUIntBE(1, 3);
      if (need > MAX_PREAMBLE_BYTES) return { kind: 'invalid', why: `ClientHello over ${MAX_PREAMBLE_BYTES} bytes` };
    }
    if (need >= 0 && have >= need) break;
    if (avail < recEnd) return tooLong(buf) ?? { kind: 'more' };
    off = recEnd;
  }
  return readClientHello(Buffer.concat(parts).subarray(4, need));
}

function tooLong(buf: Buffer): Preamble | undefined {
  return buf.length >= MAX_PREAMBLE_BYTES ? { kind: 'invalid', why: `preamble over ${MAX_PREAMBLE_BYTES} bytes` } : undefined;
}

/** readClientHello walks a complete ClientHello body (after the handshake header) to the SNI. */
function readClientHello(b: Buffer): Preamble {
  const bad = (why: string): Preamble => ({ kind: 'invalid', why: `ClientHello: ${why}` });
  let p = 2 + 32; // legacy_version, random
  if (p + 1 > b.length) return bad('truncated before session id');
  p += 1 + b[p]!;
  if (p + 2 > b.length) return bad('truncated before cipher suites');
  p += 2 + b.readUInt16BE(p);
  if (p + 1 > b.length) return bad('truncated before compression methods');
  p += 1 + b[p]!;
  if (p === b.length) return { kind: 'tls', sni: undefined }; // no extensions
  if (p + 2 > b.length) return bad('truncated before extensions');
  const extEnd = p + 2 + b.readUInt16BE(p);
  if (extEnd !== b.length) return bad('extensions length does not match');
  p += 2;
  let sni: string | undefined;
  const seen = new Set<number>();
  while (p < extEnd) {
    if (p + 4 > extEnd) return bad('truncated extension header');
    const type = b.readUInt16BE(p);
    const len = b.readUInt16BE(p + 2);
    p += 4;
    if (p + len > extEnd) return bad('extension overruns');
    if (seen.has(type)) return bad(`extension ${type} repeated`);
    seen.add(type);
    if (type === EXT_SERVER_NAME) {
      const r = readServerName(b.subarray(p, p + len));
      if (typeof r !== 'string' && r !== undefined) return bad(r.why);
      sni = r;
    }
    p += len;
  }
  return { kind: 'tls', sni };
}

/** readServerName reads a ServerNameList: the host_name entry (exactly one), or an error. */
function readServerName(e: Buffer): string | undefined | { why: string } {
  if (e.length === 0) return undefined; // a server's empty echo; not sent by clients, harmless
  if (e.length < 2 || e.readUInt16BE(0) !== e.length - 2) return { why: 'server_name list length' };
  let p = 2;
  let name: string | undefined;
  while (p < e.length) {
    if (p + 3 > e.length) return { why: 'server_name entry truncated' };
    const type = e[p]!;
    const len = e.readUInt16BE(p + 1);
    p += 3;
    if (p + len > e.length) return { why: 'server_name entry overruns' };
    if (type === 0) {
      if (name !== undefined) return { why: 'two host_name entries' };
      const raw = e.subarray(p, p + len);
      if (len === 0 || !raw.every((c) => c > 0x20 && c < 0x7f)) return { why: 'host_name is not printable ASCII' };
      name = raw.toString('latin1');
    }
    p += len;
  }
  return name;
}

// RFC 9110 token characters (method names)
function isTokenChar(c: number): boolean {
  return (c >= 0x30 && c <= 0x39) || (c >= 0x41 && c <= 0x5a) || (c >= 0x61 && c <= 0x7a) || "!#$%&'*+-.^_`|~".includes(String.fromCharCode(c));
}

const REQUEST_LINE = /^([!#$%&'*+\-.^_`|~0-9A-Za-z]{1,32}) ([^\s]{1,8192}) HTTP\/1\.[01]$/;
const HEADER = /^([!#$%&'*+\-.^_`|~0-9A-Za-z]+):[ \t]*(.*?)[ \t]*$/;

/**
 * parseHttpHead reads an HTTP/1.x request head (request line + headers up to the empty line).
 * `host` is the authority of an absolute-form target ("http://h:80/x", RFC 9112 §3.2.2) or
 * else the Host header; two Host headers are invalid. CONNECT is answered as invalid (the
 * sandbox's port 80 is not a forward proxy).
 */
export function parseHttpHead(buf: Buffer): Preamble {
  const limit = Math.min(buf.length, MAX_PREAMBLE_BYTES);
  const text = buf.toString('latin1', 0, limit);
  const firstEol = text.indexOf('\n');
  if (firstEol < 0) {
    if (!/^[!#$%&'*+\-.^_`|~0-9A-Za-z]{1,32}( |$)/.test(text)) return { kind: 'other' };
    return tooLong(buf) ?? { kind: 'more' };
  }
  const end = text.indexOf('\r\n\r\n');
  const line = text.slice(0, firstEol).replace(/\r$/, '');
  const m = REQUEST_LINE.exec(line);
  if (!m) return /^[!#$%&'*+\-.^_`|~0-9A-Za-z]{1,32} /.test(line) ? { kind: 'invalid', why: 'HTTP request line malformed' } : { kind: 'other' };
  if (end < 0) return tooLong(buf) ?? { kind: 'more' };
  const method = m[1]!;
  const target = m[2]!;
  if (method === 'CONNECT') return { kind: 'invalid', why: 'CONNECT is not proxied' };
  let host: string | undefined;
  for (const h of text.slice(firstEol + 1, end).split('\r\n')) {
    if (h.length === 0) continue;
    const hm = HEADER.exec(h);
    if (!hm) return { kind: 'invalid', why: 'HTTP header line malformed' };
    if (hm[1]!.toLowerCase() !== 'host') continue;
    if (host !== undefined) return { kind: 'invalid', why: 'two Host headers' };
    host = hm[2]!;
  }
  const abs = /^https?:\/\/([^/?#@]+)/i.exec(target);
  if (abs) host = abs[1]!;
  return { kind: 'http', method, target, host: host === '' ? undefined : host };
}
