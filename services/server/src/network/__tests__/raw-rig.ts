/**
 * A raw-engine ingress in front of a hostile "sandbox" socket, for the unit tests of the raw
 * engine (ingress-response-head, attack3-ingress-*): the sandbox is a net server on 127.0.0.1
 * whose handler writes whatever bytes a test wants; the ingress serves the directory's sb-1.
 */
import { createHash } from 'node:crypto';
import net from 'node:net';
import { createLogger } from '@sandnode/shared';
import type { MapNetworkDirectory } from '../../core/network-directory';
import { createIngress } from '../ingress';

/** sha is the hex SHA-256 of an access token (a view's accessTokenSha256). */
export const sha = (t: string): string => createHash('sha256').update(t).digest('hex');

/** send writes `data` on a new connection to port and resolves with every byte received (latin1) until it closes, `until` says so, or `ms` pass. */
export function send(port: number, data: Buffer | string, ms: number, until?: (got: string) => boolean): Promise<string> {
  return new Promise((resolve) => {
    const s = net.connect(port, '127.0.0.1');
    let got = '';
    const done = () => {
      clearTimeout(t);
      s.destroy();
      resolve(got);
    };
    s.on('data', (d: Buffer) => {
      got += d.toString('latin1');
      if (until?.(got)) done();
    });
    s.on('error', () => undefined);
    const t = setTimeout(done, ms);
    s.on('close', done);
    s.write(data);
  });
}

/** The running pair: the ingress's port, the sandbox's port, close() ends both. */
export interface RawRig {
  port: number;
  upPort: number;
  close(): Promise<void>;
}

/** rawRig starts the sandbox (each connection to `handler`) and a raw ingress (domain localhost) over `dir`, both on 127.0.0.1:0. */
export async function rawRig(name: string, dir: MapNetworkDirectory, handler: (sock: net.Socket) => void): Promise<RawRig> {
  const upstream = net.createServer(handler);
  await new Promise<void>((r) => upstream.listen(0, '127.0.0.1', r));
  const ingress = createIngress({ engine: 'raw', directory: dir, domain: 'localhost', log: createLogger(name, '0', 'silent') });
  await new Promise<void>((r) => ingress.server.listen(0, '127.0.0.1', r));
  return {
    port: (ingress.server.address() as net.AddressInfo).port,
    upPort: (upstream.address() as net.AddressInfo).port,
    close: async () => {
      await ingress.close();
      await new Promise((r) => upstream.close(r));
    },
  };
}
