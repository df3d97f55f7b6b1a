/**
 * Trusted config files (docs/security.md "Config files"): a daemon runs as root and takes its
 * settings (the TLS CA path, the node's dirs, the vmm-supervisor's socket ...) from a JSON file
 * and the slots beside it (`server.v2.json`, config.ts). Whoever may write that file, or rename
 * entries in a dir on its way, chooses root's settings: a local user who plants
 * `server.v2.json` beside a root config in /tmp has it read instead of `server.json`. So a
 * config file is read only when it and every dir on its way are the daemon's own, like sshd's
 * StrictModes (openssh auth.c `auth_secure_path`: owner root or the user, no group/other write,
 * checked from the file up to /).
 *
 * The rules, for the file as given and for its realpath (both chains are walked, lstat per
 * component):
 *   - every file, dir and symlink is owned by uid 0 or by the daemon's effective uid;
 *   - the file is a regular file, not group/other writable; it is opened with O_NOFOLLOW and
 *     checked by fstat on that fd (no swap between the check and the read), and the fd must be
 *     the file its path names once the dirs above it were checked;
 *   - the file's own dir is not group/other writable, not even sticky (a sticky dir still lets
 *     another user create a name that does not exist yet: the `server.v2.json` slot);
 *   - an ancestor may be group/other writable only when it is sticky AND root's (/tmp): then
 *     nobody but the owner of the next component (root or the daemon, checked) may rename it;
 *   - on a read-only mount the group/other write bits are not held against a component (nobody
 *     writes through that mount): Kubernetes ConfigMap volumes are a root symlink farm
 *     (`..data` -> `..2026_..`) on a read-only mount whose top dir is 0777. Owners still count,
 *     so a read-only bind of another user's dir (which they still write through its source) is
 *     refused.
 * A refusal is a {@link ConfigError} naming the path, why, its owner uid, gid and mode: the
 * daemon prints it and exits at start (EXIT_USAGE).
 */
import { closeSync, constants, fstatSync, lstatSync, openSync, readFileSync, realpathSync, type Stats } from 'node:fs';
import path from 'node:path';
import { ConfigError } from './config';

/** The mode bit of a sticky dir (/tmp is 1777): only an entry's owner may rename or remove it. */
const STICKY = 0o1000;
/** Group- and other-write bits of a mode. */
const GO_WRITE = 0o022;

/** The uids whose files a daemon trusts: root and its own effective uid. */
export function trustedUids(): number[] {
  const me = process.geteuid?.() ?? 0;
  return me === 0 ? [0] : [0, me];
}

/**
 * readTrustedFile is the text (utf8) of the config file `file` after the checks of this
 * module's doc: throws {@link ConfigError} naming the path, why and its owner uid / mode when
 * a check fails, or when the file cannot be opened (ENOENT, ELOOP for a symlink swapped in
 * after realpath ...). uids: the owners trusted (default {@link trustedUids}).
 */
export function readTrustedFile(file: string, uids: readonly number[] = trustedUids()): string {
  const abs = path.resolve(file);
  const mounts = readOnlyMounts();
  let real: string;
  try {
    checkChain(abs, abs, uids, mounts, true);
    real = realpathSync(abs);
  } catch (err) {
    if (err instanceof ConfigError) throw err;
    throw new ConfigError(`config file ${abs}: ${(err as Error).message}`);
  }
  let fd: number;
  try {
    // O_NONBLOCK: a FIFO planted under the name must not hang the start; it fails the isFile check
    fd = openSync(real, constants.O_RDONLY | constants.O_NOFOLLOW | constants.O_NONBLOCK);
  } catch (err) {
    throw new ConfigError(`config file ${abs}: ${(err as Error).message}`);
  }
  try {
    const st = fstatSync(fd);
    if (!st.isFile()) throw refuse(abs, real, st, 'is not a regular file');
    checkOwnerMode(abs, real, st, uids, mounts, 'file');
    checkChain(abs, real, uids, mounts, false);
    const now = lstatSync(real);
    if (now.dev !== st.dev || now.ino !== st.ino) throw refuse(abs, real, now, 'changed while it was checked');
    return readFileSync(fd, 'utf8');
  } catch (err) {
    if (err instanceof ConfigError) throw err;
    throw new ConfigError(`config file ${abs}: ${(err as Error).message}`);
  } finally {
    closeSync(fd);
  }
}

