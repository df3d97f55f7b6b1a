/** Conversions between podd's proto messages and its domain types (the only place that knows both). */
import { FileType, type ExecRequest, type ExecResponse, type StatResponse } from '@sandnode/shared/proto/podd/v1/podd';
import type { ExecEvent, ExecSpec } from '../core/exec';
import type { FileInfo, FileKind } from '../core/files';

/** execSpecFromProto: ExecRequest -> ExecSpec (cwd "" stays "" = the default cwd). */
export function execSpecFromProto(req: ExecRequest): ExecSpec {
  return { argv: req.argv, env: req.env, cwd: req.cwd, stdin: req.stdin, timeoutMs: req.timeoutMs };
}

/** execEventToProto: ExecEvent -> ExecResponse. */
export function execEventToProto(ev: ExecEvent): ExecResponse {
  switch (ev.kind) {
    case 'started':
      return { event: { $case: 'started', value: { pid: ev.pid } } };
    case 'stdout':
      return { event: { $case: 'stdout', value: ev.data } };
    case 'stderr':
      return { event: { $case: 'stderr', value: ev.data } };
    case 'exit':
      return { event: { $case: 'exit', value: { exitCode: ev.exitCode, signal: ev.signal } } };
  }
}

const FILE_TYPES: Record<FileKind, FileType> = {
  regular: FileType.FILE_TYPE_REGULAR,
  directory: FileType.FILE_TYPE_DIRECTORY,
  symlink: FileType.FILE_TYPE_SYMLINK,
  other: FileType.FILE_TYPE_UNSPECIFIED,
};

/** fileInfoToProto: FileInfo -> StatResponse. */
export function fileInfoToProto(info: FileInfo): StatResponse {
  return { type: FILE_TYPES[info.kind], sizeBytes: info.sizeBytes, mode: info.mode, mtimeMs: info.mtimeMs };
}
