/**
 * SharedEpochFence: the shared EpochFence (`<stateDir>/ublk-manager/epoch`) made safe for the
 * two slots that share that file. The shared fence reads the file once at start and then
 * trusts its memory, so slot b could accept epoch 4 after slot a had persisted 5, and two
 * concurrent writers could interleave. Here every admit runs under an flock on
 * `<dir>/epoch.lock` and first catches up with the file (another slot may have raised it).
 *
 * Methods listed in `handlerFenced` (FenceEpoch) are skipped by the fence middleware: their
 * handler fences with the epoch of the request body through EpochFence.fenceEpoch,
 * after validating it, so a bad request changes nothing.
 */
import path from 'node:path';
import { EpochFence, readEpochFile, type EpochFenceOptions } from '@sandnode/shared';
import { FileMutex } from './locks';

/** Options of a SharedEpochFence (those of the shared EpochFence). */
export type SharedEpochFenceOptions = EpochFenceOptions;

/** SharedEpochFence is an EpochFence whose highest epoch is shared by every process on dir. */
export class SharedEpochFence extends EpochFence {
  private readonly mutex: FileMutex;

  constructor(dir: string, opts: SharedEpochFenceOptions = {}) {
    super(dir, opts);
    this.mutex = new FileMutex(path.join(dir, 'epoch.lock'));
  }

  /**
   * raise: the shared check and persist, under the dir's lock and after catching up with the
   * epoch file (another slot may have raised it); returns the highest epoch seen after the
   * call (by any process on this dir, as far as the file says).
   */
  override raise(epoch: number, rpc: string): number {
    return this.mutex.runSync(() => {
      const onDisk = readEpochFile(this.epochFile);
      // the file holds it already (another slot raised it, within the lease then): no re-check, no write
      if (onDisk > this.highest) this.highest = onDisk;
      return super.raise(epoch, rpc);
    });
  }
}
