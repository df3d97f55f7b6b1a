/**
 * Attacks on the real server's unix socket (issue 10 §5), from a local client speaking raw
 * HTTP/2: 250 held, incomplete 4 MB requests (they grew the server to 1.1 GiB before) are
 * refused RESOURCE_EXHAUSTED past the held-bytes caps, a GetSandbox declaring 4 MB is refused by
 * its length prefix, connections that only send the preface are closed by the handshake
 * timeout, and 500 Exec streams into one sandbox are RESOURCE_EXHAUSTED beyond its cap. A
 * well-behaved client's GetSandbox keeps succeeding meanwhile, and the sandbox still runs a
 * command afterwards.
 */
import http2 from 'node:http2';
import net from 'node:net';
import { Status } from 'nice-grpc-common';
import { ClientError, createChannel, type Channel } from 'nice-grpc';
import { createServiceClient, DEFAULT_GUARD_LIMITS } from '@sandnode/shared';
import { SandboxServiceDefinition } from '@sandnode/shared/proto/server/v1/sandbox';
import { describeNode, execCollect, startNode, waitFor, type TestNode } from '@sandnode/testkit';

jest.setTimeout(300_000);

const MiB = 1024 * 1024;
const PREFACE = Buffer.from('PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n');
const SETTINGS = Buffer.from([0, 0, 0, 4, 0, 0, 0, 0, 0]);

const prefix = (len: number) => {
  const b = Buffer.alloc(5);
  b.writeUInt32BE(len, 1);
  return b;
};

function connectRaw(sock: string): Promise<http2.ClientHttp2Session> {
  const s = http2.connect('http://localhost', { createConnection: () => net.connect(sock) });
  s.on('error', () => undefined);
  return new Promise((resolve) => s.once('remoteSettings', () => resolve(s)));
}

/** holdCall opens a call, writes body and keeps the request open; resolves with the grpc-status, or 'held' while it is still open. */
function holdCall(s: http2.ClientHttp2Session, path: string, body: Buffer): { status: Promise<string>; done: () => boolean } {
  const req = s.request({ ':method': 'POST', ':path': path, 'content-type': 'application/grpc', te: 'trailers' });
  let ended = false;
  const status = new Promise<string>((resolve) => {
    let st = '';
    const take = (h: http2.IncomingHttpHeaders) => (st = String(h['grpc-status'] ?? st));
    req.on('response', take);
    req.on('trailers', take);
    req.on('data', () => undefined);
    req.on('error', () => undefined);
    req.on('close', () => {
      ended = true;
      resolve(st || `closed ${req.rstCode}`);
    });
  });
  req.write(body);
  return { status, done: () => ended };
}

