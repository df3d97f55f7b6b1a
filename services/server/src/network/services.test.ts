/**
 * NetworkServices.late: an activation whose supervisor had no network (0.2.0, or its network
 * off) starts the egress proxy and resolver once the supervisor has one, so a supervisor
 * upgraded after the server does not leave networked sandboxes without DNS until the next
 * server activation.
 */
import { createLogger } from '@sandnode/shared';
import { MapNetworkDirectory } from '../core/network-directory';
import type { NodeNetwork } from '../core/types';
import { NetworkServices } from './services';

const log = createLogger('test', '0', 'silent');
const off: NodeNetwork = { available: false, reason: 'vmm-supervisor 0.2.0 lacks feature "vmm.network.v1"', slots: [], pool: '', dnsPort: 0, egressProxyPort: 0, proxiedPorts: [], alwaysDenied: [] };

describe('NetworkServices.late', () => {
  it('gives nothing while the supervisor has no network, then the egress proxy and resolver once it has, then nothing again', async () => {
    let n = off;
    let asked = 0;
    const s = new NetworkServices({
      directory: new MapNetworkDirectory(),
      ingress: { listen: '', domain: 'localhost' },
      dnsUpstreams: [{ address: '127.0.0.1', port: 53 }],
      networkStatus: async () => (asked++, n),
      logger: log,
      lateCheckMs: 0,
    });
    try {
      expect(await s.wanted()).toEqual([]);
      expect(await s.late()).toEqual([]);
      n = { ...off, available: true, reason: '', pool: '10.209.0.0/16', dnsPort: 15053, egressProxyPort: 15080, proxiedPorts: [80, 443], alwaysDenied: ['10.0.0.0/8'] };
      const specs = await s.late();
      expect(specs.map((x) => `${x.name} ${x.kind} ${x.address}`)).toEqual(['egress-proxy tcp 0.0.0.0:15080', 'dns-tcp tcp 0.0.0.0:15053', 'dns-udp udp 0.0.0.0:15053']);
      for (const x of specs) expect(s.serve(x)).toBeDefined();
      const before = asked;
      expect(await s.late()).toEqual([]);
      expect(asked).toBe(before); // running: the supervisor is not asked again
    } finally {
      await s.close();
    }
  });

  it('asks the supervisor at most every lateCheckMs', async () => {
    let asked = 0;
    const s = new NetworkServices({ directory: new MapNetworkDirectory(), ingress: { listen: '', domain: 'localhost' }, networkStatus: async () => (asked++, off), logger: log, lateCheckMs: 60_000 });
    try {
      await s.wanted();
      expect(asked).toBe(1);
      expect(await s.late()).toEqual([]);
      expect(asked).toBe(1);
    } finally {
      await s.close();
    }
  });
});
