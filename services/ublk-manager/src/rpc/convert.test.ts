import { InvalidArgumentError } from '@sandnode/shared';
import { Capability, DeviceState, Filesystem } from '@sandnode/shared/proto/ublk/v1/ublk';
import { capabilitiesToPb, createInputFromPb, deviceToPb, filesystemFromPb } from './convert';

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
    });
    expect(pb).toMatchObject({ filesystem: Filesystem.FILESYSTEM_UNSPECIFIED, state: DeviceState.DEVICE_STATE_UNSPECIFIED, createdAtMs: 7 });
  });

  it('maps capabilities', () => {
    expect(capabilitiesToPb({ driver: 'ublk', capabilities: ['quiesce', 'reissue'], maxDeviceSizeBytes: 9 })).toEqual({
      driver: 'ublk',
      capabilities: [Capability.CAPABILITY_QUIESCE, Capability.CAPABILITY_REISSUE],
      maxDeviceSizeBytes: 9,
    });
  });
});
