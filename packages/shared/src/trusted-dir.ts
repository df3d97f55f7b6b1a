/**
 * The node's own dirs (stateDir, runDir) must be root's, like sshd's StrictModes and Docker's
 * root dir (issue 10, docs/security.md "Node dirs"): whoever may write a dir on the way can
 * rename the root-only sockets and files in it away and put their own in their place (the
 * vmm-supervisor's socket, the server's settings file with the TLS CA path).
 */
import { lstatSync, mkdirSync, realpathSync, type Stats } from 'node:fs';
import path from 'node:path';
import { ConfigError } from './config';

/** The mode bit of a sticky dir (/tmp is 1777): only an entry's owner may rename or remove it. */
const STICKY = 0o1000;
/** Group- and other-write bits of a mode. */
const GO_WRITE = 0o022;

/** A dir to check and the config key it comes from (for the message). */
export interface TrustedDir {
  key: string;
  dir: string;
}

/**
 * checkTrustedDir throws ConfigError (naming key, the offending path, its owner and mode, and
 * the fix) unless dir and each of its ancestors is owned by uid 0 and writable by nobody else:
 * no group or other write bit, except on an ANCESTOR with the sticky bit (/tmp). A symlink on
 * the way must be root's too; it is resolved (realpath) and its target checked the same way.
 * A dir that does not exist yet is fine if its nearest existing ancestor passes (its creator
 * checks again once it made it). Throws the fs error of anything but ENOENT/ENOTDIR.
 */
export function checkTrustedDir(key: string, dir: string): void {
  const abs = path.resolve(dir);
  walk(key, abs, abs, false);
  const real = nearestReal(abs);
  if (real !== undefined && real !== abs) walk(key, abs, real, true);
}

/** checkTrustedDirs runs {@link checkTrustedDir} on each dir (throws ConfigError on the first that fails). */
export function checkTrustedDirs(dirs: TrustedDir[]): void {
  for (const d of dirs) checkTrustedDir(d.key, d.dir);
}

/**
 * prepareTrustedDirs makes a node's runDir (missing parents with the default mode: the
 * sandboxes' user namespace root must pass them) and stateDir (0700) when missing, THEN checks
 * both ({@link checkTrustedDirs}, keys "runDir" and "stateDir"): a dir that did not exist at a
 * check may be made by another user below a sticky /tmp before it is made here, so only a check
 * of what exists counts. runDir first, so that a missing parent both share is not made 0700.
 * Throws ConfigError, or the fs error of mkdir.
 */
export function prepareTrustedDirs(dirs: { stateDir: string; runDir: string }): void {
  mkdirSync(dirs.runDir, { recursive: true });
  mkdirSync(dirs.stateDir, { recursive: true, mode: 0o700 });
  checkTrustedDirs([
    { key: 'stateDir', dir: dirs.stateDir },
    { key: 'runDir', dir: dirs.runDir },
  ]);
}

/** walk checks every component of abs from / down (lstat, a symlink's own owner; what follows it through the link). */
function walk(key: string, given: string, abs: string, realOnly: boolean): void {
  const parts = abs.split(path.sep).filter((p) => p !== '');
  let cur: string = path.sep;
  const chain = [cur, ...parts.map((p) => (cur = path.join(cur, p)))];
  for (let i = 0; i < chain.length; i++) {
    const p = chain[i]!;
    const st = lstatOrUndefined(p);
    if (!st) return; // not made yet: what exists above was checked
    const final = i === chain.length - 1;
    if (st.isSymbolicLink()) {
      if (realOnly) throw refuse(key, given, p, st, 'is a symlink that changed while it was checked');
      if (st.uid !== 0) throw refuse(key, given, p, st, 'is a symlink owned by a user other than root (its owner can point it elsewhere)');
      continue;
    }
    if (!st.isDirectory()) throw refuse(key, given, p, st, 'is not a directory');
    if (st.uid !== 0) throw refuse(key, given, p, st, 'is not owned by root');
    if (st.mode & GO_WRITE && (final || !(st.mode & STICKY))) throw refuse(key, given, p, st, final ? 'is writable by group or others' : 'is writable by group or others and not sticky');
  }
}

/** nearestReal is realpath(abs), or of its nearest existing ancestor joined with the rest; undefined if none exists. */
function nearestReal(abs: string): string | undefined {
  let rest = '';
  for (let d = abs; ; d = path.dirname(d)) {
    try {
      return path.join(realpathSync(d), rest);
    } catch (err) {
      if (!isMissing(err)) throw err;
      if (d === path.dirname(d)) return undefined;
      rest = path.join(path.basename(d), rest);
    }
  }
}

function lstatOrUndefined(p: string): Stats | undefined {
  try {
    return lstatSync(p);
  } catch (err) {
    if (isMissing(err)) return undefined;
    throw err;
  }
}

function isMissing(err: unknown): boolean {
  const code = (err as NodeJS.ErrnoException).code;
  return code === 'ENOENT' || code === 'ENOTDIR';
}

function refuse(key: string, given: string, p: string, st: Stats, why: string): ConfigError {
  const mode = (st.mode & 0o7777).toString(8).padStart(4, '0');
  const where = p === given ? given : `${p} (on the way to ${given})`;
  return new ConfigError(
    `key "${key}": ${where} ${why} (owner uid ${st.uid}, gid ${st.gid}, mode ${mode}): the node's dirs and every dir above them must be root's and writable only by root ` +
      `(a sticky parent like /tmp aside), or another local user can swap the sockets and files in them; chown root:root and chmod go-w it, or choose a dir under one that is (e.g. /var/lib/sandnode, /run/sandnode)`,
  );
}
