/**
 * SandboxService handlers: validate -> call SandboxManager -> convert. Errors are domain errors
 * mapped to gRPC codes by the shared middleware.
 */
import { InvalidArgumentError, requireSandboxId, type SandnodeCallContext } from '@sandnode/shared';
import { Sandbox, type ExecResponse, type SandboxServiceImplementation } from '@sandnode/shared/proto/server/v1/sandbox';
import type { SandboxManager } from '../core/sandbox-manager';
import type { SandboxRecord } from '../core/types';
import { observeFork } from '../metrics';
import { execStreamService } from './exec-stream-service';
import { withIdle } from './idle-hooks';
import type { BulkChannel } from './bulk-transfer';
import { fileTransferService, type PoddFileRelay } from './file-transfer-service';
import { forkMethodToPb, NO_INGRESS, sandboxToPb as recordToPb, statesFromPb, type IngressAddress } from './convert';

/** listedBytes is what one sandbox adds to a ListSandboxesResponse, bytes: its encoding, the field tag and the length prefix. */
function listedBytes(s: Sandbox): number {
  const n = Sandbox.encode(s).finish().length;
  return 1 + varintBytes(n) + n;
}

function varintBytes(n: number): number {
  let k = 1;
  while (n >= 0x80) {
    n = Math.floor(n / 0x80);
    k++;
  }
  return k;
}

/**
 * counters.streams counts running Exec streams and file transfers (a retiring server relays
 * them to the end); ingress is where the ingress listener is (Sandbox.network.ingress_url);
 * podds reaches the sandboxes' podds for the streamed file calls (file-transfer-service.ts;
 * without it they are UNIMPLEMENTED); bulk issues PrepareBulkTransfer's tokens (bulk-transfer.ts).
 */
export function sandboxService(
  m: SandboxManager,
  counters: { streams: number } = { streams: 0 },
  ingress: IngressAddress = NO_INGRESS,
  podds?: PoddFileRelay,
  bulk?: BulkChannel,
): SandboxServiceImplementation<SandnodeCallContext> {
  const sandboxToPb = (r: SandboxRecord) => recordToPb(r, ingress, m.idle.lastActivityMs(r));
  // activity and auto-resume of every handler that names a sandbox (idle-hooks.ts)
  return withIdle(
    {
      ...execStreamService(m, counters),
      ...fileTransferService(m, podds, counters, undefined, bulk),
      async createSandbox(req, ctx) {
        const t0 = performance.now();
        const { rec, poolMiss, repeat } = await m.createDetailed(
          {
            template: req.template,
            timeoutSeconds: req.timeoutSeconds,
            metadata: req.metadata,
            resources: req.resources,
            requestId: req.requestId,
            network: req.network,
            idle: req.idle,
            env: req.env,
          },
          ctx.signal,
        );
        // a repeat by request_id derives the same token (core/network.ts, AccessTokens)
        const createMs = Math.min(0xffffffff, Math.round(performance.now() - t0));
        return { sandbox: sandboxToPb(rec), accessToken: m.accessToken(rec), fromPool: (rec.pool?.claimedAtMs ?? 0) > 0, createMs, poolMiss, repeat: repeat === true };
      },
      async getSandbox(req) {
        return { sandbox: sandboxToPb(m.get(req.sandboxId)) };
      },
      async listSandboxes(req) {
        // a page is cut by bytes too (MAX_PAGE_BYTES), so it always fits a gRPC message
        const page = m.list({ states: statesFromPb(req.states), metadata: req.metadata, pageSize: req.pageSize, pageToken: req.pageToken, sizeOf: (r) => listedBytes(sandboxToPb(r)) });
        return { sandboxes: page.sandboxes.map(sandboxToPb), nextPageToken: page.nextPageToken };
      },
      async pauseSandbox(req, ctx) {
        return { sandbox: sandboxToPb(await m.pause(req.sandboxId, ctx.signal)) };
      },
      async resumeSandbox(req, ctx) {
        return { sandbox: sandboxToPb(await m.resume(req.sandboxId, ctx.signal)) };
      },
      async deleteSandbox(req, ctx) {
        await m.delete(req.sandboxId, ctx.signal);
        return {};
      },
      async setTimeout(req, ctx) {
        return { sandbox: sandboxToPb(await m.setTimeout(req.sandboxId, req.timeoutSeconds, ctx.signal)) };
      },
      async *exec(req, ctx): AsyncIterable<ExecResponse> {
        requireSandboxId('sandbox_id', req.sandboxId);
        const events = m.exec(req.sandboxId, { argv: req.argv, env: req.env, cwd: req.cwd, stdin: req.stdin, timeoutMs: req.timeoutMs }, ctx.signal);
        counters.streams++;
        try {
          for await (const ev of events) {
            switch (ev.kind) {
              case 'started':
                yield { event: { $case: 'started', value: { pid: ev.pid } } };
                break;
              case 'stdout':
                yield { event: { $case: 'stdout', value: Buffer.from(ev.data) } };
                break;
              case 'stderr':
                yield { event: { $case: 'stderr', value: Buffer.from(ev.data) } };
                break;
              case 'exit':
                yield { event: { $case: 'exit', value: { exitCode: ev.exitCode, signal: ev.signal } } };
                break;
            }
          }
        } finally {
          counters.streams--;
        }
      },
      async readFile(req) {
        if (req.offset > Number.MAX_SAFE_INTEGER) throw new InvalidArgumentError('offset: too large');
        const r = await m.readFile(req.sandboxId, req.path, req.offset, req.length);
        return { data: Buffer.from(r.data), sizeBytes: r.sizeBytes, eof: r.eof };
      },
      async writeFile(req) {
        return m.writeFile(req.sandboxId, req.path, req.data, req.mode, req.append);
      },
      async forkSandbox(req, ctx) {
        const r = await m.fork(
          { parentId: req.parentId, metadata: req.metadata, timeoutSeconds: req.timeoutSeconds, maxFreezeMs: req.maxFreezeMs, requestId: req.requestId, network: req.network, idle: req.idle },
          ctx.signal,
        );
        observeFork(r);
        return { sandbox: sandboxToPb(r.child), method: forkMethodToPb(r.method), parentHeldMs: r.parentHeldMs, cloneMs: r.cloneMs, forkMs: r.forkMs, accessToken: m.accessToken(r.child) };
      },
      async resetRootfs(req, ctx) {
        return { sandbox: sandboxToPb(await m.resetRootfs(req.sandboxId, ctx.signal)) };
      },

      async updateSandboxNetwork(req, ctx) {
        return { sandbox: sandboxToPb(await m.updateNetwork({ sandboxId: req.sandboxId, egress: req.egress, public: req.public }, ctx.signal)) };
      },
      async keepAlive(req, ctx) {
        return { sandbox: sandboxToPb(await m.keepAlive(req.sandboxId, req.forS, ctx.signal)) };
      },
    },
    m.idle,
  );
}
