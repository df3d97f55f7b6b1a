/**
 * The CLI's bearer token options (issue 10 §4): --token on the command line works but warns on
 * stderr (argv is readable by every local user), SANDNODE_TOKEN is silent, --token-file /
 * SANDNODE_TOKEN_FILE reads a 0600 file and refuses one group or others may read with a usage
 * error, and two sources given the same way are a usage error.
 */
import { chmodSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { useTempDir } from '@sandnode/testkit';
import { Command } from 'commander';
import { addGlobalOptions, tokenOf } from './options';
import { UsageError } from './output';

/** run parses argv (user words) with env set, and returns the token the sub command reads and the warnings printed. */
function run(argv: string[], env: Record<string, string> = {}): { token: string | undefined; warnings: string[] } {
  const saved = { ...process.env };
  Object.assign(process.env, env);
  try {
    const program = addGlobalOptions(new Command('sandnode')).exitOverride();
    const warnings: string[] = [];
    let token: string | undefined;
    program.command('list').action((_o, cmd: Command) => {
      token = tokenOf(cmd, cmd.optsWithGlobals(), (l) => warnings.push(l));
      tokenOf(cmd, cmd.optsWithGlobals(), (l) => warnings.push(l)); // a second read prints no second warning
    });
    program.parse([...argv, 'list'], { from: 'user' });
    return { token, warnings };
  } finally {
    for (const k of Object.keys(env)) if (saved[k] === undefined) delete process.env[k];
    Object.assign(process.env, saved);
  }
}

describe('--token and --token-file', () => {
  const tmp = useTempDir('cli-token');
  const tokenFile = (mode: number, text = 'sn_filesecret\n') => {
    const f = path.join(tmp(), 'token');
    writeFileSync(f, text);
    chmodSync(f, mode);
    return f;
  };

  it('--token on the command line is used and warns once on stderr; SANDNODE_TOKEN is silent', () => {
    const a = run(['--token', 'sn_argv']);
    expect(a.token).toBe('sn_argv');
    expect(a.warnings).toEqual([expect.stringMatching(/--token puts the secret in the process list.*--token-file/)]);
    expect(run([], { SANDNODE_TOKEN: 'sn_env' })).toEqual({ token: 'sn_env', warnings: [] });
    expect(run([])).toEqual({ token: undefined, warnings: [] });
  });

  it('--token-file and SANDNODE_TOKEN_FILE read a 0600 (or 0400) file, whitespace trimmed', () => {
    expect(run(['--token-file', tokenFile(0o600)])).toEqual({ token: 'sn_filesecret', warnings: [] });
    expect(run([], { SANDNODE_TOKEN_FILE: tokenFile(0o400) })).toEqual({ token: 'sn_filesecret', warnings: [] });
  });

  it('a token file group or others may read or write is a usage error naming the mode; so is an empty or missing one', () => {
    for (const mode of [0o640, 0o604, 0o620, 0o644]) {
      expect(() => run(['--token-file', tokenFile(mode)])).toThrow(UsageError);
      expect(() => run(['--token-file', tokenFile(mode)])).toThrow(new RegExp(`mode 0${mode.toString(8)}: other users may read the secret; run: chmod 600`));
    }
    expect(() => run(['--token-file', tokenFile(0o600, ' \n')])).toThrow(/is empty/);
    expect(() => run(['--token-file', path.join(tmp(), 'missing')])).toThrow(/--token-file: cannot read .*ENOENT/);
  });

  it('both given the same way is a usage error; the command line wins over the environment', () => {
    const f = tokenFile(0o600);
    expect(() => run(['--token', 'sn_argv', '--token-file', f])).toThrow(/give only one of --token/);
    expect(() => run([], { SANDNODE_TOKEN: 'sn_env', SANDNODE_TOKEN_FILE: f })).toThrow(/give only one of --token/);
    expect(run(['--token-file', f], { SANDNODE_TOKEN: 'sn_env' })).toEqual({ token: 'sn_filesecret', warnings: [] });
    expect(run(['--token', 'sn_argv'], { SANDNODE_TOKEN_FILE: f }).token).toBe('sn_argv');
  });
});
