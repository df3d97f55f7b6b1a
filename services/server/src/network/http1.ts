/**
 * A small, strict HTTP/1.1 message-head parser and body-framing tracker for the raw ingress
 * engine (ingress-raw.ts). It reads what a hostile client or a hostile sandbox may send, so it
 * accepts only the plain form of RFC 9112 and refuses everything a request-smuggling attack
 * leans on:
 *
 *   head       = start-line CRLF *( field-name ":" OWS field-value OWS CRLF ) CRLF
 *   refused    : bare LF, obs-fold (a line starting with SP/HTAB), whitespace before ":",
 *                a field name that is not a token, control bytes in a value, a version other
 *                than HTTP/1.0 and HTTP/1.1, a method that is not a token, a target with spaces
 *   framing    : Transfer-Encoding and Content-Length together, two Content-Length fields (or
 *                a list), a Content-Length that is not 1..15 digits, a Transfer-Encoding other
 *                than exactly `chunked` (requests; a response's other coding is read to close)
 *   chunks     : a size that is not 1..16 hex digits, a size line (with extensions) over
 *                MAX_CHUNK_LINE bytes, a chunk not followed by CRLF, trailers over the head bound
 *
 * The tracker only finds where a body ends: the body's bytes are passed on as they came (no
 * re-framing), so a chunked body stays chunked on the other side.
 */

/** A parse failure: `status` is the HTTP status to answer a client with (400, 431, 501). */
export class HttpParseError extends Error {
  constructor(
    readonly status: number,
    message: string,
  ) {
    super(message);
  }
}

/** One parsed message head. Header names are lower-cased in `headers`, as sent in `raw`. */
export interface MessageHead {
  /** request: the method; response: '' */
  method: string;
  /** request: the target (path, or authority for CONNECT); response: '' */
  target: string;
  /** response: the status code; request: 0 */
  status: number;
  /** response: the reason phrase */
  reason: string;
  /** 0 for HTTP/1.0, 1 for HTTP/1.1 */
  minor: 0 | 1;
  /** lower-cased name -> value (repeated fields: their values in order) */
  headers: Record<string, string | string[]>;
  /** [name, value] pairs as received (names as sent, values trimmed) */
  raw: [string, string][];
  /** the lower-cased name of each raw pair */
  lower: string[];
  /** where each raw pair's line is in the parsed buffer: [start, end) offsets, two per pair (end: its CRLF) */
  spans: number[];
}

/** Largest chunk-size line (size, extensions, CRLF), bytes. */
export const MAX_CHUNK_LINE = 4096;

const TOKEN = /^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/;
/** TCHAR[c] is 1 for the bytes of an RFC 9110 token (tchar), 0 for every other latin1 code. */
const TCHAR = new Uint8Array(256);
for (const c of "!#$%&'*+-.^_`|~") TCHAR[c.charCodeAt(0)] = 1;
for (let c = 0x30; c <= 0x39; c++) TCHAR[c] = 1;
for (let c = 0x41; c <= 0x5a; c++) TCHAR[c] = TCHAR[c + 0x20] = 1;
/** VCHAR[c] is 1 for the bytes a field value may hold: visible ASCII, obs-text, SP and HTAB (no CR, LF, NUL or other controls). */
const VCHAR = new Uint8Array(256).fill(1);
for (let c = 0; c < 0x20; c++) if (c !== 0x09) VCHAR[c] = 0;
VCHAR[0x7f] = 0;
const TARGET = /^[\x21-\x7e\x80-\xff]+$/;
/** Lower-cased names of the fields most requests and responses carry (a name seen as sent gives its lower case without a new string). */
const LOWER = new Map<string, string>();
for (const n of [
  'Host',
  'host',
  'Connection',
  'connection',
  'Keep-Alive',
  'keep-alive',
  'Content-Length',
  'content-length',
  'Content-Type',
  'content-type',
  'Date',
  'date',
  'Transfer-Encoding',
  'transfer-encoding',
  'User-Agent',
  'user-agent',
  'Accept',
  'accept',
  'Upgrade',
  'upgrade',
  'sandnode-access-token',
  'sandnode-sandbox-id',
  'sandnode-sandbox-port',
])
  LOWER.set(n, n.toLowerCase());

