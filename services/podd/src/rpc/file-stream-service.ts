/**
 * PoddService handlers of the streamed file calls (feature "podd.files.stream.v1"):
 * DownloadFile, UploadFile, ListDirectory, and Stat with beneath; and of the tree calls
 * (feature "podd.files.tree.v1"): CreateDirectory, CreateSymlink. Thin: convert -> core
 * (file-stream.ts, file-list.ts) -> convert; domain errors become gRPC codes in the shared
 * middleware.
 */
import type { SandnodeCallContext } from '@sandnode/shared';
import { EntryType, type DirectoryEntry, type DownloadFileResponse, type UploadFileRequest } from '@sandnode/shared/proto/podd/v1/files';
import type { PoddServiceImplementation, StatRequest, StatResponse } from '@sandnode/shared/proto/podd/v1/podd';
import { listDirectory, statBeneath, type EntryInfo } from '../core/file-list';
import { createDirectory, createSymlink } from '../core/file-tree';
import { downloadFile, uploadFile, type UploadPart } from '../core/file-stream';
import type { FileKind } from '../core/files';
import { fileInfoToProto } from './convert';

const ENTRY_TYPES: Record<FileKind, EntryType> = {
  regular: EntryType.ENTRY_TYPE_REGULAR,
  directory: EntryType.ENTRY_TYPE_DIRECTORY,
  symlink: EntryType.ENTRY_TYPE_SYMLINK,
  other: EntryType.ENTRY_TYPE_OTHER,
};

function entryToProto(e: EntryInfo): DirectoryEntry {
  return { name: e.name, type: ENTRY_TYPES[e.kind], sizeBytes: e.sizeBytes, mode: e.mode, mtimeMs: e.mtimeMs, linkTarget: e.linkTarget ?? '' };
}

/** uploadParts converts the request stream to core's parts (a message without a part is empty data). */
async function* uploadParts(requests: AsyncIterable<UploadFileRequest>): AsyncIterable<UploadPart> {
  for await (const r of requests) {
    if (r.part?.$case === 'header') {
      const h = r.part.value;
      yield { header: { path: h.path, offset: h.offset, mode: h.mode, createParents: h.createParents, inPlace: h.inPlace, beneath: h.beneath } };
    } else if (r.part?.$case === 'end') {
      yield { end: { sha256: r.part.value.sha256 } };
    } else {
      yield { data: r.part?.$case === 'data' ? r.part.value : Buffer.alloc(0) };
    }
  }
}

type FileStreamCalls = Pick<PoddServiceImplementation<SandnodeCallContext>, 'downloadFile' | 'uploadFile' | 'listDirectory' | 'createDirectory' | 'createSymlink'>;

/** fileStreamService is the DownloadFile / UploadFile / ListDirectory part of PoddService. */
export function fileStreamService(): FileStreamCalls {
  return {
    async *downloadFile(req, ctx): AsyncIterable<DownloadFileResponse> {
      for await (const c of downloadFile(req.path, req.offset, req.beneath, ctx.signal)) yield { data: c.data, offset: c.offset, sizeBytes: c.sizeBytes };
    },
    async uploadFile(requests, ctx) {
      const r = await uploadFile(uploadParts(requests));
      ctx.log.debug({ bytes: r.bytesWritten, size: r.sizeBytes }, 'upload written');
      return r;
    },
    async listDirectory(req) {
      const page = await listDirectory(req.path, req.pageSize, req.pageToken, req.beneath);
      return { entries: page.entries.map(entryToProto), nextPageToken: page.nextPageToken };
    },
    async createDirectory(req) {
      return createDirectory(req.path, req.mode, req.createParents, req.beneath);
    },
    async createSymlink(req) {
      await createSymlink(req.path, req.target, req.replace, req.createParents, req.beneath);
      return {};
    },
  };
}

/** statWithBeneath answers Stat: with beneath through the confined walk, else as before (files.ts statPath). */
export async function statWithBeneath(req: StatRequest, plain: (p: string) => Promise<StatResponse>): Promise<StatResponse> {
  if (!req.beneath) return plain(req.path);
  const e = await statBeneath(req.path, req.beneath);
  return fileInfoToProto(e);
}
