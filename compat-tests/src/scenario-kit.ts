/**
 * The pieces scenarios are made of: gRPC status names, scenario results with the log of the
 * component to blame, and exec/file/sandbox helpers over the server's public API.
 */
import type { Sandbox } from '@sandnode/shared/proto/server/v1/sandbox';
import { SandboxState } from '@sandnode/shared/proto/server/v1/sandbox';
import type { ServerApi, TempNode } from './node';
import type { Component, ScenarioOutcome, ScenarioResult } from './types';

const STATUS_NAMES = [
  'OK',
  'CANCELLED',
  'UNKNOWN',
  'INVALID_ARGUMENT',
  'DEADLINE_EXCEEDED',
  'NOT_FOUND',
  'ALREADY_EXISTS',
  'PERMISSION_DENIED',
  'RESOURCE_EXHAUSTED',
  'FAILED_PRECONDITION',
  'ABORTED',
  'OUT_OF_RANGE',
  'UNIMPLEMENTED',
  'INTERNAL',
  'UNAVAILABLE',
  'DATA_LOSS',
  'UNAUTHENTICATED',
];

/** grpcStatusOf names the gRPC status of a client error (undefined for other errors). */
export function grpcStatusOf(err: unknown): string | undefined {
  const e = err as { code?: unknown; details?: unknown; name?: string };
  if (typeof e?.code === 'number' && typeof e.details === 'string') return STATUS_NAMES[e.code] ?? String(e.code);
  return undefined;
}

/** stateName gives "RUNNING" for SANDBOX_STATE_RUNNING. */
export function stateName(s: SandboxState | number): string {
  const n = SandboxState[s as SandboxState];
  return typeof n === 'string' ? n.replace(/^SANDBOX_STATE_/, '') : `UNKNOWN(${s})`;
}

/** A failure with the component to blame (whose log is excerpted). */
export class ScenarioError extends Error {
  constructor(
    message: string,
    readonly component: Component = 'server',
  ) {
    super(message);
  }
}

/** Outcome of a scenario body: pass unless it says fallback or n/a. */
export interface ScenarioBody {
  result?: ScenarioOutcome;
  detail?: string;
}

/**
 * runScenario runs one scenario body and turns what it returns or throws into a result;
 * failures carry the gRPC status and the log tail of the component to blame.
 */
export async function runScenario(node: TempNode, name: string, blame: Component, fn: () => Promise<ScenarioBody | string | void>): Promise<ScenarioResult> {
  const t0 = Date.now();
  try {
    const r = await fn();
    const body: ScenarioBody = typeof r === 'string' ? { detail: r } : (r ?? {});
    return { name, result: body.result ?? 'pass', ms: Date.now() - t0, ...(body.detail ? { detail: body.detail } : {}) };
  } catch (err) {
    const component = err instanceof ScenarioError ? err.component : blame;
    const grpcStatus = grpcStatusOf(err);
    const msg = (err as Error).message ?? String(err);
    return { name, result: 'fail', ms: Date.now() - t0, detail: msg, ...(grpcStatus ? { grpcStatus } : {}), component, logExcerpt: node.logTail(component) };
  }
}

/** ExecResult is what an exec stream delivered. */
export interface ExecResult {
  stdout: string;
  stderr: string;
  exitCode: number;
  pid: number;
  /** number of stdout/stderr events (a streamed command yields several) */
  chunks: number;
}

/** execCollect runs argv in a sandbox and collects the stream; onStdout sees each chunk as it arrives. */
export async function execCollect(api: ServerApi, sandboxId: string, argv: string[], onStdout?: (s: string) => void): Promise<ExecResult> {
  const out: Buffer[] = [];
  const err: Buffer[] = [];
  let exitCode = -1;
  let pid = 0;
  let chunks = 0;
  for await (const ev of api.sandboxes.exec({ sandboxId, argv, env: {}, cwd: '', stdin: Buffer.alloc(0), timeoutMs: 0 })) {
    const e = ev.event;
    if (e?.$case === 'stdout') {
      const b = Buffer.from(e.value);
      out.push(b);
      chunks++;
      onStdout?.(b.toString());
    } else if (e?.$case === 'stderr') {
      err.push(Buffer.from(e.value));
      chunks++;
    } else if (e?.$case === 'started') pid = e.value.pid;
    else if (e?.$case === 'exit') exitCode = e.value.exitCode;
  }
  return { stdout: Buffer.concat(out).toString(), stderr: Buffer.concat(err).toString(), exitCode, pid, chunks };
}

/** readAll reads a whole file of a sandbox's /workspace through ReadFile (following offsets to eof). */
export async function readAll(api: ServerApi, sandboxId: string, file: string): Promise<Buffer> {
  const parts: Buffer[] = [];
  let offset = 0;
  for (let i = 0; i < 10_000; i++) {
    const r = await api.sandboxes.readFile({ sandboxId, path: file, offset, length: 0 });
    parts.push(Buffer.from(r.data));
    offset += r.data.length;
    if (r.eof || r.data.length === 0) break;
  }
  return Buffer.concat(parts);
}

/** getSandbox returns the sandbox record as the server reports it. */
export async function getSandbox(api: ServerApi, id: string): Promise<Sandbox> {
  const s = (await api.sandboxes.getSandbox({ sandboxId: id })).sandbox;
  if (!s) throw new Error(`GetSandbox ${id}: empty answer`);
  return s;
}
