/**
 * podd's ExecStream, ListProcesses and SignalProcess handlers over core/exec-session.ts: the
 * first request starts or attaches, the rest are applied in order (stdin waits while the
 * command's input is full, so the request stream is not read further and gRPC flow control
 * pushes back on the sender). The end of the request stream changes nothing (close_stdin
 * closes stdin); the client going away detaches (the command runs on).
 */
import type { SandnodeCallContext } from '@sandnode/shared';
import { InvalidArgumentError } from '@sandnode/shared';
import type { ExecStreamRequest, ExecStreamResponse, ListProcessesResponse, PoddServiceImplementation } from '@sandnode/shared/proto/podd/v1/podd';
import { parseSignal, type ExecSessions, type Session, type SessionEvent } from '../core/exec-session';

type Handlers = Pick<PoddServiceImplementation<SandnodeCallContext>, 'execStream' | 'listProcesses' | 'signalProcess'>;

/** sessionEventToProto: SessionEvent -> ExecStreamResponse. */
export function sessionEventToProto(ev: SessionEvent): ExecStreamResponse {
  switch (ev.kind) {
    case 'started':
      return { event: { $case: 'started', value: { pid: ev.pid, execId: ev.execId, pty: ev.pty, droppedBytes: ev.droppedBytes } } };
    case 'stdout':
      return { event: { $case: 'stdout', value: ev.data } };
    case 'stderr':
      return { event: { $case: 'stderr', value: ev.data } };
    case 'exit':
      return { event: { $case: 'exit', value: { exitCode: ev.exitCode, signal: ev.signal } } };
  }
}

/** applyInput applies one request after the first. Errors: INVALID_ARGUMENT (start/attach again, bad size or signal), FAILED_PRECONDITION. */
export async function applyInput(s: Session, req: ExecStreamRequest): Promise<void> {
  const i = req.input;
  if (!i) return;
  switch (i.$case) {
    case 'start':
    case 'attach':
      throw new InvalidArgumentError(`${i.$case}: only the first request may start or attach`);
    case 'stdin':
      return s.write(Buffer.from(i.value));
    case 'closeStdin':
      if (i.value) s.closeStdin();
      return;
    case 'signal':
      return s.signal(parseSignal('signal', i.value));
    case 'resize':
      return s.resize({ rows: i.value.rows, cols: i.value.cols });
  }
}

/** execStreamHandlers implements ExecStream, ListProcesses and SignalProcess. */
export function execStreamHandlers(sessions: ExecSessions): Handlers {
  return {
    async *execStream(requests, context) {
      const it = requests[Symbol.asyncIterator]();
      const first = await it.next();
      const i = first.done ? undefined : first.value.input;
      let s: Session;
      if (i?.$case === 'start') {
        const st = i.value;
        s = await sessions.start({ argv: st.argv, env: st.env, cwd: st.cwd, timeoutMs: st.timeoutMs, pty: st.pty, size: st.size, detachKeepMs: st.detachKeepMs });
        context.log.debug({ argv0: st.argv[0], child_pid: s.pid, exec_id: s.execId, pty: st.pty }, 'exec stream started');
      } else if (i?.$case === 'attach') {
        s = sessions.get(i.value.execId);
      } else {
        throw new InvalidArgumentError('the first request of ExecStream must be start or attach');
      }
      // input and output run side by side; a bad input ends the stream with its error (the command runs on)
      const stop = new AbortController();
      const onCallAbort = () => stop.abort();
      context.signal.addEventListener('abort', onCallAbort);
      let inputError: unknown;
      const pump = (async () => {
        try {
          for (;;) {
            const r = await it.next();
            if (r.done || stop.signal.aborted) return;
            await applyInput(s, r.value);
          }
        } catch (err) {
          if (!stop.signal.aborted) inputError = err;
          stop.abort();
        }
      })();
      try {
        for await (const ev of sessions.attach(s, stop.signal)) yield sessionEventToProto(ev);
      } catch (err) {
        if (inputError) throw inputError;
        throw err;
      } finally {
        context.signal.removeEventListener('abort', onCallAbort);
        stop.abort();
        void pump;
      }
    },
    async listProcesses(): Promise<ListProcessesResponse> {
      return { processes: sessions.list() };
    },
    async signalProcess(req) {
      const sig = parseSignal('signal', req.signal);
      sessions.find(req.execId, req.pid).signal(sig);
      return {};
    },
  };
}
