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
import { clampFreezeMs, CommandError, FailedPreconditionError, InternalError, InvalidArgumentError, run, type Failpoints, type Logger } from '@sandnode/shared';
import { FAILPOINTS, poddFailpoints, type PoddFailpoint } from './failpoints';

export { clampFreezeMs, DEFAULT_FREEZE_MS, MAX_FREEZE_MS, MIN_FREEZE_MS } from '@sandnode/shared';
/** Filesystems podd syncs (syncfs) before a freeze, when they exist. */
export const SYNC_PATHS = ['/', '/workspace'] as const;
/** Default of the longest `sync` / `sync -f` may take, in ms (config `syncTimeoutMs`). */
export const DEFAULT_SYNC_TIMEOUT_MS = 60_000;

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
  /** freeze is not cancellable: once asked, the host's watchdog bounds it and the token must come back. */
  freeze(maxFreezeMs: number): Promise<PortFreeze>;
  /** thaw and status end early (AbortError) when signal aborts. */
  thaw(token: string, signal?: AbortSignal): Promise<{ endedBy: FreezeEnd; frozenMs: number }>;
  status(signal?: AbortSignal): Promise<PortStatus>;
}

/** QuiesceResult answers Quiesce. */
export interface QuiesceResult extends PortFreeze {
  /** Time of sync + syncfs before the freeze, ms. */
  syncMs: number;
}

/** QuiescerOptions wire a Quiescer. */
export interface QuiescerOptions {
  port: FreezePort;
  /** Runs sync + syncfs, ending early when signal aborts; default {@link syncFilesystems}. */
  sync?: (signal?: AbortSignal) => Promise<void>;
  /** Longest each sync command may take, in ms (default {@link DEFAULT_SYNC_TIMEOUT_MS}); for the default sync. */
  syncTimeoutMs?: number;
  /** Where a failed sync is logged in full (its stderr never reaches the caller). */
  log?: Logger;
  /** podd's failpoints, parsed at start (default: none active). */
  failpoints?: Failpoints<PoddFailpoint>;
}

/** Quiescer implements Quiesce / Thaw / GetFreezeStatus over a FreezePort. */
export class Quiescer {
  private readonly port: FreezePort;
  private readonly sync: (signal?: AbortSignal) => Promise<void>;
  private readonly log: Logger | undefined;
  private readonly failpoints: Failpoints<PoddFailpoint>;

  constructor(opts: QuiescerOptions) {
    this.port = opts.port;
    const syncTimeoutMs = opts.syncTimeoutMs ?? DEFAULT_SYNC_TIMEOUT_MS;
    this.sync = opts.sync ?? ((signal) => syncFilesystems(syncTimeoutMs, signal));
    this.log = opts.log;
    this.failpoints = opts.failpoints ?? poddFailpoints();
  }

  /**
   * quiesce: window = clampFreezeMs(requestedMs); FailedPreconditionError when a freeze holds
   * (asked first: a sync would block on a frozen fs); then sync + syncfs (timed: syncMs), then
   * the port freezes with its watchdog. A caller that went away before the freeze (signal
   * aborted) gets nothing frozen. UnavailableError when the port is unreachable (nothing frozen);
   * InternalError with a short message when the sync fails (the full error goes to the log).
   */
  async quiesce(requestedMs: number, signal?: AbortSignal): Promise<QuiesceResult> {
    const maxFreezeMs = clampFreezeMs(requestedMs);
    const st = await this.port.status(signal);
    if (st.frozen) throw new FailedPreconditionError(`a freeze holds already (${st.remainingMs} ms left)`);
    const t0 = performance.now();
    try {
      await this.sync(signal);
    } catch (err) {
      signal?.throwIfAborted();
      this.log?.error({ err }, 'sync before the freeze failed; nothing frozen');
      const exit = err instanceof CommandError && err.exitCode >= 0 ? ` (exit ${err.exitCode})` : '';
      throw new InternalError(`sync of the sandbox filesystems failed${exit}; nothing frozen (see the podd log)`);
    }
    const syncMs = Math.round(performance.now() - t0);
    signal?.throwIfAborted();
    const r = await this.port.freeze(maxFreezeMs);
    await this.failpoints.hitAsync(FAILPOINTS.quiesceHangAfterFreeze);
    return { ...r, syncMs };
  }

  /** thaw ends the freeze named by token (InvalidArgumentError when empty; FailedPreconditionError when stale). */
  async thaw(token: string, signal?: AbortSignal): Promise<{ endedBy: FreezeEnd; frozenMs: number }> {
    if (!token) throw new InvalidArgumentError('freeze_token: required');
    return this.port.thaw(token, signal);
  }

  /** status describes the current or latest freeze. */
  status(signal?: AbortSignal): Promise<PortStatus> {
    return this.port.status(signal);
  }
}

/**
 * syncFilesystems runs `sync` (sync(2): every filesystem) then `sync -f` (syncfs(2)) on each of
 * SYNC_PATHS that exists (busybox and coreutils both have `sync -f`), each for at most
 * timeoutMs; signal kills the running one. Rejects with CommandError when one fails.
 */
export async function syncFilesystems(timeoutMs = DEFAULT_SYNC_TIMEOUT_MS, signal?: AbortSignal): Promise<void> {
  await run('sync', [], { timeoutMs, signal });
  const paths = SYNC_PATHS.filter((p) => existsSync(p));
  if (paths.length) await run('sync', ['-f', ...paths], { timeoutMs, signal });
}
