/**
 * deploy/lock-current.js (host-setup.sh's "is node_modules installed from this lock?"), on
 * lockfiles written to temp dirs, and as the process host-setup runs.
 */
import { spawnSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, rmSync, utimesSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';

const SCRIPT = path.resolve(__dirname, 'lock-current.js');
const { staleReason } = require(SCRIPT) as { staleReason: (dir: string) => string };

type Packages = Record<string, Record<string, unknown>>;
const pkg = (version: string, extra: Record<string, unknown> = {}) => ({ version, resolved: `https://registry.npmjs.org/x/-/x-${version}.tgz`, integrity: `sha512-${version}`, ...extra });
const LOCKED: Packages = {
  '': { name: 'root' },
  'node_modules/a': pkg('1.0.0'),
  'node_modules/buf-darwin': pkg('2.0.0', { optional: true }),
  'services/s': { version: '0.1.0' },
  'node_modules/@x/s': { resolved: 'services/s', link: true },
};
const INSTALLED: Packages = Object.fromEntries(Object.entries(LOCKED).filter(([k]) => k !== '' && k !== 'node_modules/buf-darwin'));

describe('deploy/lock-current.js', () => {
  let dir: string;
  beforeEach(() => {
    dir = mkdtempSync(path.join(os.tmpdir(), 'lock-current-'));
  });
  afterEach(() => rmSync(dir, { recursive: true, force: true }));

  const write = (locked: Packages, installed?: Packages) => {
    writeFileSync(path.join(dir, 'package-lock.json'), JSON.stringify({ lockfileVersion: 3, packages: locked }));
    if (installed) {
      mkdirSync(path.join(dir, 'node_modules'), { recursive: true });
      writeFileSync(path.join(dir, 'node_modules/.package-lock.json'), JSON.stringify({ lockfileVersion: 3, packages: installed }));
    }
  };

  it("current by content even when the lock is newer (a fresh checkout): another platform's optional binary may be absent", () => {
    write(LOCKED, INSTALLED);
    const later = new Date(Date.now() + 60_000);
    utimesSync(path.join(dir, 'package-lock.json'), later, later);
    expect(staleReason(dir)).toBe('');
    const r = spawnSync(process.execPath, [SCRIPT, dir], { encoding: 'utf8' });
    expect([r.status, r.stdout]).toEqual([0, '']);
  });

  it('not current: no node_modules, another version, integrity or link, a locked package missing, an extra one installed', () => {
    write(LOCKED);
    expect(staleReason(dir)).toBe('node_modules/.package-lock.json: missing');
    write(LOCKED, { ...INSTALLED, 'node_modules/a': pkg('1.0.1') });
    expect(staleReason(dir)).toBe('node_modules/a: version "1.0.1" installed, "1.0.0" locked');
    write(LOCKED, { ...INSTALLED, 'node_modules/a': { ...pkg('1.0.0'), integrity: 'sha512-other' } });
    expect(staleReason(dir)).toMatch(/^node_modules\/a: integrity /);
    write(LOCKED, { ...INSTALLED, 'node_modules/@x/s': { resolved: 'services/s' } });
    expect(staleReason(dir)).toMatch(/^node_modules\/@x\/s: link /);
    const { 'node_modules/a': _a, ...withoutA } = INSTALLED;
    write(LOCKED, withoutA);
    expect(staleReason(dir)).toBe('node_modules/a is locked but not installed');
    write(LOCKED, { ...INSTALLED, 'node_modules/b': pkg('3.0.0') });
    expect(staleReason(dir)).toBe('node_modules/b is installed but not in package-lock.json');
    const r = spawnSync(process.execPath, [SCRIPT, dir], { encoding: 'utf8' });
    expect([r.status, r.stdout]).toEqual([1, 'node_modules/b is installed but not in package-lock.json\n']);
  });

  it('a malformed lock is a reason, never a throw', () => {
    writeFileSync(path.join(dir, 'package-lock.json'), '{');
    expect(staleReason(dir)).toMatch(/^package-lock.json: /);
  });

  it("this checkout's node_modules is current (host-setup would not run npm ci here)", () => {
    expect(staleReason(path.resolve(__dirname, '..'))).toBe('');
  });
});
