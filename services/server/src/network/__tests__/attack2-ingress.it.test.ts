/**
 * Second attack round on the ingress (issue 12): a WebSocket or CONNECT tunnel is checked once,
 * when it opens. A client that opened one while the sandbox was public (or with the token of a
 * sandbox since deleted, whose address the next sandbox got) must not keep reaching it after
 * UpdateSandboxNetwork made it private or the sandbox left the directory: the next chunk resets
 * the tunnel, as the egress proxy does for a policy change. The "sandbox" here is a TCP echo on
 * 127.0.0.1 named by a directory view (the ingress dials view.address).
 */
import { createHash } from 'node:crypto';
import http from 'node:http';
import net from 'node:net';
import { createLogger, parseEgressPolicy } from '@sandnode/shared';
import { MapNetworkDirectory, type SandboxNetworkView } from '../../core/network-directory';
import { createIngress, INGRESS_ENGINES, type Ingress } from '../ingress';

jest.setTimeout(30_000);

const TOKEN = 'token-of-attack2';

/** tunnelOutcome writes `text` into the tunnel and says whether it came back (echo) or the tunnel closed first. */
function tunnelOutcome(sock: net.Socket, text: string): Promise<'echoed' | 'closed'> {
  return new Promise((resolve) => {
    let got = '';
    const onData = (d: Buffer) => {
      got += d.toString('latin1');
      if (got.includes(text)) {
        sock.off('data', onData);
        resolve('echoed');
      }
    };
    sock.on('data', onData);
    sock.once('close', () => resolve('closed'));
    sock.write(text);
  });
}

/** openTunnel: CONNECT (or a WebSocket-style upgrade) through the ingress; resolves after the 200/echoed head. */
async function openTunnel(port: number, host: string, kind: 'connect' | 'upgrade', token?: string): Promise<net.Socket> {
  const sock = net.connect(port, '127.0.0.1');
  sock.on('error', () => undefined);
  await new Promise<void>((r) => sock.once('connect', () => r()));
  const tok = token ? `sandnode-access-token: ${token}\r\n` : '';
  const marker = kind === 'connect' ? '200 Connection Established\r\n\r\n' : 'Upgrade: probe\r\n\r\n';
  const answered = new Promise<void>((resolve, reject) => {
    let s = '';
    const on = (d: Buffer) => {
      s += d.toString('latin1');
      if (s.includes(marker)) {
        sock.off('data', on);
        resolve();
      } else if (/^HTTP\/1\.1 [45]/.test(s)) reject(new Error(`tunnel refused: ${s.split('\r\n')[0]}`));
    };
    sock.on('data', on);
  });
  if (kind === 'connect') sock.write(`CONNECT ${host} HTTP/1.1\r\nHost: ${host}\r\n${tok}\r\n`);
  else sock.write(`GET /ws HTTP/1.1\r\nHost: ${host}\r\nConnection: Upgrade\r\nUpgrade: probe\r\n${tok}\r\n`);
  await answered;
  return sock;
}

