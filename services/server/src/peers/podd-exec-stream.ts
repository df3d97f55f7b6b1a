/**
 * The server's side of podd's ExecStream, ListProcesses and SignalProcess (podd.exec-stream.v1):
 * domain input and events <-> sandnode.podd.v1 messages. The request stream is pulled by
 * nice-grpc, which waits for the call to drain before the next message, so a podd that stops
 * reading (its command's stdin is full) stops the relay, and the caller's stream behind it.
 */
import type { ServiceClient } from '@sandnode/shared';
import type { ExecStreamRequest, PoddServiceDefinition } from '@sandnode/shared/proto/podd/v1/podd';
import type { ExecInput, ExecStreamEvent, ExecStreamFirst, PoddExecStreams, ProcessInfo } from '../core/exec-stream';

/** inputToPodd: ExecInput -> ExecStreamRequest. */
export function inputToPodd(i: ExecInput): ExecStreamRequest {
  switch (i.kind) {
    case 'stdin':
      return { input: { $case: 'stdin', value: Buffer.from(i.data) } };
    case 'closeStdin':
      return { input: { $case: 'closeStdin', value: true } };
    case 'signal':
      return { input: { $case: 'signal', value: i.name } };
    case 'resize':
      return { input: { $case: 'resize', value: { rows: i.size.rows, cols: i.size.cols } } };
  }
}

function firstToPodd(f: ExecStreamFirst): ExecStreamRequest {
  if (f.kind === 'attach') return { input: { $case: 'attach', value: { execId: f.execId } } };
  const s = f.start;
  return { input: { $case: 'start', value: { argv: s.argv, env: s.env, cwd: s.cwd, timeoutMs: s.timeoutMs, pty: s.pty, size: s.size, detachKeepMs: s.detachKeepMs } } };
}

/** poddExecStreams implements PoddExecStreams over a (mapped-error) podd client. */
export function poddExecStreams(client: ServiceClient<typeof PoddServiceDefinition>): PoddExecStreams {
  return {
    async *execStream(first: ExecStreamFirst, input: AsyncIterable<ExecInput>, signal: AbortSignal): AsyncIterable<ExecStreamEvent> {
      async function* requests(): AsyncIterable<ExecStreamRequest> {
        yield firstToPodd(first);
        for await (const i of input) yield inputToPodd(i);
      }
      for await (const ev of client.execStream(requests(), { signal })) {
        const e = ev.event;
        if (!e) continue;
        switch (e.$case) {
          case 'started':
            yield { kind: 'started', pid: e.value.pid, execId: e.value.execId, pty: e.value.pty, droppedBytes: e.value.droppedBytes };
            break;
          case 'stdout':
            yield { kind: 'stdout', data: e.value };
            break;
          case 'stderr':
            yield { kind: 'stderr', data: e.value };
            break;
          case 'exit':
            yield { kind: 'exit', exitCode: e.value.exitCode, signal: e.value.signal };
            break;
        }
      }
    },
    async listProcesses(): Promise<ProcessInfo[]> {
      return (await client.listProcesses({})).processes;
    },
    async signalProcess(execId: string, pid: number, signal: string): Promise<void> {
      await client.signalProcess({ execId, pid, signal }, { retry: false });
    },
  };
}
