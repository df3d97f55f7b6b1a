/**
 * CommandRunner (drivers/command-runner.ts) with its real helper processes from dist: output and
 * errors as shared `run` gives them, a helper that dies with a command in flight, a cancelled
 * command, and concurrent commands spread over the helpers.
 */
import { existsSync } from 'node:fs';
import path from 'node:path';
import { CommandError, InternalError } from '@sandnode/shared';
import { CommandRunner } from './drivers/command-runner';

const SCRIPT = path.join(__dirname, '..', 'dist', 'drivers', 'spawner-child.js');
const d = existsSync(SCRIPT) ? describe : describe.skip;

d('CommandRunner', () => {
  let r: CommandRunner;
  beforeEach(() => {
    r = new CommandRunner(SCRIPT, 2);
  });
  afterEach(() => r.close());

  it('gives stdout and stderr, and a CommandError with the exit code and stderr for a failing command', async () => {
    expect(await r.run('sh', ['-c', 'echo out; echo err >&2'])).toEqual({ stdout: 'out\n', stderr: 'err\n' });
    const err = (await r.run('sh', ['-c', 'echo nope >&2; exit 3']).catch((e: unknown) => e)) as CommandError;
    expect(err).toBeInstanceOf(CommandError);
    expect([err.exitCode, err.stderr, err.message]).toEqual([3, 'nope\n', 'sh -c echo nope >&2; exit 3: exit 3: nope']);
    const missing = (await r.run('/nonexistent-binary', []).catch((e: unknown) => e)) as CommandError;
    expect([missing instanceof CommandError, missing.exitCode, missing.message]).toEqual([true, -1, expect.stringContaining('ENOENT')]);
    expect(await r.run('cat', [], { input: 'in' })).toEqual({ stdout: 'in', stderr: '' });
  });

  it('runs commands at once over its helpers', async () => {
    const out = await Promise.all(Array.from({ length: 6 }, (_, i) => r.run('sh', ['-c', `sleep 0.2; echo ${i}`])));
    expect(out.map((o) => o.stdout)).toEqual(['0\n', '1\n', '2\n', '3\n', '4\n', '5\n']);
  });

  it('rejects a command whose helper dies with InternalError and starts a new helper for the next one', async () => {
    const inFlight = r.run('sh', ['-c', 'kill -9 $PPID; sleep 5']).catch((e: unknown) => e);
    expect(await inFlight).toBeInstanceOf(InternalError);
    expect((await r.run('echo', ['again'])).stdout).toBe('again\n');
  });

  it('kills a cancelled command and rejects with the abort reason', async () => {
    const ac = new AbortController();
    const p = r.run('sleep', ['30'], { signal: ac.signal }).catch((e: unknown) => e);
    setTimeout(() => ac.abort(new Error('gave up')), 50);
    expect(((await p) as Error).message).toBe('gave up');
  });
});
