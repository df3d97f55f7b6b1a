/**
 * Writeback pacing of a large sequential write that ends with an fsync (`sandbox cp` in podd's
 * upload and the CLI's download). The kernel starts writing dirty pages back only at
 * dirty_background_ratio of free memory (10 % of 24 GiB here), so a 1 GiB copy stayed dirty in
 * the page cache until its final fsync, which then wrote the whole GiB while the transfer had
 * ended: the copy took transfer + flush in a row. Starting an fdatasync every
 * WRITEBACK_EVERY_BYTES (never two at once, not awaited by the writer) makes the disk write
 * beside the transfer, and leaves the final fsync only the tail. The idea is Linux's
 * sync_file_range(SYNC_FILE_RANGE_WRITE) streaming-write advice (used by e.g. PostgreSQL's
 * checkpointer, `dd oflag=...`), which Node does not expose; fdatasync of the whole file is the
 * portable form of it.
 */

/** Bytes written between two fdatasync starts (64 MiB). */
export const WRITEBACK_EVERY_BYTES = 64 * 1024 * 1024;

/** The file operation the pacer needs (a node:fs/promises FileHandle has it). */
export interface DatasyncTarget {
  datasync(): Promise<void>;
}

/**
 * WritebackPacer starts a background fdatasync of fh each time `wrote` has counted everyBytes
 * since the last start, one at a time. `drain` waits for the one in flight and throws its error
 * (the caller's final fsync would report the same failure; a failed background one is never
 * lost). Not thread-shared state: one pacer per file being written.
 */
export class WritebackPacer {
  private pending = 0;
  private inFlight: Promise<void> | undefined;
  private failure: unknown;
  /** how many background fdatasyncs were started */
  started = 0;

  constructor(
    private readonly fh: DatasyncTarget,
    private readonly everyBytes = WRITEBACK_EVERY_BYTES,
  ) {}

  /** wrote counts n bytes just written and starts an fdatasync when everyBytes are pending and none runs. */
  wrote(n: number): void {
    this.pending += n;
    if (this.pending < this.everyBytes || this.inFlight) return;
    this.pending = 0;
    this.started++;
    this.inFlight = this.fh
      .datasync()
      .catch((err: unknown) => {
        this.failure ??= err;
      })
      .finally(() => {
        this.inFlight = undefined;
      });
  }

  /** drain waits for the fdatasync in flight (if any); rejects with the first background failure. */
  async drain(): Promise<void> {
    await this.inFlight;
    if (this.failure !== undefined) throw this.failure;
  }
}
