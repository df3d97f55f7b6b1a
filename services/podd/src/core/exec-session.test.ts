import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { AbortedError, FailedPreconditionError, InvalidArgumentError, NotFoundError } from '@sandnode/shared';
import { waitFor } from '@sandnode/testkit';
import { ExecRunner } from './exec';
import { ExecSessions, listedArgv, MAX_LISTED_ARGV_BYTES, parseSignal, type Session, type SessionEvent } from './exec-session';
import { ptyAvailable } from './pty';

/** Client is one attach to a session: its events as they come, and the text of its stdout. */
class Client {
  readonly events: SessionEvent[] = [];
  readonly ac = new AbortController();
  error: unknown;
  readonly done: Promise<void>;
  constructor(sessions: ExecSessions, s: Session) {
    this.done = (async () => {
      try {
        for await (const ev of sessions.attach(s, this.ac.signal)) this.events.push(ev);
      } catch (err) {
        this.error = err;
      }
    })();
  }
  get out(): string {
    return Buffer.concat(this.events.flatMap((e) => (e.kind === 'stdout' ? [e.data] : []))).toString();
  }
  get exit(): SessionEvent | undefined {
    return this.events.find((e) => e.kind === 'exit');
  }
  async until(re: RegExp): Promise<void> {
    await waitFor(`output matching ${re} (have ${JSON.stringify(this.out.slice(-200))})`, () => re.test(this.out), 10_000);
  }
}

/** foregroundSleep: a `sleep` child of pid runs in a process group of its own (the shell's job). */
function foregroundSleep(pid: number): boolean {
  try {
    const kids = readFileSync(`/proc/${pid}/task/${pid}/children`, 'utf8').trim().split(/\s+/).filter(Boolean);
    return kids.some((k) => {
      const stat = readFileSync(`/proc/${k}/stat`, 'utf8');
      const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
      return stat.includes('(sleep)') && Number(f[2]) === Number(k) && Number(f[5]) === Number(f[2]);
    });
  } catch {
    return false;
  }
}

