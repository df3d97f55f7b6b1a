import net from 'node:net';
import { connectTcp } from './tcp-connect';

describe('connectTcp', () => {
  let server: net.Server;
  let port: number;
  beforeAll(async () => {
    server = net.createServer((s) => s.end('hi'));
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    port = (server.address() as net.AddressInfo).port;
  });
  afterAll(() => new Promise<void>((r) => server.close(() => r())));

  it('resolves with the connected socket, its error listeners left to the caller', async () => {
    const s = await connectTcp({ host: '127.0.0.1', port }, 5000);
    expect(s.listenerCount('error')).toBe(0);
    const got = await new Promise<string>((resolve) => {
      let b = '';
      s.on('data', (d: Buffer) => (b += d.toString())).on('end', () => resolve(b));
    });
    expect(got).toBe('hi');
    s.destroy();
  });

  it("rejects with the socket's error when refused (the caller's onTimeout is not used)", async () => {
    const closed = net.createServer();
    await new Promise<void>((r) => closed.listen(0, '127.0.0.1', r));
    const free = (closed.address() as net.AddressInfo).port;
    await new Promise<void>((r) => closed.close(() => r()));
    await expect(connectTcp({ host: '127.0.0.1', port: free }, 5000, () => new Error('timeout'))).rejects.toMatchObject({ code: 'ECONNREFUSED' });
  });
});