describeNode('gRPC limits of the real server under attack', () => {
  let node: TestNode;
  let id: string;
  let sock: string;
  const sessions: http2.ClientHttp2Session[] = [];

  beforeAll(async () => {
    node = await startNode();
    sock = node.address.replace(/^unix:\/\//, '');
    id = (await node.api.sandboxes.createSandbox({ template: 'base' })).sandbox!.sandboxId;
  });
  const clients: { stop: () => Promise<unknown> }[] = [];
  afterEach(async () => {
    for (const s of sessions.splice(0)) s.destroy();
    // a failed test leaves its client looping: stop it before the node stops
    await Promise.all(clients.splice(0).map((c) => c.stop()));
  });
  afterAll(async () => {
    await node?.stop();
  });

  /** wellBehaved runs GetSandbox in a loop until stop() and returns how many failed. */
  function wellBehaved(): { stop: () => Promise<{ ok: number; failed: string[] }> } {
    let running = true;
    const failed: string[] = [];
    let ok = 0;
    const loop = (async () => {
      while (running) {
        try {
          await node.api.sandboxes.getSandbox({ sandboxId: id });
          ok++;
        } catch (err) {
          failed.push(err instanceof ClientError ? `${Status[err.code]}: ${err.details}` : String(err));
        }
      }
    })();
    const c = {
      stop: async () => {
        running = false;
        await loop;
        return { ok, failed };
      },
    };
    clients.push(c);
    return c;
  }

  it('250 held incomplete 4 MB requests are refused RESOURCE_EXHAUSTED past the caps, and GetSandbox keeps succeeding', async () => {
    const client = wellBehaved();
    const conns = await Promise.all(Array.from({ length: 25 }, () => connectRaw(sock)));
    sessions.push(...conns);
    // each declares 4 MiB (an Exec may be that big), sends 1 MiB of it and holds the rest back
    const calls = conns.flatMap((s) => Array.from({ length: 10 }, () => holdCall(s, '/sandnode.server.v1.SandboxService/Exec', Buffer.concat([prefix(4 * MiB), Buffer.alloc(MiB)]))));
    // and a GetSandbox declaring 4 MB is refused by its length prefix alone
    const small = conns.slice(0, 5).map((s) => holdCall(s, '/sandnode.server.v1.SandboxService/GetSandbox', prefix(4 * MiB)));
    const mostHeld = Math.floor(DEFAULT_GUARD_LIMITS.maxHeldRequestBytes / MiB);
    await waitFor('the calls above the held-bytes cap to be refused', () => calls.filter((c) => c.done()).length >= calls.length - mostHeld || undefined, 120_000);
    const ended = await Promise.all(calls.filter((c) => c.done()).map((c) => c.status));
    expect(new Set(ended)).toEqual(new Set([String(Status.RESOURCE_EXHAUSTED)]));
    expect(await Promise.all(small.map((c) => c.status))).toEqual(Array(5).fill(String(Status.RESOURCE_EXHAUSTED)));
    // the well-behaved client was served all along, and still is
    const r = await client.stop();
    expect(r.failed).toEqual([]);
    expect(r.ok).toBeGreaterThan(0);
    await expect(node.api.sandboxes.getSandbox({ sandboxId: id })).resolves.toBeDefined();
  });

  it('connections that only send the preface (or nothing) are closed by the handshake timeout, and GetSandbox keeps succeeding', async () => {
    const client = wellBehaved();
    const closed: boolean[] = [];
    await Promise.all(
      Array.from({ length: 50 }, async (_, i) => {
        const s = net.connect(sock);
        closed[i] = false;
        s.on('close', () => (closed[i] = true));
        s.on('error', () => undefined);
        s.on('data', () => undefined);
        await new Promise((r) => s.once('connect', r));
        if (i % 2 === 0) s.write(Buffer.concat([PREFACE, SETTINGS]));
      }),
    );
    await waitFor('the server to close all 50 connections', () => closed.every(Boolean) || undefined, 60_000);
    const r = await client.stop();
    expect(r.failed).toEqual([]);
  });

  it("podd runs with its soft RLIMIT_NOFILE raised to the sandbox's hard limit (sandnode-init)", async () => {
    // the command's parent is podd
    const r = await execCollect(node.api, id, ['sh', '-c', 'grep "Max open files" /proc/$PPID/limits']);
    const [, soft, hard] = /Max open files\s+(\d+)\s+(\d+)/.exec(r.stdout) ?? [];
    expect(Number(hard)).toBeGreaterThan(1024);
    expect(soft).toBe(hard);
  });

  it('500 Exec streams into one sandbox: the ones beyond its cap are RESOURCE_EXHAUSTED, and the sandbox runs a command afterwards', async () => {
    const abort = new AbortController();
    // 4 connections of their own (grpc-js shares one between equal channels; 256 streams each)
    const channels: Channel[] = Array.from({ length: 4 }, () => createChannel(node.address, undefined, { 'grpc.use_local_subchannel_pool': 1 }));
    const clients = channels.map((ch) => createServiceClient(SandboxServiceDefinition, ch, { timeoutMs: 120_000 }));
    const outcomes = await Promise.all(
      Array.from({ length: 500 }, async (_, i): Promise<string> => {
        try {
          for await (const ev of clients[i % 4]!.exec({ sandboxId: id, argv: ['sleep', '60'] }, { signal: abort.signal })) if (ev.event?.$case === 'started') return 'started';
          return 'ended without started';
        } catch (err) {
          return err instanceof ClientError ? (err.code === Status.RESOURCE_EXHAUSTED ? 'RESOURCE_EXHAUSTED' : `${Status[err.code]}: ${err.details}`) : String(err);
        }
      }),
    );
    abort.abort();
    for (const ch of channels) ch.close();
    expect([...new Set(outcomes)].sort()).toEqual(['RESOURCE_EXHAUSTED', 'started']);
    expect(outcomes.filter((o) => o === 'RESOURCE_EXHAUSTED').length).toBeGreaterThanOrEqual(500 - 64);
    await waitFor(
      'the sandbox to run a command once the flood ended',
      () =>
        execCollect(node.api, id, ['echo', 'ok']).then(
          (r) => (r.stdout === 'ok\n' ? true : undefined),
          () => undefined,
        ),
      60_000,
    );
  });
});
