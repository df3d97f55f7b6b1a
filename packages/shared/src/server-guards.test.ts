/**
 * ServerGuards on a real createServiceServer (issue 10 §5), attacked with raw HTTP/2 frames:
 * per-method receive limits refuse an oversized request by its length prefix; incomplete
 * requests held open are refused once the connection's or the server's held bytes pass their
 * caps (and a normal call keeps working meanwhile); a connection that opens no stream is closed
 * after the handshake timeout (the idle timeout is 300 s here); a peer above its connection cap
 * gets RESOURCE_EXHAUSTED on its call, not a silent drop.
 */
import http2 from 'node:http2';
import net from 'node:net';
import { createChannel, createClient, Status, ClientError } from 'nice-grpc';
import { createLogger } from './logger';
import { SandboxServiceDefinition } from './gen/sandnode/server/v1/sandbox';
import { createServiceServer, type ServiceServer } from './server';
import { DEFAULT_GUARD_LIMITS, METHOD_RECEIVE_LIMITS } from './server-guards';

const log = createLogger('test', '0', 'silent');
const MiB = 1024 * 1024;

async function waitFor(what: string, cond: () => unknown): Promise<void> {
  for (const end = Date.now() + 10_000; !cond(); await new Promise((r) => setTimeout(r, 20))) if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
}
const PREFACE = Buffer.from('PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n');
const SETTINGS = Buffer.from([0, 0, 0, 4, 0, 0, 0, 0, 0]);

/** prefix is a gRPC message prefix (uncompressed) declaring len bytes. */
const prefix = (len: number) => {
  const b = Buffer.alloc(5);
  b.writeUInt32BE(len, 1);
  return b;
};

interface RawCall {
  /** resolves with the grpc-status (or how the stream ended) */
  status: Promise<string>;
  req: http2.ClientHttp2Stream;
}

/** rawCall opens a call on session and writes body; end closes the request side. */
function rawCall(session: http2.ClientHttp2Session, method: string, body: Buffer, end: boolean): RawCall {
  const req = session.request({ ':method': 'POST', ':path': `/sandnode.server.v1.SandboxService/${method}`, 'content-type': 'application/grpc', te: 'trailers' });
  const status = new Promise<string>((resolve) => {
    let st = '';
    const take = (h: http2.IncomingHttpHeaders) => (st = String(h['grpc-status'] ?? st));
    req.on('response', take);
    req.on('trailers', take);
    req.on('data', () => undefined);
    req.on('error', (e: NodeJS.ErrnoException) => resolve(st || `error ${e.code ?? e.message}`));
    req.on('close', () => resolve(st || `closed ${req.rstCode}`));
  });
  if (end) req.end(body);
  else req.write(body);
  return { status, req };
}

function connect(port: number): Promise<http2.ClientHttp2Session> {
  const s = http2.connect(`http://127.0.0.1:${port}`);
  s.on('error', () => undefined);
  return new Promise((r) => s.once('remoteSettings', () => r(s)));
}

