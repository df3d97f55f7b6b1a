/**
 * The chaos run's calls to the node as a user makes them, each counted by outcome: unary calls
 * with a deadline, and exec streams whose every byte is checked against what the command was
 * given (stdin, written to /workspace with fsync and read back) or is known to write (`head -c`
 * of a repeated line).
 */
import { createHash } from 'node:crypto';
import { ClientError, Status } from 'nice-grpc-common';
import type { ServerApi } from '@sandnode/node-stack';
import { payload, type Action } from './plan';

/** Deadline of a chaos unary call, ms (a call held by a handover answers well within it). */
export const CALL_DEADLINE_MS = 45_000;
/** The exec's own timeout (ExecRequest.timeout_ms), ms. */
export const EXEC_TIMEOUT_MS = 30_000;
/** The client's deadline of an exec stream, ms: a stream that neither ends nor fails by then hangs. */
export const STREAM_DEADLINE_MS = 45_000;

/** How one call ended: "OK" or its gRPC code name ("UNAVAILABLE"); a hang is "HANG". */
export type Outcome = string;

/** outcomeOf is the code name of a call's error ("UNKNOWN" for an error that is no gRPC status). */
export function outcomeOf(err: unknown): Outcome {
  if (err instanceof ClientError) return Status[err.code] ?? `CODE_${err.code}`;
  if ((err as Error)?.name === 'AbortError') return 'CANCELLED';
  return 'UNKNOWN';
}

/** The counts of a run's calls, by method and outcome. */
export class CallLog {
  /** "CreateSandbox OK" -> n */
  readonly counts = new Map<string, number>();

  /** add counts one call. */
  add(method: string, outcome: Outcome): void {
    const k = `${method} ${outcome}`;
    this.counts.set(k, (this.counts.get(k) ?? 0) + 1);
  }

  /** failedByCode sums the failed calls by code: {"UNAVAILABLE": 3}. */
  failedByCode(): Record<string, number> {
    const out: Record<string, number> = {};
    for (const [k, n] of this.counts) {
      const code = k.split(' ')[1]!;
      if (code !== 'OK') out[code] = (out[code] ?? 0) + n;
    }
    return out;
  }

  /** total and ok calls */
  totals(): { calls: number; ok: number } {
    let calls = 0;
    let ok = 0;
    for (const [k, n] of this.counts) {
      calls += n;
      if (k.endsWith(' OK')) ok += n;
    }
    return { calls, ok };
  }
}

/** What a call returned or how it failed. */
export type CallResult<T> = { ok: true; value: T } | { ok: false; outcome: Outcome; message: string };

/** call runs fn with a deadline of CALL_DEADLINE_MS and counts its outcome under method. */
export async function call<T>(log: CallLog, method: string, fn: (opts: { deadline: Date }) => Promise<T>): Promise<CallResult<T>> {
  try {
    const value = await fn({ deadline: new Date(Date.now() + CALL_DEADLINE_MS) });
    log.add(method, 'OK');
    return { ok: true, value };
  } catch (err) {
    const outcome = outcomeOf(err);
    log.add(method, outcome);
    return { ok: false, outcome, message: String((err as Error).message).split('\n')[0] ?? '' };
  }
}

/** What an exec stream did. */
export interface StreamResult {
  /** "OK": every byte arrived and the command exited 0; else the code of the failure, "HANG", or "CORRUPT" */
  outcome: Outcome;
  /** what went wrong, for a failure */
  message: string;
  /** stdout bytes received */
  bytes: number;
  ms: number;
}

/** expectedStdout is what the exec of a writes on stdout: its stdin read back, or `head -c` of `chaos<seed>\n` repeated. */
export function expectedStdout(a: Action): Buffer {
  if (a.stdin) return payload(a.payloadSeed, a.bytes);
  const line = Buffer.from(`chaos${a.payloadSeed}\n`);
  const out = Buffer.allocUnsafe(a.bytes);
  for (let i = 0; i < a.bytes; i += line.length) line.copy(out, i, 0, Math.min(line.length, a.bytes - i));
  return out;
}

/**
 * execStream runs the exec of a in sandbox id and checks its stdout byte for byte (length and
 * sha256) and its exit code; counts it under "Exec". A stream that neither ends nor fails within
 * STREAM_DEADLINE_MS is cancelled and reported "HANG".
 */
export async function execStream(log: CallLog, api: ServerApi, id: string, a: Action): Promise<StreamResult> {
  const want = expectedStdout(a);
  // stdin goes through /workspace (written with fsync, so that its device must serve I/O) and back
  const argv = a.stdin ? ['sh', '-c', 'dd of=/workspace/chaos.bin bs=64k conv=fsync 2>/dev/null && cat /workspace/chaos.bin'] : ['sh', '-c', `yes chaos${a.payloadSeed} | head -c ${a.bytes}`];
  const t0 = Date.now();
  const ac = new AbortController();
  let hung = false;
  const timer = setTimeout(() => {
    hung = true;
    ac.abort();
  }, STREAM_DEADLINE_MS);
  const chunks: Buffer[] = [];
  let exit: number | undefined;
  let signal = '';
  let res: StreamResult;
  try {
    for await (const ev of api.sandboxes.exec({ sandboxId: id, argv, stdin: a.stdin ? want : Buffer.alloc(0), timeoutMs: EXEC_TIMEOUT_MS }, { signal: ac.signal })) {
      if (ev.event?.$case === 'stdout') chunks.push(Buffer.from(ev.event.value));
      if (ev.event?.$case === 'exit') {
        exit = ev.event.value.exitCode;
        signal = ev.event.value.signal;
      }
    }
    const got = Buffer.concat(chunks);
    const sha = (b: Buffer) => createHash('sha256').update(b).digest('hex').slice(0, 16);
    if (exit === undefined) res = { outcome: 'CORRUPT', message: `the stream ended without an exit event after ${got.length} of ${want.length} bytes`, bytes: got.length, ms: 0 };
    else if (exit !== 0 || signal) res = { outcome: 'CORRUPT', message: `the command exited ${exit}${signal ? ` (signal ${signal})` : ''}`, bytes: got.length, ms: 0 };
    else if (!got.equals(want)) res = { outcome: 'CORRUPT', message: `stdout ${got.length} bytes sha256 ${sha(got)}, expected ${want.length} bytes sha256 ${sha(want)}`, bytes: got.length, ms: 0 };
    else res = { outcome: 'OK', message: '', bytes: got.length, ms: 0 };
  } catch (err) {
    const outcome = hung ? 'HANG' : outcomeOf(err);
    res = { outcome, message: hung ? `no end nor error within ${STREAM_DEADLINE_MS} ms` : (String((err as Error).message).split('\n')[0] ?? ''), bytes: Buffer.concat(chunks).length, ms: 0 };
  } finally {
    clearTimeout(timer);
  }
  res.ms = Date.now() - t0;
  log.add('Exec', res.outcome);
  return res;
}
