/**
 * Attack on issue 10's trusted-dir check (docs/security.md "Node dirs"): `sandnode up` checks
 * the run dir with checkStackDirs while it does not exist yet (fine: its nearest existing
 * ancestor, a sticky dir like /tmp, passes) and then makes it with `mkdir -p` in withNodeLock,
 * which accepts a dir that is already there. A local user who makes the run dir in between
 * (in a sticky parent anyone may create entries in) owns it, and plants `up.lock` as a symlink:
 * root then opens, TRUNCATES and writes its pid into the symlink's target (any file of root's).
 */
import { chmodSync, lchownSync, mkdirSync, chownSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { checkStackDirs } from '../stack';
import { withNodeLock } from '../node-lock';

const NOBODY = 65534;
const asRoot = process.getuid?.() === 0 ? describe : describe.skip;

asRoot('attack: a run dir a user makes after `sandnode up` checked it (run as root: chowns to uid 65534)', () => {
  let top: string;
  beforeEach(() => {
    top = mkdtempSync(path.join(os.tmpdir(), 'sandnode-attack-rundir-')); // root 0700
  });
  afterEach(() => rmSync(top, { recursive: true, force: true }));

  test('attack: the node lock does not follow a user-planted up.lock symlink into a root file', async () => {
    const sticky = path.join(top, 'tmp');
    mkdirSync(sticky);
    chmodSync(sticky, 0o1777); // like /tmp
    const dirs = { stateDir: path.join(sticky, 'state'), runDir: path.join(sticky, 'run'), listen: '' };
    const victim = path.join(top, 'victim'); // stands for /etc/shadow
    writeFileSync(victim, 'precious\n', { mode: 0o600 });

    expect(() => checkStackDirs(dirs)).not.toThrow(); // neither dir exists yet: passes

    // the user's move between the check and the mkdir -p
    mkdirSync(dirs.runDir);
    chownSync(dirs.runDir, NOBODY, NOBODY);
    const lock = path.join(dirs.runDir, 'up.lock');
    symlinkSync(victim, lock);
    lchownSync(lock, NOBODY, NOBODY);

    let ran = false;
    const locked = withNodeLock(dirs.runDir, 0, async () => {
      ran = true;
    });
    await expect(locked).rejects.toThrow(/not owned by root/);
    expect(ran).toBe(false);
    expect(readFileSync(victim, 'utf8')).toBe('precious\n');
  });
});
