/**
 * Bounded quiesce of the sandbox's writable filesystems (PoddService Quiesce / Thaw /
 * GetFreezeStatus). The sandbox holds no CAP_SYS_ADMIN and a watchdog inside it would die with
 * it, so the FIFREEZE/FITHAW (util-linux fsfreeze(8); Linux Documentation/filesystems/vfs.rst,
 * freeze_fs) and the watchdog live on the host: the vmm-supervisor's FreezePortService for this
 * VM, reached at /run/sandnode-freeze/freeze.sock. podd makes the data crash-consistent first
 * (`sync`, then syncfs(2) of / and /workspace through busybox `sync -f`) and forwards.
 * No proto imports: the port is the {@link FreezePort} interface (rpc/freeze-port-client.ts).
 */
import { existsSync } from 'node:fs';
import { clampFreezeMs, FailedPreconditionError, InvalidArgumentError, run, type Failpoints } from '@sandnode/shared';
import { FAILPOINTS, poddFailpoints, type PoddFailpoint } from './failpoints';

export { clampFreezeMs, DEFAULT_FREEZE_MS, MAX_FREEZE_MS, MIN_FREEZE_MS } from '@sandnode/shared';
/** Filesystems podd syncs (syncfs) before a freeze, when they exist. */
export const SYNC_PATHS = ['/', '/workspace'] as const;
/** Longest `sync` / `sync -f` may take, in ms. */
export const SYNC_TIMEOUT_MS = 60_000;


/** FreezeEnd says what ended a freeze (undefined: it still holds, or unknown). */
export type FreezeEnd = 'caller' | 'watchdog' | undefined;

/** PortFreeze is the freeze port's answer to a freeze. */
export interface PortFreeze {
  token: string;
  maxFreezeMs: number;
  /** Unix epoch ms when the host watchdog thaws. */
  deadlineUnixMs: number;
  /** Sandbox paths frozen. */
  filesystems: string[];
  /** Time of the FIFREEZE calls, ms. */
  freezeMs: number;
}

/** PortStatus is the freeze port's view of the current or latest freeze. */
export interface PortStatus {
  frozen: boolean;
  token: string;
  maxFreezeMs: number;
  remainingMs: number;
  endedBy: FreezeEnd;
  frozenMs: number;
}

/**
 * FreezePort is the host's FreezePortService for this VM. Errors are domain errors:
 * UnavailableError (port unreachable), FailedPreconditionError, InvalidArgumentError, ...
 */
export interface FreezePort {
  freeze(maxFreezeMs: number): Promise<PortFreeze>;
  thaw(token: string): Promise<{ endedBy: FreezeEnd; frozenMs: number }>;
  status(): Promise<PortStatus>;
}

/** QuiesceResult answers Quiesce. */
export interface QuiesceResult extends PortFreeze {
  /** Time of sync + syncfs before the freeze, ms. */
  syncMs: number;
}

/** QuiescerOptions wire a Quiescer. */
export interface QuiescerOptions {
  port: FreezePort;
  /** Runs sync + syncfs; default {@link syncFilesystems}. */
  sync?: () => Promise<void>;
  /** podd's failpoints, parsed at start (default: none active). */
  failpoints?: Failpoints<PoddFailpoint>;
}

/** Quiescer implements Quiesce / Thaw / GetFreezeStatus over a FreezePort. */
export class Quiescer {
  private readonly port: FreezePort;
  private readonly sync: () => Promise<void>;
  private readonly failpoints: Failpoints<PoddFailpoint>;

  constructor(opts: QuiescerOptions) {
    this.port = opts.port;
    this.sync = opts.sync ?? syncFilesystems;
    this.failpoints = opts.failpoints ?? poddFailpoints();
  }

  /**
   * quiesce: window = clampFreezeMs(requestedMs); FailedPreconditionError when a freeze holds
   * (asked first: a sync would block on a frozen fs); then sync + syncfs (timed: syncMs), then
   * the port freezes with its watchdog. A caller that went away before the freeze (signal
   * aborted) gets nothing frozen. UnavailableError when the port is unreachable (nothing frozen).
   */
  async quiesce(requestedMs: number, signal?: AbortSignal): Promise<QuiesceResult> {
    const maxFreezeMs = clampFreezeMs(requestedMs);
    const st = await this.port.status();
    if (st.frozen) throw new FailedPreconditionError(`a freeze holds already (${st.remainingMs} ms left)`);
    const t0 = performance.now();
    await this.sync();
    const syncMs = Math.round(performance.now() - t0);
    signal?.throwIfAborted();
    const r = await this.port.freeze(maxFreezeMs);
    await this.failpoints.hitAsync(FAILPOINTS.quiesceHangAfterFreeze);
    return { ...r, syncMs };
  }

  /** thaw ends the freeze named by token (InvalidArgumentError when empty; FailedPreconditionError when stale). */
  async thaw(token: string): Promise<{ endedBy: FreezeEnd; frozenMs: number }> {
    if (!token) throw new InvalidArgumentError('freeze_token: required');
    return this.port.thaw(token);
  }

  /** status describes the current or latest freeze. */
  status(): Promise<PortStatus> {
    return this.port.status();
  }
}

/**
 * syncFilesystems runs `sync` (sync(2): every filesystem) then `sync -f` (syncfs(2)) on each of
 * SYNC_PATHS that exists (busybox and coreutils both have `sync -f`).
 */
export async function syncFilesystems(): Promise<void> {
  await run('sync', [], { timeoutMs: SYNC_TIMEOUT_MS });
  const paths = SYNC_PATHS.filter((p) => existsSync(p));
  if (paths.length) await run('sync', ['-f', ...paths], { timeoutMs: SYNC_TIMEOUT_MS });
}
