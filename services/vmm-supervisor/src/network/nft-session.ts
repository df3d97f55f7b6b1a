/**
 * NftSession: changes go through libnftables on the network worker thread when the session has
 * a usable worker (net-worker.ts: `nft_run_cmd_from_buffer`, one buffer = one transaction, no
 * process, ~0.2-0.5 ms a slot change here); else, or when the worker breaks, through one
 * long-lived `nft -i` process that applies the node's table changes, so that a
 * change costs what nft needs for the change (about 2 ms here) and not a process start and a
 * fresh ruleset cache (`nft -f -`: 10-40 ms on a loaded host; the spare path of CreateVm is
 * one change). Each change is written as ONE line (nft runs one line as one batch: one
 * transaction, all or nothing), followed by a command that fails on purpose naming a unique
 * set (`list set inet <table> sync-<n>`): its error on stderr marks the end of the change, and
 * any "Error:" line before it is the change's own failure. Changes are serialised. A session
 * that dies or does not answer within SYNC_TIMEOUT_MS is killed and the change is retried
 * once with `nft -f -`, so a broken session never loses a change.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { CommandError, run, type Logger } from '@sandnode/shared';
import { WorkerBrokenError, WorkerCallError, type NetWorker } from './net-worker';

/** Longest a change may take in the session before it is given up (then `nft -f -`), ms. */
export const SYNC_TIMEOUT_MS = 10_000;

/** oneLine joins a multi-line nft script into one line (`;` between statements; nft allows the empty ones this leaves). */
export function oneLine(text: string): string {
  return text
    .split('\n')
    .map((l) => l.trim())
    .filter((l) => l !== '')
    .join('; ');
}

/** changeError is the failure of a change in the stderr text before its sync marker, or undefined when it applied. */
export function changeError(before: string): string | undefined {
  const lines = before.split('\n');
  // the last "Error:" line belongs to the sync command itself
  const errs = lines.map((l, i) => (l.startsWith('Error:') ? i : -1)).filter((i) => i >= 0);
  if (errs.length <= 1) return undefined;
  return lines
    .slice(errs[0], errs[errs.length - 1])
    .join('\n')
    .trim();
}

/** NftSession applies changes to one table through a persistent `nft -i`. */
export class NftSession {
  private proc: ChildProcess | undefined;
  private stderr = '';
  private seq = 0;
  private tail: Promise<unknown> = Promise.resolve();
  /** Changes applied or waiting (0: the next one starts at once, in the caller's turn). */
  private queued = 0;
  private closed = false;
  /** Why libnftables is not used (undefined: it is, when there is a worker). */
  private noLib: string | undefined;

  constructor(
    private readonly table: string,
    private readonly log: Logger,
    private readonly worker?: NetWorker,
  ) {}

  /**
   * apply runs text (an nft script) as one transaction. Throws CommandError naming nft's error;
   * nothing changed then. With nothing queued the change starts before apply returns (its
   * message is on the worker), so a caller can write its row while the worker applies it.
   */
  apply(text: string): Promise<void> {
    this.queued++;
    const next = (this.queued === 1 ? this.applyNow(text) : this.tail.then(() => this.applyNow(text))).finally(() => this.queued--);
    this.tail = next.catch(() => undefined);
    return next;
  }

  /** close ends the session process. */
  close(): void {
    this.closed = true;
    this.proc?.kill('SIGKILL');
    this.proc = undefined;
  }

  private async applyNow(text: string): Promise<void> {
    if (this.worker && !this.worker.broken && this.noLib === undefined && !this.closed) {
      try {
        const err = await this.worker.nft(text);
        if (err === '') return;
        throw new CommandError(`nft: ${err.split('\n')[0]}`, err, 1);
      } catch (e) {
        if (e instanceof WorkerCallError) {
          // libnftables could not be loaded (not installed): the session below from now on
          this.noLib = e.message;
          this.log.warn({ err: e }, 'libnftables not usable: nft changes go through nft -i');
        } else if (e instanceof WorkerBrokenError) this.log.warn({ err: e }, 'network worker broken: nft changes go through nft -i');
        else throw e;
      }
    }
    if (!this.closed) {
      try {
        const err = await this.inSession(text);
        if (err === undefined) return;
        throw new CommandError(`nft: ${err.split('\n')[0]}`, err, 1);
      } catch (e) {
        if (e instanceof CommandError) throw e;
        this.log.warn({ err: e }, 'nft session failed; this change goes through nft -f');
        this.proc?.kill('SIGKILL');
        this.proc = undefined;
      }
    }
    // rare (the session broke): spawned from here, not through the command helpers
    await run('nft', ['-f', '-'], { input: text });
  }

  private start(): ChildProcess {
    const p = spawn('nft', ['-i'], { stdio: ['pipe', 'ignore', 'pipe'] });
    p.stderr!.setEncoding('utf8');
    p.stderr!.on('data', (d: string) => (this.stderr += d));
    p.once('exit', () => {
      if (this.proc === p) this.proc = undefined;
    });
    p.stdin!.on('error', () => undefined);
    p.unref();
    (p.stdin as unknown as { unref?: () => void }).unref?.();
    (p.stderr as unknown as { unref?: () => void }).unref?.();
    return p;
  }

  /** inSession returns the change's error text, or undefined when it applied; throws when the session broke. */
  private inSession(text: string): Promise<string | undefined> {
    const p = (this.proc ??= this.start());
    const marker = `sync-${++this.seq}`;
    this.stderr = '';
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => done(new Error(`nft -i gave no answer in ${SYNC_TIMEOUT_MS} ms`)), SYNC_TIMEOUT_MS);
      const onExit = () => done(new Error('nft -i exited'));
      const check = () => {
        const i = this.stderr.indexOf(` ${marker}`);
        if (i < 0) return;
        done(undefined, changeError(this.stderr.slice(0, this.stderr.lastIndexOf('\n', i) + 1)));
      };
      const done = (err?: Error, result?: string) => {
        clearTimeout(timer);
        p.stderr!.off('data', check);
        p.off('exit', onExit);
        if (err) reject(err);
        else resolve(result);
      };
      p.stderr!.on('data', check);
      p.once('exit', onExit);
      p.stdin!.write(`${oneLine(text)}\nlist set inet ${this.table} ${marker}\n`);
    });
  }
}
