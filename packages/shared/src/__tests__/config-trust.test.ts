/**
 * Config planting (security finding a): a local user who may write a dir on the way to root's
 * config, or the config's own dir (even a sticky one), must not choose root's settings. Real
 * files in a temp dir, chowned to uid 65534 and chmodded the way an attacker would find or make
 * them; each case reads through loadConfig, the one door every daemon uses. Run as root.
 */
import { chmodSync, chownSync, lchownSync, mkdirSync, mkdtempSync, renameSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { execFileSync } from 'node:child_process';
import os from 'node:os';
import path from 'node:path';
import { ConfigError, loadConfig, z } from '..';
import { readTrustedFile } from '../config-trust';

const NOBODY = 65534;
const asRoot = process.getuid?.() === 0 ? describe : describe.skip;
const schema = z.object({ stateDir: z.string().default('/var/lib/sandnode'), version: z.number().optional() });
const load = (file: string) => loadConfig(schema, { service: 'server', file, env: {} });

asRoot('config files are read only when root (or the daemon) alone can change them', () => {
  let top: string;
  beforeEach(() => {
    top = mkdtempSync(path.join(os.tmpdir(), 'sandnode-cfgtrust-')); // root 0700 in sticky root /tmp
  });
  afterEach(() => rmSync(top, { recursive: true, force: true }));

  const dir = (name: string, mode = 0o755, uid = 0) => {
    const d = path.join(top, name);
    mkdirSync(d, { recursive: true });
    chmodSync(d, mode);
    chownSync(d, uid, uid);
    return d;
  };
  const file = (p: string, stateDir: string, mode = 0o600, uid = 0) => {
    writeFileSync(p, JSON.stringify({ version: 1, stateDir }));
    chmodSync(p, mode);
    chownSync(p, uid, uid);
    return p;
  };

  test('root config in a root dir below sticky /tmp is read', () => {
    const f = file(path.join(dir('etc'), 'server.json'), '/root/state');
    expect(load(f).stateDir).toBe('/root/state');
  });

  test('a server.v2.json planted beside root config in a sticky world-writable dir is refused, naming it, its owner and mode', () => {
    const d = dir('shared', 0o1777);
    const f = file(path.join(d, 'server.json'), '/root/state');
    // what the local user does: their own file in the slot name the loader prefers
    const planted = file(path.join(d, 'server.v2.json'), '/attacker', 0o644, NOBODY);
    writeFileSync(planted, JSON.stringify({ version: 2, stateDir: '/attacker' }));
    expect(() => load(f)).toThrow(ConfigError);
    expect(() => load(f)).toThrow(new RegExp(`config file ${planted}: refused: ${d} \\(on the way to ${planted}\\) is writable by group or others .*mode 1777`));
    // the planted file itself, once its dir is closed, is refused by its owner
    chmodSync(d, 0o755);
    expect(() => load(f)).toThrow(new RegExp(`config file ${planted}: refused: ${planted} is owned by uid 65534.*owner uid 65534, gid 65534, mode 0644`));
    chmodSync(d, 0o1777);
    rmSync(planted);
    // and root's own file there is refused too: the dir lets anyone create the slot next time
    expect(() => load(f)).toThrow(new RegExp(`${d} \\(on the way to ${f}\\) is writable by group or others \\(sticky or not.*mode 1777`));
  });

  test("the file's own dir may not be group writable, sticky or not", () => {
    const f = file(path.join(dir('grp', 0o775), 'server.json'), '/x');
    expect(() => load(f)).toThrow(/is writable by group or others \(owner uid 0, gid 0, mode 0775\)/);
  });

  test('a file of another user, or one others may write, is refused', () => {
    const d = dir('etc');
    expect(() => load(file(path.join(d, 'a.json'), '/x', 0o644, NOBODY))).toThrow(/a\.json is owned by uid 65534/);
    expect(() => load(file(path.join(d, 'b.json'), '/x', 0o666))).toThrow(/b\.json is writable by group or others \(owner uid 0, gid 0, mode 0666\)/);
  });

  test('a dir of another user on the way is refused even when the file is root 0600', () => {
    const theirs = dir('home', 0o755, NOBODY);
    mkdirSync(path.join(theirs, 'cfg'), { mode: 0o755 });
    const f = file(path.join(theirs, 'cfg', 'server.json'), '/x');
    expect(() => load(f)).toThrow(new RegExp(`${theirs} \\(on the way to ${f}\\) is owned by uid 65534`));
  });

  test('an ancestor may be world writable only when sticky and root', () => {
    const open = dir('open', 0o777);
    mkdirSync(path.join(open, 'etc'), { mode: 0o755 });
    const f = file(path.join(open, 'etc', 'server.json'), '/ok');
    expect(() => load(f)).toThrow(/open \(on the way to .*\) is writable by group or others and not a sticky dir of root/);
    chmodSync(open, 0o1777);
    expect(load(f).stateDir).toBe('/ok');
    chownSync(open, NOBODY, NOBODY); // a sticky dir of another user: its owner renames anything in it
    expect(() => load(f)).toThrow(/open \(on the way to .*\) is owned by uid 65534/);
  });

  test("a symlink of another user (to root's own file) is refused; root's symlink is followed and its target checked", () => {
    const etc = dir('etc');
    const real = file(path.join(etc, 'real.json'), '/real');
    const link = path.join(etc, 'server.json');
    symlinkSync(real, link);
    expect(load(link).stateDir).toBe('/real');
    lchownSync(link, NOBODY, NOBODY);
    expect(() => load(link)).toThrow(new RegExp(`${link} is a symlink owned by uid 65534`));
    // root's link into a dir of another user: the target chain is checked
    rmSync(link);
    const theirs = dir('theirs', 0o755, NOBODY);
    symlinkSync(file(path.join(theirs, 'c.json'), '/theirs'), link);
    expect(() => load(link)).toThrow(/theirs \(on the way to .*\) is owned by uid 65534/);
  });

  test('a ConfigMap-style symlink farm (..data -> ..<ts>) of root is read, and a swap of ..data stays inside the checks', () => {
    const vol = dir('cm');
    const ts1 = dir('cm/..2026_01', 0o755);
    const ts2 = dir('cm/..2026_02', 0o755);
    file(path.join(ts1, 'server.json'), '/one', 0o644);
    file(path.join(ts2, 'server.json'), '/two', 0o644);
    symlinkSync('..2026_01', path.join(vol, '..data'));
    symlinkSync('..data/server.json', path.join(vol, 'server.json'));
    expect(load(path.join(vol, 'server.json')).stateDir).toBe('/one');
    // kubelet's atomic update: a new ..data renamed over the old one
    symlinkSync('..2026_02', path.join(vol, '..data_tmp'));
    renameSync(path.join(vol, '..data_tmp'), path.join(vol, '..data'));
    expect(load(path.join(vol, 'server.json')).stateDir).toBe('/two');
  });

  test('on a read-only mount group/other write bits do not count (ConfigMap volume root is 0777), owners still do', () => {
    const src = dir('cm-src', 0o777);
    file(path.join(src, 'server.json'), '/from-ro', 0o666);
    const mnt = dir('cm-mnt');
    execFileSync('mount', ['--bind', src, mnt]);
    try {
      expect(() => load(path.join(mnt, 'server.json'))).toThrow(/is writable by group or others/); // read-write bind: refused
      execFileSync('mount', ['-o', 'remount,bind,ro', mnt]);
      expect(load(path.join(mnt, 'server.json')).stateDir).toBe('/from-ro');
      expect(() => load(path.join(src, 'server.json'))).toThrow(/cm-src .*is writable by group or others/); // the writable source stays refused
    } finally {
      execFileSync('umount', [mnt]);
    }
    chownSync(path.join(src, 'server.json'), NOBODY, NOBODY);
    execFileSync('mount', ['--bind', '-o', 'ro', src, mnt]);
    try {
      execFileSync('mount', ['-o', 'remount,bind,ro', mnt]);
      expect(() => load(path.join(mnt, 'server.json'))).toThrow(/server\.json is owned by uid 65534/);
    } finally {
      execFileSync('umount', [mnt]);
    }
  });

  test('a FIFO or a dir under the config name is refused without hanging', () => {
    const d = dir('etc');
    mkdirSync(path.join(d, 'server.json'));
    expect(() => readTrustedFile(path.join(d, 'server.json'))).toThrow(/is not a regular file/);
    execFileSync('mkfifo', ['-m', '0600', path.join(d, 'fifo.json')]);
    expect(() => load(path.join(d, 'fifo.json'))).toThrow(/fifo\.json is not a regular file/);
  });

  test('a missing file is a ConfigError naming it', () => {
    expect(() => load(path.join(top, 'nope.json'))).toThrow(new RegExp(`config file ${top}/nope.json: ENOENT`));
  });
});
