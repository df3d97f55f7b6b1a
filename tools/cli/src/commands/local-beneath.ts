/**
 * The host side of `sandbox cp` out of a sandbox: every name below the directory the user
 * named comes from the sandbox (a listing, a symlink it made), so the receiver writes only
 * through directory fds, one component at a time, never following a symlink: a directory is
 * opened O_DIRECTORY | O_NOFOLLOW from its parent's fd, a file O_NOFOLLOW (and checked with
 * fstat), a symlink is made under a temp name and renamed into place (rename replaces a link,
 * never follows it). So a symlink the sandbox had copied out earlier (`d/x -> /etc`), or one
 * already in the target, cannot turn a later write (`d/x/passwd`, `--resume` of `d/x`) into a
 * write outside the target. Node has no openat(2): each step opens `/proc/self/fd/<fd>/<name>`
 * (the kernel resolves the fd's own directory, not a path that can be swapped), as podd's
 * walk.ts does. Errors: CliError naming the path and what was refused.
 */
import { randomBytes } from 'node:crypto';
import { constants as fsc, unlinkSync } from 'node:fs';
import { mkdir, open, readdir, rename, symlink, unlink, type FileHandle } from 'node:fs/promises';
import { processLiveness, processStartTicks } from '@sandnode/shared';
import { CliError } from '../output';

/** at is the path of name inside the directory fd holds. */
export const at = (fd: number, name: string): string => `/proc/self/fd/${fd}/${name}`;

/** The longest file name of Linux file systems (NAME_MAX), bytes. */
const NAME_MAX_BYTES = 255;

/** isEntryName: name is one directory entry's name (not empty, ".", "..", nor holding "/" or NUL, at most NAME_MAX bytes). */
export function isEntryName(name: string): boolean {
  return name !== '' && name !== '.' && name !== '..' && !name.includes('/') && !name.includes('\0') && Buffer.byteLength(name) <= NAME_MAX_BYTES;
}

function checkName(name: string, shown: string): void {
  if (!isEntryName(name)) throw new CliError(`${shown}: the sandbox named an entry ${JSON.stringify(name.slice(0, 100))}, which is not a file name; refused`);
}

/**
 * tempName is a new temp name beside name: `.<name><mark><12 hex>`, name cut at a character
 * boundary so the whole stays within NAME_MAX bytes.
 */
export function tempName(name: string, mark: string): string {
  const room = NAME_MAX_BYTES - 1 - mark.length - 12;
  let kept = '';
  for (const ch of name) {
    if (Buffer.byteLength(kept + ch) > room) break;
    kept += ch;
  }
  return `.${kept}${mark}${randomBytes(6).toString('hex')}`;
}

/**
 * The mark of a download's temp file: it names the CLI process (pid and start ticks), so that a
 * later copy to the same name removes the temp files of CLIs that are gone (kill -9 runs no
 * handler: before, each left a hidden file as large as what had arrived, for good).
 */
const DOWNLOAD_TEMP_MARK = `.sandnode-download-${process.pid}.${processStartTicks(process.pid) ?? 0}-`;
/** A download temp name and its owner: `.<name>.sandnode-download-<pid>.<start ticks>-<12 hex>`. */
const DOWNLOAD_TEMP_RE = /^\.(.*)\.sandnode-download-(\d+)\.(\d+)-[0-9a-f]{12}$/s;

/**
 * sweepDeadTemps removes, in dir, the download temp files of name whose CLI process is gone
 * (processLiveness by pid and start ticks; one that cannot be told is left). Unlinks by name
 * through dir's fd (never follows); never throws. Returns how many it removed.
 */
export async function sweepDeadTemps(dir: FileHandle, name: string): Promise<number> {
  const prefix = tempName(name, DOWNLOAD_TEMP_MARK).slice(0, -(DOWNLOAD_TEMP_MARK.length + 12));
  let removed = 0;
  let entries: string[];
  try {
    entries = await readdir(`/proc/self/fd/${dir.fd}`);
  } catch {
    return 0;
  }
  for (const e of entries) {
    const m = DOWNLOAD_TEMP_RE.exec(e);
    if (!m || `.${m[1]}` !== prefix) continue;
    if (processLiveness(Number(m[2]), Number(m[3])) !== 'gone') continue;
    try {
      await unlink(at(dir.fd, e));
      removed++;
    } catch {
      /* gone meanwhile, or not ours to remove */
    }
  }
  return removed;
}

/**
 * Temp files of downloads not committed yet, removed when the CLI is stopped by SIGINT or
 * SIGTERM (Node ends the process at once on those, so no `finally` runs): a cut plain copy
 * leaves nothing (newcomer: each ^C left a hidden file as large as what had arrived). The
 * handlers are installed while one is pending; after the cleanup the process exits with
 * 128 + the signal's number, as it would have.
 */
const pendingTemps = new Map<string, () => void>();
const SIGNAL_EXIT: Partial<Record<NodeJS.Signals, number>> = { SIGINT: 130, SIGTERM: 143, SIGHUP: 129 };

function onStopSignal(sig: NodeJS.Signals): void {
  for (const remove of pendingTemps.values()) remove();
  pendingTemps.clear();
  process.exit(SIGNAL_EXIT[sig] ?? 1);
}

/** pendTemp registers the cleanup of a temp file until the returned function is called. */
function pendTemp(key: string, remove: () => void): () => void {
  if (pendingTemps.size === 0) for (const sig of Object.keys(SIGNAL_EXIT) as NodeJS.Signals[]) process.on(sig, onStopSignal);
  pendingTemps.set(key, remove);
  return () => {
    pendingTemps.delete(key);
    if (pendingTemps.size === 0) for (const sig of Object.keys(SIGNAL_EXIT) as NodeJS.Signals[]) process.off(sig, onStopSignal);
  };
}

