import type { PeerFeatures } from '@sandnode/shared';
import { announceEpoch } from './epoch-announce';

function peer(features: string[]) {
  const calls: string[] = [];
  const f = { reset: () => calls.push('reset'), has: async (x: string) => features.includes(x) } as unknown as PeerFeatures;
  return { f, calls };
}

describe('announceEpoch', () => {
  it('uses FenceEpoch when the peer lists the feature, asking afresh', async () => {
    const { f, calls } = peer(['vmm.fence-epoch.v1']);
    const how = await announceEpoch(f, 'vmm.fence-epoch.v1', async () => calls.push('fence'), { name: 'DeleteVm', call: async () => calls.push('legacy') });
    expect(how).toBe('FenceEpoch');
    expect(calls).toEqual(['reset', 'fence']);
  });
  it('falls back to the 0.2.0 no-op delete when the peer lacks it, and says so', async () => {
    const { f, calls } = peer([]);
    const how = await announceEpoch(f, 'ublk.fence-epoch.v1', async () => calls.push('fence'), { name: 'DeleteDevice', call: async () => calls.push('legacy') });
    expect(how).toBe('DeleteDevice of "epoch-fence-probe" (the peer lacks "ublk.fence-epoch.v1")');
    expect(calls).toEqual(['reset', 'legacy']);
  });
  it('passes the call error on (ABORTED when a higher epoch exists)', async () => {
    const { f } = peer(['x']);
    await expect(announceEpoch(f, 'x', () => Promise.reject(new Error('stale epoch 2')), { name: 'DeleteVm', call: async () => undefined })).rejects.toThrow('stale epoch 2');
  });
});
