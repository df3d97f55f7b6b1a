import { BodyTracker, findHeadEnd, HttpParseError, parseHead, requestFraming, responseFraming } from './http1';

const head = (s: string, request = true) => {
  const b = Buffer.from(s, 'latin1');
  return parseHead(b, findHeadEnd(b), request);
};

describe('http1 heads', () => {
  test('a request head: method, target, fields in order, repeated ones as a list', () => {
    const h = head('GET /a?b HTTP/1.1\r\nHost: x\r\nX-A: 1\r\nx-a:  2 \r\n\r\n');
    expect(h).toMatchObject({ method: 'GET', target: '/a?b', minor: 1, headers: { host: 'x', 'x-a': ['1', '2'] } });
    expect(h.raw).toEqual([
      ['Host', 'x'],
      ['X-A', '1'],
      ['x-a', '2'],
    ]);
  });
  test.each([
    ['bare LF', 'GET / HTTP/1.1\nHost: x\r\n\r\n'],
    ['obs-fold', 'GET / HTTP/1.1\r\nX: a\r\n b\r\n\r\n'],
    ['space before colon', 'GET / HTTP/1.1\r\nHost : x\r\n\r\n'],
    ['HTTP/2.0', 'GET / HTTP/2.0\r\n\r\n'],
    ['a space in the target', 'GET /a b HTTP/1.1\r\n\r\n'],
    ['a control byte in a value', 'GET / HTTP/1.1\r\nX: a\x01b\r\n\r\n'],
  ])('refused: %s', (_n, s) => {
    expect(() => head(s)).toThrow(HttpParseError);
  });
  test('a head ended by bare LFs is refused as it comes, not waited on for a CRLFCRLF (attacker)', () => {
    const b = (s: string) => Buffer.from(s, 'latin1');
    expect(() => findHeadEnd(b('HTTP/1.1 200 OK\nContent-Length: 2\n\nok'))).toThrow('bare LF in the head');
    expect(() => findHeadEnd(b('HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\nok'))).toThrow('bare LF in the head');
    expect(() => findHeadEnd(b('GET / HTTP/1.1\r\nHost: x\n\r\n'))).toThrow('bare LF in the head');
    // a head still coming (its CR may end this read): wait for more; a bare LF inside a line is parseHead's to refuse
    expect(findHeadEnd(b('GET / HTTP/1.1\r\nHost: x\r'))).toBe(-1);
    expect(findHeadEnd(b('GET / HTTP/1.1\r\nHost: x\r\n\r'))).toBe(-1);
    expect(findHeadEnd(b('GET / HTTP/1.1\r\nHost: x\nX-A'))).toBe(-1);
    expect(() => head('GET / HTTP/1.1\r\nHost: x\nX-A: 1\r\n\r\n')).toThrow(HttpParseError);
    expect(findHeadEnd(b('GET / HTTP/1.1\r\nHost: x\r\n\r\nbody\n'))).toBe(27); // body bytes are not the head's
  });
  test('request framing: smuggling forms refused', () => {
    expect(() => requestFraming(head('POST / HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n'))).toThrow(/both/);
    expect(() => requestFraming(head('POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\n'))).toThrow(/more than one/);
    expect(() => requestFraming(head('POST / HTTP/1.1\r\nContent-Length: 1, 1\r\n\r\n'))).toThrow(/bad Content-Length/);
    expect(() => requestFraming(head('POST / HTTP/1.1\r\nContent-Length: +1\r\n\r\n'))).toThrow(/bad Content-Length/);
    expect(() => requestFraming(head('POST / HTTP/1.1\r\nTransfer-Encoding: chunked, gzip\r\n\r\n'))).toThrow(/other than chunked/);
    expect(requestFraming(head('POST / HTTP/1.1\r\nTransfer-Encoding: Chunked\r\n\r\n'))).toEqual({ kind: 'chunked' });
    expect(requestFraming(head('GET / HTTP/1.1\r\n\r\n'))).toEqual({ kind: 'none' });
  });
  test('response framing: HEAD, 204, 304 have none; no length reads to close', () => {
    expect(responseFraming(head('HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n', false), 'HEAD')).toEqual({ kind: 'none' });
    expect(responseFraming(head('HTTP/1.1 204 No Content\r\n\r\n', false), 'GET')).toEqual({ kind: 'none' });
    expect(responseFraming(head('HTTP/1.1 200 OK\r\n\r\n', false), 'GET')).toEqual({ kind: 'close' });
    expect(() => responseFraming(head('HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n', false), 'GET')).toThrow(HttpParseError);
  });
});

describe('http1 BodyTracker', () => {
  const chunked = '5\r\nhello\r\n10;x=y\r\n0123456789abcdef\r\n0\r\nT: 1\r\n\r\n';
  test('a chunked body fed byte by byte ends exactly at its last CRLF', () => {
    const t = new BodyTracker({ kind: 'chunked' });
    const all = Buffer.from(`${chunked}NEXT`);
    let taken = 0;
    for (let i = 0; i < all.length && !t.done; i++) taken += t.feed(all.subarray(i, i + 1));
    expect(t.done).toBe(true);
    expect(taken).toBe(chunked.length);
  });
  test('fed at once: the rest is the next message', () => {
    const t = new BodyTracker({ kind: 'chunked' });
    expect(t.feed(Buffer.from(`${chunked}NEXT`))).toBe(chunked.length);
  });
  test.each(['zz\r\n', '5\r\nhelloXX', '5\nhello\r\n', '11111111111111111\r\n', '-1\r\n'])('a bad chunk is refused: %j', (s) => {
    expect(() => new BodyTracker({ kind: 'chunked' }).feed(Buffer.from(s))).toThrow(HttpParseError);
  });
  test('a length body takes its bytes only', () => {
    const t = new BodyTracker({ kind: 'length', length: 3 });
    expect(t.feed(Buffer.from('ab'))).toBe(2);
    expect(t.feed(Buffer.from('cdef'))).toBe(1);
    expect(t.done).toBe(true);
  });
});
