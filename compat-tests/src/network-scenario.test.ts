/** The pure parts of the network scenario: pool membership, the ingress Host of a sandbox's URL, the create request with and without `network`. */
import { createRequest, ingressHost, inPool } from './network-scenario';

describe('network scenario helpers', () => {
  it('inPool tells addresses of the pool from those outside it', () => {
    expect(inPool('10.209.130.6', '10.209.130.0/24')).toBe(true);
    expect(inPool('10.209.131.6', '10.209.130.0/24')).toBe(false);
    expect(inPool('10.209.0.2', '10.209.0.0/16')).toBe(true);
    expect(inPool('10.210.0.2', '10.209.0.0/16')).toBe(false);
  });

  it('ingressHost puts the port into the URL template and keeps only the host name', () => {
    expect(ingressHost('http://{port}-sb-0123456789abcdef.localhost:16402', 8080)).toBe('8080-sb-0123456789abcdef.localhost');
  });

  it('createRequest sets network only for a networked sandbox (an older server sees no field at all otherwise)', () => {
    expect(createRequest('t', false)).not.toHaveProperty('network');
    expect(createRequest('t', true).network).toEqual({ disabled: false, egress: undefined, public: false });
    expect(createRequest('t', true).requestId).not.toBe(createRequest('t', true).requestId);
  });
});
