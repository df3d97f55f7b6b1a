import { consoleTmpfsOptions, guestTmpfsOptions, vmTmpfsPaths } from './vm-tmpfs';

describe('vm tmpfs', () => {
  test('the guest run dir is a sized tmpfs, no setuid, devices or exec; its owner is one parameter', () => {
    expect(guestTmpfsOptions(16 << 20)).toEqual(['size=16777216', 'mode=0755', 'uid=0', 'gid=0', 'nosuid', 'nodev', 'noexec']);
    expect(guestTmpfsOptions(1 << 20, { uid: 100000, gid: 100000, mode: 0o755 })).toContain('uid=100000');
    expect(consoleTmpfsOptions(1 << 20)).toEqual(['size=1048576', 'mode=0700', 'uid=0', 'gid=0', 'nosuid', 'nodev', 'noexec']);
  });

  test('paths live outside <runDir>/vms/<id>', () => {
    expect(vmTmpfsPaths('/r', 'vm-1')).toEqual({ dir: '/r/vm-tmpfs/vm-1', guest: '/r/vm-tmpfs/vm-1/guest', console: '/r/vm-tmpfs/vm-1/console' });
  });
});
