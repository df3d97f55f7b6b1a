import { createLogger, FailedPreconditionError, InternalError, NotFoundError } from '@sandnode/shared';
import type { DeviceManager } from './device-manager';
import { handoverAll, type OldSlot } from './handover';
import type { Device } from './types';

const log = createLogger('test', '0', 'silent');

const device = (id: string): Device =>
  ({
    deviceId: id,
    path: `/dev/loop-${id}`,
    backingFile: `/images/${id}.img`,
    state: 'attached',
    sizeBytes: 1,
    sourceImage: '',
    filesystem: 'ext4',
    readOnly: false,
    driver: 'loop',
    flags: [],
  }) as unknown as Device;

/**
 * A fake old slot that serves its calls in arrival order, one at a time (like the device's lock
 * on the real one), each answered after a turn of the event loop; events records what happened.
 */
class OrderedOldSlot implements OldSlot {
  events: string[] = [];
  quiesced = new Set<string>();
  released = new Map<string, string>();
  /** answer release with FAILED_PRECONDITION when it arrives before the quiesce took effect */
  strict = true;
  /** run the release before the quiesce it follows (a reordering on the way) */
  reorder = false;
  failQuiesce: Error | undefined;
  private tail: Promise<unknown> = Promise.resolve();

  constructor(private readonly ids: string[]) {}

  private serve<T>(fn: () => T): Promise<T> {
    const next = this.tail.then(
      () =>
        new Promise<T>((resolve, reject) =>
          setImmediate(() => {
            try {
              resolve(fn());
            } catch (err) {
              reject(err);
            }
          }),
        ),
    );
    this.tail = next.catch(() => undefined);
    return next;
  }

  async list(): Promise<Device[]> {
    return this.ids.filter((id) => !this.released.has(id)).map(device);
  }
  quiesce(id: string): Promise<void> {
    this.events.push(`quiesce sent ${id}`);
    const run = () => {
      if (this.failQuiesce) throw this.failQuiesce;
      if (!this.ids.includes(id)) throw new NotFoundError(`no ${id}`);
      this.quiesced.add(id);
      this.events.push(`quiesced ${id}`);
    };
    if (this.reorder) return new Promise((resolve, reject) => setTimeout(() => this.serve(run).then(resolve, reject), 5));
    return this.serve(run);
  }
  async resume(id: string): Promise<void> {
    this.quiesced.delete(id);
    this.events.push(`resumed ${id}`);
  }
  release(id: string): Promise<{ device: Device; token: string }> {
    this.events.push(`release sent ${id}`);
    return this.serve(() => {
      if (!this.ids.includes(id)) throw new NotFoundError(`no ${id}`);
      if (this.strict && !this.quiesced.has(id)) {
        this.events.push(`release refused ${id}`);
        throw new FailedPreconditionError(`ReleaseDevice "${id}": the device is not quiesced`);
      }
      this.released.set(id, `tok-${id}`);
      this.events.push(`released ${id}`);
      return { device: device(id), token: `tok-${id}` };
    });
  }
  async abort(id: string): Promise<void> {
    this.released.delete(id);
    this.events.push(`aborted ${id}`);
  }
}

function fakeManager(recovered: string[]): DeviceManager {
  return {
    capabilities: () => ({ driver: 'loop', capabilities: [], maxDeviceSizeBytes: 1 }),
    recover: async (input: { deviceId: string }, token: string) => {
      recovered.push(`${input.deviceId} ${token}`);
      return { device: device(input.deviceId), recoverMs: 0 };
    },
  } as unknown as DeviceManager;
}

describe('handoverAll', () => {
  it('sends the release right behind the quiesce, before the quiesce answered (one round trip less per device)', async () => {
    const old = new OrderedOldSlot(['a', 'b']);
    const recovered: string[] = [];
    const r = await handoverAll({ manager: fakeManager(recovered), old, deviceIds: [], perDeviceTimeoutMs: 0, log });
    expect(r.devices.map((d) => [d.deviceId, d.result])).toEqual([
      ['a', 'moved'],
      ['b', 'moved'],
    ]);
    expect(recovered).toEqual(['a tok-a', 'b tok-b']);
    expect(old.events.slice(0, 4)).toEqual(['quiesce sent a', 'release sent a', 'quiesced a', 'released a']);
  });

  it('sends the release again when it got to the old slot before the quiesce (FAILED_PRECONDITION, nothing changed)', async () => {
    const old = new OrderedOldSlot(['a']);
    old.reorder = true;
    const recovered: string[] = [];
    const r = await handoverAll({ manager: fakeManager(recovered), old, deviceIds: [], perDeviceTimeoutMs: 0, log });
    expect(r.devices.map((d) => [d.deviceId, d.result])).toEqual([['a', 'moved']]);
    expect(old.events).toEqual(['quiesce sent a', 'release sent a', 'release refused a', 'quiesced a', 'release sent a', 'released a']);
    expect(recovered).toEqual(['a tok-a']);
  });

  it('a failed quiesce leaves the device with the old slot (resumed), the early release changed nothing', async () => {
    const old = new OrderedOldSlot(['a']);
    old.failQuiesce = new InternalError('flush failed');
    const recovered: string[] = [];
    const r = await handoverAll({ manager: fakeManager(recovered), old, deviceIds: [], perDeviceTimeoutMs: 0, log });
    expect(r.devices.map((d) => [d.deviceId, d.result])).toEqual([['a', 'aborted']]);
    expect(old.released.size).toBe(0);
    expect(old.events).toContain('resumed a');
    expect(recovered).toEqual([]);
  });

  it('skips a device deleted on the old slot before its turn', async () => {
    const gone = new OrderedOldSlot(['a']);
    gone.list = async () => [device('a')];
    (gone as unknown as { ids: string[] }).ids = [];
    const r = await handoverAll({ manager: fakeManager([]), old: gone, deviceIds: [], perDeviceTimeoutMs: 0, log });
    expect(r.devices).toEqual([]);
  });
});
