import { InvalidArgumentError } from '@sandnode/shared';
import { Capability, DeviceState, Filesystem } from '@sandnode/shared/proto/ublk/v1/ublk';
import { capabilitiesToPb, cloneInputFromPb, cloneToPb, createInputFromPb, deviceFromPb, deviceToPb, filesystemFromPb } from './convert';

describe('convert', () => {
  it('maps filesystem: UNSPECIFIED means ext4; unknown values are INVALID_ARGUMENT', () => {
    expect(filesystemFromPb(Filesystem.FILESYSTEM_UNSPECIFIED)).toBe('ext4');
    expect(filesystemFromPb(Filesystem.FILESYSTEM_NONE)).toBe('none');
    expect(() => filesystemFromPb(42 as Filesystem)).toThrow(InvalidArgumentError);
  });

  it('maps a request and a device', () => {
    expect(createInputFromPb({ deviceId: 'a', sizeBytes: 1 << 20, sourceImage: '', filesystem: Filesystem.FILESYSTEM_EXT4, readOnly: true })).toEqual({
      deviceId: 'a',
      sizeBytes: 1 << 20,
      sourceImage: '',
      filesystem: 'ext4',
      readOnly: true,
    });
    const pb = deviceToPb({
      deviceId: 'a',
      path: '',
      sizeBytes: 5,
      backingFile: '/i/a.img',
      readOnly: false,
      filesystem: 'inherited',
      state: 'missing',
      driver: 'loop',
      flags: [],
      createdAtMs: 7,
      sourceImage: '/t.img',
      clonedFrom: 'p',
    });
    expect(pb).toMatchObject({ filesystem: Filesystem.FILESYSTEM_UNSPECIFIED, state: DeviceState.DEVICE_STATE_UNSPECIFIED, createdAtMs: 7, clonedFrom: 'p' });
    expect(deviceFromPb(pb).clonedFrom).toBe('p');
  });

  it('maps CloneDevice: request fields; clone_ms rounded up and never 0 for a made clone, 0 for an existing one', () => {
    expect(cloneInputFromPb({ deviceId: 'c', sourceDeviceId: 'p', sourceQuiesced: true, readOnly: false })).toEqual({
      deviceId: 'c',
      sourceDeviceId: 'p',
      sourceQuiesced: true,
      readOnly: false,
    });
    const device = {
      deviceId: 'c',
      path: '/dev/loop1',
      sizeBytes: 5,
      backingFile: '/i/c.img',
      readOnly: false,
      filesystem: 'ext4' as const,
      state: 'attached' as const,
      driver: 'loop' as const,
      flags: [],
      createdAtMs: 1,
      sourceImage: '',
      clonedFrom: 'p',
    };
    expect(cloneToPb({ device, cloneMs: 0.2, totalMs: 3, reflinked: true, cloneMethod: 'reflink', copyReason: '', copiedBytes: 8192, created: true })).toMatchObject({
      cloneMs: 1,
      reflinked: true,
      copiedBytes: 8192,
      cloneMethod: 'reflink',
      copyReason: '',
    });
    expect(cloneToPb({ device, cloneMs: 41.3, totalMs: 50, reflinked: false, cloneMethod: 'copy', copyReason: 'no reflink', copiedBytes: 8192, created: true })).toMatchObject({
      cloneMs: 42,
      cloneMethod: 'copy',
      copyReason: 'no reflink',
    });
    expect(cloneToPb({ device, cloneMs: 0, totalMs: 1, reflinked: false, cloneMethod: '', copyReason: '', copiedBytes: 0, created: false }).cloneMs).toBe(0);
  });

  it('maps capabilities', () => {
    expect(capabilitiesToPb({ driver: 'ublk', capabilities: ['quiesce', 'reissue'], maxDeviceSizeBytes: 9 })).toEqual({
      driver: 'ublk',
      capabilities: [Capability.CAPABILITY_QUIESCE, Capability.CAPABILITY_REISSUE],
      maxDeviceSizeBytes: 9,
    });
  });
});
