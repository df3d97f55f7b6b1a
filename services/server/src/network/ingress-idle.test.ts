/**
 * The ingress's idle hook with real sockets on loopback (no netns): a request to a sandbox that is
 * not RUNNING asks the idle wake first and is then forwarded; a wake that fails answers its status
 * (503 with Retry-After past the auto-resume bound, 409 with auto_resume off) and reaches nothing;
 * a private sandbox's request without its token is 401 and wakes nothing; every forwarded request
 * is activity.
 */
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { createLogger } from '@sandnode/shared';
import { MapNetworkDirectory, type SandboxNetworkView } from '../core/network-directory';
import { createIngress, INGRESS_ENGINES, type Ingress, type IngressIdle } from './ingress';
import { loopbackView } from './__tests__/loopback-view';

function get(port: number, headers: Record<string, string>): Promise<{ status: number; headers: http.IncomingHttpHeaders; body: string }> {
  return new Promise((resolve, reject) => {
    http
      .get({ host: '127.0.0.1', port, path: '/', headers, agent: false }, (res) => {
        let body = '';
        res.on('data', (d: Buffer) => (body += d.toString()));
        res.on('end', () => resolve({ status: res.statusCode!, headers: res.headers, body }));
      })
      .on('error', reject);
  });
}

for (const engine of INGRESS_ENGINES) {
  describe(`ingress [${engine}] idle hook`, () => {
    let upstream: http.Server;
    let hits = 0;
    let ingress: Ingress;
    let port: number;
    let upPort: number;
    const dir = new MapNetworkDirectory();
    const wakes: string[] = [];
    const activity: string[] = [];
    let wake: IngressIdle['wake'];
    const view = (state: SandboxNetworkView['state'], pub = true): SandboxNetworkView => ({ ...loopbackView({}), state, public: pub });

    beforeAll(async () => {
      upstream = http.createServer((_q, s) => {
        hits++;
        s.end('hello');
      });
      await new Promise<void>((r) => upstream.listen(0, '127.0.0.1', r));
      upPort = (upstream.address() as AddressInfo).port;
      const idle: IngressIdle = { activity: (id) => activity.push(id), wake: (id) => (wakes.push(id), wake(id)) };
      ingress = createIngress({ engine, directory: dir, domain: 'localhost', log: createLogger('test', '0', 'silent'), idle });
      await new Promise<void>((r) => ingress.server.listen(0, '127.0.0.1', r));
      port = (ingress.server.address() as AddressInfo).port;
    });
    afterAll(async () => {
      await ingress.close();
      await new Promise((r) => upstream.close(r));
    });
    beforeEach(() => {
      hits = 0;
      wakes.length = 0;
      activity.length = 0;
    });
    const headers = (extra: Record<string, string> = {}) => ({ 'sandnode-sandbox-id': 'sb-1', 'sandnode-sandbox-port': String(upPort), ...extra });

    it('a PAUSED sandbox is woken, then the request is forwarded (and is activity)', async () => {
      dir.set(view('PAUSED'));
      wake = async () => {
        dir.set(view('RUNNING'));
        return { ok: true };
      };
      expect(await get(port, headers())).toMatchObject({ status: 200, body: 'hello' });
      expect(wakes).toEqual(['sb-1']);
      expect(activity).toContain('sb-1');
      // RUNNING now: no wake
      expect((await get(port, headers())).status).toBe(200);
      expect(wakes).toEqual(['sb-1']);
    });

    it('a wake past the bound is 503 with Retry-After; auto_resume off is 409 naming the state; nothing is reached', async () => {
      dir.set(view('PAUSED'));
      wake = async () => ({ ok: false, status: 503, reason: 'sandbox sb-1 is being resumed from PAUSED and did not come up within 100 ms', retryAfterS: 1 });
      const late = await get(port, headers());
      expect(late).toMatchObject({ status: 503, headers: { 'retry-after': '1' } });
      expect(late.body).toMatch(/did not come up within/);
      wake = async () => ({ ok: false, status: 409, reason: 'sandbox sb-1 is PAUSED and its idle.auto_resume is off' });
      const off = await get(port, headers());
      expect(off).toMatchObject({ status: 409 });
      expect(off.body).toMatch(/is PAUSED and its idle.auto_resume is off/);
      wake = async () => {
        throw new Error('boom');
      };
      expect((await get(port, headers())).status).toBe(503);
      expect(hits).toBe(0);
    });

    it('a private sandbox without its token is 401 and is not woken', async () => {
      dir.set(view('PAUSED', false));
      wake = async () => ({ ok: true });
      expect((await get(port, headers())).status).toBe(401);
      expect(wakes).toEqual([]);
    });
  });
}
