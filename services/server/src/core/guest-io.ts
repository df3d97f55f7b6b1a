/**
 * Guest I/O: Exec and the file calls of a RUNNING sandbox, through its podd. Input is checked
 * here (argv, sizes, paths below /workspace) before podd is asked; podd's answer is passed on
 * as it is (it concerns the caller's own sandbox, and no safety decision of the host rests on
 * it). None of these calls moves the record.
 */
import { InvalidArgumentError, ResourceExhaustedError } from '@sandnode/shared';
import type { CoreContext } from './context';
import type { ExecArgs, ExecEvent, SandboxRecord } from './types';
import { MAX_FILE_CHUNK_BYTES, validateArgv, validateChunk, validateCwd, workspacePath } from './validate';

/** The working directory of an Exec that names none. */
export const DEFAULT_EXEC_CWD = '/workspace';
/** Default of server key `maxExecStreamsPerSandbox`: Exec streams one sandbox may have running at once. */
export const DEFAULT_MAX_EXEC_STREAMS = 64;

/**
 * ExecStreams counts the Exec streams running per sandbox and refuses one above the cap with
 * RESOURCE_EXHAUSTED, so that one caller's (or one sandbox's) flood of streams cannot spend
 * podd's file descriptors and the server's memory for everyone (issue 10 §5).
 */
export class ExecStreams {
  private readonly running = new Map<string, number>();
  constructor(readonly max: number) {}

  /** enter takes a slot of sandbox id; call the returned release exactly once. Errors: RESOURCE_EXHAUSTED. */
  enter(id: string): () => void {
    const n = this.running.get(id) ?? 0;
    if (n >= this.max) throw new ResourceExhaustedError(`sandbox ${id} has ${n} Exec streams running (the most, server key maxExecStreamsPerSandbox); wait for one to end`);
    this.running.set(id, n + 1);
    let released = false;
    return () => {
      if (released) return;
      released = true;
      const left = (this.running.get(id) ?? 1) - 1;
      if (left <= 0) this.running.delete(id);
      else this.running.set(id, left);
    };
  }

  /** count is the number of streams running in sandbox id. */
  count(id: string): number {
    return this.running.get(id) ?? 0;
  }
}

/**
 * exec runs a command through the sandbox's podd; signal ends it (the caller went away).
 * Errors: INVALID_ARGUMENT (argv, cwd, stdin size), NOT_FOUND, FAILED_PRECONDITION (not RUNNING),
 * RESOURCE_EXHAUSTED (the sandbox has maxExecStreamsPerSandbox streams running),
 * and podd's (see SandboxService.Exec).
 */
export function exec(c: CoreContext, id: string, args: ExecArgs, signal: AbortSignal): AsyncIterable<ExecEvent> {
  validateArgv('argv', args.argv, args.env);
  validateCwd('cwd', args.cwd);
  validateChunk('stdin', args.stdin.length);
  const rec = c.requireState(id, 'Exec');
  const env = commandEnv(rec, args.env);
  validateArgv('argv', args.argv, env);
  const release = c.execStreams.enter(id);
  try {
    const events = c.podd.connect(rec.poddAddress).exec({ ...args, env, cwd: args.cwd || DEFAULT_EXEC_CWD }, signal);
    // the caller going away ends the slot too, even if the stream was never read
    signal.addEventListener('abort', release, { once: true });
    return released(events, release);
  } catch (err) {
    release();
    throw err;
  }
}

/**
 * commandEnv is the environment a command in rec starts with: the sandbox's (CreateSandboxRequest.env)
 * under the call's own, which wins per name.
 */
export function commandEnv(rec: Pick<SandboxRecord, 'env'>, callEnv: Record<string, string>): Record<string, string> {
  return { ...(rec.env ?? {}), ...callEnv };
}

/** released passes events on and calls release when the stream ends, fails or is abandoned. */
async function* released<T>(events: AsyncIterable<T>, release: () => void): AsyncIterable<T> {
  try {
    yield* events;
  } finally {
    release();
  }
}

/**
 * readFile reads at most `length` bytes (0: MAX_FILE_CHUNK_BYTES) at offset of a file below
 * /workspace. Errors: INVALID_ARGUMENT (path, length), NOT_FOUND, FAILED_PRECONDITION.
 */
export async function readFile(c: CoreContext, id: string, p: string, offset: number, length: number): Promise<{ data: Uint8Array; sizeBytes: number; eof: boolean }> {
  const abs = workspacePath('path', p);
  validateChunk('length', length);
  const rec = c.requireState(id, 'ReadFile');
  return c.podd.connect(rec.poddAddress).readFile(abs, offset, length || MAX_FILE_CHUNK_BYTES);
}

/**
 * writeFile writes (or appends) data to a file below /workspace with mode (0..0777), fsync'd
 * by podd; returns the file's size, bytes. Errors as readFile, and INVALID_ARGUMENT (mode).
 */
export async function writeFile(c: CoreContext, id: string, p: string, data: Uint8Array, mode: number, append: boolean): Promise<{ sizeBytes: number }> {
  const abs = workspacePath('path', p);
  validateChunk('data', data.length);
  if (mode > 0o777) throw new InvalidArgumentError(`mode: ${mode.toString(8)} is not a permission mode (0..0777)`);
  const rec = c.requireState(id, 'WriteFile');
  return c.podd.connect(rec.poddAddress).writeFile(abs, data, mode, append);
}
