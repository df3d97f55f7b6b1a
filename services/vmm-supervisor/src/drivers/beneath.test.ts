/**
 * The no-follow walk of host root inside a sandbox's tree (beneath.ts, writeMachineId): a
 * symlink planted at any component sends no write outside the tree.
 */
import { closeSync, linkSync, lstatSync, mkdirSync, mkdtempSync, readFileSync, readdirSync, rmSync, statSync, symlinkSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { ensureDirNoFollow, openDirNoFollow, openRootDir, replaceFileNoFollow, UnsafePathError } from './beneath';
import { writeMachineId } from './runc';

const ID = '0123456789abcdef0123456789abcdef';

describe('writeMachineId beneath a sandbox-written upper dir', () => {
  let tmp: string;
  let upper: string;
  let victim: string;
  beforeEach(() => {
    tmp = mkdtempSync(path.join(os.tmpdir(), 'beneath-'));
    upper = path.join(tmp, 'upper');
    victim = path.join(tmp, 'host-etc');
    mkdirSync(upper);
    mkdirSync(victim);
    writeFileSync(path.join(victim, 'machine-id'), 'host\n');
  });
  afterEach(() => rmSync(tmp, { recursive: true, force: true }));

  it('writes etc/machine-id 0444 in a fresh upper dir', () => {
    expect(writeMachineId(upper, ID)).toBe(true);
    expect(readFileSync(path.join(upper, 'etc', 'machine-id'), 'utf8')).toBe(`${ID}\n`);
    expect(statSync(path.join(upper, 'etc', 'machine-id')).mode & 0o777).toBe(0o444);
  });

  it('refuses an etc that is a symlink to a host dir: the host file is neither removed nor written', () => {
    symlinkSync(victim, path.join(upper, 'etc'));
    expect(writeMachineId(upper, ID)).toBe(false);
    expect(readFileSync(path.join(victim, 'machine-id'), 'utf8')).toBe('host\n');
    expect(readdirSync(victim)).toEqual(['machine-id']);
  });

  it('replaces a machine-id that is a symlink to a host file: the symlink goes, the host file stays', () => {
    mkdirSync(path.join(upper, 'etc'));
    symlinkSync(path.join(victim, 'machine-id'), path.join(upper, 'etc', 'machine-id'));
    expect(writeMachineId(upper, ID)).toBe(true);
    expect(lstatSync(path.join(upper, 'etc', 'machine-id')).isFile()).toBe(true);
    expect(readFileSync(path.join(victim, 'machine-id'), 'utf8')).toBe('host\n');
  });

  it('a hardlinked machine-id only loses its name in the upper dir', () => {
    mkdirSync(path.join(upper, 'etc'));
    const other = path.join(upper, 'other');
    writeFileSync(other, 'keep\n');
    linkSync(other, path.join(upper, 'etc', 'machine-id'));
    expect(writeMachineId(upper, ID)).toBe(true);
    expect(readFileSync(other, 'utf8')).toBe('keep\n');
  });

  it('refuses an upper root that is itself a symlink, and an etc that is a file', () => {
    const link = path.join(tmp, 'link');
    symlinkSync(victim, link);
    expect(() => writeMachineId(link, ID)).toThrow(UnsafePathError);
    writeFileSync(path.join(upper, 'etc'), 'x');
    expect(writeMachineId(upper, ID)).toBe(false);
    expect(readFileSync(path.join(victim, 'machine-id'), 'utf8')).toBe('host\n');
  });

  it('the walk helpers refuse names that are not one component and symlinked dirs at any depth', () => {
    const root = openRootDir(upper);
    try {
      for (const bad of ['..', '.', 'a/b', '', 'a\0b']) expect(() => openDirNoFollow(root, bad)).toThrow(UnsafePathError);
      const a = ensureDirNoFollow(root, 'a', 0o755);
      symlinkSync(victim, path.join(upper, 'a', 'b'));
      expect(() => ensureDirNoFollow(a, 'b', 0o755)).toThrow(UnsafePathError);
      mkdirSync(path.join(upper, 'a', 'd'));
      expect(() => replaceFileNoFollow(a, 'd', 'x', 0o644)).toThrow(UnsafePathError);
      closeSync(a);
    } finally {
      closeSync(root);
    }
    expect(readdirSync(victim)).toEqual(['machine-id']);
  });
});
