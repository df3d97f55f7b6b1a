/**
 * The file commands of `sandnode sandbox`: `cp SRC DST` (a file: sandbox-files.ts; a directory,
 * recursively: sandbox-tree.ts), `ls ID [PATH]`, `stat ID PATH`.
 */
import type { Command } from 'commander';
import { FileType } from '@sandnode/shared/proto/server/v1/files';
import { dirsOf } from '../options';
import { action, CliError, print, UsageError } from '../output';
import { withServer } from '../server-calls';
import { download, infoJson, infoLine, listAll, parseRemote, statRemote, streamFailed, upload, type CopyResult, type RemoteSpec } from './sandbox-files';
import { downloadTree, isLocalDir, uploadTree, type TreeResult } from './sandbox-tree';

/** Below this many bytes sent a rate says nothing (a few KiB in 3 ms rounds to "0 MB/s"): the human line leaves it out; --json keeps mbPerSec. */
export const RATE_MIN_BYTES = 1_000_000;

/** rateText is ", N MB/s" for a copy that sent at least RATE_MIN_BYTES, else "". */
export function rateText(r: { bytesSent: number; mbPerSec: number }): string {
  return r.bytesSent >= RATE_MIN_BYTES ? `, ${r.mbPerSec} MB/s` : '';
}

/** registerFileCommands adds `cp`, `ls` and `stat` to the sandbox command group. */
export function registerFileCommands(sandbox: Command): void {
  sandbox
    .command('cp <src> <dst>')
    .description(
      'copy a file or directory into (cp ./d sb-ID:/workspace/d) or out of (cp sb-ID:/workspace/d ./d) a sandbox; any size, streamed; directories recursively with modes, symlinks as symlinks',
    )
    .option(
      '--resume',
      'write in place and continue each file from the size its target has: a cut cp --resume continues where it stopped (a plain cp writes a temp file, so a cut one leaves nothing to continue)',
    )
    .option('--json', 'print the result as JSON (bytes, sha256, rate)')
    .action(
      action(async (src: string, dst: string, o: { resume?: boolean; json?: boolean }, cmd: Command) => {
        const from = parseRemote(src);
        const to = parseRemote(dst);
        if ((from && to) || (!from && !to)) throw new UsageError('cp: exactly one of SRC and DST is a sandbox path (sb-<id>:PATH)');
        const r = await withServer(dirsOf(cmd), async (api): Promise<CopyResult | TreeResult> => {
          if (to) return (await isLocalDir(src)) ? uploadTree(api, src, to, o) : upload(api, src, to, o);
          const remote = from as RemoteSpec;
          const info = await statRemote(api, remote);
          // a file keeps its permission bits, as in a directory copy (never set-id or sticky bits)
          return info?.type === FileType.FILE_TYPE_DIRECTORY ? downloadTree(api, remote, dst, o) : download(api, remote, dst, { ...o, mode: info ? info.mode & 0o777 : undefined });
        });
        print(o.json === true, r, () =>
          'sha256' in r
            ? `${r.source} -> ${r.destination}: ${r.bytes} bytes (${r.bytesSent} copied from byte ${r.offset}) in ${r.durationMs} ms${rateText(r)}, sha256 ${r.sha256}`
            : `${r.source} -> ${r.destination}: ${r.files} files, ${r.directories} directories, ${r.symlinks} symlinks${r.skipped ? `, ${r.skipped} skipped (not a file, directory or symlink)` : ''}; ${r.bytes} bytes (${r.bytesSent} copied) in ${r.durationMs} ms${rateText(r)}`,
        );
      }),
    );
  sandbox
    .command('ls <id> [path]')
    .description('list a directory of the sandbox (below /workspace; default /workspace)')
    .option('--json', 'print {entries: [...]} (the proto JSON of FileInfo)')
    .action(
      action(async (id: string, p: string | undefined, o: { json?: boolean }, cmd: Command) => {
        const entries = await withServer(dirsOf(cmd), (api) => listAll(api, id, p ?? ''));
        print(o.json === true, { entries: entries.map(infoJson) }, () => entries.map(infoLine).join('\n') || '(empty)');
      }),
    );
  sandbox
    .command('stat <id> <path>')
    .description('describe a path of the sandbox (below /workspace; a symlink is described, not followed)')
    .option('--json', 'print the proto JSON of FileInfo')
    .action(
      action(async (id: string, p: string, o: { json?: boolean }, cmd: Command) => {
        const info = await withServer(dirsOf(cmd), async (api) => {
          try {
            return (await api.sandboxes.statFile({ sandboxId: id, path: p })).info;
          } catch (err) {
            throw streamFailed(err);
          }
        });
        if (!info) throw new CliError('the server answered without a description');
        print(o.json === true, infoJson(info), () => infoLine(info));
      }),
    );
}
