/**
 * GrpcHost.shutdown on a sniffing listener (bulk-channel.ts sniffRaw; the server's public unix
 * socket): a connection the retiring process accepted but whose client bytes had not arrived
 * when shutdown began must still be handed to the HTTP/2 server before its GOAWAY, so the
 * client's call is refused there (and retried on a new connection, to the next server), not
 * cut when the process exits. Clean-clone CI saw 1 of 250 fresh unix connections fail
 * ECONNRESET through 3 handovers (handover-fresh-conn.it.test.ts) before this.
 *
 * A proxy between client and servers stands in for the kernel's backlog: it connects to the
 * old server at once (the old server accepts, its sniff starts) and holds the client's bytes
 * until the test lets them through, after shutdown began. Its first connection goes to the
 * old server, later ones to the new one; "exit" of the old process is the proxy closing every
 * connection to it once shutdown resolved.
 */
import net from 'node:net';
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { createChannel, createClient } from 'nice-grpc';
import { createLogger } from './logger';
import { SandboxServiceDefinition } from './gen/sandnode/server/v1/sandbox';
import { createServiceServer, type ServiceServer } from './server';
import { BULK_MAGIC } from './bulk-channel';

const log = createLogger('test', '0', 'silent');

function listen(p: string): Promise<net.Server> {
  return new Promise((resolve) => {
    const l = net.createServer();
    l.listen(p, () => resolve(l));
  });
}

function serverOn(listener: net.Server, name: string): ServiceServer {
  const s = createServiceServer({ info: { component: 'test', version: '0.0.0', commit: '', features: [] }, log });
  s.add(SandboxServiceDefinition, { getSandbox: async () => ({ sandbox: { sandboxId: name } }) } as never);
  s.serveListener(listener, undefined, { magic: BULK_MAGIC, handle: (sock) => sock.destroy() });
  return s;
}

describe('GrpcHost.shutdown with a sniffing listener', () => {
  let dir: string;
  beforeEach(() => {
    dir = mkdtempSync(path.join(os.tmpdir(), 'sniff-shutdown-'));
  });
  afterEach(() => {
    rmSync(dir, { recursive: true, force: true });
  });

  it('a connection accepted before shutdown whose bytes come after it began is served before the GOAWAY, not cut at exit', async () => {
    const [la, lb] = await Promise.all([listen(path.join(dir, 'a.sock')), listen(path.join(dir, 'b.sock'))]);
    const oldServer = serverOn(la, 'old');
    const newServer = serverOn(lb, 'new');
    let gateOpen = false;
    const held: Array<() => void> = [];
    const toOld = new Set<net.Socket>();
    let accepted = 0;
    let first = true;
    const proxy = net.createServer((client) => {
      const target = first ? 'a.sock' : 'b.sock';
      const upstream = net.connect(path.join(dir, target));
      if (first) toOld.add(upstream);
      first = false;
      upstream.on('connect', () => accepted++);
      upstream.on('error', () => client.destroy());
      client.on('error', () => upstream.destroy());
      // a closed side ends the other once what it sent is through (pipe ends it on 'end')
      upstream.on('close', () => client.end());
      client.on('close', () => upstream.end());
      upstream.pipe(client);
      const flow = () => client.pipe(upstream);
      if (gateOpen) flow();
      else {
        client.pause();
        held.push(flow);
      }
    });
    const proxyPath = path.join(dir, 'p.sock');
    await new Promise<void>((r) => proxy.listen(proxyPath, r));
    const channel = createChannel(`unix://${proxyPath}`);
    try {
      const call = createClient(SandboxServiceDefinition, channel).getSandbox({ sandboxId: 'x' }, { signal: AbortSignal.timeout(8000) });
      while (accepted === 0) await new Promise((r) => setTimeout(r, 10));
      // the old server has accepted the connection; none of the client's bytes reached it yet
      const shut = oldServer.shutdown(5000).then(() => {
        // the old process exits: every connection it holds is gone
        for (const s of toOld) s.destroy();
      });
      await new Promise((r) => setTimeout(r, 100));
      gateOpen = true;
      for (const f of held.splice(0)) f();
      await shut;
      const res = await call;
      expect(res.sandbox?.sandboxId).toMatch(/^(old|new)$/);
    } finally {
      channel.close();
      proxy.close();
      await newServer.shutdown(100);
      await oldServer.shutdown(100).catch(() => undefined);
    }
  });

  it('a connection that never sends a byte is closed at shutdown, after at most drainMs', async () => {
    const l = await listen(path.join(dir, 's.sock'));
    const server = serverOn(l, 'old');
    const silent = net.connect(path.join(dir, 's.sock'));
    silent.on('error', () => undefined);
    await new Promise((r) => silent.once('connect', r));
    await new Promise((r) => setTimeout(r, 50));
    let closed = false;
    silent.once('close', () => (closed = true));
    await server.shutdown(300);
    // the server closed it (before: it stayed open until the sniff timeout, 10 s, in a process about to exit)
    await new Promise((r) => setTimeout(r, 50));
    expect(closed).toBe(true);
    silent.destroy();
  });
});
