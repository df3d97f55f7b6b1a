/**
 * SandboxService.ExecStream, ListProcesses and SignalProcess: validate -> core/exec-stream.ts ->
 * convert. The first request names the sandbox and starts or attaches; later requests are
 * relayed to podd in order, pulled only as fast as podd takes them (stdin backpressure reaches
 * the caller through gRPC flow control). counters.streams counts the stream like an Exec, so a
 * retiring server relays it to its end. ExecStream auto-resumes a PAUSED or hibernated sandbox and
 * counts as its activity (core/idle.ts), as Exec does.
 */
import { InvalidArgumentError, requireSandboxId, type SandnodeCallContext } from '@sandnode/shared';
import type { ExecStreamRequest, ExecStreamResponse, SandboxServiceImplementation } from '@sandnode/shared/proto/server/v1/sandbox';
import type { ExecInput, ExecStreamEvent, ExecStreamFirst } from '../core/exec-stream';
import type { SandboxManager } from '../core/sandbox-manager';
import { idleStream } from './idle-hooks';

type Handlers = Pick<SandboxServiceImplementation<SandnodeCallContext>, 'execStream' | 'listProcesses' | 'signalProcess'>;

/** firstFromPb reads the first request: the sandbox id and start or attach. Errors: INVALID_ARGUMENT. */
export function firstFromPb(req: ExecStreamRequest | undefined): { sandboxId: string; first: ExecStreamFirst } {
  const i = req?.input;
  if (i?.$case === 'start') {
    const s = i.value;
    requireSandboxId('start.sandbox_id', s.sandboxId);
    return {
      sandboxId: s.sandboxId,
      first: {
        kind: 'start',
        start: { argv: s.argv, env: s.env, cwd: s.cwd, timeoutMs: s.timeoutMs, pty: s.pty, size: s.size ? { rows: s.size.rows, cols: s.size.cols } : undefined, detachKeepMs: s.detachKeepMs },
      },
    };
  }
  if (i?.$case === 'attach') {
    requireSandboxId('attach.sandbox_id', i.value.sandboxId);
    if (!i.value.execId) throw new InvalidArgumentError('attach.exec_id: must not be empty');
    return { sandboxId: i.value.sandboxId, first: { kind: 'attach', execId: i.value.execId } };
  }
  throw new InvalidArgumentError('the first request of ExecStream must be start or attach');
}

/** inputFromPb maps a later request; undefined for an empty one. Errors: INVALID_ARGUMENT (start or attach again). */
export function inputFromPb(req: ExecStreamRequest): ExecInput | undefined {
  const i = req.input;
  if (!i) return undefined;
  switch (i.$case) {
    case 'start':
    case 'attach':
      throw new InvalidArgumentError(`${i.$case}: only the first request may start or attach`);
    case 'stdin':
      return { kind: 'stdin', data: i.value };
    case 'closeStdin':
      return i.value ? { kind: 'closeStdin' } : undefined;
    case 'signal':
      return { kind: 'signal', name: i.value };
    case 'resize':
      return { kind: 'resize', size: { rows: i.value.rows, cols: i.value.cols } };
  }
}

/** eventToPb: ExecStreamEvent -> ExecStreamResponse. */
export function eventToPb(ev: ExecStreamEvent): ExecStreamResponse {
  switch (ev.kind) {
    case 'started':
      return { event: { $case: 'started', value: { pid: ev.pid, execId: ev.execId, pty: ev.pty, droppedBytes: ev.droppedBytes } } };
    case 'stdout':
      return { event: { $case: 'stdout', value: Buffer.from(ev.data) } };
    case 'stderr':
      return { event: { $case: 'stderr', value: Buffer.from(ev.data) } };
    case 'exit':
      return { event: { $case: 'exit', value: { exitCode: ev.exitCode, signal: ev.signal } } };
  }
}

/** execStreamService implements the three RPCs over m. */
export function execStreamService(m: SandboxManager, counters: { streams: number }): Handlers {
  return {
    async *execStream(requests, ctx) {
      const it = requests[Symbol.asyncIterator]();
      const head = await it.next();
      const { sandboxId, first } = firstFromPb(head.done ? undefined : head.value);
      async function* input(): AsyncIterable<ExecInput> {
        for (;;) {
          const r = await it.next();
          if (r.done) return;
          const i = inputFromPb(r.value);
          if (i) yield i;
        }
      }
      // idle actions (idle-hooks.ts, which cannot see the id of a client stream: it is in the
      // first message): activity while it runs, a PAUSED or hibernated sandbox auto-resumed first
      yield* idleStream(m.idle, sandboxId, 'ExecStream', ctx, async function* () {
        const events = await m.execStream(sandboxId, first, input(), ctx.signal);
        counters.streams++;
        try {
          for await (const ev of events) yield eventToPb(ev);
        } finally {
          counters.streams--;
        }
      });
    },
    async listProcesses(req) {
      requireSandboxId('sandbox_id', req.sandboxId);
      return { processes: await m.listProcesses(req.sandboxId) };
    },
    async signalProcess(req) {
      requireSandboxId('sandbox_id', req.sandboxId);
      await m.signalProcess(req.sandboxId, req.execId, req.pid, req.signal);
      return {};
    },
  };
}
