import { existsSync, mkdirSync, readFileSync, statSync, writeFileSync, rmSync } from 'node:fs';
import path from 'node:path';
import { DriverBinaries, versionDirName } from './driver-binaries';
import { makeTempDir } from '@sandnode/testkit';

describe('DriverBinaries', () => {
  const dir = makeTempDir('vmm-bins');
  afterAll(() => rmSync(dir, { recursive: true, force: true }));
  const src = path.join(dir, 'runc');
  writeFileSync(src, '#!/bin/sh\necho v1\n', { mode: 0o755 });
  const bins = new DriverBinaries(path.join(dir, 'bin'));

  test('install copies into <driver>-<version>/<name> once, executable; a later host change does not touch the copy', () => {
    const p = bins.install('runc', '1.1.5+ds1', src);
    expect(p).toBe(path.join(dir, 'bin', 'runc-1.1.5+ds1', 'runc'));
    expect(readFileSync(p, 'utf8')).toContain('v1');
    expect(statSync(p).mode & 0o777).toBe(0o755);
    writeFileSync(src, '#!/bin/sh\necho v2\n');
    expect(bins.install('runc', '1.1.5+ds1', src)).toBe(p);
    expect(readFileSync(p, 'utf8')).toContain('v1');
  });

  test('version dir names keep + and drop path separators', () => {
    expect(versionDirName('runc', '1.1.5+ds1')).toBe('runc-1.1.5+ds1');
    expect(versionDirName('runc', '../x y')).toBe('runc-.._x_y');
  });

  test('prune keeps dirs in use, ignores paths outside the store, removes the rest', () => {
    bins.install('runc', '1.1.4', src);
    mkdirSync(path.join(bins.dir, 'firecracker-1.6.0'), { recursive: true });
    const removed = bins.prune([path.join(bins.dir, 'runc-1.1.5+ds1', 'runc'), '/usr/sbin/runc', '']);
    expect(removed.sort()).toEqual(['firecracker-1.6.0', 'runc-1.1.4']);
    expect(bins.list()).toEqual(['runc-1.1.5+ds1']);
    expect(existsSync(path.join(bins.dir, 'runc-1.1.4'))).toBe(false);
  });
});