describe('podd core exec sessions', () => {
  let dir: string;
  let runner: ExecRunner;
  let sessions: ExecSessions;
  const started: Session[] = [];
  const start = async (...a: Parameters<ExecSessions['start']>) => {
    const s = await sessions.start(...a);
    started.push(s);
    return s;
  };
  beforeAll(() => {
    dir = mkdtempSync(path.join(tmpdir(), 'podd-sessions-'));
    runner = new ExecRunner({ defaultCwd: dir, maxChunkBytes: 1000, maxRunning: 8 });
    sessions = new ExecSessions({ runner, defaultCwd: dir, maxChunkBytes: 1000, keepBytes: 4096, highWaterBytes: 8192 });
  });
  afterAll(() => {
    for (const s of started) if (!s.exit) s.signal('SIGKILL');
    rmSync(dir, { recursive: true, force: true });
  });

  test('stdin flows as written: each line comes back before the next is sent', async () => {
    const s = await start({ argv: ['cat'] });
    const c = new Client(sessions, s);
    await s.write(Buffer.from('one\n'));
    await c.until(/^one\n$/);
    await s.write(Buffer.from('two\n'));
    await c.until(/^one\ntwo\n$/);
    s.closeStdin();
    await c.done;
    expect(c.events[0]).toMatchObject({ kind: 'started', pid: s.pid, execId: s.execId, pty: false });
    expect(c.exit).toEqual({ kind: 'exit', exitCode: 0, signal: '' });
  });

  test('signals by name reach the process group; unknown names are INVALID_ARGUMENT; exited is FAILED_PRECONDITION', async () => {
    const s = await start({ argv: ['sleep', '100'] });
    const c = new Client(sessions, s);
    expect(sessions.list().find((p) => p.execId === s.execId)).toMatchObject({ pid: s.pid, argv: ['sleep', '100'], running: true, attached: true, endedAtMs: 0 });
    expect(() => parseSignal('signal', 'SIGBOGUS')).toThrow(/signal: "SIGBOGUS" is not one of SIGINT/);
    expect(() => parseSignal('signal', 'SIGSEGV')).toThrow(InvalidArgumentError);
    expect(parseSignal('signal', 'SIGINT')).toBe('SIGINT');
    const signalledAt = Date.now();
    sessions.find(s.execId, 0).signal('SIGTERM');
    await c.done;
    expect(c.exit).toEqual({ kind: 'exit', exitCode: 143, signal: 'SIGTERM' });
    const ended = sessions.list().find((p) => p.execId === s.execId)!;
    expect(ended).toMatchObject({ running: false, exitCode: 143, signal: 'SIGTERM', attached: false });
    // ended_at_ms: when it exited (after the signal, not after the stream's end)
    expect(ended.endedAtMs).toBeGreaterThanOrEqual(signalledAt);
    expect(ended.endedAtMs).toBeLessThanOrEqual(Date.now());
    expect(() => s.signal('SIGKILL')).toThrow(FailedPreconditionError);
    expect(() => sessions.find('', process.pid)).toThrow(NotFoundError);
    expect(() => sessions.find('', 1)).toThrow(NotFoundError);
    // the operator sees this message (`sandbox kill ID 1`): it says what can be named and where to look
    expect(() => sessions.find('', 1)).toThrow(/pid 1: not a command exec started .*`sandbox ps` lists them/);
    expect(() => sessions.find('ex-1', 5)).toThrow(InvalidArgumentError);
  });

  test('a client that goes away detaches: the command runs on, output is kept, attach gets it', async () => {
    const s = await start({ argv: ['sh', '-c', 'read x; echo "got $x"; read y; echo "got $y"'] });
    const a = new Client(sessions, s);
    await s.write(Buffer.from('first\n'));
    await a.until(/got first\n/);
    a.ac.abort();
    await a.done;
    expect(s.exit).toBeUndefined();
    await s.write(Buffer.from('second\n'));
    await waitFor('exit while detached', () => !!s.exit, 10_000);
    const b = new Client(sessions, s);
    await b.done;
    expect(b.out).toBe('got second\n');
    expect(b.exit).toEqual({ kind: 'exit', exitCode: 0, signal: '' });
    expect(b.events[0]).toMatchObject({ kind: 'started', droppedBytes: 0 });
  });

  test('while detached at most keepBytes are kept; the rest is counted as dropped', async () => {
    const s = await start({ argv: ['head', '-c', '20000', '/dev/zero'] });
    await waitFor('exit', () => !!s.exit && s.ended, 10_000);
    const c = new Client(sessions, s);
    await c.done;
    const got = c.events.flatMap((e) => (e.kind === 'stdout' ? [e.data.length] : [])).reduce((x, y) => x + y, 0);
    const dropped = (c.events[0] as { droppedBytes: number }).droppedBytes;
    expect(got).toBeLessThanOrEqual(4096);
    expect(got + dropped).toBe(20000);
  });

  test('a second attach takes over: the first ends ABORTED', async () => {
    const s = await start({ argv: ['cat'] });
    const a = new Client(sessions, s);
    await waitFor('first attach started', () => a.events.length > 0);
    const b = new Client(sessions, s);
    await a.done;
    expect(a.error).toBeInstanceOf(AbortedError);
    await s.write(Buffer.from('x\n'));
    await b.until(/^x\n$/);
    s.closeStdin();
    await b.done;
  });

  test('stdin flood against a command that never reads: write waits, podd memory stays bounded', async () => {
    const s = await start({ argv: ['sleep', '100'] });
    const c = new Client(sessions, s);
    const chunk = Buffer.alloc(64 * 1024, 1);
    let written = 0;
    let pending = false;
    const flood = (async () => {
      for (let i = 0; i < 1000; i++) {
        pending = true;
        await s.write(chunk);
        pending = false;
        written += chunk.length;
      }
    })().then(
      () => undefined,
      (err: unknown) => err,
    );
    await waitFor('a write that waits', () => pending && (s.input?.writableLength ?? 0) > 0);
    const before = written;
    await new Promise((r) => setTimeout(r, 300));
    // the pipe (64 KiB) and one chunk in node's buffer: the rest of the 64 MB is never taken
    expect(written).toBe(before);
    expect(written).toBeLessThanOrEqual(256 * 1024);
    expect(s.input?.writableLength ?? 0).toBeLessThanOrEqual(chunk.length);
    s.signal('SIGKILL');
    await c.done;
    // the waiting write ends with the command; the next one is refused
    expect(await flood).toBeInstanceOf(FailedPreconditionError);
    expect(written).toBe(before + chunk.length);
    expect(c.exit).toMatchObject({ signal: 'SIGKILL' });
  });

  test('bad start input changes nothing: INVALID_ARGUMENT / NOT_FOUND before a spawn', async () => {
    const n = sessions.list().length;
    await expect(sessions.start({ argv: [] })).rejects.toThrow(InvalidArgumentError);
    await expect(sessions.start({ argv: ['nope-not-a-cmd-xyz'] })).rejects.toThrow(NotFoundError);
    await expect(sessions.start({ argv: ['nope-not-a-cmd-xyz'], pty: true })).rejects.toThrow(ptyAvailable() ? NotFoundError : FailedPreconditionError);
    await expect(sessions.start({ argv: ['sh'], pty: true, size: { rows: 70000, cols: 80 } })).rejects.toThrow(/size.rows: 70000 is not in 1..65535/);
    await expect(sessions.start({ argv: ['true'], detachKeepMs: 86_400_001 })).rejects.toThrow(/detach_keep_ms/);
    expect(sessions.list().length).toBe(n);
  });

  test('timeout_ms kills the group (exit says SIGKILL); a command left without a client past detach_keep_ms is killed', async () => {
    const t = await start({ argv: ['sleep', '100'], timeoutMs: 100 });
    const c = new Client(sessions, t);
    await c.done;
    expect(c.exit).toEqual({ kind: 'exit', exitCode: 137, signal: 'SIGKILL' });
    const d = await start({ argv: ['sleep', '100'], detachKeepMs: 100 });
    await waitFor('the detached command to be killed', () => d.exit, 10_000);
    expect(d.exit).toEqual({ exitCode: 137, signal: 'SIGKILL' });
    // while a client is attached the keep timer does not run
    const e = await start({ argv: ['sh', '-c', 'sleep 0.5; echo fine'], detachKeepMs: 100 });
    const ec = new Client(sessions, e);
    await ec.done;
    expect(ec.out).toBe('fine\n');
    expect(ec.exit).toEqual({ kind: 'exit', exitCode: 0, signal: '' });
  });

  test('ListProcesses shows at most MAX_LISTED_ARGV_BYTES of an argv (every command fits one answer)', async () => {
    expect(listedArgv(['a', 'b'])).toEqual(['a', 'b']);
    const cut = listedArgv(['sh', '-c', 'x'.repeat(100_000), 'more']);
    expect(cut).toHaveLength(3);
    expect(cut[2]).toMatch(/^x+\.\.\.$/);
    expect(Buffer.byteLength(cut.join(''))).toBeLessThanOrEqual(MAX_LISTED_ARGV_BYTES + 3);
    const s = await start({ argv: ['sh', '-c', 'exit 0', 'y'.repeat(120_000)] });
    await new Client(sessions, s).done;
    expect(
      sessions
        .list()
        .find((p) => p.execId === s.execId)!
        .argv.join('').length,
    ).toBeLessThanOrEqual(MAX_LISTED_ARGV_BYTES + 3);
  });

  const ptyTest = ptyAvailable() ? test : test.skip;
  ptyTest('pty: tty is /dev/pts/N, stty size follows a resize, Ctrl-C interrupts sleep and the shell lives on', async () => {
    const s = await start({ argv: ['sh', '-i'], pty: true, size: { rows: 30, cols: 100 }, env: { PS1: '$ ' } });
    const c = new Client(sessions, s);
    await s.write(Buffer.from('tty; stty size\n'));
    await c.until(/\/dev\/pts\/\d+\r\n30 100\r\n/);
    s.resize({ rows: 50, cols: 132 });
    await s.write(Buffer.from('stty size\n'));
    await c.until(/50 132\r\n/);
    expect(() => s.resize({ rows: 0, cols: 10 })).toThrow(InvalidArgumentError);
    expect(() => s.resize({ rows: 1e9, cols: 10 })).toThrow(InvalidArgumentError);
    await s.write(Buffer.from('sleep 100\n'));
    // the sleep runs in the terminal's foreground group (not the shell's) once it shows in ps
    await waitFor('sleep 100 in the foreground', () => sessions.list().length > 0 && foregroundSleep(s.pid));
    await s.write(Buffer.from('\x03'));
    await s.write(Buffer.from('echo after $? alive $$\n'));
    await c.until(new RegExp(`after 130 alive ${s.pid}`));
    await s.write(Buffer.from('exit 7\n'));
    await c.done;
    expect(c.exit).toEqual({ kind: 'exit', exitCode: 7, signal: '' });
  });
});
