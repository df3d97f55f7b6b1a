import { VMM_FEATURES } from '@sandnode/shared';
import { runcIsolation } from './isolation';

describe('runcIsolation', () => {
  test('names what a runc VM gets, sorted; seccomp only with a profile', () => {
    const base = [VMM_FEATURES.cgroupNamespace, VMM_FEATURES.consoleCap, VMM_FEATURES.guestTmpfs, VMM_FEATURES.pidsLimit];
    expect(runcIsolation({ seccomp: false, userns: false })).toEqual(base);
    expect(runcIsolation({ seccomp: true, userns: false })).toEqual([...base, VMM_FEATURES.seccomp].sort());
    expect(runcIsolation({ seccomp: true, userns: true })).toEqual([...base, VMM_FEATURES.seccomp, VMM_FEATURES.userns].sort());
    expect(runcIsolation({ seccomp: false, userns: false, ioLimits: false })).toEqual(base);
    expect(runcIsolation({ seccomp: true, userns: false, ioLimits: true })).toEqual([...base, VMM_FEATURES.seccomp, 'vmm.io-limits.v1'].sort());
  });
});
