/**
 * The user namespace range (userns.ts): the config value, the shift of a tree a sandbox wrote
 * (never following what it planted) and the template copies owned in the range.
 */
import { execFileSync, spawnSync } from 'node:child_process';
import { chmodSync, chownSync, existsSync, linkSync, lstatSync, mkdirSync, mkdtempSync, readdirSync, renameSync, rmSync, statSync, symlinkSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { ConfigError, createLogger } from '@sandnode/shared';
import { writeMachineId } from './runc';
import { ensureTreeInRange, makeTraversable, parseUsernsRange, ShiftedTemplates, shiftTreeIntoRange } from './userns';

const R = { hostId: 100000, size: 65536 };
const log = createLogger('vmm-supervisor-test', '0.0.0', 'silent');
const isRoot = process.getuid?.() === 0;
const rootIt = isRoot ? it : it.skip;

const owner = (p: string) => {
  const st = lstatSync(p);
  return `${st.uid}:${st.gid}`;
};

describe('parseUsernsRange (config key usernsRange)', () => {
  it('"" is no user namespace; "<hostId>:<size>" a range', () => {
    expect(parseUsernsRange('')).toBeUndefined();
    expect(parseUsernsRange('100000:65536')).toEqual(R);
    expect(parseUsernsRange('200000:131072')).toEqual({ hostId: 200000, size: 131072 });
  });
  it.each([['100000'], ['a:b'], ['100000:1000'], ['1000:65536'], ['4294967000:65536'], ['-1:65536'], [' 100000:65536']])('%j is a ConfigError naming the key', (raw) => {
    expect(() => parseUsernsRange(raw)).toThrow(ConfigError);
    expect(() => parseUsernsRange(raw)).toThrow(/usernsRange/);
  });
});

(isRoot ? describe : describe.skip)('shiftTreeIntoRange on a tree the sandbox wrote', () => {
  let tmp: string;
  let tree: string;
  let host: string;
  beforeEach(() => {
    tmp = mkdtempSync(path.join(os.tmpdir(), 'userns-'));
    tree = path.join(tmp, 'upper');
    host = path.join(tmp, 'host');
    mkdirSync(path.join(tree, 'etc', 'deep'), { recursive: true });
    mkdirSync(host);
    writeFileSync(path.join(host, 'shadow'), 'host secret');
    mkdirSync(path.join(host, 'dir'));
    writeFileSync(path.join(host, 'dir', 'f'), 'x');
    writeFileSync(path.join(tree, 'etc', 'hostname'), 'box');
    writeFileSync(path.join(tree, 'etc', 'deep', 'f'), 'f');
    writeFileSync(path.join(tree, 'suid'), '#!/bin/sh\n');
    chmodSync(path.join(tree, 'suid'), 0o4755);
    writeFileSync(path.join(tree, 'user-file'), 'u');
    chownSync(path.join(tree, 'user-file'), 1000, 1000);
    writeFileSync(path.join(tree, 'already'), 'a');
    chownSync(path.join(tree, 'already'), 101000, 101000);
    writeFileSync(path.join(tree, 'foreign'), 'o');
    chownSync(path.join(tree, 'foreign'), 70000, 70000);
    symlinkSync(path.join(host, 'shadow'), path.join(tree, 'to-host-file'));
    symlinkSync(path.join(host, 'dir'), path.join(tree, 'to-host-dir'));
    linkSync(path.join(tree, 'etc', 'hostname'), path.join(tree, 'hardlink'));
    execFileSync('mkfifo', [path.join(tree, 'fifo')]);
  });
  afterEach(() => rmSync(tmp, { recursive: true, force: true }));

  it('moves ids 0..size-1 into the range, root last, keeps setuid bits, and never follows a symlink out of the tree', () => {
    const rep = shiftTreeIntoRange(tree, R);
    expect(owner(tree)).toBe('100000:100000');
    expect(owner(path.join(tree, 'etc'))).toBe('100000:100000');
    expect(owner(path.join(tree, 'etc', 'deep', 'f'))).toBe('100000:100000');
    expect(owner(path.join(tree, 'user-file'))).toBe('101000:101000');
    expect(owner(path.join(tree, 'already'))).toBe('101000:101000');
    expect(owner(path.join(tree, 'foreign'))).toBe('70000:70000');
    expect(owner(path.join(tree, 'fifo'))).toBe('100000:100000');
    expect(statSync(path.join(tree, 'suid')).mode & 0o7777).toBe(0o4755);
    // the symlinks themselves moved; what they point at did not
    expect(owner(path.join(tree, 'to-host-file'))).toBe('100000:100000');
    expect(owner(path.join(tree, 'to-host-dir'))).toBe('100000:100000');
    for (const p of [host, path.join(host, 'shadow'), path.join(host, 'dir'), path.join(host, 'dir', 'f')]) expect(owner(p)).toBe('0:0');
    expect(rep.left).toBe(1);
    expect(rep.changed).toBe(rep.entries - 3); // all but "already", "foreign" and the second name of the hardlink
    // idempotent: a second shift (a crash half way, then the next boot) changes nothing
    expect(shiftTreeIntoRange(tree, R).changed).toBe(0);
  });

  it('refuses a root that is a symlink', () => {
    symlinkSync(host, path.join(tmp, 'link'));
    expect(() => shiftTreeIntoRange(path.join(tmp, 'link'), R)).toThrow(/symlink/);
    expect(owner(host)).toBe('0:0');
  });

  it('ensureTreeInRange: walks only a tree whose root is not the range yet; leaves one of another range', () => {
    chownSync(tree, 100000, 100000);
    expect(ensureTreeInRange(tree, R)).toEqual({ entries: 1, changed: 0, left: 0 });
    expect(owner(path.join(tree, 'etc', 'hostname'))).toBe('0:0'); // not walked
    chownSync(tree, 0, 0);
    expect(ensureTreeInRange(tree, R)!.changed).toBeGreaterThan(5);
    expect(owner(path.join(tree, 'etc', 'hostname'))).toBe('100000:100000');
    chownSync(tree, 300000, 300000);
    expect(ensureTreeInRange(tree, R)).toBeUndefined();
  });

  it("writeMachineId with a range: a new /etc and the machine-id are the range root's", () => {
    const fresh = path.join(tmp, 'fresh');
    mkdirSync(fresh);
    expect(writeMachineId(fresh, '0123456789abcdef0123456789abcdef', R)).toBe(true);
    expect(owner(path.join(fresh, 'etc'))).toBe('100000:100000');
    expect(owner(path.join(fresh, 'etc', 'machine-id'))).toBe('100000:100000');
    expect(statSync(path.join(fresh, 'etc', 'machine-id')).mode & 0o777).toBe(0o444);
    // an /etc the sandbox chowned within its range keeps its owner
    chownSync(path.join(fresh, 'etc'), 101000, 101000);
    expect(writeMachineId(fresh, 'fedcba9876543210fedcba9876543210', R)).toBe(true);
    expect(owner(path.join(fresh, 'etc'))).toBe('101000:101000');
  });
});

describe('ShiftedTemplates', () => {
  let tmp: string;
  let source: string;
  let cache: string;
  beforeEach(() => {
    tmp = mkdtempSync(path.join(os.tmpdir(), 'userns-tpl-'));
    source = path.join(tmp, 'templates', 'base', 'rootfs');
    cache = path.join(tmp, 'userns-templates');
    mkdirSync(path.join(source, 'etc'), { recursive: true });
    mkdirSync(path.join(source, 'bin'));
    writeFileSync(path.join(source, 'etc', 'passwd'), 'root:x:0:0::/root:/bin/sh\n');
    writeFileSync(path.join(source, 'bin', 'busybox'), 'elf');
    symlinkSync('busybox', path.join(source, 'bin', 'sh'));
  });
  afterEach(() => rmSync(tmp, { recursive: true, force: true }));

  rootIt("makes one copy owned in the range, once; the template stays host root's", async () => {
    const t = new ShiftedTemplates(cache, R, log);
    const [a, b] = await Promise.all([t.rootfsFor(source), t.rootfsFor(source)]);
    expect(a).toBe(b);
    expect(a.startsWith(`${cache}/`)).toBe(true);
    expect(owner(a)).toBe('100000:100000');
    expect(owner(path.join(a, 'etc', 'passwd'))).toBe('100000:100000');
    expect(lstatSync(path.join(a, 'bin', 'sh')).isSymbolicLink()).toBe(true);
    expect(owner(path.join(a, 'bin', 'sh'))).toBe('100000:100000');
    expect(owner(path.join(source, 'etc', 'passwd'))).toBe('0:0');
    // persisted: a new instance (a restarted supervisor) finds it and copies nothing
    writeFileSync(path.join(a, 'marker'), 'kept');
    expect(await new ShiftedTemplates(cache, R, log).rootfsFor(source)).toBe(a);
    expect(existsSync(path.join(a, 'marker'))).toBe(true);
    expect(readdirSync(cache).filter((n) => n.startsWith('.tmp-'))).toEqual([]);
  });

  rootIt('a rebuilt template (a new tree renamed into place) gets a new copy; the old unmounted copy is removed', async () => {
    const t = new ShiftedTemplates(cache, R, log);
    const first = await t.rootfsFor(source);
    const next = path.join(tmp, 'templates', 'base', '.rootfs.tmp');
    mkdirSync(path.join(next, 'etc'), { recursive: true });
    writeFileSync(path.join(next, 'etc', 'passwd'), 'new\n');
    renameSync(source, path.join(tmp, 'old'));
    renameSync(next, source);
    const second = await t.rootfsFor(source);
    expect(second).not.toBe(first);
    expect(existsSync(first)).toBe(false);
    expect(readdirSync(cache)).toHaveLength(1);
  });

  it('a template that does not exist fails and leaves nothing', async () => {
    const t = new ShiftedTemplates(cache, R, log);
    await expect(t.rootfsFor(path.join(tmp, 'nope'))).rejects.toThrow(/ENOENT/);
    expect(existsSync(cache) ? readdirSync(cache) : []).toEqual([]);
  });
});

describe('makeTraversable (the run dir and the dirs above it)', () => {
  let tmp: string;
  beforeEach(() => {
    tmp = mkdtempSync(path.join(os.tmpdir(), 'sandnode-traverse-'));
    chmodSync(tmp, 0o755);
  });
  afterEach(() => rmSync(tmp, { recursive: true, force: true }));

  rootIt('a 0700 parent keeps its mode bits: the range root alone is let through by an ACL entry, nobody still cannot pass', () => {
    const home = path.join(tmp, 'home');
    mkdirSync(path.join(home, 'run'), { recursive: true, mode: 0o700 });
    chmodSync(home, 0o700);
    writeFileSync(path.join(home, 'notes'), 'x', { mode: 0o644 });
    makeTraversable(path.join(home, 'run'), R, log);
    expect(statSync(home).mode & 0o007).toBe(0); // others: nothing
    expect(spawnSync('getfacl', ['-cp', home], { encoding: 'utf8' }).stdout).toMatch(/^user:100000:--x$/m);
    expect(spawnSync('test', ['-x', home], { uid: R.hostId, gid: R.hostId }).status).toBe(0);
    expect(spawnSync('cat', [path.join(home, 'notes')], { uid: 65534, gid: 65534 }).status).not.toBe(0);
  });

  rootIt('without setfacl a 0700 parent is left 0700 and named in a ConfigError; the run dir below it is not touched', () => {
    const home = path.join(tmp, 'home');
    mkdirSync(path.join(home, 'run'), { recursive: true, mode: 0o700 });
    chmodSync(home, 0o700);
    const noSetfacl = path.join(tmp, 'no-such-bin', 'setfacl');
    expect(() => makeTraversable(path.join(home, 'run'), R, log, noSetfacl)).toThrow(ConfigError);
    expect(() => makeTraversable(path.join(home, 'run'), R, log, noSetfacl)).toThrow(
      new RegExp(`key "runDir": ${home} \\(on the way to .*mode 0700\\) does not let .*host uid 100000.*setfacl -m u:100000:x ${home}`),
    );
    expect(statSync(home).mode & 0o7777).toBe(0o700);
    expect(statSync(path.join(home, 'run')).mode & 0o7777).toBe(0o700);
  });

  rootIt('parents the range root may pass (o+x; its group with g+x) are left as they are; the run dir itself gets o+x', () => {
    const grp = path.join(tmp, 'grp');
    mkdirSync(path.join(grp, 'run'), { recursive: true });
    chownSync(grp, 0, R.hostId);
    chmodSync(grp, 0o710);
    chmodSync(path.join(grp, 'run'), 0o700);
    makeTraversable(path.join(grp, 'run'), R, log);
    expect(statSync(grp).mode & 0o7777).toBe(0o710);
    expect(statSync(path.join(grp, 'run')).mode & 0o7777).toBe(0o701);
    // the range root can now reach a file below the run dir by name
    writeFileSync(path.join(grp, 'run', 'f'), 'x', { mode: 0o644 });
    expect(execFileSync('cat', [path.join(grp, 'run', 'f')], { uid: R.hostId, gid: R.hostId, encoding: 'utf8' })).toBe('x');
  });
});
