/**
 * Test fakes of the DeviceManager's ports (in memory, calls recorded, failures injectable),
 * shared by the unit tests of device-manager, clone, adoption and device-handover.
 */
import path from 'node:path';
import { createLogger, FailedPreconditionError, NotFoundError, type Logger } from '@sandnode/shared';
import { DeviceManager } from '../device-manager';
import type { AttachOptions, BlockDriver, CloneResult, ImageOps, SourceImageInfo } from '../driver';
import { MemoryDeviceStore } from '../memory-store';
import { MIB, type AttachedDevice, type DeviceRecord, type DriverCapability } from '../types';
import type { CreateDeviceInput } from '../validate';

export const DIR = '/images';
/** A BlockDriver in memory; records calls; failures injectable. */
export class FakeDriver implements BlockDriver {
  readonly name = 'loop' as const;
  devices = new Map<string, AttachedDevice>();
  busy = new Map<string, string>();
  failAttach: Error | undefined;
  calls: string[] = [];
  private next = 0;
  capabilities(): DriverCapability[] {
    return [];
  }
  async checkAvailable(): Promise<void> {}
  async attach(backingFile: string, opts: AttachOptions): Promise<AttachedDevice> {
    this.calls.push(`attach ${backingFile}`);
    if (this.failAttach) throw this.failAttach;
    const d = { path: `/dev/loop${this.next++}`, backingFile, readOnly: opts.readOnly, flags: ['direct-io'] };
    this.devices.set(d.path, d);
    return { ...d };
  }
  failDetach: Error | undefined;
  async detach(p: string): Promise<void> {
    this.calls.push(`detach ${p}`);
    if (this.failDetach) throw this.failDetach;
    this.devices.delete(p);
  }
  async listAttached(dir: string): Promise<AttachedDevice[]> {
    return [...this.devices.values()].filter((d) => path.dirname(d.backingFile) === dir).map((d) => ({ ...d }));
  }
  async busyReason(p: string): Promise<string | undefined> {
    return this.busy.get(p);
  }
  async quiesce(d: AttachedDevice): Promise<void> {
    this.calls.push(`quiesce ${d.path}`);
  }
  async resume(d: AttachedDevice): Promise<void> {
    this.calls.push(`resume ${d.path}`);
  }
  async release(d: AttachedDevice): Promise<void> {
    this.calls.push(`release ${d.path}`);
  }
  async recover(d: AttachedDevice): Promise<AttachedDevice> {
    this.calls.push(`recover ${d.path}`);
    const live = [...this.devices.values()].find((x) => x.backingFile === d.backingFile);
    if (!live) throw new FailedPreconditionError(`${d.backingFile} is not attached`);
    return { ...live };
  }
}

/** ImageOps in memory: file -> size. */
export class FakeImages implements ImageOps {
  readonly dir = DIR;
  files = new Map<string, number>();
  failFormat: Error | undefined;
  onCreate: (() => void) | undefined;
  imagePath(id: string): string {
    return `${DIR}/${id}.img`;
  }
  async exists(f: string): Promise<boolean> {
    return this.files.has(f);
  }
  async inspectSource(f: string): Promise<SourceImageInfo> {
    const size = this.files.get(f);
    if (size === undefined) throw new NotFoundError(`source_image: ${f} does not exist`);
    return { sizeBytes: size };
  }
  async createEmpty(f: string, size: number): Promise<void> {
    this.onCreate?.();
    if (this.files.has(f)) throw new Error('EEXIST');
    this.files.set(f, size);
  }
  async formatExt4(): Promise<void> {
    if (this.failFormat) throw this.failFormat;
  }
  /** Files the clone of a test left as temps: file -> target. */
  temps = new Map<string, string>();
  failClone: Error | undefined;
  clones: string[] = [];
  async clone(src: string, dst: string, opts: { signal?: AbortSignal } = {}): Promise<CloneResult> {
    this.clones.push(`${src} -> ${dst}`);
    if (this.failClone) throw this.failClone;
    if (opts.signal?.aborted) throw Object.assign(new Error('The operation was aborted'), { name: 'AbortError', code: 'ABORT_ERR' });
    if (this.files.has(dst)) throw new Error('EEXIST');
    this.files.set(dst, this.files.get(src) ?? 0);
    return { reflinked: false, copyReason: 'fake', copyMs: 3, syncMs: 1, sourceAllocatedBytes: 4096 };
  }
  async cloneTemps(): Promise<{ file: string; target: string }[]> {
    return [...this.temps].map(([file, target]) => ({ file, target }));
  }
  async remove(f: string): Promise<boolean> {
    return this.temps.delete(f) || this.files.delete(f);
  }
}

/** setup: a DeviceManager on fakes, with a clock that ticks 1 ms per read. */
export function setup(maxDeviceSizeBytes = 1024 * MIB, log: Logger = createLogger('test', '0', 'silent')) {
  const store = new MemoryDeviceStore();
  const driver = new FakeDriver();
  const images = new FakeImages();
  let t = 1000;
  const manager = new DeviceManager({ store, driver, images, log, limits: { maxDeviceSizeBytes }, now: () => t++ });
  return { store, driver, images, manager };
}

export const input = (over: Partial<CreateDeviceInput> = {}): CreateDeviceInput => ({
  deviceId: 'dev-a',
  sizeBytes: 64 * MIB,
  sourceImage: '',
  filesystem: 'ext4',
  readOnly: false,
  ...over,
});

export const row = (over: Partial<DeviceRecord>): DeviceRecord => ({
  deviceId: 'x',
  state: 'ready',
  sizeBytes: 8 * MIB,
  sourceImage: '',
  filesystem: 'ext4',
  readOnly: false,
  backingFile: `${DIR}/x.img`,
  path: '',
  createdAtMs: 1,
  updatedAtMs: 1,
  handoverToken: '',
  clonedFrom: '',
  ...over,
});
/** A FakeDriver that can look one device up directly, counting full scans. */
export class LookupDriver extends FakeDriver {
  scans = 0;
  override async listAttached(dir: string): Promise<AttachedDevice[]> {
    this.scans++;
    return super.listAttached(dir);
  }
  async lookup(p: string): Promise<AttachedDevice | undefined> {
    const d = this.devices.get(p);
    return d ? { ...d } : undefined;
  }
}
