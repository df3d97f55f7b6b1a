/**
 * `sandbox exec` options after the command's first word (commander takes -t, -i, --cwd ...
 * anywhere): the usage error shows the line with `--` before the command.
 */
import { Command } from 'commander';
import { registerSandboxCommands } from './sandbox';
import { killSignal, ownFlagAfterCommand, registerExecCommand } from './sandbox-exec';
import { UsageError } from '../output';

describe('ownFlagAfterCommand', () => {
  const program = new Command('sandnode');
  registerExecCommand(registerSandboxCommands(program));
  const exec = program.commands.find((c) => c.name() === 'sandbox')!.commands.find((c) => c.name() === 'exec')!;

  it("an own option after the command's first word gets the line with -- before the command", () => {
    expect(ownFlagAfterCommand(exec, ['sb-1', 'ls', '-t'])).toBe('sandnode sandbox exec sb-1 -- ls -t');
    expect(ownFlagAfterCommand(exec, ['-i', 'sb-1', 'grep', '-i', 'x'])).toBe('sandnode sandbox exec -i sb-1 -- grep -i x');
    expect(ownFlagAfterCommand(exec, ['--cwd', '/tmp', 'sb-1', 'tar', '--cwd=/x'])).toBe('sandnode sandbox exec --cwd /tmp sb-1 -- tar --cwd=/x');
    expect(ownFlagAfterCommand(exec, ['sb-1', 'sh', '-it'])).toBe('sandnode sandbox exec sb-1 -- sh -it');
  });

  it('own options before the command, or a --, are fine', () => {
    expect(ownFlagAfterCommand(exec, ['-it', 'sb-1', 'sh'])).toBeUndefined();
    expect(ownFlagAfterCommand(exec, ['sb-1', '-t', 'sh'])).toBeUndefined();
    expect(ownFlagAfterCommand(exec, ['sb-1', '--cwd', '/tmp', 'ls'])).toBeUndefined();
    expect(ownFlagAfterCommand(exec, ['sb-1', '--', 'ls', '-t'])).toBeUndefined();
    expect(ownFlagAfterCommand(exec, ['sb-1', 'ls', '-l'])).toBeUndefined();
  });
});

describe('kill --signal', () => {
  it('takes a name with or without SIG in any case, and refuses another as a usage error (exit 2) before any call', () => {
    expect(killSignal('term')).toBe('SIGTERM');
    expect(killSignal('SIGkill')).toBe('SIGKILL');
    expect(() => killSignal('BOGUS')).toThrow(UsageError);
    expect(() => killSignal('SIGSEGV')).toThrow(/--signal "SIGSEGV" is not one of SIGINT, SIGTERM/);
  });
});
