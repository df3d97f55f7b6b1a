/**
 * What `down --purge` takes as its own: only the mounts sandnode made below the node's dirs
 * (the supervisor's per-VM mounts, mounts of sandnode images), never the user's.
 */
import { classifyMounts, isSandnodeImage, parseMountinfo, type MountEntry } from './purge';

const dirs = { runDir: '/n/run', stateDir: '/n/state' };
const loops = new Map([
  ['/dev/loop3', '/n/state/images/sb-1-upper.img'],
  ['/dev/loop4', '/n/state/images/sb-1-ws.img'],
  ['/dev/loop7', '/n/state/mine/disk.img'],
]);
const m = (mountPoint: string, fsType: string, source: string): MountEntry => ({ mountPoint, fsType, source });

describe('classifyMounts', () => {
  it("takes the supervisor's per-VM mounts and mounts of sandnode images, deepest first", () => {
    const r = classifyMounts(
      [
        m('/n/run/vms/sb-1/upper-dev', 'ext4', '/dev/loop3'),
        m('/n/run/vms/sb-1/rootfs', 'overlay', 'overlay'),
        m('/n/run/vms/sb-1/workspace', 'ext4', '/dev/loop4'),
        m('/n/run/vm-tmpfs/sb-1/guest', 'tmpfs', 'tmpfs'),
        m('/n/run/vm-tmpfs/sb-1/console', 'tmpfs', 'tmpfs'),
        m('/n/state/tmp-check/x', 'ext4', '/dev/loop4'),
        m('/', 'ext4', '/dev/sda1'),
        m('/n/runner', 'tmpfs', 'tmpfs'),
      ],
      dirs,
      loops,
    );
    expect(r.ours).toEqual(['/n/run/vm-tmpfs/sb-1/console', '/n/run/vm-tmpfs/sb-1/guest', '/n/run/vms/sb-1/upper-dev', '/n/run/vms/sb-1/workspace', '/n/run/vms/sb-1/rootfs', '/n/state/tmp-check/x']);
    expect(r.foreign).toEqual([]);
  });

  it("leaves every other mount at or below the dirs to its owner: a user's tmpfs, a loop of a foreign image, odd paths under vms/", () => {
    const foreign = [
      m('/n/state/mine', 'tmpfs', 'tmpfs'),
      m('/n/state', 'tmpfs', 'tmpfs'),
      m('/n/run/data', 'ext4', '/dev/loop7'),
      m('/n/run/vms', 'tmpfs', 'tmpfs'),
      m('/n/run/vms/sb-1', 'tmpfs', 'tmpfs'),
      m('/n/run/vms/sb-1/rootfs/mnt', 'tmpfs', 'tmpfs'),
      m('/n/run/vms/sb-1/cache', 'tmpfs', 'tmpfs'),
      m('/n/run/rootfs', 'tmpfs', 'tmpfs'),
      m('/n/run/vm-tmpfs/sb-1/guest/x', 'tmpfs', 'tmpfs'),
      m('/n/run/vm-tmpfs/sb-1/guest', 'ext4', '/dev/loop7'),
      m('/n/run/vm-tmpfs/sb-1/cache', 'tmpfs', 'tmpfs'),
    ];
    const r = classifyMounts([...foreign, m('/n/run/vms/sb-1/rootfs', 'overlay', 'overlay')], dirs, loops);
    expect(r.ours).toEqual(['/n/run/vms/sb-1/rootfs']);
    expect(r.foreign).toEqual(foreign);
  });

  it('isSandnodeImage: an .img directly in <stateDir>/images only', () => {
    expect(isSandnodeImage('/n/state/images/sb-1-upper.img', '/n/state')).toBe(true);
    expect(isSandnodeImage('/n/state/images/sub/x.img', '/n/state')).toBe(false);
    expect(isSandnodeImage('/n/state/images/x.raw', '/n/state')).toBe(false);
    expect(isSandnodeImage('/n/state/mine/x.img', '/n/state')).toBe(false);
    expect(isSandnodeImage('/other/images/x.img', '/n/state')).toBe(false);
  });
});

describe('parseMountinfo', () => {
  it('reads mount point, type and source, with and without optional fields, decoding escapes', () => {
    const text = ['36 35 98:0 / /n/run/vms/sb-1/upper-dev rw,noatime shared:1 master:2 - ext4 /dev/loop3 rw', '37 35 0:50 / /n/state/my\\040dir rw - tmpfs tmpfs rw,size=1024k', ''].join('\n');
    expect(parseMountinfo(text)).toEqual([m('/n/run/vms/sb-1/upper-dev', 'ext4', '/dev/loop3'), m('/n/state/my dir', 'tmpfs', 'tmpfs')]);
  });
});
