/**
 * Second attack round on the ingress's podd relay (issue 12): the podd is the guest's, so a
 * sandbox can answer ForwardPort itself. A hostile podd that sends ForwardPort data in messages
 * as large as gRPC lets it (4 MiB) to an ingress client that reads nothing made the server hold
 * about 100 MiB per tunnel (measured: 4 tunnels, 480 MiB taken from the podd, rss +402 MiB),
 * and a sandbox may have 512 tunnels. podd sends at most MAX_FORWARD_CHUNK_BYTES (64 KiB) per
 * message: the relay's channel takes no larger one, so such a tunnel is closed at its first one.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { createLogger, createServiceServer, parseEgressPolicy, PODD_FEATURES, type ServiceServer } from '@sandnode/shared';
import { PoddServiceDefinition } from '@sandnode/shared/proto/podd/v1/podd';
import { MapNetworkDirectory } from '../../core/network-directory';
import { createIngress, INGRESS_ENGINES, type Ingress } from '../ingress';
import { poddRelay, type PoddRelay } from '../ingress-podd';

jest.setTimeout(60_000);

/** what the hostile podd may hand the server for one tunnel before the tunnel must have been closed, bytes */
const TAKEN_LIMIT = 64 * 1024 * 1024;

for (const engine of INGRESS_ENGINES) {
  describe(`attack2: [${engine}] a hostile podd floods a ForwardPort tunnel whose client reads nothing`, () => {
    let dir: string;
    let podd: ServiceServer;
    let relay: PoddRelay;
    let ingress: Ingress;
    let port: number;
    let sent = 0;
    let sentMore: () => void = () => undefined;
    beforeAll(async () => {
      dir = mkdtempSync(path.join(os.tmpdir(), 'attack2-podd-'));
      podd = createServiceServer({ info: { component: 'podd', version: '0.3.0', commit: 'hostile', features: [PODD_FEATURES.forwardPort] }, log: createLogger('hostile-podd', '0', 'silent') });
      const chunk = Buffer.alloc(4 * 1024 * 1024 - 1024, 120);
      podd.add(PoddServiceDefinition, {
        async *forwardPort() {
          yield { connected: true, data: Buffer.alloc(0), eof: false };
          while (sent < TAKEN_LIMIT) {
            yield { connected: false, data: chunk, eof: false };
            sent += chunk.length;
            sentMore();
          }
          sentMore();
          await new Promise(() => undefined); // holds the call open
        },
      } as unknown as Parameters<ServiceServer['add']>[1]);
      const sock = path.join(dir, 'podd.sock');
      await podd.listen([`unix://${sock}`]);
      const d = new MapNetworkDirectory();
      d.set({
        sandboxId: 'sb-hostile',
        state: 'RUNNING',
        slot: 1,
        address: '127.0.0.1', // port 1 refuses there: the ingress goes through the podd
        gateway: '127.0.0.2',
        policy: parseEgressPolicy({ allowOut: [], denyOut: [], blockAll: false }),
        public: true,
        accessTokenSha256: '0'.repeat(64),
        poddAddress: `unix://${sock}`,
      });
      relay = poddRelay();
      ingress = createIngress({ engine, directory: d, domain: 'localhost', log: createLogger('ingress-attack2', '0', 'silent'), podd: relay });
      await new Promise<void>((r) => ingress.server.listen(0, '127.0.0.1', r));
      port = (ingress.server.address() as net.AddressInfo).port;
    });
    afterAll(async () => {
      await ingress?.close();
      relay?.close();
      await podd?.shutdown(0);
      rmSync(dir, { recursive: true, force: true });
    });

    it('the tunnel is refused or closed before the server took TAKEN_LIMIT bytes from the podd', async () => {
      const c = net.connect(port, '127.0.0.1');
      c.on('error', () => undefined);
      let closed = false;
      const closedP = new Promise<void>((r) => c.once('close', () => r()));
      void closedP.then(() => (closed = true));
      // the answer's head is read, then nothing more
      const status = await new Promise<string>((resolve) => {
        let head = '';
        const on = (d: Buffer) => {
          head += d.toString('latin1');
          if (!head.includes('\r\n\r\n')) return;
          c.off('data', on);
          c.pause();
          resolve(head.split('\r\n')[0]!);
        };
        c.on('data', on);
        c.write('CONNECT 1-sb-hostile.localhost:1 HTTP/1.1\r\nHost: 1-sb-hostile.localhost\r\n\r\n');
      });
      // tunnelled: either it is closed, or the podd got everything it sent taken (then it holds the call)
      if (status.includes(' 200 ')) await Promise.race([closedP, new Promise<void>((r) => (sentMore = () => sent >= TAKEN_LIMIT && r()))]);
      c.destroy();
      expect({ refusedOrClosed: closed || !status.includes(' 200 '), taken: sent >= TAKEN_LIMIT }).toEqual({ refusedOrClosed: true, taken: false });
    });
  });
}
