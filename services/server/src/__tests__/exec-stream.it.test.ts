/**
 * ExecStream on a real node (runc sandboxes, issue 15 §1): stdin flows as it is sent (a line
 * comes back before the next is sent), a pty gives the command a controlling terminal
 * (/dev/pts/N, `stty size` follows a resize, Ctrl-C interrupts the foreground job and the shell
 * lives on), ListProcesses / SignalProcess (only commands exec started), reattaching by exec_id
 * gets the output produced while no client was attached, and hostile input: a window size out
 * of range is INVALID_ARGUMENT and the command runs on, a stdin flood against a command that
 * never reads is pulled only as far as the pipes take it.
 */
import { Status } from 'nice-grpc-common';
import type { ExecStreamRequest, ExecStreamResponse } from '@sandnode/shared/proto/server/v1/sandbox';
import { describeNode, expectCode, startNode, waitFor, type TestNode } from '@sandnode/testkit';

jest.setTimeout(240_000);

/** Requests is a request stream the test pushes into; `pulled` counts what the call took. */
class Requests implements AsyncIterable<ExecStreamRequest> {
  private readonly items: ExecStreamRequest[] = [];
  private wake: (() => void) | undefined;
  private ended = false;
  pulled = 0;
  constructor(first: ExecStreamRequest) {
    this.items.push(first);
  }
  push(r: ExecStreamRequest['input']): void {
    this.items.push({ input: r });
    this.wake?.();
  }
  stdin(s: string | Buffer): void {
    this.push({ $case: 'stdin', value: Buffer.from(s) });
  }
  end(): void {
    this.ended = true;
    this.wake?.();
  }
  async *[Symbol.asyncIterator](): AsyncIterator<ExecStreamRequest> {
    for (;;) {
      const r = this.items.shift();
      if (r) {
        this.pulled++;
        yield r;
        continue;
      }
      if (this.ended) return;
      await new Promise<void>((resolve) => (this.wake = resolve));
      this.wake = undefined;
    }
  }
}

/** Session is one ExecStream call: its events as they come. */
class Session {
  readonly events: ExecStreamResponse[] = [];
  error: unknown;
  readonly done: Promise<void>;
  readonly ac = new AbortController();
  constructor(
    node: TestNode,
    readonly req: Requests,
  ) {
    this.done = (async () => {
      try {
        for await (const ev of node.api.sandboxes.execStream(req, { signal: this.ac.signal })) this.events.push(ev);
      } catch (err) {
        this.error = err;
      } finally {
        req.end();
      }
    })();
  }
  get out(): string {
    return Buffer.concat(this.events.flatMap((e) => (e.event?.$case === 'stdout' ? [Buffer.from(e.event.value)] : []))).toString();
  }
  get started() {
    const e = this.events[0]?.event;
    return e?.$case === 'started' ? e.value : undefined;
  }
  get exit() {
    const e = this.events.at(-1)?.event;
    return e?.$case === 'exit' ? e.value : undefined;
  }
  async until(re: RegExp): Promise<void> {
    await waitFor(`output matching ${re}`, () => re.test(this.out) || (this.error !== undefined && Promise.reject(this.error)), 30_000);
  }
}

