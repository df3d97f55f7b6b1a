/**
 * LifecycleGate: how an active server stops starting lifecycle operations for a handover
 * (ARCHITECTURE.md section 4, step 3). Open: operations enter and are counted. Closed: new
 * operations wait up to holdMs for it to open again, then fail UNAVAILABLE (retryable; the
 * shared client retries idempotent calls), and `close()` resolves once the operations that
 * already entered have finished. Retired: every waiting and new operation fails UNAVAILABLE at
 * once (the node has a new active server).
 */
import { UnavailableError } from '@sandnode/shared';

/** How long a new operation waits while the gate is closed, ms (a handover's hold window). */
export const DEFAULT_GATE_HOLD_MS = 2000;

interface Waiter {
  resolve: () => void;
  reject: (e: unknown) => void;
  timer: NodeJS.Timeout;
}

export class LifecycleGate {
  private inflight = 0;
  private state: 'open' | 'closed' | 'retired' = 'open';
  private waiters: Waiter[] = [];
  private idle: (() => void)[] = [];
  /** How long a new operation waits while the gate is closed, ms. */
  holdMs = DEFAULT_GATE_HOLD_MS;

  /** inFlight is how many lifecycle operations run now. */
  get inFlight(): number {
    return this.inflight;
  }

  get isOpen(): boolean {
    return this.state === 'open';
  }

  /**
   * run enters the gate (waiting while closed), runs fn, and leaves. signal (the caller went
   * away) ends the wait to enter with signal.reason; it has no effect once fn runs.
   */
  async run<T>(fn: () => Promise<T>, signal?: AbortSignal): Promise<T> {
    signal?.throwIfAborted();
    if (this.state !== 'open') await this.wait(signal);
    this.inflight++;
    try {
      return await fn();
    } finally {
      this.inflight--;
      if (this.inflight === 0) this.idle.splice(0).forEach((r) => r());
    }
  }

  private wait(signal?: AbortSignal): Promise<void> {
    if (this.state === 'retired') return Promise.reject(retiredError());
    return new Promise((resolve, reject) => {
      const leave = (w: Waiter) => {
        clearTimeout(w.timer);
        this.waiters = this.waiters.filter((x) => x !== w);
        signal?.removeEventListener('abort', onAbort);
      };
      const w: Waiter = {
        resolve: () => {
          leave(w);
          resolve();
        },
        reject: (e) => {
          leave(w);
          reject(e);
        },
        timer: setTimeout(() => w.reject(new UnavailableError(`a server handover is in progress; lifecycle calls are held at most ${this.holdMs} ms: retry`)), this.holdMs),
      };
      const onAbort = () => w.reject(signal?.reason);
      signal?.addEventListener('abort', onAbort, { once: true });
      this.waiters.push(w);
    });
  }

  /** close stops new operations; resolves when the running ones have finished. */
  close(): Promise<void> {
    this.state = 'closed';
    return this.inflight === 0 ? Promise.resolve() : new Promise((r) => this.idle.push(r));
  }

  /** open lets held and new operations run again (a handover was aborted). */
  open(): void {
    this.state = 'open';
    for (const w of [...this.waiters]) w.resolve();
  }

  /** retire fails every held and future operation with UNAVAILABLE. */
  retire(): void {
    this.state = 'retired';
    for (const w of [...this.waiters]) w.reject(retiredError());
  }
}

function retiredError(): Error {
  return new UnavailableError('this server handed the node over to a new server: retry (the connection moves to it)');
}
