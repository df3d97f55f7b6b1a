/**
 * Attack on issue 10's trusted-dir check (docs/security.md "Node dirs"): `sandnode up` refuses
 * a run dir another user owns, but `sandnode down` never checks it. With the run dir below a
 * sticky dir (/tmp, which checkTrustedDir accepts as a parent) and gone (never up, `down
 * --purge`, a reboot emptied /tmp), any local user may make it and fill it: root's `down` then
 * kills the pid the user's pid file names (a root process of their choice: an empty start time
 * is accepted) and truncates the target of the user's up.lock symlink (any root file). No race.
 */
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { chmodSync, chownSync, lchownSync, mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';

const NOBODY = 65534;
const asRoot = process.getuid?.() === 0 ? describe : describe.skip;

asRoot('attack: `sandnode down` on a run dir another user made (run as root: chowns to uid 65534)', () => {
  let top: string;
  let victimProc: ChildProcess | undefined;
  beforeEach(() => {
    top = mkdtempSync(path.join(os.tmpdir(), 'sandnode-attack-down-')); // root 0700
  });
  afterEach(() => {
    victimProc?.kill('SIGKILL');
    victimProc = undefined;
    rmSync(top, { recursive: true, force: true });
  });

  test('attack: down refuses a user-owned run dir: it kills no process of the pid file and writes no file through its up.lock', async () => {
    const sticky = path.join(top, 'tmp');
    mkdirSync(sticky);
    chmodSync(sticky, 0o1777); // like /tmp
    const runDir = path.join(sticky, 'run');
    const victimFile = path.join(top, 'victim'); // stands for /etc/shadow
    writeFileSync(victimFile, 'precious\n', { mode: 0o600 });
    const proc = spawn('sleep', ['600'], { stdio: 'ignore' }); // stands for a root daemon (sshd)
    victimProc = proc;
    await new Promise<void>((resolve, reject) => proc.once('spawn', resolve).once('error', reject));

    // what the user (uid 65534) does while the node is down
    mkdirSync(runDir);
    chownSync(runDir, NOBODY, NOBODY);
    const pid = path.join(runDir, 'server.pid');
    writeFileSync(pid, `${proc.pid}\n`);
    chownSync(pid, NOBODY, NOBODY);
    const lock = path.join(runDir, 'up.lock');
    symlinkSync(victimFile, lock);
    lchownSync(lock, NOBODY, NOBODY);

    const cli = require.resolve('@sandnode/cli/dist/main.js');
    const r = spawnSync(process.execPath, [cli, '--state-dir', path.join(sticky, 'state'), '--run-dir', runDir, 'down'], { encoding: 'utf8', timeout: 60_000 });

    // still running (not a zombie: spawnSync kept this process from reaping it)
    expect(readFileSync(`/proc/${proc.pid}/stat`, 'utf8').split(') ')[1]![0]).not.toBe('Z');
    expect(readFileSync(victimFile, 'utf8')).toBe('precious\n');
    expect({ status: r.status, stdout: r.stdout }).toEqual({ status: 2, stdout: '' });
    expect(r.stderr).toMatch(/key "runDir": .* is not owned by root/);
  });
});
