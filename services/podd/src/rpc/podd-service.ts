/**
 * PoddService handlers: validate -> call core -> convert. Domain errors thrown by core become
 * gRPC statuses in the shared error middleware (InvalidArgumentError -> INVALID_ARGUMENT, ...).
 */
import { hostname } from 'node:os';
import type { SandnodeCallContext } from '@sandnode/shared';
import { ThawEndedBy, type PoddServiceImplementation } from '@sandnode/shared/proto/podd/v1/podd';
import type { FreezeEnd, Quiescer } from '../core/quiesce';
import type { ExecRunner } from '../core/exec';
import type { PortForwarder } from '../core/forward';
import { readFile, statPath, writeFile } from '../core/files';
import { execEventToProto, execSpecFromProto, fileInfoToProto } from './convert';
import type { ExecSessions } from '../core/exec-session';
import { execStreamHandlers } from './exec-stream';
import { fileStreamService, statWithBeneath } from './file-stream-service';
import { readFileBeneath, writeFileBeneath } from '../core/files-beneath';
import { activeBulkTransfers } from '../core/file-bulk';

export interface PoddServiceDeps {
  runner: ExecRunner;
  /** ExecStream commands (core/exec-session.ts). */
  sessions: ExecSessions;
  /** When podd started, epoch ms (for uptime_ms). */
  startedAtMs: number;
  /** Quiesce / Thaw / GetFreezeStatus over the host's freeze port. */
  quiescer: Quiescer;
  /** ForwardPort streams (core/forward.ts). */
  forwarder: PortForwarder;
}

/** thawEndedByToProto maps how a freeze ended to the wire (undefined = UNSPECIFIED: holds, or none). */
export function thawEndedByToProto(end: FreezeEnd): ThawEndedBy {
  if (end === 'caller') return ThawEndedBy.THAW_ENDED_BY_CALLER;
  if (end === 'watchdog') return ThawEndedBy.THAW_ENDED_BY_WATCHDOG;
  return ThawEndedBy.THAW_ENDED_BY_UNSPECIFIED;
}

/** poddService implements sandnode.podd.v1.PoddService over the core. */
export function poddService(deps: PoddServiceDeps): PoddServiceImplementation<SandnodeCallContext> {
  return {
    ...execStreamHandlers(deps.sessions),
    async health() {
      return { ok: true, uptimeMs: Date.now() - deps.startedAtMs, hostname: hostname(), bulkTransfers: activeBulkTransfers() };
    },
    async *exec(req, context) {
      let pid = 0;
      for await (const ev of deps.runner.run(execSpecFromProto(req), context.signal)) {
        if (ev.kind === 'started') {
          pid = ev.pid;
          context.log.debug({ argv0: req.argv[0], child_pid: pid }, 'exec started');
        } else if (ev.kind === 'exit') {
          context.log.debug({ child_pid: pid, exitCode: ev.exitCode, signal: ev.signal }, 'exec exited');
        }
        yield execEventToProto(ev);
      }
    },
    async readFile(req) {
      // with beneath: the confined walk (files-beneath.ts), never a path check and then an open by path
      const r = req.beneath ? await readFileBeneath(req.path, req.offset, req.length, req.beneath) : await readFile(req.path, req.offset, req.length);
      return { data: r.data, sizeBytes: r.sizeBytes, eof: r.eof };
    },
    async writeFile(req) {
      const opts = { mode: req.mode, append: req.append, createParents: req.createParents };
      return req.beneath ? writeFileBeneath(req.path, req.data, { ...opts, beneath: req.beneath }) : writeFile(req.path, req.data, opts);
    },
    async stat(req) {
      return statWithBeneath(req, async (p) => fileInfoToProto(await statPath(p)));
    },
    ...fileStreamService(),
    /**
     * Quiesce: max_freeze_ms 0 -> 1500, clamped to [100, 5000] ms; sync + syncfs, then the host
     * freezes with its watchdog. FAILED_PRECONDITION (a freeze holds), UNAVAILABLE (no freeze
     * port; nothing frozen), CANCELLED (caller gone before the freeze; nothing frozen).
     */
    async quiesce(req, context) {
      const r = await deps.quiescer.quiesce(req.maxFreezeMs, context.signal);
      context.log.info({ max_freeze_ms: r.maxFreezeMs, sync_ms: r.syncMs, freeze_ms: r.freezeMs, filesystems: r.filesystems }, 'quiesced');
      return { freezeToken: r.token, maxFreezeMs: r.maxFreezeMs, deadlineUnixMs: r.deadlineUnixMs, filesystems: r.filesystems, syncMs: r.syncMs, freezeMs: r.freezeMs };
    },
    /** Thaw: INVALID_ARGUMENT (empty token), FAILED_PRECONDITION (not the latest freeze), UNAVAILABLE (no port). */
    async thaw(req, context) {
      const r = await deps.quiescer.thaw(req.freezeToken, context.signal);
      return { endedBy: thawEndedByToProto(r.endedBy), frozenMs: r.frozenMs };
    },
    /** GetFreezeStatus: the current or latest freeze; UNAVAILABLE (no port). */
    async getFreezeStatus(_req, context) {
      const s = await deps.quiescer.status(context.signal);
      return { frozen: s.frozen, freezeToken: s.token, maxFreezeMs: s.maxFreezeMs, remainingMs: s.remainingMs, endedBy: thawEndedByToProto(s.endedBy), frozenMs: s.frozenMs };
    },
    /** ForwardPort: INVALID_ARGUMENT (bad port, data first), UNAVAILABLE (refused), RESOURCE_EXHAUSTED (256 open). */
    async *forwardPort(requests, context) {
      yield* deps.forwarder.forward(requests, context.signal);
    },
  };
}
