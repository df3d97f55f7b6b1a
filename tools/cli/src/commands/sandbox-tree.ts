/**
 * Recursive `sandnode sandbox cp` of directories, both ways, like `kubectl cp`: a directory
 * SRC is copied as DST when DST does not exist, or into DST (as DST/<name of SRC>) when it is a
 * directory. Regular files stream (sandbox-files.ts), directories keep their modes, symlinks are
 * copied as symlinks (their targets stored, never followed on either side), other entries
 * (FIFOs, sockets, devices) are skipped and counted. `--resume` continues every file from the
 * size its copy has (a finished file sends nothing). Out of a sandbox every name comes from the
 * sandbox: the host side writes only through directory fds without following symlinks
 * (local-beneath.ts). Into a sandbox the server and podd do the same below /workspace
 * (CreateDirectory, CreateSymlink, UploadFile; feature "server.files.tree.v1").
 */
import { lstat, readdir, readlink, stat } from 'node:fs/promises';
import path from 'node:path';
import { ClientError, Status } from 'nice-grpc-common';
import { FileType } from '@sandnode/shared/proto/server/v1/files';
import type { ServerApi } from '@sandnode/node-stack';
import { CliError } from '../output';
import type { FileHandle } from 'node:fs/promises';
import { makeSymlink, openRoot, openSubdir } from './local-beneath';
import { listAll, receiveInto, sendFile, type RemoteSpec } from './sandbox-files';

/** What a recursive copy did. */
export interface TreeResult {
  source: string;
  destination: string;
  files: number;
  directories: number;
  symlinks: number;
  /** FIFOs, sockets, devices (and symlinks an older podd did not describe): not copied */
  skipped: number;
  /** bytes of all files after the copy */
  bytes: number;
  /** bytes moved by this run */
  bytesSent: number;
  durationMs: number;
  /** bytesSent / duration, 10^6 bytes per second */
  mbPerSec: number;
}

const rate = (bytes: number, ms: number) => Math.round((bytes / 1e3 / Math.max(ms, 1)) * 10) / 10;

function tally(source: string, destination: string): TreeResult {
  return { source, destination, files: 0, directories: 0, symlinks: 0, skipped: 0, bytes: 0, bytesSent: 0, durationMs: 0, mbPerSec: 0 };
}

/** The most directory levels a copy descends (a sandbox can nest deeper than any real tree). */
export const MAX_TREE_DEPTH = 256;

/**
 * downloadTree copies directory r of the sandbox to local dst (see the file comment). Errors:
 * CliError (a name that is not a file name, a symlink or non-directory in the way, deeper than
 * MAX_TREE_DEPTH), the calls' ClientError.
 */
export async function downloadTree(api: ServerApi, r: RemoteSpec, dst: string, o: { resume?: boolean }): Promise<TreeResult> {
  const t0 = Date.now();
  // dst is the user's own path: followed as given (only what is below it is walked without following)
  const local = await stat(dst).catch(() => undefined);
  const into = local?.isDirectory() === true || dst.endsWith('/');
  const target = into ? path.join(dst, path.posix.basename(path.posix.normalize(r.path || '/workspace'))) : dst;
  const res = tally(`${r.sandboxId}:${r.path}`, target);
  const root = await openRoot(path.dirname(target));
  try {
    const top = await api.sandboxes.statFile({ sandboxId: r.sandboxId, path: r.path });
    const walk = async (dir: FileHandle, name: string, remote: string, shown: string, mode: number, depth: number): Promise<void> => {
      if (depth > MAX_TREE_DEPTH) throw new CliError(`${shown}: more than ${MAX_TREE_DEPTH} directory levels; stopped`);
      const here = await openSubdir(dir, name, shown, true);
      res.directories++;
      try {
        for (const e of await listAll(api, r.sandboxId, remote)) {
          const rp = path.posix.join(remote, e.name);
          const lp = path.join(shown, e.name);
          if (e.type === FileType.FILE_TYPE_DIRECTORY) {
            await walk(here, e.name, rp, lp, e.mode, depth + 1);
          } else if (e.type === FileType.FILE_TYPE_REGULAR) {
            const got = await receiveInto(api, { sandboxId: r.sandboxId, path: rp }, here, e.name, lp, { resume: o.resume, mode: e.mode & 0o777, quiet: true });
            res.files++;
            res.bytes += got.bytes;
            res.bytesSent += got.bytesSent;
          } else if (e.type === FileType.FILE_TYPE_SYMLINK && e.linkTarget) {
            await makeSymlink(here, e.name, e.linkTarget, lp);
            res.symlinks++;
          } else {
            res.skipped++;
          }
        }
        // the mode last (through the fd: never a path), so a directory without write permission is filled first
        await here.chmod(mode & 0o777);
      } finally {
        await here.close();
      }
    };
    const topMode = (top.info?.mode ?? 0o755) & 0o777;
    await walk(root, path.basename(target), r.path, target, topMode, 0);
  } catch (err) {
    if (err instanceof ClientError && err.code === Status.UNIMPLEMENTED)
      throw new CliError(`the server or the sandbox's podd lacks the file calls a directory copy needs: ${err.details}`, { cause: err });
    throw err;
  } finally {
    await root.close();
  }
  res.durationMs = Date.now() - t0;
  res.mbPerSec = rate(res.bytesSent, res.durationMs);
  return res;
}

