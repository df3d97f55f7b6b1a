/**
 * `sandnode sandbox exec` against a real node, as a person uses it: `exec -it ID -- sh` inside
 * a real pseudo-terminal (a tmux server of the test's own) is an interactive shell (its tty,
 * the window size and its changes, Ctrl-C to the foreground job, the exit code passed through);
 * `exec -i` sends stdin as it is typed; `sandbox ps` and `sandbox kill` list and signal what
 * exec started; an option after the command without `--` gets the hint.
 */
import { execFileSync, spawn, spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import type { ExecStreamRequest, ExecStreamResponse } from '@sandnode/shared/proto/server/v1/sandbox';
import { describeNode, startNode, waitFor, type TestNode } from '@sandnode/testkit';

jest.setTimeout(240_000);

const CLI = require.resolve('@sandnode/cli/dist/main.js');
/** tmux gives the test a real terminal; without it (outside CI, which installs it: deploy/host-setup.sh) that test skips. */
const HAS_TMUX = spawnSync('tmux', ['-V']).status === 0;
const withTmux = HAS_TMUX || process.env.CI === 'true' ? test : test.skip;

describeNode('sandnode sandbox exec on a terminal', () => {
  let node: TestNode;
  let id: string;
  let tmp: string;
  const cliArgs = () => [CLI, '--state-dir', node.dirs.stateDir, '--run-dir', node.dirs.runDir, '--listen', ''];

  beforeAll(async () => {
    node = await startNode();
    id = (await node.api.sandboxes.createSandbox({ template: 'base' })).sandbox!.sandboxId;
    tmp = mkdtempSync(path.join(os.tmpdir(), 'sandnode-exec-tty-'));
  });
  afterAll(async () => {
    await node?.stop();
    if (tmp) rmSync(tmp, { recursive: true, force: true });
  });

  withTmux('exec -it ID -- sh under tmux: tty, stty size and resize, Ctrl-C, exit code', async () => {
    const sock = path.join(tmp, 'tmux.sock');
    const tmux = (...a: string[]) => execFileSync('tmux', ['-S', sock, ...a], { encoding: 'utf8' });
    const screen = () => tmux('capture-pane', '-p', '-J', '-S', '-200', '-t', 'x');
    const see = (re: RegExp, what: string) => waitFor(`${what} (screen: ${JSON.stringify(screen().trim().split('\n').slice(-6))})`, () => re.test(screen()), 30_000);
    const cmd = [process.execPath, ...cliArgs(), 'sandbox', 'exec', '-it', id, '--', 'sh'].map((w) => `'${w}'`).join(' ');
    tmux('-f', '/dev/null', 'new-session', '-d', '-s', 'x', '-x', '100', '-y', '30', `${cmd}; echo cli-exit=$?; sleep 600`);
    try {
      tmux('set-option', '-t', 'x', 'status', 'off');
      tmux('send-keys', '-t', 'x', 'export PS1="sb# "; tty; stty size', 'Enter');
      await see(/\/dev\/pts\/\d+\n\d+ 100\n/, 'the tty and the size');
      tmux('resize-window', '-t', 'x', '-x', '120', '-y', '40');
      tmux('send-keys', '-t', 'x', 'stty size', 'Enter');
      await see(/\n40 120\n/, 'the new size');
      tmux('send-keys', '-t', 'x', 'sleep 100', 'Enter');
      await see(/sb# sleep 100\n/, 'sleep started');
      // the sleep is the foreground job (its own process group) once ps in another exec shows it
      await waitFor('sleep 100 runs', () => /sleep 100/.test(execFileSync(process.execPath, [...cliArgs(), 'sandbox', 'exec', id, '--', 'ps', '-o', 'args'], { encoding: 'utf8' })));
      tmux('send-keys', '-t', 'x', 'C-c');
      tmux('send-keys', '-t', 'x', 'echo after $?', 'Enter');
      await see(/after 130\n/, 'Ctrl-C interrupted sleep, the shell lives on');
      tmux('send-keys', '-t', 'x', 'exit 5', 'Enter');
      await see(/cli-exit=5\n/, 'the exit code passed through');
    } finally {
      tmux('kill-server');
    }
  });

  test('exec -i sends stdin as it is typed: a line comes back before the next is written', async () => {
    const child = spawn(process.execPath, [...cliArgs(), 'sandbox', 'exec', '-i', id, '--', 'cat'], { stdio: ['pipe', 'pipe', 'pipe'] });
    let out = '';
    child.stdout.on('data', (d: Buffer) => (out += d.toString()));
    const exited = new Promise<number | null>((resolve) => child.once('exit', resolve));
    child.stdin.write('one\n');
    await waitFor('one back', () => out === 'one\n', 30_000);
    child.stdin.write('two\n');
    await waitFor('two back', () => out === 'one\ntwo\n', 30_000);
    child.stdin.end();
    expect(await exited).toBe(0);
  });

  test('sandbox ps lists what exec started; sandbox kill signals it by pid; a pid exec did not start is refused', async () => {
    // a command started through the API, so its stream stays open while the CLI looks at it
    let push: (() => void) | undefined;
    const requests = (async function* (): AsyncIterable<ExecStreamRequest> {
      yield { input: { $case: 'start', value: { sandboxId: id, argv: ['sleep', '100'], env: {}, cwd: '', timeoutMs: 0, pty: false, detachKeepMs: 0, size: undefined } } };
      await new Promise<void>((r) => (push = r));
    })();
    const events: ExecStreamResponse[] = [];
    const done = (async () => {
      for await (const ev of node.api.sandboxes.execStream(requests)) events.push(ev);
    })();
    const started = await waitFor('started', () => (events[0]?.event?.$case === 'started' ? events[0].event.value : undefined));
    const ps = node.cli(['sandbox', 'ps', id]);
    expect(ps.status).toBe(0);
    expect(ps.stdout).toMatch(new RegExp(`${started.execId}\\s+${started.pid}\\s+running .*sleep 100`));
    // -o wide: the client's stream is attached (this test holds it) and the age
    const wide = node.cli(['sandbox', 'ps', id, '-o', 'wide']).stdout;
    expect(wide.split('\n')[0]).toMatch(/^EXEC ID +PID +STATUS +STARTED +TTY +ATTACHED +AGE +ENDED +COMMAND$/);
    expect(wide).toMatch(new RegExp(`${started.execId}\\s+${started.pid}\\s+running .* yes +\\d+[smhd]\\S* +- +sleep 100`));
    const js = JSON.parse(node.cli(['sandbox', 'ps', id, '--json']).stdout) as { processes: { execId: string; pid: number; running: boolean; argv: string[] }[] };
    expect(js.processes.find((p) => p.execId === started.execId)).toMatchObject({ pid: started.pid, running: true, argv: ['sleep', '100'] });

    const refused = node.cli(['sandbox', 'kill', id, '1', '--signal', 'KILL']);
    expect(refused.status).not.toBe(0);
    expect(refused.stderr).toMatch(/NOT_FOUND|not a command started/);
    expect(node.cli(['sandbox', 'kill', id, String(started.pid), '--signal', 'KILL']).status).toBe(0);
    await done;
    push?.();
    expect(events.at(-1)?.event).toMatchObject({ $case: 'exit', value: { exitCode: 137, signal: 'SIGKILL' } });
    // the finished command: ENDED is its exit time and run time (the podd of this tree says it)
    const after = node.cli(['sandbox', 'ps', id, '-o', 'wide']).stdout;
    expect(after).toMatch(new RegExp(`${started.execId}\\s+${started.pid}\\s+killed \\(SIGKILL\\) .* \\d{4}-\\d\\d-\\d\\dT\\S+Z \\(ran \\d+s\\) +sleep 100`));
  });

  test('a second Ctrl-C leaves the command running; sandbox attach gets its output and exit code', async () => {
    const child = spawn(process.execPath, [...cliArgs(), 'sandbox', 'exec', '-i', id, '--', 'sh', '-c', 'trap \'echo int\' INT; until read x; do :; done; echo "got $x"; exit 4'], {
      stdio: ['pipe', 'pipe', 'pipe'],
    });
    let out = '';
    let err = '';
    child.stdout.on('data', (d: Buffer) => (out += d.toString()));
    child.stderr.on('data', (d: Buffer) => (err += d.toString()));
    const exited = new Promise<number | null>((resolve) => child.once('exit', resolve));
    // the first Ctrl-C reaches the command as SIGINT (its trap answers; the interrupted read is retried), the second leaves
    await waitFor('the command to run', () => /sh -c trap/.test(node.cli(['sandbox', 'ps', id]).stdout), 30_000);
    child.kill('SIGINT');
    await waitFor('the trap', () => out.includes('int\n'), 30_000);
    child.kill('SIGINT');
    expect(await exited).toBe(130);
    const execId = /as (ex-[0-9a-f]{16})/.exec(err)?.[1];
    expect(execId).toBeDefined();
    const r = node.cli(['sandbox', 'attach', id, execId!], 'hello\n');
    expect([r.status, r.stdout, r.stderr]).toEqual([4, 'got hello\n', '']);
  });

  test('an option after the command without -- gets the hint', () => {
    const r = node.cli(['sandbox', 'exec', id, 'ls', '-la']);
    expect(r.status).toBe(2);
    expect(r.stderr).toContain(`sandbox exec ${id} -- ls -la`);
  });
});