describe('ServerGuards', () => {
  let server: ServiceServer;
  let port: number;
  let handled = 0;
  const sessions: http2.ClientHttp2Session[] = [];

  beforeAll(async () => {
    server = createServiceServer({
      info: { component: 'test', version: '0.0.0', commit: '', features: [] },
      log,
      limits: { handshakeTimeoutMs: 300, maxConnectionIdleMs: 300_000, maxHeldRequestBytesPerConnection: 6 * MiB, maxHeldRequestBytes: 10 * MiB, maxConnectionsPerPeer: 40 },
    });
    server.add(SandboxServiceDefinition, {
      getSandbox: async () => {
        handled++;
        return {};
      },
      // eslint-disable-next-line require-yield
      exec: async function* () {
        handled++;
      },
    } as never);
    [port] = (await server.listen(['127.0.0.1:0'])) as [number];
  });
  afterEach(() => {
    for (const s of sessions.splice(0)) s.destroy();
  });
  afterAll(async () => {
    await server.shutdown(100);
  });

  it('the defaults are bounded, and the listed limits are at least the contract maxima', () => {
    expect(DEFAULT_GUARD_LIMITS.handshakeTimeoutMs).toBeGreaterThan(0);
    expect(DEFAULT_GUARD_LIMITS.maxHeldRequestBytes).toBeGreaterThanOrEqual(DEFAULT_GUARD_LIMITS.maxHeldRequestBytesPerConnection);
    // Exec: 3 MiB stdin + 1 MiB argv/env; WriteFile: 3 MiB data
    expect(METHOD_RECEIVE_LIMITS['/sandnode.server.v1.SandboxService/Exec']).toBeGreaterThanOrEqual(4 * MiB);
    expect(METHOD_RECEIVE_LIMITS['/sandnode.server.v1.SandboxService/WriteFile']).toBeGreaterThan(3 * MiB);
    expect(server.guards.receiveLimitOf('/sandnode.server.v1.SandboxService/GetSandbox')).toBe(64 * 1024);
  });

  it('a GetSandbox declaring 1 MiB is RESOURCE_EXHAUSTED by its length prefix (the handler never runs); an Exec of 1 MiB is served', async () => {
    const s = await connect(port);
    sessions.push(s);
    const before = handled;
    // only the prefix is sent and the request is held open: the refusal cannot wait for the bytes
    const big = rawCall(s, 'GetSandbox', prefix(MiB), false);
    expect(await big.status).toBe(String(Status.RESOURCE_EXHAUSTED));
    expect(handled).toBe(before);
    const ok = rawCall(s, 'Exec', Buffer.concat([prefix(MiB), Buffer.alloc(MiB)]), true);
    expect(await ok.status).toBe('0');
    expect(handled).toBe(before + 1);
  });

  it('a grpc-js client sending a GetSandbox of 200 KiB gets RESOURCE_EXHAUSTED naming the limit, and its connection keeps working', async () => {
    const ch = createChannel(`127.0.0.1:${port}`);
    const c = createClient(SandboxServiceDefinition, ch);
    for (let i = 0; i < 5; i++) {
      const err = await c.getSandbox({ sandboxId: 'x'.repeat(200 * 1024) }).catch((e: unknown) => e);
      expect(err).toBeInstanceOf(ClientError);
      expect((err as ClientError).code).toBe(Status.RESOURCE_EXHAUSTED);
      expect((err as ClientError).details).toMatch(/GetSandbox: a request message is larger than this method accepts \(65536 bytes\)/);
      await expect(c.getSandbox({ sandboxId: 'x' })).resolves.toBeDefined();
    }
    ch.close();
  });

  it('held incomplete requests are refused past the per-connection and server caps; a normal call is served meanwhile', async () => {
    // 3 connections x 8 streams, each declares 4 MiB and sends 1 MiB, then holds: 24 MiB would be held
    const conns = await Promise.all([0, 1, 2].map(() => connect(port)));
    sessions.push(...conns);
    const calls = conns.flatMap((s) => Array.from({ length: 8 }, () => rawCall(s, 'Exec', Buffer.concat([prefix(4 * MiB), Buffer.alloc(MiB)]), false)));
    await waitFor('the held bytes to reach the server cap', () => server.guards.heldBytes >= 9 * MiB || undefined);
    // at most 6 per connection and 10 in all are held: the other 14 or more are refused (as fast
    // as a loaded machine answers: counted as they come, not within a fixed time)
    let refused = 0;
    let other = 0;
    for (const c of calls) void c.status.then((x) => (x === String(Status.RESOURCE_EXHAUSTED) ? refused++ : other++));
    await waitFor('14 of the 24 held calls to be refused', () => refused >= 14 || undefined);
    expect(other).toBe(0);
    expect(server.guards.heldBytes).toBeLessThanOrEqual(10 * MiB);
    const ch = createChannel(`127.0.0.1:${port}`);
    await expect(createClient(SandboxServiceDefinition, ch).getSandbox({ sandboxId: 'x' })).resolves.toBeDefined();
    ch.close();
    for (const s of conns) s.destroy();
    await waitFor('the held bytes to be released', () => server.guards.heldBytes === 0 || undefined);
  });

  it('connections that send nothing, or only the preface and SETTINGS, are closed after the handshake timeout (the idle timeout is 300 s)', async () => {
    const open = async (bytes: Buffer) => {
      const sock = net.connect(port, '127.0.0.1');
      let closed = false;
      sock.on('close', () => (closed = true));
      sock.on('error', () => undefined);
      sock.on('data', () => undefined);
      await new Promise((r) => sock.once('connect', r));
      if (bytes.length) sock.write(bytes);
      return () => closed;
    };
    const silent = await open(Buffer.alloc(0));
    const preface = await open(Buffer.concat([PREFACE, SETTINGS]));
    const half = await open(PREFACE.subarray(0, 10));
    await waitFor('the server to close the three connections', () => (silent() && preface() && half()) || undefined);
  });

  it('a peer above maxConnectionsPerPeer gets RESOURCE_EXHAUSTED on its call, and may connect again once one closed', async () => {
    const conns = await Promise.all(Array.from({ length: 40 }, () => connect(port)));
    sessions.push(...conns);
    // each makes a call (so the handshake timeout does not close it) and stays open
    expect(await Promise.all(conns.map((s) => rawCall(s, 'GetSandbox', prefix(0), true).status))).toEqual(Array(40).fill('0'));
    // the 41st connection of this peer (127.0.0.1)
    const ch = createChannel(`127.0.0.1:${port}`);
    const err = await createClient(SandboxServiceDefinition, ch)
      .getSandbox({ sandboxId: 'x' })
      .catch((e: unknown) => e);
    expect(err).toBeInstanceOf(ClientError);
    expect((err as ClientError).code).toBe(Status.RESOURCE_EXHAUSTED);
    expect((err as ClientError).details).toMatch(/maxConnectionsPerPeer/);
    conns[0]!.destroy();
    ch.close();
    const ch2 = createChannel(`127.0.0.1:${port}`);
    const again = createClient(SandboxServiceDefinition, ch2);
    let ok = false;
    for (let i = 0; i < 50 && !ok; i++)
      ok = await again.getSandbox({ sandboxId: 'x' }).then(
        () => true,
        () => new Promise<boolean>((r) => setTimeout(() => r(false), 50)),
      );
    ch2.close();
    expect(ok).toBe(true);
  });
});
