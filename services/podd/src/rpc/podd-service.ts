/**
 * PoddService handlers: validate -> call core -> convert. Domain errors thrown by core become
 * gRPC statuses in the shared error middleware (InvalidArgumentError -> INVALID_ARGUMENT, ...).
 */
import { hostname } from 'node:os';
import { UnimplementedError, type SandnodeCallContext } from '@sandnode/shared';
import type { PoddServiceImplementation } from '@sandnode/shared/proto/podd/v1/podd';
import type { ExecRunner } from '../core/exec';
import { readFile, statPath, writeFile } from '../core/files';
import { execEventToProto, execSpecFromProto, fileInfoToProto } from './convert';

export interface PoddServiceDeps {
  runner: ExecRunner;
  /** When podd started, epoch ms (for uptime_ms). */
  startedAtMs: number;
}

/** poddService implements sandnode.podd.v1.PoddService over the core. */
export function poddService(deps: PoddServiceDeps): PoddServiceImplementation<SandnodeCallContext> {
  return {
    async health() {
      return { ok: true, uptimeMs: Date.now() - deps.startedAtMs, hostname: hostname() };
    },
    async *exec(req, context) {
      let pid = 0;
      for await (const ev of deps.runner.run(execSpecFromProto(req), context.signal)) {
        if (ev.kind === 'started') {
          pid = ev.pid;
          context.log.debug({ argv0: req.argv[0], pid }, 'exec started');
        } else if (ev.kind === 'exit') {
          context.log.debug({ pid, exitCode: ev.exitCode, signal: ev.signal }, 'exec exited');
        }
        yield execEventToProto(ev);
      }
    },
    async readFile(req) {
      const r = await readFile(req.path, req.offset, req.length, req.beneath);
      return { data: r.data, sizeBytes: r.sizeBytes, eof: r.eof };
    },
    async writeFile(req) {
      return writeFile(req.path, req.data, { mode: req.mode, append: req.append, createParents: req.createParents, beneath: req.beneath });
    },
    async stat(req) {
      return fileInfoToProto(await statPath(req.path));
    },
    async quiesce() {
      throw new UnimplementedError('Quiesce is not built yet');
    },
    async thaw() {
      throw new UnimplementedError('Thaw is not built yet');
    },
    async getFreezeStatus() {
      throw new UnimplementedError('GetFreezeStatus is not built yet');
    },
  };
}
