/**
 * The user namespace of runc sandboxes (issue 10 §2): one node-wide range, like Docker's
 * `userns-remap`. uid/gid 0..size-1 inside every sandbox are host uid/gid hostId..hostId+size-1,
 * so root inside is an unprivileged host user, and everything a sandbox reads or writes as its
 * own is owned in that range on the host:
 *
 *   - the template lower: a shifted copy of the template rootfs (made once per template build,
 *     kept in `<stateDir>/vmm-supervisor/userns-templates/`, see {@link ShiftedTemplates});
 *   - the roots of its upper dir and workspace (a fresh drive's root is host root's; the drive
 *     of a sandbox that ran without the namespace is shifted once, {@link shiftTreeIntoRange}).
 *
 * Why one range and not one per sandbox with idmapped mounts: see docs/security.md ("User
 * namespace").
 *
 * Every walk of a tree a sandbox has written goes fd by fd without following a symlink
 * (beneath.ts): the tree is the attacker's, the ownership change must stay inside it.
 */
import { spawnSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import {
  chmodSync,
  chownSync,
  closeSync,
  constants as fsc,
  fchmodSync,
  fchownSync,
  fstatSync,
  lchownSync,
  lstatSync,
  mkdirSync,
  openSync,
  readdirSync,
  readFileSync,
  renameSync,
  rmSync,
  statSync,
  writeFileSync,
} from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import path from 'node:path';
import { ConfigError, InternalError, run } from '@sandnode/shared';
import type { Logger } from '@sandnode/shared';
import { openDirNoFollow, openRootDir } from './beneath';

/** The default of config key `usernsRange`: host 100000..165535 are 0..65535 inside (Docker's usual subuid range). */
export const DEFAULT_USERNS_RANGE = '100000:65536';
/** Deepest directory nesting a shift walks (each level holds an fd); a deeper tree fails the shift (INTERNAL). */
export const MAX_SHIFT_DEPTH = 2048;
/** Longest the copy of one template rootfs may take, in ms. */
export const COPY_TIMEOUT_MS = 300_000;
/** Dir of the shifted template copies in `<stateDir>/vmm-supervisor/`. */
export const USERNS_TEMPLATES_DIR = 'userns-templates';
/** Temp trees of a shifted copy older than this are left by a crashed supervisor and removed, in ms. */
export const STALE_SHIFT_TMP_MS = 10 * 60 * 1000;

/** UsernsRange: host ids hostId..hostId+size-1 are ids 0..size-1 inside (uid and gid alike). */
export interface UsernsRange {
  hostId: number;
  size: number;
}

/**
 * parseUsernsRange reads config key `usernsRange` ("<hostId>:<size>", "" = no user namespace).
 * size is at least 65536 (so uid 65534 "nobody" exists inside) and hostId at least size (so a
 * shifted id never falls back into 0..size-1: a shift is idempotent); hostId+size fits 32 bits.
 * Throws ConfigError naming the key.
 */
export function parseUsernsRange(raw: string): UsernsRange | undefined {
  if (raw === '') return undefined;
  const m = /^(\d{1,10}):(\d{1,10})$/.exec(raw);
  const bad = (why: string) => new ConfigError(`key "usernsRange": ${JSON.stringify(raw)} ${why}`);
  if (!m) throw bad('must be "<hostId>:<size>" (e.g. "100000:65536") or "" for no user namespace');
  const hostId = Number(m[1]);
  const size = Number(m[2]);
  if (size < 65536) throw bad('has a size below 65536');
  if (hostId < size) throw bad('starts below its size (the host ids must not overlap 0..size-1)');
  if (hostId + size > 0xffffffff) throw bad('ends beyond uid 4294967294');
  return { hostId, size };
}

/** inRange says whether host id is one of the range's. */
export function inRange(id: number, r: UsernsRange): boolean {
  return id >= r.hostId && id < r.hostId + r.size;
}

/** shifted is the host id of id (0..size-1 inside) in the range; ids outside 0..size-1 stay. */
function shifted(id: number, r: UsernsRange): number {
  return id < r.size ? id + r.hostId : id;
}

/** What a shift did: entries seen, entries whose owner changed, entries left (owner outside 0..size-1 and outside the range). */
export interface ShiftReport {
  entries: number;
  changed: number;
  left: number;
}

const at = (dirFd: number, name: string) => `/proc/self/fd/${dirFd}/${name}`;

/** fixOwner chowns the inode behind fd (its stat st) into the range; a setuid/setgid mode that chown cleared is put back. */
function fixOwnerFd(fd: number, st: { uid: number; gid: number; mode: number }, r: UsernsRange, rep: ShiftReport): void {
  rep.entries++;
  if (inRange(st.uid, r) && inRange(st.gid, r)) return;
  const uid = shifted(st.uid, r);
  const gid = shifted(st.gid, r);
  if (uid === st.uid && gid === st.gid) {
    rep.left++;
    return;
  }
  fchownSync(fd, uid, gid);
  if (st.mode & 0o6000) fchmodSync(fd, st.mode & 0o7777); // chown(2) clears S_ISUID/S_ISGID
  rep.changed++;
}

function walk(dirFd: number, r: UsernsRange, rep: ShiftReport, depth: number): void {
  if (depth > MAX_SHIFT_DEPTH) throw new InternalError(`shift into the user namespace range: directories nest deeper than ${MAX_SHIFT_DEPTH}`);
  for (const name of readdirSync(`/proc/self/fd/${dirFd}`)) {
    const p = at(dirFd, name);
    const st = lstatSync(p); // never follows the final component
    if (st.isDirectory()) {
      const sub = openDirNoFollow(dirFd, name);
      try {
        walk(sub, r, rep, depth + 1);
        fixOwnerFd(sub, fstatSync(sub), r, rep);
      } finally {
        closeSync(sub);
      }
    } else if (st.isFile()) {
      // open without following and check it is still the file lstat saw (no swap in between)
      const fd = openSync(p, fsc.O_RDONLY | fsc.O_NOFOLLOW | fsc.O_NONBLOCK | fsc.O_NOCTTY);
      try {
        const fst = fstatSync(fd);
        if (!fst.isFile() || fst.ino !== st.ino || fst.dev !== st.dev) throw new InternalError(`shift: ${name} changed while it was shifted`);
        fixOwnerFd(fd, fst, r, rep);
      } finally {
        closeSync(fd);
      }
    } else {
      // symlink, fifo, socket, device node (an overlay whiteout): lchown(2) never follows
      rep.entries++;
      if (inRange(st.uid, r) && inRange(st.gid, r)) continue;
      const uid = shifted(st.uid, r);
      const gid = shifted(st.gid, r);
      if (uid === st.uid && gid === st.gid) {
        rep.left++;
        continue;
      }
      lchownSync(p, uid, gid);
      rep.changed++;
    }
  }
}

/**
 * shiftTreeIntoRange chowns every entry of the tree at root whose uid/gid is 0..size-1 to the
 * same id in the range (uid + hostId), directories after their contents and root last, so a
 * tree whose root is in the range is whole (a crash half way is finished by the next call;
 * entries already in the range are left: the shift is idempotent). Never follows a symlink
 * (fd-relative walk, lchown for what is not a file or directory); setuid/setgid bits are kept.
 * Hardlinks need no care: a drive is its own file system. The sandbox must not run meanwhile.
 * Errors: UnsafePathError when root is a symlink; InternalError when a file changes under the
 * walk or the tree nests deeper than MAX_SHIFT_DEPTH; fs errors.
 */
export function shiftTreeIntoRange(root: string, r: UsernsRange): ShiftReport {
  const rep: ShiftReport = { entries: 0, changed: 0, left: 0 };
  const fd = openRootDir(root);
  try {
    walk(fd, r, rep, 0);
    fixOwnerFd(fd, fstatSync(fd), r, rep);
  } finally {
    closeSync(fd);
  }
  return rep;
}

/**
 * ensureTreeInRange makes the tree at root (a sandbox's upper dir or workspace root) the
 * range's: nothing when its root is owned in the range (it was made or shifted before; the
 * sandbox may have chowned it within its range since); a shift of the whole tree when its root
 * is owned by a host id 0..size-1 (a fresh drive, or one a sandbox used without the namespace);
 * returns undefined (nothing done) when the root's owner is outside both (another range: the
 * config changed), for the caller to log.
 */
export function ensureTreeInRange(root: string, r: UsernsRange): ShiftReport | undefined {
  const st = lstatSync(root);
  if (inRange(st.uid, r)) return { entries: 1, changed: 0, left: 0 };
  if (st.uid >= r.size) return undefined;
  return shiftTreeIntoRange(root, r);
}

/**
 * makeTraversable lets the range's root (host uid r.hostId) pass runDir on its way to
 * `<runDir>/vms/<id>/rootfs` and the bind sources below runDir: runc's init runs as that user
 * and resolves those paths itself. runDir, the node's own dir, gets o+x (never read) if it
 * lacks it. Its ancestors' mode bits are NOT changed (issue 10: `sandnode up` in a 0700 /root
 * must not open /root to every local user): one that does not let that uid pass (its owner or
 * group with x, o+x, or an ACL: checked as that uid with `test -x`) gets an ACL entry for that
 * uid alone (`setfacl -m u:<hostId>:x`, logged at warn), as Docker needs its root dir passable
 * under userns-remap. Where that cannot be done (no setfacl, a file system without ACLs) throws
 * ConfigError naming key "runDir", the dir, its owner and mode, and the fixes. setfacl: the
 * binary (tests name a missing one).
 */
export function makeTraversable(runDir: string, r: UsernsRange, log: Logger, setfacl = 'setfacl'): void {
  const own = path.resolve(runDir);
  const ancestors: string[] = [];
  for (let d = path.dirname(own); ; d = path.dirname(d)) {
    ancestors.unshift(d);
    if (d === path.dirname(d)) break;
  }
  for (const d of ancestors) {
    const st = statSync(d);
    if (rangeRootMayPass(st, r)) continue;
    if (rangeRootPasses(d, r)) continue; // an ACL grants it
    // grant search to that one uid by an ACL entry (the mode bits others see stay as they are), then check it took
    const acl = spawnSync(setfacl, ['-m', `u:${r.hostId}:x`, d], { stdio: ['ignore', 'ignore', 'pipe'], encoding: 'utf8' });
    if (acl.status === 0 && rangeRootPasses(d, r)) {
      log.warn(
        { dir: d, uid: r.hostId },
        `a parent of the run dir did not let the root of the sandboxes' user namespace pass: granted that uid alone search (setfacl -m u:${r.hostId}:x); other users still cannot pass`,
      );
      continue;
    }
    const mode = (st.mode & 0o7777).toString(8).padStart(4, '0');
    throw new ConfigError(
      `key "runDir": ${d} (on the way to ${own}; owner uid ${st.uid}, gid ${st.gid}, mode ${mode}) does not let the root of the sandboxes' user namespace (host uid ${r.hostId}) pass, ` +
        `and runc starts each sandbox as that user from ${path.join(own, 'vms', '<id>', 'rootfs')}: choose a runDir whose every parent has o+x (e.g. /run/sandnode), ` +
        `or let that uid alone pass: setfacl -m u:${r.hostId}:x ${d} (package acl), or chmod o+x ${d} (every local user may then pass), or set usernsRange "" (no user namespace)`,
    );
  }
  const mode = statSync(own).mode & 0o7777;
  if (mode & 0o001) return;
  chmodSync(own, mode | 0o001);
  log.info({ dir: own, mode: (mode | 0o001).toString(8) }, 'made the run dir traversable (o+x) for sandboxes in a user namespace');
}

/** rangeRootPasses asks the kernel whether host uid r.hostId may search dir (mode bits and ACLs): `test -x` run as that uid. */
function rangeRootPasses(dir: string, r: UsernsRange): boolean {
  return spawnSync('test', ['-x', dir], { uid: r.hostId, gid: r.hostId, stdio: 'ignore' }).status === 0;
}

/** rangeRootMayPass says whether the mode bits of st give search permission to host uid/gid r.hostId. */
function rangeRootMayPass(st: { uid: number; gid: number; mode: number }, r: UsernsRange): boolean {
  if (st.uid === r.hostId) return (st.mode & 0o100) !== 0;
  if (st.gid === r.hostId) return (st.mode & 0o010) !== 0;
  return (st.mode & 0o001) !== 0;
}

/**
 * openToRange makes a host dir (not the sandbox's) root:<range root gid> with mode (default
 * 0710: the range's root may pass, not list; 0750 lets it list too).
 */
export function openToRange(dir: string, r: UsernsRange, mode = 0o710): void {
  chownSync(dir, 0, r.hostId);
  chmodSync(dir, mode);
}

/** lchownIntoRange makes the host-made entry at p (not followed) owned by the range's root (hostId:hostId). */
export function lchownIntoRange(p: string, r: UsernsRange): void {
  lchownSync(p, r.hostId, r.hostId);
}

/**
 * ShiftedTemplates keeps one copy per template rootfs owned in the range, under dir:
 *
 *   <dir>/<key>/rootfs        the copy (`cp -a`, then {@link shiftTreeIntoRange})
 *   <dir>/<key>/source.json   { source, dev, ino, ctimeMs, hostId, size }
 *
 * key hashes the template rootfs path, its inode and ctime (a rebuild renames a new tree into
 * place: a new key) and the range. The copy is made in `<dir>/.tmp-*` and renamed into place,
 * so `<dir>/<key>` is whole or absent; once made, a create only stats the source. Copies of an
 * older build of the same path are removed once no overlay mount uses them.
 */
export class ShiftedTemplates {
  private readonly making = new Map<string, Promise<string>>();

  constructor(
    private readonly dir: string,
    private readonly range: UsernsRange,
    private readonly log: Logger,
  ) {}

  /**
   * rootfsFor returns the shifted copy of the template rootfs at source, making it first when
   * missing (one copy at a time per key). Errors: InternalError when the copy fails (nothing is
   * left); fs errors of source (ENOENT).
   */
  async rootfsFor(source: string): Promise<string> {
    const st = statSync(source);
    const id = { source: path.resolve(source), dev: st.dev, ino: st.ino, ctimeMs: Math.trunc(st.ctimeMs), hostId: this.range.hostId, size: this.range.size };
    const key = createHash('sha256').update(JSON.stringify(id)).digest('hex').slice(0, 32);
    const final = path.join(this.dir, key);
    const rootfs = path.join(final, 'rootfs');
    try {
      if (lstatSync(rootfs).isDirectory()) return rootfs;
    } catch {
      /* not made yet */
    }
    let p = this.making.get(key);
    if (!p) {
      p = this.make(id, final).finally(() => this.making.delete(key));
      this.making.set(key, p);
    }
    return p;
  }

  private async make(id: { source: string } & Record<string, unknown>, final: string): Promise<string> {
    mkdirSync(this.dir, { recursive: true, mode: 0o700 });
    this.removeStaleTemps();
    const t0 = Date.now();
    const tmp = await mkdtemp(path.join(this.dir, '.tmp-'));
    try {
      // once per template build: the fork of the supervisor this costs is paid once, not per create
      await run('cp', ['-a', '--', id.source, path.join(tmp, 'rootfs')], { timeoutMs: COPY_TIMEOUT_MS });
      const rep = shiftTreeIntoRange(path.join(tmp, 'rootfs'), this.range);
      writeFileSync(path.join(tmp, 'source.json'), `${JSON.stringify(id)}\n`, { mode: 0o600 });
      try {
        renameSync(tmp, final);
      } catch (err) {
        const code = (err as NodeJS.ErrnoException).code;
        if (code !== 'ENOTEMPTY' && code !== 'EEXIST') throw err; // else another supervisor made it meanwhile
        await rm(tmp, { recursive: true, force: true });
      }
      this.log.info({ template: id.source, copy: final, entries: rep.entries, changed: rep.changed, ms: Date.now() - t0 }, 'template rootfs copied into the user namespace range');
    } catch (err) {
      await rm(tmp, { recursive: true, force: true });
      throw new InternalError(`copy template ${id.source} into the user namespace range: ${(err as Error).message}`);
    }
    this.removeOlderCopies(id.source, final);
    return path.join(final, 'rootfs');
  }

  /** removeStaleTemps removes `.tmp-*` trees a crashed supervisor left (older than STALE_SHIFT_TMP_MS). */
  private removeStaleTemps(): void {
    for (const name of readdirSync(this.dir)) {
      if (!name.startsWith('.tmp-')) continue;
      const p = path.join(this.dir, name);
      try {
        if (Date.now() - lstatSync(p).mtimeMs > STALE_SHIFT_TMP_MS) rmSync(p, { recursive: true, force: true });
      } catch {
        /* gone meanwhile */
      }
    }
  }

  /** removeOlderCopies removes the copies of source other than keep that no mounted overlay uses as its lower. */
  private removeOlderCopies(source: string, keep: string): void {
    const mountinfo = readFileSync('/proc/self/mountinfo', 'utf8');
    for (const name of readdirSync(this.dir)) {
      const p = path.join(this.dir, name);
      if (name.startsWith('.') || p === keep) continue;
      try {
        const id = JSON.parse(readFileSync(path.join(p, 'source.json'), 'utf8')) as { source?: string };
        if (id.source !== source || mountinfo.includes(`lowerdir=${path.join(p, 'rootfs')}`)) continue;
        rmSync(p, { recursive: true, force: true });
        this.log.info({ template: source, copy: p }, 'older shifted template copy removed');
      } catch {
        /* not a copy, or gone meanwhile */
      }
    }
  }
}