for (const engine of INGRESS_ENGINES) {
  describe(`attack2: ingress [${engine}] tunnels after the sandbox turned private or left`, () => {
    let ingress: Ingress;
    let port: number;
    let echo: net.Server;
    let echoPort: number;
    const dir = new MapNetworkDirectory();
    const sockets: net.Socket[] = [];
    const view = (id: string, pub: boolean): SandboxNetworkView => ({
      sandboxId: id,
      state: 'RUNNING',
      slot: 1,
      address: '127.0.0.1',
      gateway: '127.0.0.2',
      policy: parseEgressPolicy({ allowOut: [], denyOut: [], blockAll: false }),
      public: pub,
      accessTokenSha256: createHash('sha256').update(TOKEN).digest('hex'),
      poddAddress: 'unix:///nonexistent/podd.sock',
    });

    beforeAll(async () => {
      echo = net.createServer((s) => {
        s.on('error', () => undefined);
        s.pipe(s);
        sockets.push(s);
      });
      await new Promise<void>((r) => echo.listen(0, '127.0.0.1', r));
      echoPort = (echo.address() as net.AddressInfo).port;
      ingress = createIngress({ engine, directory: dir, domain: 'localhost', log: createLogger('ingress-attack2', '0', 'silent') });
      await new Promise<void>((r) => ingress.server.listen(0, '127.0.0.1', r));
      port = (ingress.server.address() as net.AddressInfo).port;
    });
    afterAll(async () => {
      for (const s of sockets) s.destroy();
      await ingress?.close();
      await new Promise<void>((r) => echo.close(() => r()));
    });

    const host = (id: string) => `${echoPort}-${id}.localhost`;
    const track = (s: net.Socket) => (sockets.push(s), s);

    it.each(['connect', 'upgrade'] as const)('a %s tunnel opened while public is reset when the sandbox turns private', async (kind) => {
      const id = `sb-pub-${kind}`;
      dir.set(view(id, true));
      const sock = track(await openTunnel(port, host(id), kind));
      await expect(tunnelOutcome(sock, 'while-public')).resolves.toBe('echoed');
      dir.set(view(id, false)); // UpdateSandboxNetwork --private
      await expect(tunnelOutcome(sock, 'after-private')).resolves.toBe('closed');
      // a tunnel that shows the token is fine
      const withToken = track(await openTunnel(port, host(id), kind, TOKEN));
      await expect(tunnelOutcome(withToken, 'with-token')).resolves.toBe('echoed');
      dir.remove(id);
    });

    it('a tunnel to a deleted sandbox is reset, and does not reach the next owner of its address', async () => {
      const id = 'sb-gone';
      dir.set(view(id, false));
      const sock = track(await openTunnel(port, host(id), 'connect', TOKEN));
      await expect(tunnelOutcome(sock, 'before-delete')).resolves.toBe('echoed');
      dir.remove(id); // DeleteSandbox
      dir.set({ ...view('sb-next', false), accessTokenSha256: createHash('sha256').update('other').digest('hex') }); // same address, new owner
      await expect(tunnelOutcome(sock, 'after-delete')).resolves.toBe('closed');
      dir.remove('sb-next');
    });

    it('a streamed response (long poll, server-sent events) started while public is cut when the sandbox turns private', async () => {
      const streams: http.ServerResponse[] = [];
      const sse = http.createServer((_req, res) => {
        res.writeHead(200, { 'content-type': 'text/event-stream' });
        res.write('data: first\n\n');
        streams.push(res);
      });
      await new Promise<void>((r) => sse.listen(0, '127.0.0.1', r));
      const ssePort = (sse.address() as net.AddressInfo).port;
      try {
        const id = 'sb-sse';
        dir.set(view(id, true));
        const got: string[] = [];
        const ended = new Promise<void>((resolve) => {
          const req = http.get({ host: '127.0.0.1', port, path: '/events', headers: { host: `${ssePort}-${id}.localhost` }, agent: false }, (res) => {
            res.on('data', (d: Buffer) => {
              got.push(d.toString());
              if (got.join('').includes('after-private')) return void res.destroy(); // relayed: the test fails below
              if (got.length === 1) {
                dir.set(view(id, false)); // UpdateSandboxNetwork --private while the stream is open
                streams[0]!.write('data: after-private\n\n');
              }
            });
            res.on('error', () => undefined);
            res.on('close', () => resolve());
          });
          req.on('error', () => resolve());
        });
        await ended;
        expect(got.join('')).not.toContain('after-private');
        dir.remove(id);
      } finally {
        for (const r of streams) r.destroy();
        sse.closeAllConnections();
        await new Promise<void>((r) => sse.close(() => r()));
      }
    });

    it('a tunnel is still relayed while the sandbox stays as it was (a state change of the same view keeps it)', async () => {
      const id = 'sb-steady';
      dir.set(view(id, true));
      const sock = track(await openTunnel(port, host(id), 'connect'));
      await expect(tunnelOutcome(sock, 'one')).resolves.toBe('echoed');
      dir.set(view(id, true)); // a new view object, nothing that matters changed
      await expect(tunnelOutcome(sock, 'two')).resolves.toBe('echoed');
      dir.remove(id);
    });
  });
}
