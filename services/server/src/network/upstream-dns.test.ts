import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { InvalidArgumentError } from '@sandnode/shared';
import { parseDnsUpstreams, resolvConfNameservers } from './upstream-dns';

describe('dnsUpstreams', () => {
  it('parses address[:port] and names the bad entry', () => {
    expect(parseDnsUpstreams(['1.1.1.1', '127.0.0.53:5353'])).toEqual([
      { address: '1.1.1.1', port: 53 },
      { address: '127.0.0.53', port: 5353 },
    ]);
    expect(() => parseDnsUpstreams(['1.1.1.1', 'dns.google'])).toThrow(new InvalidArgumentError('dnsUpstreams[1]: "dns.google" is not an IPv4 address[:port]'));
    expect(() => parseDnsUpstreams(['1.1.1.1:0'])).toThrow(InvalidArgumentError);
    expect(() => parseDnsUpstreams([])).toThrow(InvalidArgumentError);
  });

  it('defaults to the IPv4 nameservers of resolv.conf', () => {
    const dir = mkdtempSync(path.join(os.tmpdir(), 'resolv-'));
    try {
      const f = path.join(dir, 'resolv.conf');
      writeFileSync(f, '# x\nsearch example\nnameserver 127.0.0.53\nnameserver ::1\n nameserver 9.9.9.9\noptions edns0\n');
      expect(resolvConfNameservers(f)).toEqual([
        { address: '127.0.0.53', port: 53 },
        { address: '9.9.9.9', port: 53 },
      ]);
      writeFileSync(f, 'nameserver ::1\n');
      expect(() => resolvConfNameservers(f)).toThrow(/names no IPv4 nameserver/);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
