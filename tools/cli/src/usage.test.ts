/**
 * Usage errors: the hint logic on its own, and the built CLI (`npm run build` first) run as a
 * process, since exit codes and stderr are what scripts see. None of these reach a node.
 */
import { spawnSync } from 'node:child_process';
import { rmSync } from 'node:fs';
import path from 'node:path';
import { built, describeWith, makeTempDir } from '@sandnode/testkit';
import { Command } from 'commander';
import { registerSandboxCommands } from './commands/sandbox';
import { registerExecCommand } from './commands/sandbox-exec';
import { EXIT_OK, EXIT_USAGE } from './output';
import { dashDashHint, shellWord } from './usage';

const MAIN = path.resolve(__dirname, '..', 'dist', 'main.js');

describe('dashDashHint', () => {
  const program = new Command('sandnode');
  registerExecCommand(registerSandboxCommands(program));
  const exec = program.commands.find((c) => c.name() === 'sandbox')!.commands.find((c) => c.name() === 'exec')!;

  it('moves what follows the sandbox id behind --', () => {
    expect(dashDashHint(exec, ['sb-1', 'ls', '-la'], '-la')).toBe('sandnode sandbox exec sb-1 -- ls -la');
    expect(dashDashHint(exec, ['sb-1', 'sh', '-c', 'echo "a b"; exit 3'], '-c')).toBe(`sandnode sandbox exec sb-1 -- sh -c 'echo "a b"; exit 3'`);
    expect(dashDashHint(exec, ['sb-1', 'grep', '--color=never', 'x'], '--color')).toBe('sandnode sandbox exec sb-1 -- grep --color=never x');
  });

  it("keeps exec's own options before the id where they are, with their values", () => {
    expect(dashDashHint(exec, ['--cwd', '/tmp', '--stdin', 'sb-1', 'ls', '-l'], '-l')).toBe('sandnode sandbox exec --cwd /tmp --stdin sb-1 -- ls -l');
    expect(dashDashHint(exec, ['--timeout-ms=5', 'sb-1', 'ls', '-l'], '-l')).toBe('sandnode sandbox exec --timeout-ms=5 sb-1 -- ls -l');
  });

  it('says nothing for a flag before the id or a line that already has --', () => {
    expect(dashDashHint(exec, ['--bogus', 'sb-1', 'ls'], '--bogus')).toBeUndefined();
    expect(dashDashHint(exec, ['sb-1', '--bogus', '--', 'ls'], '--bogus')).toBeUndefined();
    expect(dashDashHint(exec, ['--cwd', '/tmp'], '--bogus')).toBeUndefined();
  });

  it('quotes words for a shell', () => {
    expect(shellWord('sb-0123abcd')).toBe('sb-0123abcd');
    expect(shellWord("it's")).toBe(`'it'\\''s'`);
    expect(shellWord('')).toBe("''");
  });
});