describeNode('ExecStream on a real node', () => {
  let node: TestNode;
  let id: string;
  const start = (argv: string[], extra: { pty?: boolean; rows?: number; cols?: number; env?: Record<string, string> } = {}) =>
    new Session(
      node,
      new Requests({
        input: {
          $case: 'start',
          value: { sandboxId: id, argv, env: extra.env ?? {}, cwd: '', timeoutMs: 0, pty: !!extra.pty, size: extra.rows ? { rows: extra.rows, cols: extra.cols ?? 80 } : undefined, detachKeepMs: 0 },
        },
      }),
    );
  const attach = (execId: string) => new Session(node, new Requests({ input: { $case: 'attach', value: { sandboxId: id, execId } } }));
  const processes = async () => (await node.api.sandboxes.listProcesses({ sandboxId: id })).processes;

  beforeAll(async () => {
    node = await startNode();
    // an environment at create (CreateSandboxRequest.env): every command starts with it
    id = (await node.api.sandboxes.createSandbox({ template: 'base', env: { SANDBOX_ENV: 'from-create', SHADOWED: 'sandbox' } })).sandbox!.sandboxId;
  });
  afterAll(async () => {
    await node?.stop();
  });

  test('streaming stdin: each line comes back before the next is sent (not held until EOF)', async () => {
    const s = start(['cat']);
    s.req.stdin('first line\n');
    await s.until(/^first line\n$/);
    s.req.stdin('second line\n');
    await s.until(/^first line\nsecond line\n$/);
    s.req.push({ $case: 'closeStdin', value: true });
    await s.done;
    expect(s.error).toBeUndefined();
    expect(s.started).toMatchObject({ pty: false, droppedBytes: 0 });
    expect(s.started!.execId).toMatch(/^ex-[0-9a-f]{16}$/);
    expect(s.exit).toMatchObject({ exitCode: 0, signal: '' });
  });

  test("the sandbox's env (from create) is in every command's environment; the call's own env wins per name", async () => {
    const s = start(['sh', '-c', 'echo "$SANDBOX_ENV $SHADOWED"'], { env: { SHADOWED: 'call' } });
    await s.done;
    expect([s.error, s.out, s.exit?.exitCode]).toEqual([undefined, 'from-create call\n', 0]);
    const pty = start(['sh', '-c', 'echo "$SANDBOX_ENV"'], { pty: true, rows: 24 });
    await pty.done;
    expect(pty.out).toBe('from-create\r\n');
  });

  test('pty: tty is /dev/pts/N, stty size follows a resize, Ctrl-C interrupts sleep 100 and the shell lives on', async () => {
    const s = start(['sh', '-i'], { pty: true, rows: 30, cols: 100, env: { PS1: '$ ' } });
    s.req.stdin('tty; stty size\n');
    await s.until(/\/dev\/pts\/\d+\r\n30 100\r\n/);
    s.req.push({ $case: 'resize', value: { rows: 50, cols: 132 } });
    s.req.stdin('stty size\n');
    await s.until(/50 132\r\n/);
    s.req.stdin('sleep 100\n');
    // the sleep is the terminal's foreground job once ps shows it
    const ps = () => start(['ps', '-o', 'pid,stat,args']);
    await waitFor('sleep 100 running', async () => {
      const p = ps();
      await p.done;
      return /sleep 100/.test(p.out);
    });
    s.req.stdin('\x03');
    s.req.stdin('echo after $? alive $$\n');
    await s.until(new RegExp(`after 130 alive ${s.started!.pid}`));
    s.req.stdin('exit 3\n');
    await s.done;
    expect(s.started!.pty).toBe(true);
    expect(s.exit).toMatchObject({ exitCode: 3, signal: '' });
  });

  test('ListProcesses and SignalProcess: by pid and exec id; a pid exec did not start is NOT_FOUND; bad names INVALID_ARGUMENT', async () => {
    const s = start(['sleep', '100']);
    await waitFor('started', () => s.started);
    const { pid, execId } = s.started!;
    expect((await processes()).find((p) => p.execId === execId)).toMatchObject({ pid, argv: ['sleep', '100'], running: true, attached: true, pty: false });
    await expectCode(node.api.sandboxes.signalProcess({ sandboxId: id, pid: 1, execId: '', signal: 'SIGKILL' }), Status.NOT_FOUND);
    await expectCode(node.api.sandboxes.signalProcess({ sandboxId: id, pid, execId: '', signal: 'SIGBOGUS' }), Status.INVALID_ARGUMENT);
    await expectCode(node.api.sandboxes.signalProcess({ sandboxId: id, pid, execId, signal: 'SIGTERM' }), Status.INVALID_ARGUMENT);
    await node.api.sandboxes.signalProcess({ sandboxId: id, pid, execId: '', signal: 'SIGTERM' });
    await s.done;
    expect(s.exit).toMatchObject({ exitCode: 143, signal: 'SIGTERM' });
    expect((await processes()).find((p) => p.execId === execId)).toMatchObject({ running: false, exitCode: 143, signal: 'SIGTERM' });
    await expectCode(node.api.sandboxes.signalProcess({ sandboxId: id, pid: 0, execId, signal: 'SIGKILL' }), Status.FAILED_PRECONDITION);
    // the sandbox's init (pid 1 here) is still there: nothing was signalled
    const check = start(['sh', '-c', 'kill -0 1 && echo init-alive']);
    await check.done;
    expect(check.out).toBe('init-alive\n');
  });

  test('reconnect: attach by exec_id after the client went away gets the output produced meanwhile, then the exit', async () => {
    const s = start(['sh', '-c', 'echo tick 0; read go; for i in 1 2 3 4; do echo tick $i; done; sleep 0.3; echo last']);
    await s.until(/tick 0\n/);
    const execId = s.started!.execId;
    s.ac.abort();
    await s.done;
    await waitFor('the stream to be detached', async () => (await processes()).find((p) => p.execId === execId && !p.attached && p.running));
    // a new stream attaches, sends the line, and gets everything printed after it
    const a = attach(execId);
    await waitFor('attached', () => a.started);
    a.req.stdin('go\n');
    await a.done;
    expect(a.out).toBe('tick 1\ntick 2\ntick 3\ntick 4\nlast\n');
    expect(a.exit).toMatchObject({ exitCode: 0, signal: '' });

    // output printed while nobody is attached is kept: the command prints once a file exists,
    // made by another exec after this client went away
    const b = start(['sh', '-c', 'echo ack; while [ ! -e /tmp/go-on ]; do sleep 0.05; done; echo while away; echo done']);
    await b.until(/^ack\n$/);
    b.ac.abort();
    await b.done;
    await waitFor('detached', async () => (await processes()).find((p) => p.execId === b.started!.execId && !p.attached));
    const touch = start(['touch', '/tmp/go-on']);
    await touch.done;
    await waitFor('exit while detached', async () => (await processes()).find((p) => p.execId === b.started!.execId && !p.running));
    const c = attach(b.started!.execId);
    await c.done;
    expect(b.out).toBe('ack\n');
    expect(c.out).toBe('while away\ndone\n');
    expect(c.exit).toMatchObject({ exitCode: 0, signal: '' });
    expect(c.started!.droppedBytes).toBe(0);
    await expectCode(
      (async () => {
        for await (const _ of node.api.sandboxes.execStream(new Requests({ input: { $case: 'attach', value: { sandboxId: id, execId: 'ex-0000000000000000' } } }))) void _;
      })(),
      Status.NOT_FOUND,
    );
  });

  test('hostile: a huge window size is INVALID_ARGUMENT and changes nothing; a bad first request is INVALID_ARGUMENT', async () => {
    const s = start(['sh', '-i'], { pty: true, env: { PS1: '$ ' } });
    await waitFor('started', () => s.started);
    s.req.push({ $case: 'resize', value: { rows: 4_000_000_000, cols: 65536 } });
    await s.done;
    await expectCode(Promise.reject(s.error), Status.INVALID_ARGUMENT);
    const p = (await processes()).find((x) => x.execId === s.started!.execId);
    expect(p).toMatchObject({ running: true });
    // the shell still answers on a new attach, with its size unchanged
    const a = attach(s.started!.execId);
    a.req.stdin('stty size; exit\n');
    await a.done;
    expect(a.out).toMatch(/24 80\r\n/);
    const bad = start(['sh'], { pty: true, rows: 70_000 });
    await bad.done;
    await expectCode(Promise.reject(bad.error), Status.INVALID_ARGUMENT);
    const none = new Session(node, new Requests({ input: { $case: 'stdin', value: Buffer.from('x') } }));
    await none.done;
    await expectCode(Promise.reject(none.error), Status.INVALID_ARGUMENT);
  });

  test('hostile: a stdin flood against a command that never reads is pulled only as far as the pipes take it', async () => {
    const s = start(['sleep', '100']);
    await waitFor('started', () => s.started);
    const chunk = Buffer.alloc(64 * 1024, 0x61);
    for (let i = 0; i < 1024; i++) s.req.stdin(chunk); // 64 MiB offered
    // the call stops pulling once podd's pipe, podd's, the server's and the HTTP/2 windows are full
    let last = -1;
    await waitFor('the pull to stall', async () => {
      const now = s.req.pulled;
      const stalled = now === last;
      last = now;
      await new Promise((r) => setTimeout(r, 500));
      return stalled && now === s.req.pulled;
    });
    const taken = s.req.pulled * chunk.length;
    expect(taken).toBeLessThan(16 * 1024 * 1024);
    await node.api.sandboxes.signalProcess({ sandboxId: id, pid: s.started!.pid, execId: '', signal: 'SIGKILL' });
    s.ac.abort();
    await s.done;
    process.stdout.write(`stdin flood: ${s.req.pulled} of 1025 requests (${(taken / 1048576).toFixed(1)} MiB of 64 MiB) taken before the call stalled\n`);
  });
});
