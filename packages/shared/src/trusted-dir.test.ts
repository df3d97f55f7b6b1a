import { chmodSync, chownSync, lchownSync, mkdirSync, mkdtempSync, rmSync, symlinkSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { ConfigError } from './config';
import { checkTrustedDir, checkTrustedDirs } from './trusted-dir';

const NOBODY = 65534;
const asRoot = process.getuid?.() === 0 ? describe : describe.skip;

asRoot('checkTrustedDir (run as root: chowns to uid 65534)', () => {
  let top: string;
  beforeEach(() => {
    top = mkdtempSync(path.join(os.tmpdir(), 'sandnode-trusted-')); // root 0700 in sticky /tmp
  });
  afterEach(() => rmSync(top, { recursive: true, force: true }));

  const sub = (name: string, mode = 0o755) => {
    const d = path.join(top, name);
    mkdirSync(d, { mode });
    chmodSync(d, mode);
    return d;
  };

  test('a root dir below sticky /tmp passes, and so does one not made yet', () => {
    expect(() => checkTrustedDir('runDir', sub('run'))).not.toThrow();
    expect(() => checkTrustedDir('runDir', path.join(top, 'not', 'yet'))).not.toThrow();
  });

  test('a dir owned by another user is refused, naming the key, the dir, its owner and mode', () => {
    const d = sub('theirs');
    chownSync(d, NOBODY, NOBODY);
    expect(() => checkTrustedDir('runDir', d)).toThrow(ConfigError);
    expect(() => checkTrustedDir('runDir', d)).toThrow(new RegExp(`key "runDir": ${d} is not owned by root \\(owner uid 65534, gid 65534, mode 0755\\)`));
  });

  test('a dir not made yet below a dir of another user is refused (that user could make it first)', () => {
    const d = sub('theirs');
    chownSync(d, NOBODY, NOBODY);
    expect(() => checkTrustedDir('stateDir', path.join(d, 'state'))).toThrow(/key "stateDir": .*theirs \(on the way to .*theirs\/state\) is not owned by root/);
  });

  test('the dir itself may not be group or other writable, even sticky', () => {
    expect(() => checkTrustedDir('runDir', sub('open', 0o1777))).toThrow(/is writable by group or others \(owner uid 0, gid 0, mode 1777\)/);
    expect(() => checkTrustedDir('runDir', sub('grp', 0o775))).toThrow(/is writable by group or others/);
  });

  test('an ancestor may be world writable only when sticky', () => {
    const open = sub('open', 0o777);
    mkdirSync(path.join(open, 'run'), { mode: 0o755 });
    expect(() => checkTrustedDir('runDir', path.join(open, 'run'))).toThrow(/open \(on the way to .*\) is writable by group or others and not sticky/);
    chmodSync(open, 0o1777);
    expect(() => checkTrustedDir('runDir', path.join(open, 'run'))).not.toThrow();
  });

  test('a symlink on the way must be root, and its target passes the same checks', () => {
    const theirs = sub('theirs');
    chownSync(theirs, NOBODY, NOBODY);
    const good = sub('good');
    const toGood = path.join(top, 'to-good');
    symlinkSync(good, toGood);
    expect(() => checkTrustedDir('runDir', path.join(toGood, 'run'))).not.toThrow();
    lchownSync(toGood, NOBODY, NOBODY);
    expect(() => checkTrustedDir('runDir', path.join(toGood, 'run'))).toThrow(/to-good \(on the way to .*\) is a symlink owned by a user other than root/);
    const toTheirs = path.join(top, 'to-theirs');
    symlinkSync(theirs, toTheirs);
    expect(() => checkTrustedDir('runDir', toTheirs)).toThrow(/theirs \(on the way to .*to-theirs\) is not owned by root/);
  });

  test('a file in place of the dir is refused; checkTrustedDirs stops at the first bad one', () => {
    expect(() =>
      checkTrustedDirs([
        { key: 'stateDir', dir: sub('ok') },
        { key: 'runDir', dir: '/etc/hostname' },
      ]),
    ).toThrow(/key "runDir": \/etc\/hostname is not a directory/);
  });
});