/**
 * uploadTree copies local directory src into the sandbox at r (see the file comment). Local
 * symlinks are copied as symlinks (never followed). Errors: the calls' ClientError (a symlink
 * below /workspace in the way is FAILED_PRECONDITION), CliError.
 */
export async function uploadTree(api: ServerApi, src: string, r: RemoteSpec, o: { resume?: boolean }): Promise<TreeResult> {
  const t0 = Date.now();
  let there;
  try {
    there = (await api.sandboxes.statFile({ sandboxId: r.sandboxId, path: r.path })).info;
  } catch (err) {
    if (!(err instanceof ClientError && err.code === Status.NOT_FOUND)) throw err;
  }
  const into = there?.type === FileType.FILE_TYPE_DIRECTORY || r.path.endsWith('/');
  const top = into ? path.posix.join(r.path || '/workspace', path.basename(path.resolve(src))) : r.path;
  const res = tally(src, `${r.sandboxId}:${top}`);
  const walk = async (local: string, remote: string, depth: number): Promise<void> => {
    if (depth > MAX_TREE_DEPTH) throw new CliError(`${local}: more than ${MAX_TREE_DEPTH} directory levels; stopped`);
    const st = await lstat(local);
    await api.sandboxes.createDirectory({ sandboxId: r.sandboxId, path: remote, mode: st.mode & 0o777 });
    res.directories++;
    const names = (await readdir(local)).sort();
    for (const name of names) {
      const lp = path.join(local, name);
      const rp = path.posix.join(remote, name);
      const est = await lstat(lp);
      if (est.isDirectory()) {
        await walk(lp, rp, depth + 1);
      } else if (est.isFile()) {
        const dest = { sandboxId: r.sandboxId, path: rp };
        let cur;
        if (o.resume) {
          try {
            cur = (await api.sandboxes.statFile(dest)).info;
          } catch (err) {
            if (!(err instanceof ClientError && err.code === Status.NOT_FOUND)) throw err;
          }
        }
        const sent = await sendFile(api, lp, est, dest, cur, { resume: o.resume, quiet: true });
        res.files++;
        res.bytes += sent.bytes;
        res.bytesSent += sent.bytesSent;
      } else if (est.isSymbolicLink()) {
        await api.sandboxes.createSymlink({ sandboxId: r.sandboxId, path: rp, target: await readlink(lp), replace: true });
        res.symlinks++;
      } else {
        res.skipped++;
      }
    }
  };
  try {
    await walk(src, top, 0);
  } catch (err) {
    if (err instanceof ClientError && err.code === Status.UNIMPLEMENTED)
      throw new CliError(`the server or the sandbox's podd lacks the file calls a directory copy needs: ${err.details}`, { cause: err });
    throw err;
  }
  res.durationMs = Date.now() - t0;
  res.mbPerSec = rate(res.bytesSent, res.durationMs);
  return res;
}

/** isLocalDir: src is a directory (lstat: a symlink to one is not). */
export async function isLocalDir(src: string): Promise<boolean> {
  return (await lstat(src).catch(() => undefined))?.isDirectory() === true;
}
