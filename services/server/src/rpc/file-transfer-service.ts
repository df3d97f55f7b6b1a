/**
 * SandboxService's streamed file calls (feature "server.files.stream.v1"; files.proto):
 * DownloadFile, UploadFile, ListDirectory, StatFile; and the tree calls of a recursive copy
 * (feature "server.files.tree.v1"): CreateDirectory, CreateSymlink. The server checks the sandbox id, the
 * path (below /workspace, no "..", no NUL) and the state (RUNNING), then relays to the
 * sandbox's podd with beneath "/workspace" (podd walks the path without following symlinks).
 * The bytes pass through one message at a time: each side reads the next message only when
 * the other side took the last one (nice-grpc waits for 'drain' on writes and pulls reads), so
 * a transfer holds a few chunks in the server, never the file, and a slow end slows the other.
 */
import {
  FailedPreconditionError,
  InternalError,
  InvalidArgumentError,
  PODD_FEATURES,
  peerOf,
  requireSandboxId,
  ResourceExhaustedError,
  UnimplementedError,
  type PeerFeatures,
  type PoddBulkRequest,
  type SandnodeCallContext,
  type ServiceClient,
} from '@sandnode/shared';
import type { EntryType, UploadFileRequest as PoddUploadFileRequest } from '@sandnode/shared/proto/podd/v1/files';
import type { FileType as PoddFileType, PoddServiceDefinition } from '@sandnode/shared/proto/podd/v1/podd';
import { BulkDirection, FileType, type DownloadFileResponse, type FileInfo, type UploadFileRequest } from '@sandnode/shared/proto/server/v1/files';
import type { SandboxServiceImplementation } from '@sandnode/shared/proto/server/v1/sandbox';
import path from 'node:path';
import type { SandboxManager } from '../core/sandbox-manager';
import type { BulkChannel } from './bulk-transfer';
import { idleCall } from './idle-hooks';
import { MAX_FILE_CHUNK_BYTES, workspacePath } from '../core/validate';

/** The root every relayed path is confined below (podd's beneath). */
export const WORKSPACE = '/workspace';

/** Longest symlink target CreateSymlink takes, bytes (PATH_MAX - 1). */
export const MAX_LINK_TARGET_BYTES = 4095;

/** Most DownloadFile + UploadFile streams one sandbox may have running at once; one more is RESOURCE_EXHAUSTED. */
export const MAX_FILE_STREAMS_PER_SANDBOX = 16;

/** FileStreams counts the transfers running per sandbox, so that one caller cannot hold a sandbox's podd with a flood of streams. */
export class FileStreams {
  private readonly running = new Map<string, number>();
  constructor(readonly max = MAX_FILE_STREAMS_PER_SANDBOX) {}

  /** enter takes a slot of sandbox id and returns its release (idempotent). Errors: RESOURCE_EXHAUSTED. */
  enter(id: string): () => void {
    const n = this.running.get(id) ?? 0;
    if (n >= this.max) throw new ResourceExhaustedError(`sandbox ${id} has ${n} file transfers running (the most, ${this.max}); wait for one to end`);
    this.running.set(id, n + 1);
    let done = false;
    return () => {
      if (done) return;
      done = true;
      const left = (this.running.get(id) ?? 1) - 1;
      if (left <= 0) this.running.delete(id);
      else this.running.set(id, left);
    };
  }
}

/** Where the relay finds a sandbox's podd (PoddPeers.raw). */
export interface PoddFileRelay {
  raw(address: string): { client: ServiceClient<typeof PoddServiceDefinition>; features: PeerFeatures };
}

type FileCalls = Pick<SandboxServiceImplementation<SandnodeCallContext>, 'downloadFile' | 'uploadFile' | 'listDirectory' | 'statFile' | 'createDirectory' | 'createSymlink' | 'prepareBulkTransfer'>;

/** workspaceDir is workspacePath that also takes "" and "/workspace" (the root itself), for ListDirectory and StatFile. */
function workspaceDir(field: string, p: string): string {
  if (p === '' || path.posix.normalize(p) === WORKSPACE || path.posix.normalize(p) === `${WORKSPACE}/`) return WORKSPACE;
  return workspacePath(field, p);
}

/** isFileName: name is one directory entry's name (not empty, ".", "..", nor holding "/" or NUL). */
const isFileName = (name: string): boolean => name !== '' && name !== '.' && name !== '..' && !name.includes('/') && !name.includes('\0');

/** Which SandboxService call needs a RUNNING sandbox with a streaming podd. */
type Call = 'DownloadFile' | 'UploadFile' | 'ListDirectory' | 'StatFile' | 'CreateDirectory' | 'CreateSymlink' | 'PrepareBulkTransfer';

/** typeToPb maps podd's entry types to the API's (podd.v1.EntryType and podd.v1.FileType number their common values alike). */
function typeToPb(t: EntryType | PoddFileType): FileType {
  switch (t) {
    case 1:
      return FileType.FILE_TYPE_REGULAR;
    case 2:
      return FileType.FILE_TYPE_DIRECTORY;
    case 3:
      return FileType.FILE_TYPE_SYMLINK;
    case 4:
      return FileType.FILE_TYPE_OTHER;
    default:
      return FileType.FILE_TYPE_UNSPECIFIED;
  }
}

