/** The server's config (issue 10 §4): TCP is off unless `listen` is set. */
import { loadServerConfig } from './config';

describe('loadServerConfig: who can reach the API', () => {
  it('serves no TCP by default: the unix socket is the API', () => {
    const c = loadServerConfig({ env: {} });
    expect(c.listen).toBe('');
    expect(c.socketGroup).toBe('');
    expect(c.socket.endsWith('/server.sock')).toBe(true);
  });
});
