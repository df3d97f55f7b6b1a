/**
 * route's answers for a private sandbox: a request without the access token and one with a
 * wrong token are both 401, and the reason says which, so a user knows whether to add the
 * header or fix its value; the right token routes.
 */
import { createHash } from 'node:crypto';
import { MapNetworkDirectory } from '../core/network-directory';
import { ACCESS_TOKEN_HEADER, route } from './ingress-route';
import { loopbackView } from './__tests__/loopback-view';

describe('ingress route: a private sandbox', () => {
  const dir = new MapNetworkDirectory();
  const token = 'right-token';
  dir.set({ ...loopbackView({}), accessTokenSha256: createHash('sha256').update(token).digest('hex') });
  const host = { host: '8080-sb-1.localhost' };

  it('without the token: 401 asking for the header', () => {
    const r = route(host, dir, 'localhost');
    expect(r).toMatchObject({ ok: false, status: 401 });
    expect(!r.ok && r.reason).toMatch(/is private: send its access token in the sandnode-access-token header/);
  });

  it('with a wrong token (or an empty one): 401 saying the token is wrong, or missing', () => {
    const wrong = route({ ...host, [ACCESS_TOKEN_HEADER]: 'nope' }, dir, 'localhost');
    expect(wrong).toMatchObject({ ok: false, status: 401 });
    expect(!wrong.ok && wrong.reason).toMatch(/holds a wrong access token/);
    const empty = route({ ...host, [ACCESS_TOKEN_HEADER]: '' }, dir, 'localhost');
    expect(!empty.ok && empty.reason).toMatch(/send its access token/);
  });

  it('with the token: routed to the port of the Host', () => {
    expect(route({ ...host, [ACCESS_TOKEN_HEADER]: token }, dir, 'localhost')).toMatchObject({ ok: true, port: 8080 });
  });
});

describe('ingress route: a sandbox that is not running', () => {
  const dir = new MapNetworkDirectory();
  const host = { host: '8080-sb-1.localhost' };
  it('PAUSED: 503 with Retry-After (it may come back: auto-resume, a resume); DRAINED: 503 without Retry-After, naming the resume', () => {
    dir.set({ ...loopbackView({}), public: true, state: 'PAUSED' });
    expect(route(host, dir, 'localhost')).toMatchObject({ ok: false, status: 503, retryAfterS: 5, notRunning: 'sb-1' });
    dir.set({ ...loopbackView({}), public: true, state: 'DRAINED' });
    const drained = route(host, dir, 'localhost');
    expect(drained).toMatchObject({ ok: false, status: 503, notRunning: 'sb-1' });
    expect(!drained.ok && drained.retryAfterS).toBeUndefined();
    expect(!drained.ok && drained.reason).toMatch(/is DRAINED .*sandnode sandbox resume sb-1/);
  });
});
