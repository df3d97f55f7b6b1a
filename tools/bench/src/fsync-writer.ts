/**
 * fsync writer of the device-stall bench (device-stall.ts), run as a child process (`fork`)
 * so that the bench's own event loop does not delay it: for each file given on the command
 * line, one loop writes 4 KiB at the file's start and fdatasyncs it, then pauses
 * FSYNC_WRITER_PAUSE_MS (env, ms; 0 = none), until the parent sends "stop". Each write + fdatasync is one sample: [start, latency] in ms, start
 * on the clock performance.timeOrigin + performance.now() (epoch ms, shared with the parent).
 * Answers "stop" with a {@link WriterReport} over IPC, then exits.
 *
 * The libuv thread pool is sized to one thread per file (plus one) by the parent
 * (UV_THREADPOOL_SIZE), so the loops do not queue behind each other.
 */
import { open } from 'node:fs/promises';

/** What the writer sends back: per file, its samples as [startEpochMs, latencyMs] pairs, and the errors it met. */
export interface WriterReport {
  files: { file: string; samples: [number, number][]; errors: string[] }[];
}

/** Bytes of each write. */
export const WRITE_BYTES = 4096;

const now = () => performance.timeOrigin + performance.now();

async function main(files: string[]): Promise<void> {
  const pauseMs = Number(process.env.FSYNC_WRITER_PAUSE_MS ?? 0);
  let stop = false;
  const buf = Buffer.alloc(WRITE_BYTES, 0x5a);
  const report: WriterReport = { files: files.map((file) => ({ file, samples: [], errors: [] })) };
  const handles = await Promise.all(files.map((file) => open(file, 'w')));
  const loops = report.files.map(async (f, i) => {
    const fh = handles[i]!;
    try {
      while (!stop) {
        const t0 = now();
        try {
          await fh.write(buf, 0, WRITE_BYTES, 0);
          await fh.datasync();
          f.samples.push([t0, now() - t0]);
          if (pauseMs > 0) await new Promise((r) => setTimeout(r, pauseMs));
        } catch (err) {
          if (f.errors.length < 10) f.errors.push(String((err as Error).message));
          await new Promise((r) => setTimeout(r, 10));
        }
      }
    } finally {
      await fh.close();
    }
  });
  process.on('message', (m) => {
    if (m !== 'stop') return;
    stop = true;
    void Promise.allSettled(loops).then(() => process.send?.(report, () => process.exit(0)));
  });
  process.send?.('ready');
}

if (require.main === module) void main(process.argv.slice(2));
