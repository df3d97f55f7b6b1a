/**
 * PoddPeers: PoddClients over gRPC to each sandbox's podd (podd.v1.PoddService), one channel per
 * podd socket, cached until the sandbox is deleted. Calls have the deadline `timeoutMs`
 * (config `poddCallTimeoutMs`) and `retryAttempts` retries of idempotent ones
 * (`poddRetryAttempts`); errors are mapped (peer-errors.ts: what a podd says in an INTERNAL
 * error stays in the server log).
 */
import { createSandnodeChannel, createServiceClient, PeerFeatures, type Logger, type ServiceClient } from '@sandnode/shared';
import { PoddServiceDefinition, ThawEndedBy } from '@sandnode/shared/proto/podd/v1/podd';
import type { Channel } from 'nice-grpc';
import { DEFAULT_PODD_CALL_TIMEOUT_MS, DEFAULT_PODD_RETRY_ATTEMPTS } from '../config';
import type { ExecArgs, ExecEvent, PoddClient, PoddConnector, PeerVersion, PoddFreeze, PoddThaw } from '../core/types';
import { mapPeerError, withMappedErrors } from './peer-errors';
import { poddExecStreams } from './podd-exec-stream';
import type { PoddExecStreams } from '../core/exec-stream';

/** How the server calls podds. */
export interface PoddPeerOptions {
  /** deadline of a unary call, ms (default DEFAULT_PODD_CALL_TIMEOUT_MS) */
  timeoutMs?: number;
  /** retries of an idempotent call on UNAVAILABLE (default DEFAULT_PODD_RETRY_ATTEMPTS) */
  retryAttempts?: number;
  /** where the text of a podd's INTERNAL/UNKNOWN errors goes */
  log?: Logger;
}

/** Deadline of a Quiesce beyond its freeze window (the sync before the freeze), ms. */
export const QUIESCE_DEADLINE_MARGIN_MS = 10_000;

class PoddPeer implements PoddClient {
  readonly channel: Channel;
  readonly client: ServiceClient<typeof PoddServiceDefinition>;
  readonly features: PeerFeatures;
  readonly execStreams: PoddExecStreams;

  constructor(address: string, o: PoddPeerOptions) {
    this.channel = createSandnodeChannel(address);
    const client = createServiceClient(PoddServiceDefinition, this.channel, {
      timeoutMs: o.timeoutMs ?? DEFAULT_PODD_CALL_TIMEOUT_MS,
      retryAttempts: o.retryAttempts ?? DEFAULT_PODD_RETRY_ATTEMPTS,
    });
    this.client = withMappedErrors(client, 'podd', o.log);
    // GetVersion (asked before an exec stream or a copy) fails as every other podd call
    this.features = new PeerFeatures(this.channel, `podd at ${address}`, undefined, (err) => mapPeerError('podd', 'getVersion', err, o.log));
    this.execStreams = poddExecStreams(this.client);
  }

  async health(timeoutMs: number): Promise<boolean> {
    const res = await this.client.health({}, { deadline: timeoutMs, retry: false });
    return res.ok;
  }

  async bulkTransfers(timeoutMs: number): Promise<number> {
    const res = await this.client.health({}, { deadline: timeoutMs, retry: false });
    return res.bulkTransfers;
  }

  async version(): Promise<PeerVersion> {
    const v = await this.features.get();
    return { version: v.version, features: v.features };
  }

  async quiesce(maxFreezeMs: number): Promise<PoddFreeze> {
    // not retried: a second Quiesce would meet the first freeze (FAILED_PRECONDITION)
    const r = await this.client.quiesce({ maxFreezeMs }, { retry: false, deadline: maxFreezeMs + QUIESCE_DEADLINE_MARGIN_MS });
    return { token: r.freezeToken, maxFreezeMs: r.maxFreezeMs, syncMs: r.syncMs, freezeMs: r.freezeMs };
  }

  async thaw(token: string): Promise<PoddThaw> {
    const r = await this.client.thaw({ freezeToken: token });
    const endedBy = r.endedBy === ThawEndedBy.THAW_ENDED_BY_CALLER ? 'caller' : r.endedBy === ThawEndedBy.THAW_ENDED_BY_WATCHDOG ? 'watchdog' : 'unknown';
    return { endedBy, frozenMs: r.frozenMs };
  }

  async *exec(args: ExecArgs, signal: AbortSignal): AsyncIterable<ExecEvent> {
    const stream = this.client.exec({ argv: args.argv, env: args.env, cwd: args.cwd, stdin: Buffer.from(args.stdin), timeoutMs: args.timeoutMs }, { signal });
    for await (const ev of stream) {
      const e = ev.event;
      if (!e) continue;
      switch (e.$case) {
        case 'started':
          yield { kind: 'started', pid: e.value.pid };
          break;
        case 'stdout':
          yield { kind: 'stdout', data: e.value };
          break;
        case 'stderr':
          yield { kind: 'stderr', data: e.value };
          break;
        case 'exit':
          yield { kind: 'exit', exitCode: e.value.exitCode, signal: e.value.signal };
          break;
      }
    }
  }

  async readFile(path: string, offset: number, length: number) {
    // confined below /workspace by podd itself (symlinks resolved); an older podd ignores
    // `beneath` and only the server's check of the path text applies
    const r = await this.client.readFile({ path, offset, length, beneath: '/workspace' });
    return { data: r.data, sizeBytes: r.sizeBytes, eof: r.eof };
  }

  async writeFile(path: string, data: Uint8Array, mode: number, append: boolean) {
    const r = await this.client.writeFile({ path, data: Buffer.from(data), mode, append, createParents: true, beneath: '/workspace' });
    return { sizeBytes: r.sizeBytes };
  }

  close(): void {
    this.channel.close();
  }
}

export class PoddPeers implements PoddConnector {
  private readonly peers = new Map<string, PoddPeer>();

  constructor(private readonly o: PoddPeerOptions = {}) {}

  /** connect returns the cached client of the podd at address ("unix:///.../podd.sock"). */
  connect(address: string): PoddClient {
    let p = this.peers.get(address);
    if (!p) {
      p = new PoddPeer(address, this.o);
      this.peers.set(address, p);
    }
    return p;
  }

  /**
   * raw is the cached podd client of address itself (errors mapped) and its features, for the
   * streamed file relay (rpc/file-transfer-service.ts), which passes proto messages through.
   */
  raw(address: string): { client: ServiceClient<typeof PoddServiceDefinition>; features: PeerFeatures } {
    const p = this.connect(address) as PoddPeer;
    return { client: p.client, features: p.features };
  }

  forget(address: string): void {
    this.peers.get(address)?.close();
    this.peers.delete(address);
  }

  closeAll(): void {
    for (const p of this.peers.values()) p.close();
    this.peers.clear();
  }
}
