/**
 * Epoch fencing (ARCHITECTURE.md section 4): every mutating call from the active server to
 * vmm-supervisor and ublk-manager carries the server's epoch in metadata `sandnode-epoch`.
 * Those services persist the highest epoch seen and reject lower ones with ABORTED, so two
 * servers can never both mutate the node (the idea of fencing tokens, as in Kleppmann's
 * "How to do distributed locking" and Chubby's sequencers).
 *
 * A sandnode call is mutating unless its method is marked `idempotency_level = NO_SIDE_EFFECTS`
 * (health checks and reflection are never fenced). A
 * mutating call without the metadata counts as epoch 0: accepted only while no epoch was ever
 * seen (a node before its first server took the lease, or a test calling a service alone).
 *
 * A fence only goes up, so an epoch no server holds would fence every real server out for
 * good (anyone who reaches the socket could send FenceEpoch(2^53-1), or any mutating call
 * with that `sandnode-epoch`). With `leaseFile` set (the daemons set the node's
 * `<stateDir>/server.lease`), a fence is raised only up to the epoch the lease's holder record
 * names: the server writes that record (bumped epoch) before it raises any fence. A higher
 * epoch is FAILED_PRECONDITION naming both epochs, and nothing changes.
 */
import { mkdirSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { Metadata } from 'nice-grpc-common';
import type { CallContext, ClientMiddleware, ClientMiddlewareCall, ServerMiddlewareCall, CallOptions } from 'nice-grpc-common';
import { writeFileAtomic } from './durable';
import { AbortedError, FailedPreconditionError, InvalidArgumentError } from './errors';

/** The metadata key that carries the epoch. */
export const EPOCH_METADATA_KEY = 'sandnode-epoch';

/** Options of an {@link EpochFence}. */
export interface EpochFenceOptions {
  /**
   * gRPC method paths whose handler fences itself (FenceEpoch): the middleware lets them
   * through, and the handler calls {@link EpochFence.fenceEpoch} after validating the request,
   * so a bad request changes nothing.
   */
  handlerFenced?: readonly string[];
  /**
   * The node's server lease (`<stateDir>/server.lease`, see {@link serverLeasePath}). When
   * set, an epoch above the one the lease's holder record names ({@link readLeaseEpoch}; 0
   * when there is no record: no server ever took the lease) is refused with
   * FAILED_PRECONDITION and changes nothing. Unset: any higher epoch is accepted (unit tests).
   */
  leaseFile?: string;
}

/**
 * EpochFence remembers the highest epoch seen in `<dir>/epoch`, written atomically (temp file,
 * fsync, rename, fsync dir) before a call that raised it is handled.
 */
export class EpochFence {
  protected highest: number;
  private readonly file: string;
  private readonly handlerFenced: ReadonlySet<string>;
  private readonly leaseFile: string | undefined;

  constructor(dir: string, opts: EpochFenceOptions = {}) {
    mkdirSync(dir, { recursive: true });
    this.file = path.join(dir, 'epoch');
    this.highest = readEpochFile(this.file);
    this.handlerFenced = new Set(opts.handlerFenced ?? []);
    this.leaseFile = opts.leaseFile;
  }

  /** current is the highest epoch seen. */
  get current(): number {
    return this.highest;
  }

  /** file is the path of the persisted epoch (`<dir>/epoch`). */
  get epochFile(): string {
    return this.file;
  }

  /**
   * admit (the fence middleware) checks a call's epoch: lower than the highest -> AbortedError;
   * higher -> persisted first. A handler-fenced method is let through (its handler raises).
   */
  admit(epoch: number, rpc: string): void {
    if (this.handlerFenced.has(rpc)) return;
    this.raise(epoch, rpc);
  }

  /**
   * raise is the check and persist of admit for any caller: AbortedError (ABORTED, naming both
   * epochs) when epoch is lower than the highest seen; FailedPreconditionError (naming both
   * epochs) when it is higher than the node's lease names (with `leaseFile`); a higher epoch
   * is persisted (fsync) before it returns. Returns the highest epoch seen after the call.
   */
  raise(epoch: number, rpc: string): number {
    if (epoch < this.highest) {
      throw new AbortedError(`${rpc}: stale epoch ${epoch}; this node is at epoch ${this.highest} (another server took the lease)`);
    }
    if (epoch > this.highest && this.leaseFile !== undefined) {
      const leased = readLeaseEpoch(this.leaseFile);
      if (epoch > leased) {
        throw new FailedPreconditionError(
          `${rpc}: epoch ${epoch} is above epoch ${leased}, the highest the node's server lease names (${this.leaseFile}): no server holds it; the fence stays at ${this.highest}, nothing changed`,
        );
      }
    }
    if (epoch > this.highest) {
      writeFileAtomic(this.file, JSON.stringify({ epoch, updatedAtMs: Date.now() }));
      this.highest = epoch;
    }
    return this.highest;
  }

  /**
   * fenceEpoch is the FenceEpoch RPC of vmm.v1 and ublk.v1 (features `vmm.fence-epoch.v1`,
   * `ublk.fence-epoch.v1`): it raises the fence to epoch and returns the highest epoch seen
   * after the call, persisted. metadataEpoch is the call's `sandnode-epoch` (undefined when the
   * call has none). Errors, with nothing changed: InvalidArgumentError (epoch 0 or not a safe
   * integer; epoch differs from metadataEpoch), AbortedError (lower than the highest seen).
   */
  fenceEpoch(epoch: number, metadataEpoch: number | undefined): number {
    if (!Number.isSafeInteger(epoch) || epoch < 1) throw new InvalidArgumentError(`epoch: ${epoch} is not an epoch (1..${Number.MAX_SAFE_INTEGER}; 0 is "no epoch"); nothing changed`);
    if (metadataEpoch !== undefined && metadataEpoch !== epoch) {
      throw new InvalidArgumentError(`epoch: ${epoch} differs from the call's sandnode-epoch metadata ${metadataEpoch}; nothing changed`);
    }
    return this.raise(epoch, 'FenceEpoch');
  }
}

/** serverLeasePath is the node's server lease file: `<stateDir>/server.lease` (its holder record beside it, `.json`). */
export function serverLeasePath(stateDir: string): string {
  return path.join(path.resolve(stateDir), 'server.lease');
}

/**
 * readLeaseEpoch reads the highest epoch the node's lease names: the holder records
 * `<leaseFile>.json` (written atomically since 0.2.0) and `<leaseFile>` itself (what 0.1.0
 * writes, and still written); 0 when neither holds a record. The server writes them before it
 * raises any fence, so every epoch a real server fences with is at most this.
 */
export function readLeaseEpoch(leaseFile: string): number {
  let best = 0;
  for (const f of [`${leaseFile}.json`, leaseFile]) best = Math.max(best, readEpochFile(f));
  return best;
}

/** readEpochFile reads a persisted epoch (`{"epoch":N}`); 0 when missing or unreadable. */
export function readEpochFile(file: string): number {
  try {
    const v = Number(JSON.parse(readFileSync(file, 'utf8')).epoch);
    return Number.isSafeInteger(v) && v >= 0 ? v : 0;
  } catch {
    return 0;
  }
}

/** metadataEpoch reads the epoch of a call's metadata; undefined when it carries none. */
export function metadataEpoch(metadata: Metadata): number | undefined {
  const raw = metadata.get(EPOCH_METADATA_KEY);
  return raw === undefined || raw === '' ? undefined : parseEpoch(metadata);
}

/** parseEpoch reads the epoch of a call's metadata; missing -> 0. */
export function parseEpoch(metadata: Metadata): number {
  const raw = metadata.get(EPOCH_METADATA_KEY);
  if (raw === undefined || raw === '') return 0;
  // decimal digits only: Number() would also take "0x2", "1e0", " 1" or "2.0"
  const v = /^[0-9]{1,16}$/.test(raw) ? Number(raw) : NaN;
  if (!Number.isSafeInteger(v) || v < 0) throw new InvalidArgumentError(`metadata ${EPOCH_METADATA_KEY}: ${JSON.stringify(raw)} is not an epoch (decimal digits, at most ${Number.MAX_SAFE_INTEGER})`);
  return v;
}

/**
 * isMutating says whether a call may change node state: a sandnode RPC (`/sandnode.*`) not
 * marked NO_SIDE_EFFECTS. Health checks and reflection never carry an epoch and are never
 * fenced (a kubelet probe must not get ABORTED).
 */
export function isMutating(method: { path?: string; options?: { idempotencyLevel?: string } }): boolean {
  if (!method.path?.startsWith('/sandnode.')) return false;
  return method.options?.idempotencyLevel !== 'NO_SIDE_EFFECTS';
}

/** epochFenceMiddleware admits mutating calls through fence (server side). */
export function epochFenceMiddleware(fence: EpochFence) {
  return async function* fenceCall<Req, Res>(call: ServerMiddlewareCall<Req, Res>, context: CallContext) {
    if (isMutating(call.method as { options?: { idempotencyLevel?: string } })) {
      fence.admit(parseEpoch(context.metadata), call.method.path);
    }
    return yield* call.next(call.request, context);
  };
}

/** epochClientMiddleware adds the caller's current epoch to every call (client side). */
export function epochClientMiddleware(getEpoch: () => number): ClientMiddleware {
  return async function* withEpoch<Req, Res>(call: ClientMiddlewareCall<Req, Res>, options: CallOptions) {
    const metadata = Metadata(options.metadata).set(EPOCH_METADATA_KEY, String(getEpoch()));
    return yield* call.next(call.request, { ...options, metadata });
  };
}
