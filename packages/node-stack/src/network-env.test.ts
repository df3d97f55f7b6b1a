/** networkEnv: the node's network settings reach each daemon as the env of its own keys, and nothing without settings (the daemons' defaults: network on). */
import { networkEnv } from './components';

describe('networkEnv', () => {
  const n = { enabled: true, pool: '10.209.130.0/24', tag: 't02', dnsPort: 16002, egressProxyPort: 16202, ingressListen: '127.0.0.1:16402' };

  it("gives the supervisor its network keys and the server its ingress listener, nobody else's", () => {
    expect(networkEnv('vmm-supervisor', n)).toEqual({
      SANDNODE_VMM_SUPERVISOR_NETWORK: 'true',
      SANDNODE_VMM_SUPERVISOR_NETWORK_POOL: '10.209.130.0/24',
      SANDNODE_VMM_SUPERVISOR_NETWORK_TAG: 't02',
      SANDNODE_VMM_SUPERVISOR_DNS_PORT: '16002',
      SANDNODE_VMM_SUPERVISOR_EGRESS_PROXY_PORT: '16202',
    });
    expect(networkEnv('server', n)).toEqual({ SANDNODE_SERVER_INGRESS_LISTEN: '127.0.0.1:16402' });
    expect(networkEnv('ublk-manager', n)).toEqual({});
  });

  it('off: the supervisor says network false, the server no listener; no settings: nothing (defaults)', () => {
    expect(networkEnv('vmm-supervisor', { enabled: false, ingressListen: '' })).toEqual({ SANDNODE_VMM_SUPERVISOR_NETWORK: 'false' });
    expect(networkEnv('server', { enabled: false, ingressListen: '' })).toEqual({ SANDNODE_SERVER_INGRESS_LISTEN: '' });
    expect(networkEnv('vmm-supervisor', undefined)).toEqual({});
  });
});