function checkOffset(offset: number): void {
  if (!Number.isSafeInteger(offset) || offset < 0) throw new InvalidArgumentError('offset: must be a non-negative integer below 2^53');
}

/**
 * fileTransferService implements the streamed file calls over m (records) and podds (the
 * sandboxes' podd clients); counters.streams counts running transfers beside Exec streams
 * (a retiring server relays them to their end); slots caps the transfers per sandbox
 * (RESOURCE_EXHAUSTED above MAX_FILE_STREAMS_PER_SANDBOX); bulk issues the tokens of
 * PrepareBulkTransfer (bulk-transfer.ts; without it the call is UNIMPLEMENTED).
 */
export function fileTransferService(m: SandboxManager, podds: PoddFileRelay | undefined, counters: { streams: number } = { streams: 0 }, slots = new FileStreams(), bulk?: BulkChannel): FileCalls {
  /**
   * podd returns the podd client of a RUNNING sandbox that has the streamed file calls.
   * Errors: INVALID_ARGUMENT (id), NOT_FOUND, FAILED_PRECONDITION (not RUNNING: names the
   * state), UNIMPLEMENTED (podd lacks "podd.files.stream.v1").
   */
  async function podd(id: string, call: Call, feature: string = PODD_FEATURES.filesStream) {
    requireSandboxId('sandbox_id', id);
    const rec = m.get(id);
    if (rec.state !== 'RUNNING') {
      const how = rec.state === 'PAUSED' ? `; resume it first (sandnode sandbox resume ${id})` : '';
      throw new FailedPreconditionError(`sandbox ${id} is ${rec.state}: ${call} needs it RUNNING${how}`);
    }
    if (!podds) throw new UnimplementedError(`${call}: this server runs without the file relay`);
    const p = podds.raw(rec.poddAddress);
    const v = await p.features.get();
    if (!v.features.includes(feature)) {
      throw new UnimplementedError(
        `${call}: the podd of sandbox ${id} (podd ${v.version || 'of an unknown version'}, its template's) lacks feature "${feature}"; rebuild the template with this release`,
      );
    }
    return p.client;
  }

  return {
    async *downloadFile(req, ctx): AsyncIterable<DownloadFileResponse> {
      const abs = workspacePath('path', req.path);
      checkOffset(req.offset);
      const client = await podd(req.sandboxId, 'DownloadFile');
      const release = slots.enter(req.sandboxId);
      counters.streams++;
      try {
        // podd runs in the sandbox: past the size it announced first (the file as opened) nothing is relayed
        let size: number | undefined;
        for await (const c of client.downloadFile({ path: abs, offset: req.offset, beneath: WORKSPACE }, { signal: ctx.signal })) {
          size ??= c.sizeBytes;
          if (c.data.length > 0 && c.offset + c.data.length > size) {
            throw new InternalError(`DownloadFile: the podd of sandbox ${req.sandboxId} sent more than the ${size} bytes it announced for ${abs}; the stream was ended`);
          }
          yield { data: c.data, offset: c.offset, sizeBytes: c.sizeBytes };
        }
      } finally {
        counters.streams--;
        release();
      }
    },

    async uploadFile(requests, ctx) {
      const it = requests[Symbol.asyncIterator]();
      const first = await it.next();
      if (first.done || first.value.part?.$case !== 'header') throw new InvalidArgumentError('header: the first message of an upload must be its header');
      const h = first.value.part.value;
      const abs = workspacePath('path', h.path);
      checkOffset(h.offset);
      if (h.mode > 0o777) throw new InvalidArgumentError(`mode: ${h.mode.toString(8)} is not a permission mode (0..0777)`);
      // idle actions (core/idle.ts): like the other file calls (idle-hooks.ts, which cannot see
      // the id in a client stream's header), an upload auto-resumes a PAUSED or hibernated
      // sandbox, holds idle actions off while it runs and counts as activity
      requireSandboxId('header.sandbox_id', h.sandboxId);
      return idleCall(m.idle, h.sandboxId, 'UploadFile', ctx, async () => {
        const client = await podd(h.sandboxId, 'UploadFile');
        async function* relay(): AsyncIterable<PoddUploadFileRequest> {
          yield { part: { $case: 'header', value: { path: abs, offset: h.offset, mode: h.mode, createParents: true, inPlace: h.inPlace, beneath: WORKSPACE } } };
          for (let r = await it.next(); !r.done; r = await it.next()) {
            const part = (r.value as UploadFileRequest).part;
            if (part?.$case === 'header') throw new InvalidArgumentError('header: an upload has exactly one header, its first message');
            if (part?.$case === 'end') {
              // the caller said the upload is complete: pass it on and read no further
              yield { part: { $case: 'end', value: { sha256: part.value.sha256 } } };
              return;
            }
            const data = part?.$case === 'data' ? part.value : Buffer.alloc(0);
            if (data.length > MAX_FILE_CHUNK_BYTES) throw new InvalidArgumentError(`data: ${data.length} bytes in one message, at most ${MAX_FILE_CHUNK_BYTES}`);
            yield { part: { $case: 'data', value: data } };
          }
        }
        const release = slots.enter(h.sandboxId);
        counters.streams++;
        try {
          // no deadline of its own (a unary default would cut a large upload): the caller's
          // deadline and cancellation reach podd through ctx.signal; never retried (the stream is consumed)
          const r = await client.uploadFile(relay(), { signal: ctx.signal, deadline: undefined, retry: false });
          return { sizeBytes: r.sizeBytes, bytesWritten: r.bytesWritten, sha256: r.sha256 };
        } finally {
          counters.streams--;
          release();
        }
      });
    },

    async listDirectory(req, ctx) {
      const abs = workspaceDir('path', req.path);
      const client = await podd(req.sandboxId, 'ListDirectory');
      const page = await client.listDirectory({ path: abs, pageSize: req.pageSize, pageToken: req.pageToken, beneath: WORKSPACE }, { signal: ctx.signal });
      // podd runs in the sandbox: a "name" that is a path would lead a caller that joins names (a recursive copy) elsewhere
      const bad = page.entries.find((e) => !isFileName(e.name));
      if (bad)
        throw new InternalError(`ListDirectory: the podd of sandbox ${req.sandboxId} listed ${JSON.stringify(bad.name.slice(0, 100))} in ${abs}, which is not a file name; nothing was returned`);
      return {
        entries: page.entries.map((e): FileInfo => ({ name: e.name, type: typeToPb(e.type), sizeBytes: e.sizeBytes, mode: e.mode, mtimeMs: e.mtimeMs, linkTarget: e.type === 3 ? e.linkTarget : '' })),
        nextPageToken: page.nextPageToken,
      };
    },

    async statFile(req, ctx) {
      const abs = workspaceDir('path', req.path);
      const client = await podd(req.sandboxId, 'StatFile');
      const st = await client.stat({ path: abs, beneath: WORKSPACE }, { signal: ctx.signal });
      return { info: { name: path.posix.basename(abs), type: typeToPb(st.type), sizeBytes: st.sizeBytes, mode: st.mode, mtimeMs: st.mtimeMs, linkTarget: '' } };
    },

    async createDirectory(req, ctx) {
      const abs = workspacePath('path', req.path);
      if (req.mode > 0o777) throw new InvalidArgumentError(`mode: ${req.mode.toString(8)} is not a permission mode (0..0777)`);
      const client = await podd(req.sandboxId, 'CreateDirectory', PODD_FEATURES.filesTree);
      return client.createDirectory({ path: abs, mode: req.mode, createParents: true, beneath: WORKSPACE }, { signal: ctx.signal });
    },

    async prepareBulkTransfer(req, ctx) {
      const abs = workspacePath('path', req.path);
      checkOffset(req.offset);
      if (req.mode > 0o777) throw new InvalidArgumentError(`mode: ${req.mode.toString(8)} is not a permission mode (0..0777)`);
      const up = req.direction === BulkDirection.BULK_DIRECTION_UPLOAD;
      if (!up && req.direction !== BulkDirection.BULK_DIRECTION_DOWNLOAD) throw new InvalidArgumentError('direction: must be BULK_DIRECTION_UPLOAD or BULK_DIRECTION_DOWNLOAD');
      if (up && !Number.isSafeInteger(req.sizeBytes)) throw new InvalidArgumentError('size_bytes: must be below 2^53');
      if (!bulk) throw new UnimplementedError('PrepareBulkTransfer: this server runs without the bulk channel');
      const peer = peerOf(ctx);
      if (peer?.transport !== 'unix') throw new FailedPreconditionError('PrepareBulkTransfer: the bulk channel is served on the unix socket only; use UploadFile / DownloadFile');
      await podd(req.sandboxId, 'PrepareBulkTransfer', PODD_FEATURES.filesBulk);
      const request: PoddBulkRequest = up
        ? { op: 'upload', path: abs, offset: req.offset, mode: req.mode, inPlace: req.inPlace, beneath: WORKSPACE, sizeBytes: req.sizeBytes }
        : { op: 'download', path: abs, offset: req.offset, beneath: WORKSPACE };
      return { token: bulk.issue(peer, req.sandboxId, request), expiresInMs: bulk.ttlMs };
    },

    async createSymlink(req, ctx) {
      const abs = workspacePath('path', req.path);
      if (!req.target || req.target.includes('\0') || Buffer.byteLength(req.target) > MAX_LINK_TARGET_BYTES) {
        throw new InvalidArgumentError(`target: must be 1..${MAX_LINK_TARGET_BYTES} bytes without NUL`);
      }
      const client = await podd(req.sandboxId, 'CreateSymlink', PODD_FEATURES.filesTree);
      await client.createSymlink({ path: abs, target: req.target, replace: req.replace, createParents: true, beneath: WORKSPACE }, { signal: ctx.signal });
      return {};
    },
  };
}