/**
 * findHeadEnd: the offset just past the CRLFCRLF ending a head in buf (from `from`), or -1 while
 * the head is not complete. Throws HttpParseError (400) when what came so far ends a head with
 * a bare LF (LF LF, or LF CRLF after a line): such a head would else wait for a CRLFCRLF that
 * never comes, until the size bound or a timeout (a sandbox's bare-LF response hung its client:
 * attacker). A bare LF inside a line is refused by parseHead once the head is complete. Native
 * scans only (indexOf), as before: a head dribbled a byte per read costs no more than it did.
 */
export function findHeadEnd(buf: Buffer, from = 0): number {
  const i = buf.indexOf('\r\n\r\n', from, 'latin1');
  if (i >= 0) return i + 4;
  // no CRLFCRLF: an LF followed by LF or by CRLF can only be a head ended by a bare LF
  if (buf.indexOf('\n\n', from, 'latin1') >= 0 || buf.indexOf('\n\r\n', from, 'latin1') >= 0) throw new HttpParseError(400, 'bare LF in the head');
  return -1;
}

/**
 * parseHead parses buf[0..end) (end from findHeadEnd) as a request head (`request`) or a
 * response head. Throws HttpParseError (400) on anything outside the form in the file header.
 * One pass over the head's latin1 text, byte classes from tables (this runs for every request
 * and response the raw ingress relays).
 */
export function parseHead(buf: Buffer, end: number, request: boolean): MessageHead {
  const text = buf.toString('latin1', 0, end - 4);
  const n = text.length;
  let eol = text.indexOf('\r\n');
  if (eol < 0) eol = n;
  const start = text.slice(0, eol);
  if (start.includes('\n') || start.includes('\r')) throw new HttpParseError(400, 'bare CR or LF in the head');
  const head: MessageHead = { method: '', target: '', status: 0, reason: '', minor: 1, headers: {}, raw: [], lower: [], spans: [] };
  if (request) {
    const sp1 = start.indexOf(' ');
    const sp2 = sp1 < 0 ? -1 : start.indexOf(' ', sp1 + 1);
    if (sp2 < 0 || start.indexOf(' ', sp2 + 1) >= 0) throw new HttpParseError(400, 'bad request line');
    const method = start.slice(0, sp1);
    const target = start.slice(sp1 + 1, sp2);
    const version = start.slice(sp2 + 1);
    if (!TOKEN.test(method)) throw new HttpParseError(400, 'bad method');
    if (!TARGET.test(target)) throw new HttpParseError(400, 'bad request target');
    head.method = method;
    head.target = target;
    head.minor = version === 'HTTP/1.1' ? 1 : version === 'HTTP/1.0' ? 0 : badVersion();
  } else {
    const m = /^HTTP\/1\.([01]) ([0-9]{3})(?: ([^\r\n]*))?$/.exec(start);
    if (!m) throw new HttpParseError(400, 'bad status line');
    head.minor = m[1] === '1' ? 1 : 0;
    head.status = Number(m[2]);
    head.reason = m[3] ?? '';
  }
  const headers = head.headers;
  for (let i = eol + 2; i < n;) {
    let next = text.indexOf('\r\n', i);
    if (next < 0) next = n;
    // the name: tchars up to ':'
    let j = i;
    while (j < next && TCHAR[text.charCodeAt(j)] === 1) j++;
    if (j === next || text.charCodeAt(j) !== 0x3a /* : */ || j === i) throw lineError(text, i, j, next);
    const name = text.slice(i, j);
    // the value: OWS trimmed both ends, every byte a VCHAR (a bare CR or LF is not one)
    let a = j + 1;
    let b = next;
    for (let k = a; k < b; k++) if (VCHAR[text.charCodeAt(k)] !== 1) throw lineError(text, i, k, next);
    while (a < b && (text.charCodeAt(a) === 0x20 || text.charCodeAt(a) === 0x09)) a++;
    while (b > a && (text.charCodeAt(b - 1) === 0x20 || text.charCodeAt(b - 1) === 0x09)) b--;
    const value = text.slice(a, b);
    const k = LOWER.get(name) ?? name.toLowerCase();
    const had = headers[k];
    // a repeat is appended in place: a copy per repeat made a head of N repeats cost N^2 (attacker: 16 000 `a:` lines blocked the server 1.5 s)
    if (had === undefined) headers[k] = value;
    else if (Array.isArray(had)) had.push(value);
    else headers[k] = [had, value];
    head.raw.push([name, value]);
    head.lower.push(k);
    head.spans.push(i, next);
    i = next + 2;
  }
  return head;
}

