import { InvalidArgumentError } from '@sandnode/shared';
import { MIB, TIB } from './types';
import { describeSpec, sameSpec, validateCloneSize, validateCreateInput, validateSize, type CreateDeviceInput } from './validate';

const limits = { maxDeviceSizeBytes: TIB };
const empty = (over: Partial<CreateDeviceInput> = {}): CreateDeviceInput => ({
  deviceId: 'dev-1',
  sizeBytes: 64 * MIB,
  sourceImage: '',
  filesystem: 'ext4',
  readOnly: false,
  ...over,
});

function expectInvalid(fn: () => unknown, field: string): void {
  let err: unknown;
  try {
    fn();
  } catch (e) {
    err = e;
  }
  expect(err).toBeInstanceOf(InvalidArgumentError);
  expect((err as Error).message).toContain(field);
}

describe('validateCreateInput', () => {
  it('accepts an empty device and keeps its spec', () => {
    expect(validateCreateInput(empty(), limits)).toEqual({ deviceId: 'dev-1', sizeBytes: 64 * MIB, sourceImage: '', filesystem: 'ext4', readOnly: false });
  });

  it('accepts the size bounds 1 MiB and the maximum', () => {
    expect(() => validateCreateInput(empty({ sizeBytes: MIB }), limits)).not.toThrow();
    expect(() => validateCreateInput(empty({ sizeBytes: TIB }), limits)).not.toThrow();
  });

  it.each([
    ['empty id', ''],
    ['upper case', 'Dev'],
    ['leading dash', '-dev'],
    ['slash', 'a/b'],
    ['dots', '..'],
    ['too long', 'a'.repeat(64)],
  ])('rejects a bad device_id (%s)', (_what, id) => expectInvalid(() => validateCreateInput(empty({ deviceId: id }), limits), 'device_id'));

  it.each([
    ['zero', 0],
    ['negative', -512],
    ['not a multiple of 512', MIB + 1],
    ['below 1 MiB', 512 * 1024],
    ['above the maximum', TIB + 512],
    ['fractional', 1.5 * MIB + 0.5],
  ])('rejects size_bytes %s', (_what, size) => expectInvalid(() => validateCreateInput(empty({ sizeBytes: size }), limits), 'size_bytes'));

  it('honours a configured maximum', () => {
    expectInvalid(() => validateSize(256 * MIB + 512, { maxDeviceSizeBytes: 256 * MIB }), 'size_bytes');
    expect(() => validateSize(256 * MIB, { maxDeviceSizeBytes: 256 * MIB })).not.toThrow();
  });

  it('takes a clone with size 0 and records filesystem inherited', () => {
    expect(validateCreateInput(empty({ sizeBytes: 0, sourceImage: '/img//base.img', filesystem: 'none' }), limits)).toEqual({
      deviceId: 'dev-1',
      sizeBytes: 0,
      sourceImage: '/img/base.img',
      filesystem: 'inherited',
      readOnly: false,
    });
  });

  it('rejects source_image together with size_bytes', () => {
    expectInvalid(() => validateCreateInput(empty({ sourceImage: '/img/base.img' }), limits), 'size_bytes');
  });

  it('rejects a relative source_image', () => {
    expectInvalid(() => validateCreateInput(empty({ sizeBytes: 0, sourceImage: 'base.img' }), limits), 'source_image');
    expectInvalid(() => validateCreateInput(empty({ sizeBytes: 0, sourceImage: './x/../base.img' }), limits), 'source_image');
  });
});

describe('validateCloneSize', () => {
  it('rejects empty, unaligned and oversized sources naming source_image', () => {
    expectInvalid(() => validateCloneSize('/a', 0, limits), 'source_image');
    expectInvalid(() => validateCloneSize('/a', MIB + 3, limits), 'source_image');
    expectInvalid(() => validateCloneSize('/a', 2 * MIB, { maxDeviceSizeBytes: MIB }), 'source_image');
    expect(() => validateCloneSize('/a', 4096, limits)).not.toThrow();
  });
});

describe('sameSpec', () => {
  const row = { sizeBytes: 64 * MIB, sourceImage: '', filesystem: 'ext4' as const, readOnly: false };
  it('matches identical empty specs and nothing else', () => {
    const spec = validateCreateInput(empty(), limits);
    expect(sameSpec(row, spec)).toBe(true);
    expect(sameSpec({ ...row, sizeBytes: 32 * MIB }, spec)).toBe(false);
    expect(sameSpec({ ...row, filesystem: 'none' }, spec)).toBe(false);
    expect(sameSpec({ ...row, readOnly: true }, spec)).toBe(false);
  });
  it('compares clones by source and read_only only (size comes from the source)', () => {
    const spec = validateCreateInput(empty({ sizeBytes: 0, sourceImage: '/img/base.img' }), limits);
    expect(sameSpec({ sizeBytes: 8 * MIB, sourceImage: '/img/base.img', filesystem: 'inherited', readOnly: false }, spec)).toBe(true);
    expect(sameSpec({ sizeBytes: 8 * MIB, sourceImage: '/img/other.img', filesystem: 'inherited', readOnly: false }, spec)).toBe(false);
  });
  it('describes a spec for ALREADY_EXISTS messages', () => {
    expect(describeSpec(row)).toBe(`size_bytes=${64 * MIB} filesystem=ext4 read_only=false`);
    expect(describeSpec({ ...row, sourceImage: '/img/base.img', filesystem: 'inherited', readOnly: true })).toBe('source_image=/img/base.img read_only=true');
    expect(describeSpec({ ...row, clonedFrom: 'dev-a' })).toBe('a CloneDevice clone of "dev-a" read_only=false');
  });
});
