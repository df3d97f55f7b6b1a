import net from 'node:net';
import http from 'node:http';
import { createLogger } from '@sandnode/shared';
import { waitFor } from '@sandnode/testkit';
import { MetricsEndpoint } from './metrics-endpoint';

const log = createLogger('test', '0', 'silent');

function get(port: number): Promise<number> {
  return new Promise((resolve, reject) => {
    http
      .get({ host: '127.0.0.1', port, path: '/metrics' }, (res) => {
        res.resume();
        resolve(res.statusCode ?? 0);
      })
      .on('error', reject);
  });
}

describe('MetricsEndpoint', () => {
  it('binds the port once the previous holder frees it (the handover case), and close frees it again', async () => {
    const old = net.createServer();
    await new Promise<void>((r) => old.listen({ host: '127.0.0.1', port: 0 }, () => r()));
    const port = (old.address() as net.AddressInfo).port;
    const m = new MetricsEndpoint(`127.0.0.1:${port}`, log);
    const started = m.start();
    // the behaviour under test: the old server frees the port only 300 ms later, and start waits for it
    setTimeout(() => old.close(), 300);
    await started;
    expect(await get(port)).toBe(200);
    await m.start(); // already serving: a no-op
    m.close();
    await waitFor(
      'close to free the port',
      () =>
        get(port).then(
          () => false,
          (e: Error) => /ECONNREFUSED/.test(e.message),
        ),
      2000,
    );
  });

  it('is disabled by an empty address', async () => {
    const m = new MetricsEndpoint('', log);
    await m.start();
    m.close();
  });
});
