import net from 'node:net';
import { ResourceExhaustedError } from '@sandnode/shared';
import { PortForwarder, type ForwardRequest } from './forward';

const req = (r: Partial<ForwardRequest>): ForwardRequest => ({ port: 0, data: new Uint8Array(0), closeWrite: false, ...r });

describe('PortForwarder limit', () => {
  let server: net.Server;
  let port: number;
  const conns: net.Socket[] = [];
  beforeAll(async () => {
    server = net.createServer((s) => conns.push(s));
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    port = (server.address() as net.AddressInfo).port;
  });
  afterAll(() => {
    for (const s of conns) s.destroy();
    server.close();
  });

  it('refuses a forward beyond the limit with RESOURCE_EXHAUSTED, and takes one again once a forward ended', async () => {
    const f = new PortForwarder(2);
    const ac = new AbortController();
    // two streams whose host side never ends: both stay open
    const hang = () =>
      (async function* () {
        yield req({ port });
        await new Promise<void>((r) => ac.signal.addEventListener('abort', () => r()));
      })();
    const open = [f.forward(hang(), ac.signal), f.forward(hang(), ac.signal)];
    for (const g of open) expect((await g.next()).value).toMatchObject({ connected: true });
    expect(f.running).toBe(2);
    const third = f.forward(
      (async function* () {
        yield req({ port });
      })(),
      new AbortController().signal,
    );
    await expect(third.next()).rejects.toBeInstanceOf(ResourceExhaustedError);
    await open[0]!.return(undefined);
    expect(f.running).toBe(1);
    const again = f.forward(hang(), ac.signal);
    expect((await again.next()).value).toMatchObject({ connected: true });
    ac.abort();
    await again.return(undefined);
    await open[1]!.return(undefined);
    expect(f.running).toBe(0);
  });
});
