/**
 * The client side of one ExecStream for `sandnode sandbox exec`: this process's stdin is sent as
 * it is read (not at EOF), with backpressure (stdin is paused while MAX_QUEUED messages wait for
 * the call), output goes to stdout/stderr, the exit code is returned. With tty: the local
 * terminal is put in raw mode (restored however the session ends), its size is sent at start
 * and on every SIGWINCH (`resize` of process.stdout). Without tty, a first Ctrl-C is sent to the
 * command as SIGINT; a second leaves (the command then runs on in the sandbox, detached).
 */
import { ClientError, Status } from 'nice-grpc-common';
import type { ServerApi } from '@sandnode/node-stack';
import type { ExecStreamRequest, ExecStreamStart } from '@sandnode/shared/proto/server/v1/sandbox';
import { safeLine } from '../terminal-safe';

/** Requests waiting for the call before local stdin is paused. */
export const MAX_QUEUED = 16;

/** ExecSessionOptions: what to run and how the local terminal takes part. */
export interface ExecSessionOptions {
  /** a command to start, or (attach) one to reattach to by its exec id */
  start?: Omit<ExecStreamStart, 'size'>;
  attach?: { sandboxId: string; execId: string };
  /** send this process's stdin as typed */
  stdin: boolean;
  /** the local stdin is a terminal to put in raw mode (tty mode); attach: decided by the command's pty */
  raw: boolean;
}

/** RequestQueue is the request stream of the call: pushed by local events, pulled by nice-grpc. */
class RequestQueue {
  private readonly items: ExecStreamRequest[] = [];
  private wake: (() => void) | undefined;
  private ended = false;
  constructor(private readonly onDrained: () => void) {}

  push(r: ExecStreamRequest): void {
    if (this.ended) return;
    this.items.push(r);
    this.notify();
  }
  get length(): number {
    return this.items.length;
  }
  end(): void {
    this.ended = true;
    this.notify();
  }
  private notify(): void {
    const w = this.wake;
    this.wake = undefined;
    w?.();
  }
  async *[Symbol.asyncIterator](): AsyncIterator<ExecStreamRequest> {
    for (;;) {
      const r = this.items.shift();
      if (r) {
        if (this.items.length < MAX_QUEUED / 2) this.onDrained();
        yield r;
        continue;
      }
      if (this.ended) return;
      await new Promise<void>((resolve) => (this.wake = resolve));
    }
  }
}

/** windowSize of the local terminal (stdout), or undefined when it is none. */
function windowSize(): { rows: number; cols: number } | undefined {
  const out = process.stdout;
  return out.isTTY && out.rows && out.columns ? { rows: out.rows, cols: out.columns } : undefined;
}

/**
 * runExecSession runs one command through ExecStream and resolves with its exit code (1 when
 * the stream ended without one). Throws the call's ClientError (UNIMPLEMENTED: an older server).
 */
export async function runExecSession(api: ServerApi, o: ExecSessionOptions): Promise<number> {
  const stdin = process.stdin;
  let reading = false;
  const queue = new RequestQueue(() => {
    if (reading && !stdin.readableEnded) stdin.resume();
  });
  if (o.start) queue.push({ input: { $case: 'start', value: { ...o.start, size: o.start.pty ? windowSize() : undefined } } });
  else if (o.attach) queue.push({ input: { $case: 'attach', value: o.attach } });
  let raw = o.raw;

  const cleanups: Array<() => void> = [];
  const onData = (chunk: Buffer) => {
    queue.push({ input: { $case: 'stdin', value: chunk } });
    if (queue.length >= MAX_QUEUED) stdin.pause();
  };
  const onEnd = () => queue.push({ input: { $case: 'closeStdin', value: true } });
  // stdin is read from the first event on: nothing is taken from it when the call fails (an
  // older server's UNIMPLEMENTED, then Exec reads stdin itself)
  const beginInput = () => {
    reading = true;
    if (raw && stdin.isTTY) {
      stdin.setRawMode(true);
      cleanups.push(() => stdin.setRawMode(false));
    }
    stdin.on('data', onData);
    stdin.once('end', onEnd);
    cleanups.push(() => {
      reading = false;
      stdin.off('data', onData);
      stdin.off('end', onEnd);
      stdin.pause();
    });
  };
  // a command started without stdin sees EOF at once; an attach leaves stdin as it is
  if (!o.stdin && o.start) queue.push({ input: { $case: 'closeStdin', value: true } });
  const followResize = () => {
    const onResize = () => {
      const size = windowSize();
      if (size) queue.push({ input: { $case: 'resize', value: size } });
    };
    process.stdout.on('resize', onResize);
    cleanups.push(() => process.stdout.off('resize', onResize));
  };
  if (o.start?.pty) followResize();
  const leave = new AbortController();
  if (!o.raw && !o.attach) {
    let interrupts = 0;
    const onSigint = () => {
      if (++interrupts === 1) queue.push({ input: { $case: 'signal', value: 'SIGINT' } });
      else leave.abort();
    };
    process.on('SIGINT', onSigint);
    cleanups.push(() => process.off('SIGINT', onSigint));
  }

  let code: number | undefined;
  let execId = '';
  try {
    for await (const ev of api.sandboxes.execStream(queue, { signal: leave.signal })) {
      const e = ev.event;
      if (e?.$case === 'started') {
        if (!execId && o.attach && e.value.pty) {
          // attached to a pty: this terminal takes its place (raw mode, its size)
          raw = !!process.stdin.isTTY;
          followResize();
          const size = windowSize();
          if (size) queue.push({ input: { $case: 'resize', value: size } });
        }
        if (!execId && o.stdin) beginInput();
        execId = e.value.execId;
      } else if (e?.$case === 'stdout') process.stdout.write(e.value);
      else if (e?.$case === 'stderr') process.stderr.write(e.value);
      else if (e?.$case === 'exit') code = e.value.exitCode;
    }
  } catch (err) {
    if (!(leave.signal.aborted && err instanceof Error && err.name === 'AbortError')) throw err;
    process.stderr.write(
      `\n${safeLine(`sandnode: left the command; it runs on in the sandbox as ${execId || 'an unknown exec'} (sandbox attach ID ${execId || 'EXEC_ID'}, sandbox ps, sandbox kill)`)}`,
    );
    return 130;
  } finally {
    queue.end();
    for (const c of cleanups.reverse()) c();
  }
  return code ?? 1;
}

/** isUnimplemented: the server has no ExecStream (an older release). */
export function isUnimplemented(err: unknown): boolean {
  return err instanceof ClientError && err.code === Status.UNIMPLEMENTED;
}