/**
 * checkChain lstats each dir from / down to the parent of p (and, when given, p itself when it
 * is a symlink): symlinks are allowed only on the given path (lexical; the real one has none).
 */
function checkChain(given: string, p: string, uids: readonly number[], mounts: ReadonlyMap<string, boolean>, lexical: boolean): void {
  const parts = p.split(path.sep).filter((s) => s !== '');
  let cur: string = path.sep;
  const chain = [cur, ...parts.map((s) => (cur = path.join(cur, s)))];
  const parent = chain.length - 2;
  for (let i = 0; i < chain.length; i++) {
    const c = chain[i]!;
    const final = i === chain.length - 1;
    const st = lstatSync(c); // ENOENT: the caller names the file
    if (st.isSymbolicLink()) {
      if (!lexical) throw refuse(given, c, st, 'is a symlink that appeared while it was checked');
      if (!uids.includes(st.uid)) throw refuse(given, c, st, `is a symlink owned by uid ${st.uid}, not by root or this daemon (its owner can point it elsewhere)`);
      continue;
    }
    if (final) return; // the file itself: checked on its fd
    if (!st.isDirectory()) throw refuse(given, c, st, 'is not a directory');
    checkOwnerMode(given, c, st, uids, mounts, i === parent ? 'own dir' : 'ancestor');
  }
}

/** checkOwnerMode: st (of c) is owned by a trusted uid and not group/other writable, per its role. */
function checkOwnerMode(given: string, c: string, st: Stats, uids: readonly number[], mounts: ReadonlyMap<string, boolean>, role: 'file' | 'own dir' | 'ancestor'): void {
  if (!uids.includes(st.uid)) throw refuse(given, c, st, `is owned by uid ${st.uid}, not by root or this daemon (its owner can change it)`);
  if (!(st.mode & GO_WRITE) || onReadOnlyMount(c, mounts)) return;
  if (role === 'ancestor' && st.mode & STICKY && st.uid === 0) return;
  const why =
    role === 'file'
      ? 'is writable by group or others'
      : role === 'own dir'
        ? `is writable by group or others${st.mode & STICKY ? ' (sticky or not: another user can create the config slots beside the file, e.g. server.v2.json)' : ''}`
        : 'is writable by group or others and not a sticky dir of root';
  throw refuse(given, c, st, why);
}

/** readOnlyMounts maps each mount point of /proc/self/mountinfo to whether it is read-only (per mount or per superblock). */
function readOnlyMounts(): Map<string, boolean> {
  const out = new Map<string, boolean>();
  let text: string;
  try {
    text = readFileSync('/proc/self/mountinfo', 'utf8');
  } catch {
    return out; // no /proc: nothing counts as read-only
  }
  for (const line of text.split('\n')) {
    const f = line.split(' ');
    const sep = f.indexOf('-');
    if (f.length < 7 || sep < 0) continue;
    const point = f[4]!.replace(/\\([0-7]{3})/g, (_, o: string) => String.fromCharCode(parseInt(o, 8)));
    const ro = f[5]!.split(',').includes('ro') || (f[sep + 3] ?? '').split(',').includes('ro');
    out.set(point, ro); // later lines are mounts on top: they win
  }
  return out;
}

/** onReadOnlyMount: the mount p is on (its longest mount point prefix) is read-only. */
function onReadOnlyMount(p: string, mounts: ReadonlyMap<string, boolean>): boolean {
  for (let d = p; ; d = path.dirname(d)) {
    const ro = mounts.get(d);
    if (ro !== undefined) return ro;
    if (d === path.dirname(d)) return false;
  }
}

function refuse(given: string, p: string, st: Stats, why: string): ConfigError {
  const mode = (st.mode & 0o7777).toString(8).padStart(4, '0');
  const where = p === given ? given : `${p} (on the way to ${given})`;
  return new ConfigError(
    `config file ${given}: refused: ${where} ${why} (owner uid ${st.uid}, gid ${st.gid}, mode ${mode}): a config file and every dir above it must be owned by root (or this daemon's uid) and writable by nobody else ` +
      `(an ancestor may be a sticky dir of root like /tmp), or another local user can choose this daemon's settings; chown root:root and chmod go-w it, or keep the config under a dir that is (e.g. /etc/sandnode)`,
  );
}