/** lineError: the error for the field line text[i..next) that stopped being valid at offset j. */
function lineError(text: string, i: number, j: number, next: number): HttpParseError {
  const line = text.slice(i, next);
  if (line.includes('\n') || line.includes('\r')) return new HttpParseError(400, 'bare CR or LF in the head');
  const colon = line.indexOf(':');
  if (colon <= 0) return new HttpParseError(400, line.startsWith(' ') || line.startsWith('\t') ? 'obsolete line folding' : 'bad header line');
  if (j - i <= colon) return new HttpParseError(400, 'bad header name');
  return new HttpParseError(400, `bad value of header ${line.slice(0, colon)}`);
}

function badVersion(): never {
  throw new HttpParseError(400, 'bad HTTP version (HTTP/1.0 or HTTP/1.1)');
}

/** tokens: the comma-separated, lower-cased tokens of a header (all its fields). */
export function tokens(v: string | string[] | undefined): string[] {
  if (v === undefined) return [];
  const all = Array.isArray(v) ? v.join(',') : v;
  return all
    .split(',')
    .map((s) => s.trim().toLowerCase())
    .filter((s) => s.length > 0);
}

/** How a body is delimited: none, a byte count, chunked, or by the connection's close (responses only). */
export type Framing = { kind: 'none' } | { kind: 'length'; length: number } | { kind: 'chunked' } | { kind: 'close' };

/** contentLength: the one Content-Length of h, undefined when absent; throws on a list, duplicates or a bad value. */
function contentLength(h: MessageHead): number | undefined {
  const cl = h.headers['content-length'];
  if (cl === undefined) return undefined;
  if (Array.isArray(cl)) throw new HttpParseError(400, 'more than one Content-Length');
  if (!/^[0-9]{1,15}$/.test(cl)) throw new HttpParseError(400, 'bad Content-Length');
  return Number(cl);
}

/** requestFraming: the framing of a request's body (RFC 9112 6.3); throws HttpParseError (400) on the smuggling forms. */
export function requestFraming(h: MessageHead): Framing {
  const te = h.headers['transfer-encoding'];
  const cl = contentLength(h);
  if (te !== undefined) {
    if (cl !== undefined) throw new HttpParseError(400, 'both Transfer-Encoding and Content-Length');
    const t = tokens(te);
    if (t.length !== 1 || t[0] !== 'chunked') throw new HttpParseError(400, 'Transfer-Encoding other than chunked');
    if (h.minor === 0) throw new HttpParseError(400, 'Transfer-Encoding in an HTTP/1.0 request');
    return { kind: 'chunked' };
  }
  return cl ? { kind: 'length', length: cl } : { kind: 'none' };
}

/** responseFraming: the framing of a response's body to a request of `method`; throws HttpParseError on the smuggling forms. */
export function responseFraming(h: MessageHead, method: string): Framing {
  if (method === 'HEAD' || (h.status >= 100 && h.status < 200) || h.status === 204 || h.status === 304) return { kind: 'none' };
  const te = h.headers['transfer-encoding'];
  const cl = contentLength(h);
  if (te !== undefined) {
    if (cl !== undefined) throw new HttpParseError(502, 'both Transfer-Encoding and Content-Length');
    const t = tokens(te);
    return t[t.length - 1] === 'chunked' ? { kind: 'chunked' } : { kind: 'close' };
  }
  return cl === undefined ? { kind: 'close' } : cl === 0 ? { kind: 'none' } : { kind: 'length', length: cl };
}

const enum Chunk {
  Size,
  Ext,
  SizeLf,
  Data,
  DataCr,
  DataLf,
  Trailer,
  TrailerLf,
  Done,
}

/**
 * BodyTracker finds the end of one body of a given Framing in the bytes fed to it. feed(buf,
 * off) returns how many bytes from off belong to the body (all of them while it goes on); once
 * `done`, the rest of buf is the next message's. Throws HttpParseError (400) on a bad chunk.
 */