describeWith('the built CLI on a wrong command line', [built('@sandnode/cli')], () => {
  let runDir: string;
  beforeAll(() => {
    runDir = makeTempDir('cli-usage');
  });
  afterAll(() => rmSync(runDir, { recursive: true, force: true }));

  /** cli runs the built CLI against an empty run dir (no node: nothing may get as far as a call). */
  const cli = (...args: string[]) => {
    const r = spawnSync(process.execPath, [MAIN, '--run-dir', runDir, '--state-dir', path.join(runDir, 'state'), ...args], { encoding: 'utf8', timeout: 30_000 });
    return { status: r.status, stdout: r.stdout, stderr: r.stderr };
  };

  it('sandbox exec ID ls -la: exit 2, with the line that has -- in it', () => {
    const r = cli('sandbox', 'exec', 'sb-0000000000000001', 'ls', '-la');
    expect(r.status).toBe(EXIT_USAGE);
    expect(r.stdout).toBe('');
    expect(r.stderr).toBe("error: unknown option '-la'\nsandnode: put -- before the command so that its options are not read as sandnode's: sandnode sandbox exec sb-0000000000000001 -- ls -la\n");
  });

  it.each([
    [['sandbox', 'exec', 'sb-1', '--timeout-ms'], "error: option '--timeout-ms <ms>' argument missing", 'sandbox exec'],
    [['sandbox', 'exec', 'sb-1', '--timeout-ms', 'soon', '--', 'ls'], "error: option '--timeout-ms <ms>' argument 'soon' is invalid", 'sandbox exec'],
    [['sandbox', 'exec', 'sb-1', '--bogus', '--', 'ls'], "error: unknown option '--bogus'", 'sandbox exec'],
    [['sandbox', 'exec', 'sb-1'], "error: missing required argument 'cmd'", 'sandbox exec'],
    [['sandbox', 'exec'], "error: missing required argument 'id'", 'sandbox exec'],
    [['sandbox', 'create', '--metadata', 'novalue'], "error: option '--metadata <key=value>' argument 'novalue' is invalid. expected KEY=VALUE", 'sandbox create'],
    [['sandbox', 'list', '--state', 'sleeping'], "argument 'sleeping' is invalid. expected one of CREATING, RUNNING, PAUSED", 'sandbox list'],
    [['sandbox', 'set-timeout', 'sb-1', 'soon'], "error: command-argument value 'soon' is invalid for argument 'seconds'", 'sandbox set-timeout'],
    [['status', '--bogus'], "error: unknown option '--bogus'", 'status'],
    [['drain', '--deadline-ms'], "error: option '--deadline-ms <ms>' argument missing", 'drain'],
  ])('%j: exit 2, one line from commander and one hint', (args, message, command) => {
    const r = cli(...args);
    expect(r.status).toBe(EXIT_USAGE);
    expect(r.stdout).toBe('');
    const lines = r.stderr.trimEnd().split('\n');
    expect(lines).toHaveLength(2);
    expect(lines[0]).toContain(message);
    expect(lines[1]).toBe(`sandnode: see: sandnode ${command} --help`);
  });

  it.each([
    [
      ['sandbox', 'pause', 'sb-0123456789abcdef', '-o', 'json'],
      "error: unknown option '-o'",
      'sandnode: this command has no -o/--output (read commands have it: sandbox list|get|ps, template list, status); its JSON is --json: sandnode sandbox pause --json',
    ],
    [
      ['-o', 'json', 'status'],
      "error: unknown option '-o'",
      'sandnode: -o/--output goes after the command (read commands: sandbox list|get|ps, template list, status), e.g. sandnode status -o json; see: sandnode --help',
    ],
  ])('%j (habits from other CLIs): exit 2 and a hint that names what to use', (args, message, hint) => {
    const r = cli(...args);
    expect(r.status).toBe(EXIT_USAGE);
    expect(r.stdout).toBe('');
    const lines = r.stderr.trimEnd().split('\n');
    expect(lines[0]).toBe(message);
    expect(lines[lines.length - 1]).toBe(hint);
  });

  it("keeps commander's suggestion for a near miss", () => {
    expect(cli('status', '--jsn')).toEqual({ status: EXIT_USAGE, stdout: '', stderr: "error: unknown option '--jsn'\n(Did you mean --json?)\nsandnode: see: sandnode status --help\n" });
  });

  it('a wrong combination found by the command: exit 2, as JSON with --json', () => {
    expect(cli('upgrade', 'server')).toEqual({ status: EXIT_USAGE, stdout: '', stderr: 'sandnode: give exactly one of --from-build DIR and --standby\n' });
    const j = cli('upgrade', 'ublk-manager', '--from-build', '.', '--standby', '--json');
    expect(j.status).toBe(EXIT_USAGE);
    expect(JSON.parse(j.stderr)).toEqual({ error: { code: 'USAGE', message: 'give exactly one of --from-build DIR and --standby', exitCode: EXIT_USAGE } });
  });

  it.each([
    [['token', 'list'], 'token list'],
    [['token', 'revoke', 'x'], 'token revoke'],
    [['token', 'create', '--name', 'x'], 'token create'],
    [['status'], 'status'],
  ])("%j with --address: a usage error (they use only this node's sockets), exit 2", (args, command) => {
    const r = cli('--address', '127.0.0.1:1', ...args);
    expect(r.status).toBe(EXIT_USAGE);
    expect(r.stdout).toBe('');
    expect(r.stderr).toBe(
      `sandnode: sandnode ${command} works only on the node itself (its unix sockets, as root): it cannot use --address 127.0.0.1:1 (or SANDNODE_ADDRESS); run it on the node without --address\n`,
    );
  });

  it('token --help says token commands are local only', () => {
    const h = cli('token', '--help');
    expect(h.status).toBe(EXIT_OK);
    expect(h.stdout).toContain("Token commands are local only: they talk to the active server's admin socket on this node (root only), never to --address");
  });

  it('a command group without its subcommand prints its help and exits 2; --help exits 0', () => {
    const g = cli('sandbox');
    expect(g.status).toBe(EXIT_USAGE);
    expect(g.stderr).toMatch(/^Usage: sandnode sandbox /);
    const h = cli('sandbox', 'exec', '--help');
    expect(h.status).toBe(EXIT_OK);
    expect(h.stdout).toMatch(/^Usage: sandnode sandbox exec \[options\] <id> <cmd\.\.\.>/);
  });

  it('a node that is not up is a failure (1), not a usage error, and --json keeps the gRPC code', () => {
    const r = cli('sandbox', 'get', 'sb-0000000000000001');
    expect(r.status).toBe(1);
    expect(r.stderr).toMatch(/^sandnode: UNAVAILABLE: .*\nsandnode: is the node up\? nothing answers at \/\S+\/server\.sock; run: sandnode up\n$/);
    const j = cli('sandbox', 'get', 'sb-0000000000000001', '--json');
    expect(j.status).toBe(1);
    expect(j.stdout).toBe('');
    expect(JSON.parse(j.stderr)).toMatchObject({ error: { code: 'UNAVAILABLE', grpcCode: 14, exitCode: 1, hint: expect.stringMatching(/^is the node up\? nothing answers at /) } });
  });
});
