/**
 * Attack on the ingress (issue 12): one client that holds every connection the ingress allows
 * (ingressMaxConnections) without a request in flight — connections that sent nothing yet, or
 * kept alive after a 400 — must not lock every other client out. Idle connections are what a
 * full ingress gives up first.
 */
import http from 'node:http';
import net from 'node:net';
import { createLogger } from '@sandnode/shared';
import { MapNetworkDirectory } from '../../core/network-directory';
import { createIngress, INGRESS_ENGINES, type Ingress } from '../ingress';

jest.setTimeout(60_000);

const MAX = 16;

function get(port: number, host: string): Promise<number> {
  return new Promise((resolve, reject) => {
    const req = http.get({ host: '127.0.0.1', port, path: '/', headers: { host }, agent: false }, (res) => {
      res.resume();
      res.on('end', () => resolve(res.statusCode ?? 0));
    });
    req.on('error', reject);
  });
}

for (const engine of INGRESS_ENGINES) {
  describe(`attack: ingress [${engine}] connection exhaustion by one client`, () => {
    let ingress: Ingress;
    let port: number;
    const hostile: net.Socket[] = [];
    beforeAll(async () => {
      ingress = createIngress({ engine, directory: new MapNetworkDirectory(), domain: 'localhost', log: createLogger('ingress-attack', '0', 'silent'), limits: { maxConnections: MAX } });
      await new Promise<void>((r) => ingress.server.listen(0, '127.0.0.1', r));
      port = (ingress.server.address() as net.AddressInfo).port;
    });
    afterAll(async () => {
      for (const s of hostile) s.destroy();
      await ingress?.close();
    });

    it('another client is still answered while one holds every connection idle (half silent, half kept alive after a 400)', async () => {
      for (let i = 0; i < MAX; i++) {
        const s = net.connect(port, '127.0.0.1');
        s.on('error', () => undefined);
        await new Promise<void>((r) => s.once('connect', () => r()));
        if (i % 2 === 1) {
          const answered = new Promise<void>((r) => s.once('data', () => r()));
          s.write('GET / HTTP/1.1\r\nHost: nothing\r\n\r\n'); // 400, the connection stays open (keep-alive)
          await answered;
        }
        hostile.push(s);
      }
      // a client of a sandbox this node does not have: 404 is an answer; today the socket is closed (maxConnections)
      await expect(get(port, `8080-sb-none.localhost`)).resolves.toBe(404);
    });
  });
}
