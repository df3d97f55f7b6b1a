import { execFileSync } from 'node:child_process';
import { mkdirSync, symlinkSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { createLogger, VMM_FEATURES } from '@sandnode/shared';
import { useTempDir } from '@sandnode/testkit';
import { RuncDriver } from './runc';
import { blkioWeightOffered, blockDeviceOf, blockIoSpec, driveBlockIo, ioLimitsInEffect, splitDev, type IoLimits } from './block-io';

const NONE: IoLimits = { readBps: 0, writeBps: 0, readIops: 0, writeIops: 0, weight: 0 };
const asRoot = process.getuid?.() === 0 ? test : test.skip;

describe('blockIoSpec', () => {
  const devs = [
    { major: 7, minor: 3 },
    { major: 259, minor: 1048575 },
  ];
  test('one entry per drive in each throttle that is set', () => {
    expect(blockIoSpec({ ...NONE, writeBps: 4194304, readIops: 100 }, devs, false)).toEqual({
      throttleWriteBpsDevice: [
        { major: 7, minor: 3, rate: 4194304 },
        { major: 259, minor: 1048575, rate: 4194304 },
      ],
      throttleReadIOPSDevice: [
        { major: 7, minor: 3, rate: 100 },
        { major: 259, minor: 1048575, rate: 100 },
      ],
    });
    const all = blockIoSpec({ readBps: 1, writeBps: 2, readIops: 3, writeIops: 4, weight: 0 }, [devs[0]!], false)!;
    expect(all).toEqual({
      throttleReadBpsDevice: [{ major: 7, minor: 3, rate: 1 }],
      throttleWriteBpsDevice: [{ major: 7, minor: 3, rate: 2 }],
      throttleReadIOPSDevice: [{ major: 7, minor: 3, rate: 3 }],
      throttleWriteIOPSDevice: [{ major: 7, minor: 3, rate: 4 }],
    });
  });
  test('a device named twice gets one entry', () => {
    expect(blockIoSpec({ ...NONE, writeBps: 10 }, [devs[0]!, { major: 7, minor: 3 }], false)).toEqual({ throttleWriteBpsDevice: [{ major: 7, minor: 3, rate: 10 }] });
  });
  test('nothing set, or throttles without a device: no blockIO', () => {
    expect(blockIoSpec(NONE, devs, true)).toBeUndefined();
    expect(blockIoSpec({ ...NONE, writeBps: 10 }, [], true)).toBeUndefined();
  });
  test('weight only when the host offers it', () => {
    expect(blockIoSpec({ ...NONE, weight: 500 }, devs, true)).toEqual({ weight: 500 });
    expect(blockIoSpec({ ...NONE, weight: 500 }, devs, false)).toBeUndefined();
    expect(blockIoSpec({ ...NONE, weight: 500, writeIops: 7 }, [devs[0]!], false)).toEqual({ throttleWriteIOPSDevice: [{ major: 7, minor: 3, rate: 7 }] });
    expect(ioLimitsInEffect({ ...NONE, weight: 500 }, false)).toBe(false);
    expect(ioLimitsInEffect({ ...NONE, weight: 500 }, true)).toBe(true);
    expect(ioLimitsInEffect({ ...NONE, readBps: 1 }, false)).toBe(true);
    expect(ioLimitsInEffect(NONE, true)).toBe(false);
    expect(ioLimitsInEffect(undefined, true)).toBe(false);
  });
});

describe('splitDev', () => {
  test("glibc's dev_t encoding", () => {
    expect(splitDev(0x0703n)).toEqual({ major: 7, minor: 3 });
    // major 259 (blkext), minor 1048575: minor's high 12 bits sit above major's low 12
    expect(splitDev((259n << 8n) | 0xffn | (0xfffn << 20n))).toEqual({ major: 259, minor: 1048575 });
    // glibc's makedev: major's high 20 bits above bit 44, minor's high 12 above bit 32
    const makedev = (ma: bigint, mi: bigint) => ((ma & 0xfffff000n) << 32n) | ((ma & 0xfffn) << 8n) | ((mi & 0xffffff00n) << 12n) | (mi & 0xffn);
    expect(splitDev(makedev(0x1234567n, 0x89abcn))).toEqual({ major: 0x1234567, minor: 0x89abc });
  });
});

describe('blockDeviceOf and driveBlockIo (host paths)', () => {
  const tmp = useTempDir('block-io');
  asRoot('a block device node gives its major:minor; a regular file, a dir, a char device, a missing path give none', () => {
    const blk = path.join(tmp(), 'blk');
    const big = path.join(tmp(), 'big');
    execFileSync('mknod', [blk, 'b', '7', '300']);
    execFileSync('mknod', [big, 'b', '259', '1048575']);
    const file = path.join(tmp(), 'file');
    writeFileSync(file, 'x');
    mkdirSync(path.join(tmp(), 'dir'));
    expect(blockDeviceOf(blk)).toEqual({ major: 7, minor: 300 });
    expect(blockDeviceOf(big)).toEqual({ major: 259, minor: 1048575 });
    expect(blockDeviceOf(file)).toBeUndefined();
    expect(blockDeviceOf(path.join(tmp(), 'dir'))).toBeUndefined();
    expect(blockDeviceOf('/dev/null')).toBeUndefined();
    expect(blockDeviceOf(path.join(tmp(), 'missing'))).toBeUndefined();

    const limits = { ...NONE, writeBps: 4194304 };
    expect(driveBlockIo(limits, [blk, file], false)).toEqual({ throttleWriteBpsDevice: [{ major: 7, minor: 300, rate: 4194304 }] });
    expect(driveBlockIo(limits, [file], false)).toBeUndefined();
    expect(driveBlockIo(NONE, [blk], true)).toBeUndefined();
    expect(driveBlockIo(undefined, [blk], true)).toBeUndefined();
  });
  asRoot("a server-chosen path that is a symlink to a device counts as that device (the path is the host's, never a sandbox's)", () => {
    const blk = path.join(tmp(), 'blk');
    execFileSync('mknod', [blk, 'b', '7', '5']);
    symlinkSync(blk, path.join(tmp(), 'link'));
    expect(blockDeviceOf(path.join(tmp(), 'link'))).toEqual({ major: 7, minor: 5 });
  });
});

describe('blkioWeightOffered', () => {
  const tmp = useTempDir('blkio-root');
  test('true when blkio.weight or blkio.bfq.weight exists, else false', () => {
    expect(blkioWeightOffered(tmp())).toBe(false);
    writeFileSync(path.join(tmp(), 'blkio.bfq.io_service_bytes'), '');
    expect(blkioWeightOffered(tmp())).toBe(false);
    writeFileSync(path.join(tmp(), 'blkio.bfq.weight'), '100');
    expect(blkioWeightOffered(tmp())).toBe(true);
  });
  test('blkio.weight (CFQ) counts too', () => {
    writeFileSync(path.join(tmp(), 'blkio.weight'), '500');
    expect(blkioWeightOffered(tmp())).toBe(true);
  });
});

describe('RuncDriver features', () => {
  const tmp = useTempDir('block-io-driver');
  const features = (io: IoLimits | undefined, ioWeightOffered: boolean) =>
    new RuncDriver({ runcBinary: 'runc', runcRoot: path.join(tmp(), 'runc'), runDir: tmp(), log: createLogger('test', '0', 'silent'), io, ioWeightOffered }).features;
  test('vmm.io-limits.v1 only when a limit applies here (a throttle, or a weight the host offers)', () => {
    expect(features(undefined, true)).not.toContain(VMM_FEATURES.ioLimits);
    expect(features(NONE, true)).not.toContain(VMM_FEATURES.ioLimits);
    expect(features({ ...NONE, weight: 100 }, false)).not.toContain(VMM_FEATURES.ioLimits);
    expect(features({ ...NONE, weight: 100 }, true)).toContain(VMM_FEATURES.ioLimits);
    expect(features({ ...NONE, writeIops: 50 }, false)).toContain(VMM_FEATURES.ioLimits);
  });
});
