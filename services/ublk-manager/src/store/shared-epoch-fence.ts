/**
 * SharedEpochFence: the shared EpochFence (`<stateDir>/ublk-manager/epoch`) made safe for the
 * two slots that share that file. The shared fence reads the file once at start and then
 * trusts its memory, so slot b could accept epoch 4 after slot a had persisted 5, and two
 * concurrent writers could interleave. Here every admit runs under an flock on
 * `<dir>/epoch.lock` and first catches up with the file (another slot may have raised it).
 *
 * Methods listed in `handlerFenced` (FenceEpoch) are skipped by the fence middleware: their
 * handler fences with the epoch of the request body through {@link SharedEpochFence.raise},
 * after validating it, so a bad request changes nothing.
 */
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { EpochFence } from '@sandnode/shared';
import type { EpochFencePort } from '../core/fence-epoch';
import { FileMutex } from './locks';

function readEpoch(file: string): number {
  try {
    const v = Number(JSON.parse(readFileSync(file, 'utf8')).epoch);
    return Number.isSafeInteger(v) && v >= 0 ? v : 0;
  } catch {
    return 0;
  }
}

/** Options of a SharedEpochFence. */
export interface SharedEpochFenceOptions {
  /** gRPC method paths whose handler fences itself (the middleware lets them through). */
  handlerFenced?: readonly string[];
}

/** SharedEpochFence is an EpochFence whose highest epoch is shared by every process on dir. */
export class SharedEpochFence extends EpochFence implements EpochFencePort {
  private readonly epochFile: string;
  private readonly mutex: FileMutex;
  private readonly handlerFenced: ReadonlySet<string>;

  constructor(dir: string, opts: SharedEpochFenceOptions = {}) {
    super(dir);
    this.epochFile = path.join(dir, 'epoch');
    this.mutex = new FileMutex(path.join(dir, 'epoch.lock'));
    this.handlerFenced = new Set(opts.handlerFenced ?? []);
  }

  /**
   * admit (the fence middleware): AbortedError (gRPC ABORTED) when epoch is lower than the
   * highest epoch any process on this dir has persisted; a higher epoch is persisted (fsync)
   * before the call proceeds. A handler-fenced method is let through (its handler raises).
   */
  override admit(epoch: number, rpc: string): void {
    if (this.handlerFenced.has(rpc)) return;
    this.raise(epoch, rpc);
  }

  /**
   * raise: the check and persist of admit, for every caller; returns the highest epoch seen
   * after the call (by any process on this dir, as far as the file says).
   */
  raise(epoch: number, rpc: string): number {
    return this.mutex.runSync(() => {
      const onDisk = readEpoch(this.epochFile);
      if (onDisk > this.current) super.admit(onDisk, `${rpc} (catching up with the epoch file)`);
      super.admit(epoch, rpc);
      return this.current;
    });
  }
}
