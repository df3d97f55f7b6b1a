/** Test network pools: two live nodes never share a pool, tag or port; a lock of a dead process is taken over; release frees it. */
import { writeFileSync } from 'node:fs';
import path from 'node:path';
import { poolLockDir, takeTestPool } from './test-pool';

describe('test network pools', () => {
  it('gives two holders different pools, tags and ports inside 10.211.0.0/17, and the index back once released', () => {
    const a = takeTestPool();
    const b = takeTestPool();
    try {
      expect(a.index).not.toBe(b.index);
      for (const p of [a, b]) {
        expect(p.settings).toMatchObject({ enabled: true, pool: `10.211.${p.index}.0/24`, tag: expect.stringMatching(/^t[0-9a-f]{2}$/) });
        expect(p.index).toBeLessThan(128);
      }
      expect(new Set([a, b].flatMap((p) => [p.settings.dnsPort, p.settings.egressProxyPort, p.settings.ingressListen])).size).toBe(6);
      a.release();
      // a lock left by a dead process is stale: it is taken over
      writeFileSync(path.join(poolLockDir(), `${a.index}.lock`), '2147483646 1\n');
      const c = takeTestPool();
      try {
        expect(c.index).toBe(a.index);
      } finally {
        c.release();
      }
    } finally {
      a.release();
      b.release();
    }
  });
});
