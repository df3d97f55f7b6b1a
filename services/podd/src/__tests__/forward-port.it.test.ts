/**
 * ForwardPort on the real podd process (dist/main.js on the host, like podd.it.test.ts): a
 * service on 127.0.0.1 is reached through the stream; the contract's errors.
 * Needs `npx tsc -b services/podd/tsconfig.build.json`.
 */
import net from 'node:net';
import path from 'node:path';
import { Status } from 'nice-grpc';
import { createSandnodeChannel, createServiceClient, PODD_FEATURES } from '@sandnode/shared';
import { VersionServiceDefinition } from '@sandnode/shared/proto/common/v1/version';
import { PoddServiceDefinition, type ForwardPortRequest, type ForwardPortResponse } from '@sandnode/shared/proto/podd/v1/podd';
import type { Channel } from 'nice-grpc';
import { built, describeWith, expectCode, makeTempDir, startDaemon, type RunningDaemon } from '@sandnode/testkit';
import { rmSync } from 'node:fs';

const MAIN = path.resolve(__dirname, '..', '..', 'dist', 'main.js');

/** A request queue the test pushes to; the stream reads it. */
function requestQueue() {
  const items: Partial<ForwardPortRequest>[] = [];
  let wake: (() => void) | undefined;
  let ended = false;
  return {
    push(r: Partial<ForwardPortRequest>) {
      items.push(r);
      wake?.();
    },
    end() {
      ended = true;
      wake?.();
    },
    async *iterate(): AsyncGenerator<Partial<ForwardPortRequest>> {
      for (;;) {
        while (items.length) yield items.shift()!;
        if (ended) return;
        await new Promise<void>((r) => (wake = r));
        wake = undefined;
      }
    },
  };
}

describeWith('podd ForwardPort (dist/main.js on the host)', [built('@sandnode/podd')], () => {
  let dir: string;
  let daemon: RunningDaemon;
  let channel: Channel;
  let client: ReturnType<typeof createServiceClient<typeof PoddServiceDefinition>>;
  let echo: net.Server;
  let echoPort: number;
  const echoSeen: Buffer[] = [];

  beforeAll(async () => {
    dir = makeTempDir('podd-fwd');
    const sock = path.join(dir, 'podd.sock');
    daemon = await startDaemon({ main: MAIN, args: ['--socket', sock], socket: sock, logFile: path.join(dir, 'podd.log'), env: { SANDNODE_PODD_FREEZE_SOCKET: path.join(dir, 'none.sock') } });
    channel = createSandnodeChannel(daemon.address);
    client = createServiceClient(PoddServiceDefinition, channel, { timeoutMs: 10_000 });
    // a loopback-only service: echoes in upper case, and on FIN answers "bye" then closes
    echo = net.createServer({ allowHalfOpen: true }, (s) => {
      s.on('data', (d: Buffer) => {
        echoSeen.push(d);
        s.write(d.toString().toUpperCase());
      });
      s.on('end', () => s.end('bye'));
    });
    await new Promise<void>((r) => echo.listen(0, '127.0.0.1', r));
    echoPort = (echo.address() as net.AddressInfo).port;
  });
  afterAll(async () => {
    channel?.close();
    await daemon?.stop();
    echo?.close();
    rmSync(dir, { recursive: true, force: true });
  });

  test('GetVersion lists podd.forward-port.v1', async () => {
    const v = await createServiceClient(VersionServiceDefinition, channel).getVersion({});
    expect(v.features).toContain(PODD_FEATURES.forwardPort);
  });

  test('relays both ways: connected first, data, half-close, eof, then the stream ends', async () => {
    const q = requestQueue();
    q.push({ port: echoPort });
    const got: ForwardPortResponse[] = [];
    let text = '';
    for await (const r of client.forwardPort(q.iterate())) {
      got.push(r);
      text += Buffer.from(r.data).toString();
      if (r.connected) q.push({ data: Buffer.from('hello ') });
      if (text === 'HELLO ') q.push({ data: Buffer.from('world'), closeWrite: true });
      if (r.eof) q.end();
    }
    expect(got[0]).toMatchObject({ connected: true, eof: false });
    expect(text).toBe('HELLO WORLDbye');
    expect(got.at(-1)?.eof).toBe(true);
  });

  test('a large transfer arrives whole in responses of at most 64 KiB', async () => {
    const sink = net.createServer((s) => s.end(Buffer.alloc(3 * 1024 * 1024 + 17, 7)));
    await new Promise<void>((r) => sink.listen(0, '127.0.0.1', r));
    try {
      const q = requestQueue();
      q.push({ port: (sink.address() as net.AddressInfo).port, closeWrite: true });
      q.end();
      let total = 0;
      let biggest = 0;
      for await (const r of client.forwardPort(q.iterate())) {
        total += r.data.length;
        biggest = Math.max(biggest, r.data.length);
      }
      expect(total).toBe(3 * 1024 * 1024 + 17);
      expect(biggest).toBeLessThanOrEqual(64 * 1024);
    } finally {
      sink.close();
    }
  });

  test('a port nothing listens on is UNAVAILABLE; port 0, 65536 and data first are INVALID_ARGUMENT', async () => {
    const free = net.createServer();
    await new Promise<void>((r) => free.listen(0, '127.0.0.1', r));
    const freePort = (free.address() as net.AddressInfo).port;
    await new Promise<void>((r) => free.close(() => r()));
    const run = async (reqs: Partial<ForwardPortRequest>[]) => {
      for await (const _ of client.forwardPort(
        (async function* () {
          yield* reqs;
        })(),
      ));
    };
    await expectCode(run([{ port: freePort }]), Status.UNAVAILABLE);
    await expectCode(run([{ port: 0 }]), Status.INVALID_ARGUMENT);
    await expectCode(run([{ port: 65536 }]), Status.INVALID_ARGUMENT);
    await expectCode(run([{ port: echoPort, data: Buffer.from('x') }]), Status.INVALID_ARGUMENT);
  });

  test('cancelling the call closes the connection inside', async () => {
    const closed = new Promise<void>((resolve) => {
      const once = (s: net.Socket) => {
        s.on('close', () => resolve());
        echo.off('connection', once);
      };
      echo.on('connection', once);
    });
    const ac = new AbortController();
    const q = requestQueue();
    q.push({ port: echoPort });
    await expect(
      (async () => {
        for await (const r of client.forwardPort(q.iterate(), { signal: ac.signal })) if (r.connected) ac.abort();
      })(),
    ).rejects.toThrow();
    await closed;
  });
});
