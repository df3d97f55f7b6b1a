/**
 * NetWorker: the supervisor's side of the network worker thread (net-worker-main.ts): slot
 * setup over rtnetlink and nftables changes through libnftables, in-process. One worker per
 * process, started at the first call; calls are answered in order. A worker that fails to
 * start, crashes or reports it could not return to the host netns is marked broken with the
 * reason ({@link NetWorker.broken}); callers then take the spawn path (net-host.ts) — they
 * never lose a change because of the worker.
 *
 * SLOT_SETUP_ENV (`SANDNODE_SLOT_SETUP`): `spawn` keeps every slot setup and nft change on the
 * process-spawning path; unset or `netlink`: the worker.
 */
import { existsSync } from 'node:fs';
import path from 'node:path';
import { Worker } from 'node:worker_threads';

/** The env var that picks the slot setup path: `spawn` or `netlink` (default). */
export const SLOT_SETUP_ENV = 'SANDNODE_SLOT_SETUP';

/** SlotSetupPath: how slots are made and nft changes applied. */
export type SlotSetupPath = 'netlink' | 'spawn';

/** slotSetupFromEnv reads SLOT_SETUP_ENV; throws Error naming the variable for another value. */
export function slotSetupFromEnv(env: NodeJS.ProcessEnv = process.env): SlotSetupPath {
  const v = (env[SLOT_SETUP_ENV] ?? '').trim();
  if (v === '' || v === 'netlink') return 'netlink';
  if (v === 'spawn') return 'spawn';
  throw new Error(`${SLOT_SETUP_ENV}: ${JSON.stringify(v)} is not "netlink" or "spawn"`);
}

/** WorkerCallError: the worker ran the call and it failed (step, errno); the host may be half-changed, undo as for a CommandError. */
export class WorkerCallError extends Error {
  constructor(
    message: string,
    readonly step: string,
    readonly errno: number,
  ) {
    super(message);
  }
}

/** WorkerBrokenError: the worker is not usable (did not start, died; a call it died in may be partly done: undo as for a failure). */
export class WorkerBrokenError extends Error {}

/** The compiled worker entry: beside this file in dist, or dist's copy when this runs from src (ts-jest). */
function workerMain(): string {
  const here = path.join(__dirname, 'net-worker-main.js');
  if (existsSync(here)) return here;
  return path.resolve(__dirname, '../../dist/network/net-worker-main.js');
}

interface Pending {
  resolve: (v: unknown) => void;
  reject: (e: Error) => void;
}

/** SlotSpec: what the worker's createSlot needs. */
export interface WorkerSlot {
  netnsPath: string;
  hostIfname: string;
  address: string;
  gateway: string;
  prefixLen: number;
  existing: boolean;
}

/** NetWorker runs network calls on the worker thread. */
export class NetWorker {
  private worker: Worker | undefined;
  private readonly pending = new Map<number, Pending>();
  private nextId = 1;
  /** Why the worker is not used (undefined: usable). */
  broken: string | undefined;

  private start(): Worker {
    const main = workerMain();
    if (!existsSync(main)) throw new WorkerBrokenError(`${main} is missing (build the supervisor)`);
    const w = new Worker(main);
    w.on('message', (m: { id?: number; ok?: boolean; result?: unknown; error?: string; step?: string; errno?: number; fatal?: string }) => {
      if (m.fatal) {
        this.fail(m.fatal);
        return;
      }
      const p = this.pending.get(m.id ?? -1);
      if (!p) return;
      this.pending.delete(m.id!);
      if (this.pending.size === 0) w.unref();
      if (m.ok) p.resolve(m.result);
      else p.reject(new WorkerCallError(m.error ?? 'failed', m.step ?? '', m.errno ?? 0));
    });
    w.on('error', (err) => this.fail(`worker error: ${err.message}`));
    w.on('exit', (code) => this.fail(`worker exited (code ${code})`));
    w.unref();
    return w;
  }

  private fail(why: string): void {
    if (!this.worker) return;
    this.broken ??= why;
    const w = this.worker;
    this.worker = undefined;
    for (const p of this.pending.values()) p.reject(new WorkerBrokenError(`network worker: ${why}`));
    this.pending.clear();
    void w.terminate().catch(() => undefined);
  }

  /** call runs op on the worker. Rejects WorkerBrokenError (unusable: nothing done) or WorkerCallError (ran and failed). */
  call<T>(op: string, args: unknown): Promise<T> {
    if (this.broken) return Promise.reject(new WorkerBrokenError(`network worker: ${this.broken}`));
    try {
      this.worker ??= this.start();
    } catch (err) {
      this.broken = (err as Error).message;
      return Promise.reject(err instanceof WorkerBrokenError ? err : new WorkerBrokenError(this.broken));
    }
    const id = this.nextId++;
    const w = this.worker;
    return new Promise<T>((resolve, reject) => {
      this.pending.set(id, { resolve: resolve as (v: unknown) => void, reject });
      w.ref();
      w.postMessage({ id, op, args });
    });
  }

  /** createSlot makes a veth-mode slot (see net-worker-main.ts); between: runs between its netns half and its host half (failpoints). */
  async createSlot(a: WorkerSlot, between: () => void = () => {}): Promise<void> {
    await this.call('slotNetns', a);
    between();
    await this.call('slotHost', a);
  }

  /** destroySlot removes a slot's host veth, netns mount and file (idempotent). */
  destroySlot(a: { netnsPath: string; hostIfname: string }): Promise<void> {
    return this.call('destroySlot', { netnsPath: a.netnsPath, hostIfname: a.hostIfname });
  }

  /** nft applies an nft script as one transaction; resolves '' or nft's error text (nothing changed then). */
  nft(text: string): Promise<string> {
    return this.call('nft', text);
  }

  /** links lists the host links whose name starts with prefix. */
  links(prefix: string): Promise<{ name: string; up: boolean; addrs: string[] }[]> {
    return this.call('links', prefix);
  }

  /** close ends the worker (pending calls reject). */
  async close(): Promise<void> {
    const w = this.worker;
    this.fail('closed');
    this.broken = undefined;
    if (w) await w.terminate().catch(() => undefined);
  }
}