export class BodyTracker {
  done: boolean;
  private left: number;
  private st = Chunk.Size;
  private line = 0;
  private digits = 0;
  private trailerBytes = 0;

  constructor(
    private readonly framing: Framing,
    private readonly maxTrailerBytes = 16 * 1024,
  ) {
    this.done = framing.kind === 'none';
    this.left = framing.kind === 'length' ? framing.length : 0;
  }

  /** endOfInput: the connection's end was seen; true (and done) when that ends this body (close-delimited), false when it cuts it short. */
  endOfInput(): boolean {
    if (this.framing.kind === 'close') this.done = true;
    return this.done;
  }

  /** feed: bytes of buf from off that belong to the body (see the class comment). */
  feed(buf: Buffer, off = 0): number {
    if (this.done) return 0;
    const avail = buf.length - off;
    switch (this.framing.kind) {
      case 'close':
        return avail;
      case 'length': {
        const n = Math.min(avail, this.left);
        this.left -= n;
        if (this.left === 0) this.done = true;
        return n;
      }
      case 'chunked':
        return this.chunked(buf, off);
      default:
        return 0;
    }
  }

  private chunked(buf: Buffer, off: number): number {
    let i = off;
    while (i < buf.length && !this.done) {
      if (this.st === Chunk.Data) {
        const n = Math.min(buf.length - i, this.left);
        this.left -= n;
        i += n;
        if (this.left === 0) this.st = Chunk.DataCr;
        continue;
      }
      const c = buf[i++]!;
      switch (this.st) {
        case Chunk.Size: {
          const v = hex(c);
          if (v >= 0) {
            if (++this.digits > 16) throw new HttpParseError(400, 'chunk size too long');
            this.left = this.left * 16 + v;
            if (!Number.isSafeInteger(this.left)) throw new HttpParseError(400, 'chunk size too large');
          } else if (this.digits === 0) throw new HttpParseError(400, 'bad chunk size');
          else if (c === 0x3b /* ; */ || c === 0x20 || c === 0x09) this.st = Chunk.Ext;
          else if (c === 0x0d) this.st = Chunk.SizeLf;
          else throw new HttpParseError(400, 'bad chunk size');
          break;
        }
        case Chunk.Ext:
          if (c === 0x0d) this.st = Chunk.SizeLf;
          else if (c === 0x0a || (c < 0x20 && c !== 0x09) || c === 0x7f) throw new HttpParseError(400, 'bad chunk extension');
          break;
        case Chunk.SizeLf:
          if (c !== 0x0a) throw new HttpParseError(400, 'chunk size line without CRLF');
          this.line = 0;
          this.digits = 0;
          this.st = this.left === 0 ? Chunk.Trailer : Chunk.Data;
          continue;
        case Chunk.DataCr:
          if (c !== 0x0d) throw new HttpParseError(400, 'chunk data not followed by CRLF');
          this.st = Chunk.DataLf;
          break;
        case Chunk.DataLf:
          if (c !== 0x0a) throw new HttpParseError(400, 'chunk data not followed by CRLF');
          this.st = Chunk.Size;
          this.line = 0;
          continue;
        case Chunk.Trailer:
          if (++this.trailerBytes > this.maxTrailerBytes) throw new HttpParseError(431, 'trailers too large');
          if (c === 0x0d) this.st = Chunk.TrailerLf;
          else if (c === 0x0a) throw new HttpParseError(400, 'bare LF in trailers');
          else this.line++;
          continue;
        case Chunk.TrailerLf:
          if (c !== 0x0a) throw new HttpParseError(400, 'bare CR in trailers');
          if (this.line === 0) this.done = true;
          this.line = 0;
          this.st = this.done ? Chunk.Done : Chunk.Trailer;
          continue;
        default:
          break;
      }
      if (++this.line > MAX_CHUNK_LINE) throw new HttpParseError(400, 'chunk size line too long');
    }
    return i - off;
  }
}

function hex(c: number): number {
  if (c >= 0x30 && c <= 0x39) return c - 0x30;
  if (c >= 0x61 && c <= 0x66) return c - 0x57;
  if (c >= 0x41 && c <= 0x46) return c - 0x37;
  return -1;
}
