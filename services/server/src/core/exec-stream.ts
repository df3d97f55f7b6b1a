/**
 * ExecStream, ListProcesses and SignalProcess of a RUNNING sandbox, through its podd (podd's
 * ExecStream: streamed stdin, pty, signals, resize, attach by exec_id). The server checks what
 * it can (argv, cwd, the sandbox's state, podd's features) and relays the rest in order; podd's
 * answers concern the caller's own sandbox and pass on as they are. A stream takes one of the
 * sandbox's maxExecStreamsPerSandbox slots, like Exec.
 */
import { FailedPreconditionError, PODD_FEATURES } from '@sandnode/shared';
import type { CoreContext } from './context';
import { commandEnv, DEFAULT_EXEC_CWD } from './guest-io';
import type { PoddClient } from './types';
import { validateArgv, validateCwd } from './validate';

/** ExecWindow is a terminal size in cells (1..65535 each; podd checks). */
export interface ExecWindow {
  rows: number;
  cols: number;
}

/** ExecStreamStartArgs: a new command (ExecStreamStart without the sandbox id). */
export interface ExecStreamStartArgs {
  argv: string[];
  env: Record<string, string>;
  cwd: string;
  timeoutMs: number;
  pty: boolean;
  size?: ExecWindow;
  detachKeepMs: number;
}

/** ExecStreamFirst is what the first request asks: start a command or attach to one. */
export type ExecStreamFirst = { kind: 'start'; start: ExecStreamStartArgs } | { kind: 'attach'; execId: string };

/** ExecInput is one later request: stdin bytes, EOF, a signal by name or a window size. */
export type ExecInput = { kind: 'stdin'; data: Uint8Array } | { kind: 'closeStdin' } | { kind: 'signal'; name: string } | { kind: 'resize'; size: ExecWindow };

/** ExecStreamEvent is one event of an ExecStream. */
export type ExecStreamEvent =
  | { kind: 'started'; pid: number; execId: string; pty: boolean; droppedBytes: number }
  | { kind: 'stdout'; data: Uint8Array }
  | { kind: 'stderr'; data: Uint8Array }
  | { kind: 'exit'; exitCode: number; signal: string };

/** ProcessInfo is one command of ListProcesses. */
export interface ProcessInfo {
  execId: string;
  pid: number;
  argv: string[];
  startedAtMs: number;
  /** when it exited (unix ms); 0 while it runs or when the podd does not say */
  endedAtMs: number;
  running: boolean;
  exitCode: number;
  signal: string;
  pty: boolean;
  attached: boolean;
}

/** PoddExecStreams is the part of a PoddClient that speaks podd's ExecStream (podd.exec-stream.v1). */
export interface PoddExecStreams {
  execStream(first: ExecStreamFirst, input: AsyncIterable<ExecInput>, signal: AbortSignal): AsyncIterable<ExecStreamEvent>;
  listProcesses(): Promise<ProcessInfo[]>;
  signalProcess(execId: string, pid: number, signal: string): Promise<void>;
}

/** poddStreams: the sandbox's podd if it lists podd.exec-stream.v1 (and, for pty, podd.exec-pty.v1); else FAILED_PRECONDITION. */
async function poddStreams(c: CoreContext, id: string, needPty: boolean, rpc: 'Exec' | 'ListProcesses' | 'SignalProcess' = 'Exec'): Promise<PoddExecStreams> {
  // the RPC the caller made names itself in a refusal ("ListProcesses needs RUNNING", not "Exec")
  const rec = c.requireState(id, rpc);
  const podd: PoddClient = c.podd.connect(rec.poddAddress);
  const v = await podd.version();
  if (!podd.execStreams || !v.features.includes(PODD_FEATURES.execStream)) {
    throw new FailedPreconditionError(`sandbox ${id}: its template's podd ${v.version} has no ExecStream (${PODD_FEATURES.execStream}); rebuild the template with this release`);
  }
  if (needPty && !v.features.includes(PODD_FEATURES.execPty)) {
    throw new FailedPreconditionError(`sandbox ${id}: its template's podd ${v.version} cannot make a pty (${PODD_FEATURES.execPty}); rebuild the template with this release`);
  }
  return podd.execStreams;
}

/**
 * execStream starts (or attaches to) a command in sandbox id and relays input and events; the
 * caller going away (signal) detaches (podd keeps the command). Errors: INVALID_ARGUMENT (argv,
 * cwd), NOT_FOUND, FAILED_PRECONDITION (not RUNNING, podd too old), RESOURCE_EXHAUSTED
 * (maxExecStreamsPerSandbox), and podd's (see SandboxService.ExecStream).
 */
export async function execStream(c: CoreContext, id: string, first: ExecStreamFirst, input: AsyncIterable<ExecInput>, signal: AbortSignal): Promise<AsyncIterable<ExecStreamEvent>> {
  if (first.kind === 'start') {
    validateArgv('argv', first.start.argv, first.start.env);
    validateCwd('cwd', first.start.cwd);
  }
  const podd = await poddStreams(c, id, first.kind === 'start' && first.start.pty);
  let f: ExecStreamFirst = first;
  if (first.kind === 'start') {
    const env = commandEnv(c.get(id), first.start.env);
    validateArgv('argv', first.start.argv, env);
    f = { kind: 'start', start: { ...first.start, env, cwd: first.start.cwd || DEFAULT_EXEC_CWD } };
  }
  const release = c.execStreams.enter(id);
  try {
    const events = podd.execStream(f, input, signal);
    signal.addEventListener('abort', release, { once: true });
    return released(events, release);
  } catch (err) {
    release();
    throw err;
  }
}

/** listProcesses lists the commands podd's ExecStream started in sandbox id. Errors: NOT_FOUND, FAILED_PRECONDITION. */
export async function listProcesses(c: CoreContext, id: string): Promise<ProcessInfo[]> {
  return (await poddStreams(c, id, false, 'ListProcesses')).listProcesses();
}

/** signalProcess signals one command of sandbox id (by exec id or pid). Errors: INVALID_ARGUMENT, NOT_FOUND, FAILED_PRECONDITION. */
export async function signalProcess(c: CoreContext, id: string, execId: string, pid: number, sig: string): Promise<void> {
  return (await poddStreams(c, id, false, 'SignalProcess')).signalProcess(execId, pid, sig);
}

async function* released<T>(events: AsyncIterable<T>, release: () => void): AsyncIterable<T> {
  try {
    yield* events;
  } finally {
    release();
  }
}
