/**
 * Attack (issue 10 §2, user namespace; as a hostile local user): the vmm-supervisor adds o+x to
 * `<runDir>` and EVERY ancestor of it that lacks it (userns.ts `makeTraversable`, run at each
 * start with a user namespace range, the default). The default run dir is `./.sandnode/run`
 * relative to the operator's cwd, so `sandnode up` started from root's home turns `/root`
 * (0700 on Debian) into 0701 without a word in the CLI's output: from then on every local user
 * (and host uid 100000, the root of every sandbox) reads any file below it whose own mode allows
 * (a 0644 `~/.gitconfig`, `~/.profile`, a token file written with umask 022) by its name.
 * Expected: an ancestor outside the node's own dirs gives no other user anything: its "other"
 * bits stay as they were and nobody cannot read in it (the fix grants the range's root alone
 * search by an ACL entry, or the start fails naming the dir).
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

  it('attack: starting the vmm-supervisor with its run dir below a 0700 home gives other users nothing there (nobody cannot read a file in it by name)', async () => {
    const started = await startComponent(dirs, 'vmm-supervisor', { timeoutMs: 60_000 }).then(
      () => true,
      () => false,
    );
    const read = spawnSync('cat', [path.join(home, 'notes.txt')], { uid: NOBODY, gid: NOBODY, encoding: 'utf8' });
    expect({ otherBits: statSync(home).mode & 0o007, nobodyReads: read.status === 0 ? read.stdout : read.stderr.trim() }).toEqual({
      otherBits: 0,
      nobodyReads: expect.stringMatching(/Permission denied/),
    });
    if (started) {
      // it started: the range's root alone was let through, by an ACL entry (getfacl: user:100000:--x)
      const acl = spawnSync('getfacl', ['-cp', home], { encoding: 'utf8' }).stdout;
      expect(acl).toMatch(/^user:100000:--x$/m);
      expect(acl).toMatch(/^other::---$/m);
    }
  });
});