/** openRoot opens the directory the user named (followed as given: it is the user's own path). */
export async function openRoot(dir: string): Promise<FileHandle> {
  try {
    return await open(dir, fsc.O_RDONLY | fsc.O_DIRECTORY);
  } catch (err) {
    throw new CliError(`${dir}: ${(err as NodeJS.ErrnoException).code ?? (err as Error).message} (the directory to copy into)`);
  }
}

/**
 * openSubdir opens name in dir as a directory without following a symlink; create makes it
 * first (mode 0700 until the copy sets its own). Errors: CliError (a symlink or not a directory).
 */
export async function openSubdir(dir: FileHandle, name: string, shown: string, create: boolean): Promise<FileHandle> {
  checkName(name, shown);
  if (create) {
    try {
      await mkdir(at(dir.fd, name), { mode: 0o700 });
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw new CliError(`${shown}: mkdir: ${(err as NodeJS.ErrnoException).code ?? (err as Error).message}`);
    }
  }
  try {
    return await open(at(dir.fd, name), fsc.O_RDONLY | fsc.O_DIRECTORY | fsc.O_NOFOLLOW);
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    if (code === 'ENOTDIR' || code === 'ELOOP') throw new CliError(`${shown} is a symlink or not a directory here; not followed (nothing is written through it)`);
    throw new CliError(`${shown}: ${code ?? (err as Error).message}`);
  }
}

/** A file being received: write to fh; commit makes it the target (rename of the temp file), abort removes a temp file. */
export interface LocalFile {
  fh: FileHandle;
  /** bytes already in the file (the resume offset; 0 for a new copy) */
  size: number;
  commit(mode?: number): Promise<void>;
  abort(): Promise<void>;
}

/**
 * receiveFile opens name in dir for a download: without resume a new temp file beside it
 * (O_CREAT | O_EXCL, which never follows) that commit renames over name; with resume name
 * itself, read-write (the bytes it has are hashed for the sha256), O_NOFOLLOW, and only when it
 * is a regular file (fstat). Errors: CliError (a symlink,
 * a directory or other file at name).
 */
export async function receiveFile(dir: FileHandle, name: string, shown: string, resume: boolean): Promise<LocalFile> {
  checkName(name, shown);
  await sweepDeadTemps(dir, name);
  const target = resume ? name : tempName(name, DOWNLOAD_TEMP_MARK);
  let fh: FileHandle;
  try {
    fh = await open(at(dir.fd, target), (resume ? fsc.O_RDWR : fsc.O_WRONLY) | fsc.O_CREAT | fsc.O_NOFOLLOW | fsc.O_NONBLOCK | (resume ? 0 : fsc.O_EXCL), 0o600);
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    if (code === 'ELOOP') throw new CliError(`${shown} is a symlink; a copy out of a sandbox never writes through one (remove it, or copy without --resume to replace it)`);
    if (code === 'EISDIR') throw new CliError(`${shown} is a directory`);
    if (code === 'ENXIO') throw new CliError(`${shown} is not a regular file`);
    throw new CliError(`${shown}: ${code ?? (err as Error).message}`);
  }
  const st = await fh.stat();
  if (!st.isFile()) {
    await fh.close();
    throw new CliError(`${shown} is not a regular file`);
  }
  let open_ = true;
  const close = async () => {
    if (open_) await fh.close();
    open_ = false;
  };
  // the temp file goes with a ^C; a resumed file stays (a later --resume continues it)
  const unpend = resume
    ? () => undefined
    : pendTemp(`${dir.fd}/${target}`, () => {
        try {
          unlinkSync(at(dir.fd, target));
        } catch {
          /* gone already */
        }
      });
  return {
    fh,
    size: resume ? st.size : 0,
    async commit(mode?: number) {
      if (mode !== undefined) await fh.chmod(mode);
      await fh.sync();
      await close();
      if (!resume) {
        try {
          // rename(2) replaces a file or a symlink at name (never follows it); onto a directory it fails
          await rename(at(dir.fd, target), at(dir.fd, name));
        } catch (err) {
          await unlink(at(dir.fd, target)).catch(() => undefined);
          const code = (err as NodeJS.ErrnoException).code;
          throw new CliError(`${shown}: ${code === 'EISDIR' || code === 'ENOTEMPTY' ? 'is a directory; not replaced' : (code ?? (err as Error).message)}`);
        }
        await dir.sync();
      }
      // after the rename: a ^C before it still removes the temp file (after it, the name is gone)
      unpend();
    },
    async abort() {
      unpend();
      await close().catch(() => undefined);
      if (!resume) await unlink(at(dir.fd, target)).catch(() => undefined);
    },
  };
}

/** makeSymlink makes name in dir a symlink to target (stored, never followed here), replacing a file or symlink there. Errors: CliError (a directory at name). */
export async function makeSymlink(dir: FileHandle, name: string, target: string, shown: string): Promise<void> {
  checkName(name, shown);
  if (!target || target.includes('\0')) throw new CliError(`${shown}: the sandbox gave an empty symlink target; skipped`);
  const tmp = tempName(name, '.sandnode-link-');
  try {
    await symlink(target, at(dir.fd, tmp));
    await rename(at(dir.fd, tmp), at(dir.fd, name));
  } catch (err) {
    await unlink(at(dir.fd, tmp)).catch(() => undefined);
    const code = (err as NodeJS.ErrnoException).code;
    throw new CliError(`${shown}: ${code === 'EISDIR' || code === 'ENOTEMPTY' ? 'is a directory; the symlink was not made' : (code ?? (err as Error).message)}`);
  }
}
