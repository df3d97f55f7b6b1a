/**
 * Connection limits of createServiceServer (issue 10 §5): a connection that only sends the
 * HTTP/2 preface, or stays without a call, is closed after maxConnectionIdleMs instead of held
 * forever; one connection gets at most maxConcurrentStreams streams at once (the server says so
 * in its SETTINGS, so a stream above it waits for one to end); well-behaved calls keep working.
 */
import http2 from 'node:http2';
import net from 'node:net';
import { createLogger } from './logger';
import { SandboxServiceDefinition } from './gen/sandnode/server/v1/sandbox';
import { createServiceServer, DEFAULT_SERVER_LIMITS, type ServiceServer } from './server';

const log = createLogger('test', '0', 'silent');

/** waitFor polls cond every 20 ms for up to 10 s (shared cannot use testkit, which depends on it). */
async function waitFor(what: string, cond: () => unknown): Promise<void> {
  for (const end = Date.now() + 10_000; !cond(); await new Promise((r) => setTimeout(r, 20))) if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
}
const PREFACE = Buffer.from('PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n');
/** an empty SETTINGS frame: length 0, type 4, flags 0, stream 0 */
const SETTINGS = Buffer.from([0, 0, 0, 4, 0, 0, 0, 0, 0]);

describe('createServiceServer connection limits', () => {
  let server: ServiceServer;
  let port: number;
  const release: (() => void)[] = [];

  beforeAll(async () => {
    server = createServiceServer({ info: { component: 'test', version: '0.0.0', commit: '', features: [] }, log, limits: { maxConnectionIdleMs: 300, maxConcurrentStreams: 4 } });
    server.add(SandboxServiceDefinition, {
      // a call that holds until the test lets it go
      getSandbox: () => new Promise((r) => release.push(() => r({}))),
    } as never);
    [port] = (await server.listen(['127.0.0.1:0'])) as [number];
  });
  afterAll(async () => {
    for (const r of release.splice(0)) r();
    await server.shutdown(100);
  });

  it('the defaults are bounded', () => {
    expect(DEFAULT_SERVER_LIMITS.maxConnectionIdleMs).toBeGreaterThan(0);
    expect(DEFAULT_SERVER_LIMITS.maxConcurrentStreams).toBeGreaterThan(0);
  });

  it('a connection that only sends the preface is closed by the server, not held', async () => {
    const sock = net.connect(port, '127.0.0.1');
    let closed = false;
    sock.on('close', () => (closed = true));
    sock.on('error', () => undefined);
    sock.on('data', () => undefined);
    await new Promise((r) => sock.once('connect', r));
    sock.write(Buffer.concat([PREFACE, SETTINGS]));
    await waitFor('the server to close an idle connection', () => closed || undefined);
    expect(closed).toBe(true);
  });

  it('one connection gets at most maxConcurrentStreams streams at once (SETTINGS): the one above waits until one ends', async () => {
    const session = http2.connect(`http://127.0.0.1:${port}`);
    session.on('error', () => undefined);
    await new Promise((r) => session.once('remoteSettings', r));
    expect(session.remoteSettings.maxConcurrentStreams).toBe(4);
    const open = (): Promise<string> =>
      new Promise((resolve) => {
        const req = session.request({ ':method': 'POST', ':path': '/sandnode.server.v1.SandboxService/GetSandbox', 'content-type': 'application/grpc', te: 'trailers' });
        let status = '';
        const take = (h: http2.IncomingHttpHeaders) => (status = String(h['grpc-status'] ?? status));
        req.on('response', take);
        req.on('trailers', take);
        req.on('data', () => undefined);
        req.on('error', (e: NodeJS.ErrnoException) => resolve(`error ${e.code ?? e.message}`));
        req.on('close', () => resolve(status || `closed ${req.rstCode}`));
        req.end(Buffer.alloc(5));
      });
    const calls = Array.from({ length: 5 }, open);
    await waitFor('4 calls to reach the handler', () => (release.length >= 4 ? true : undefined));
    // the fifth waits (the client queues it: the server's limit holds) until one ends
    expect(release.length).toBe(4);
    for (const r of release.splice(0)) r();
    await waitFor('the fifth call to reach the handler', () => (release.length >= 1 ? true : undefined));
    for (const r of release.splice(0)) r();
    expect(await Promise.all(calls)).toEqual(['0', '0', '0', '0', '0']);
    session.close();
  });
});
