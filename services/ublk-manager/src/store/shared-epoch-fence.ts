/**
 * SharedEpochFence: the shared EpochFence (`<stateDir>/ublk-manager/epoch`) made safe for the
 * two slots that share that file. The shared fence reads the file once at start and then
 * trusts its memory, so slot b could accept epoch 4 after slot a had persisted 5, and two
 * concurrent writers could interleave. Here every admit runs under an flock on
 * `<dir>/epoch.lock` and first catches up with the file (another slot may have raised it).
 */
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { EpochFence } from '@sandnode/shared';
import { FileMutex } from './locks';

function readEpoch(file: string): number {
  try {
    const v = Number(JSON.parse(readFileSync(file, 'utf8')).epoch);
    return Number.isSafeInteger(v) && v >= 0 ? v : 0;
  } catch {
    return 0;
  }
}

/** SharedEpochFence is an EpochFence whose highest epoch is shared by every process on dir. */
export class SharedEpochFence extends EpochFence {
  private readonly epochFile: string;
  private readonly mutex: FileMutex;

  constructor(dir: string) {
    super(dir);
    this.epochFile = path.join(dir, 'epoch');
    this.mutex = new FileMutex(path.join(dir, 'epoch.lock'));
  }

  /**
   * admit: AbortedError (gRPC ABORTED) when epoch is lower than the highest epoch any process
   * on this dir has persisted; a higher epoch is persisted (fsync) before the call proceeds.
   */
  override admit(epoch: number, rpc: string): void {
    this.mutex.runSync(() => {
      const onDisk = readEpoch(this.epochFile);
      if (onDisk > this.current) super.admit(onDisk, `${rpc} (catching up with the epoch file)`);
      super.admit(epoch, rpc);
    });
  }
}
