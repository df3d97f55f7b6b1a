/**
 * Attack (issue 10 §2, user namespace; as a hostile local user): the vmm-supervisor adds o+x to
 * `<runDir>` and EVERY ancestor of it that lacks it (userns.ts `makeTraversable`, run at each
 * start with a user namespace range, the default). The default run dir is `./.sandnode/run`
 * relative to the operator's cwd, so `sandnode up` started from root's home turns `/root`
 * (0700 on Debian) into 0701 without a word in the CLI's output: from then on every local user
 * (and host uid 100000, the root of every sandbox) reads any file below it whose own mode allows
 * (a 0644 `~/.gitconfig`, `~/.profile`, a token file written with umask 022) by its name.
 * Expected: an ancestor outside the node's own dirs keeps its mode (the start fails naming it,
 * or the supervisor finds a path that needs no change to it).
 */
import { spawnSync } from 'node:child_process';
import { chmodSync, mkdirSync, mkdtempSync, rmSync, statSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { purgeNode, startComponent, stopComponent, type StackDirs } from '@sandnode/node-stack';
import { describeNode } from '@sandnode/testkit';

jest.setTimeout(120_000);

const NOBODY = 65534;

describeNode("the supervisor's user namespace setup and the operator's home dir", () => {
  let top: string;
  let home: string;
  let dirs: StackDirs;
  beforeAll(() => {
    top = mkdtempSync(path.join(os.tmpdir(), 'sandnode-home-'));
    // a home dir as Debian makes root's: 0700, inside a traversable dir
    chmodSync(top, 0o755);
    home = path.join(top, 'root');
    mkdirSync(home, { mode: 0o700 });
    writeFileSync(path.join(home, 'notes.txt'), 'private\n', { mode: 0o644 });
    dirs = { stateDir: path.join(home, '.sandnode', 'state'), runDir: path.join(home, '.sandnode', 'run'), listen: '' };
  });
  afterAll(async () => {
    await stopComponent(dirs, 'vmm-supervisor').catch(() => undefined);
    await purgeNode(dirs).catch(() => undefined);
    rmSync(top, { recursive: true, force: true });
  });

  it('attack: starting the vmm-supervisor with its run dir below a 0700 home leaves the home 0700 (nobody cannot read a file in it by name)', async () => {
    await startComponent(dirs, 'vmm-supervisor', { timeoutMs: 60_000 }).catch(() => undefined);
    const read = spawnSync('cat', [path.join(home, 'notes.txt')], { uid: NOBODY, gid: NOBODY, encoding: 'utf8' });
    expect({ homeMode: (statSync(home).mode & 0o7777).toString(8), nobodyReads: read.status === 0 ? read.stdout : read.stderr.trim() }).toEqual({
      homeMode: '700',
      nobodyReads: expect.stringMatching(/Permission denied/),
    });
  });
});
