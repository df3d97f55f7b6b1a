/**
 * CommandRunner: host commands (runc, umount, mount) run in a few small helper processes
 * (spawner-child.ts) instead of by the supervisor itself. A child process start forks the
 * parent on its one thread, for a time that grows with the parent's memory; the supervisor's
 * heap grows with its VMs, so each of the ~8 commands of a VM stop held every other VM's calls
 * (a drain at concurrency 8 was no faster than at 1). Errors are those of @sandnode/shared's
 * `run`: CommandError (exit code, stderr) for a command that fails; InternalError when a
 * helper dies with the command in flight (it is started again for the next one).
 */
import { spawn, type ChildProcess } from 'node:child_process';
import path from 'node:path';
import { createInterface } from 'node:readline';
import { CommandError, DEFAULT_COMMAND_TIMEOUT_MS, InternalError, run as runHere, type RunResult } from '@sandnode/shared';
import type { SpawnReply, SpawnRequest } from './spawner-child';
import { commandLabel, hostCommands } from '../metrics';

/** How many helper processes run commands at once. */
export const DEFAULT_SPAWNERS = 2;

interface Pending {
  resolve(r: RunResult): void;
  reject(err: Error): void;
  what: string;
}

/** One helper process and the commands it runs. */
class Spawner {
  private readonly child: ChildProcess;
  readonly pending = new Map<number, Pending>();
  dead = false;

  constructor(script: string) {
    this.child = spawn(process.execPath, [script], { stdio: ['pipe', 'pipe', 'inherit'] });
    // an idle helper keeps no process alive; one with a command in flight does (see hold)
    this.child.unref();
    this.hold(false);
    createInterface({ input: this.child.stdout! }).on('line', (line) => {
      const r = JSON.parse(line) as SpawnReply;
      const p = this.pending.get(r.id);
      this.pending.delete(r.id);
      if (this.pending.size === 0) this.hold(false);
      if (!p) return; // cancelled
      if (r.ok) p.resolve({ stdout: r.stdout, stderr: r.stderr });
      else p.reject(new CommandError(`${p.what}: ${r.how}: ${r.stderr.trim() || r.how}`, r.stderr, r.exitCode));
    });
    const die = (why: string) => {
      this.dead = true;
      for (const [id, p] of this.pending) {
        this.pending.delete(id);
        p.reject(new InternalError(`${p.what}: the command helper ${why}`));
      }
    };
    this.child.once('exit', (code, sig) => die(`exited (${code ?? sig})`));
    this.child.once('error', (err) => die(`failed: ${err.message}`));
    this.child.stdin!.on('error', () => undefined); // a helper that died: 'exit' rejects its calls
  }

  send(m: SpawnRequest | { cancel: number }): void {
    if (!('cancel' in m)) this.hold(true);
    this.child.stdin!.write(`${JSON.stringify(m)}\n`);
  }

  /** hold refs the helper's pipes (the event loop waits for its answers) or unrefs them when idle. */
  private hold(on: boolean): void {
    for (const s of [this.child.stdin, this.child.stdout] as unknown as ({ ref(): void; unref(): void } | null)[]) {
      if (on) s?.ref();
      else s?.unref();
    }
  }

  close(): void {
    this.child.stdin!.end();
  }
}

/** CommandRunner runs host commands through a pool of helper processes; see the file header. */
export class CommandRunner {
  private readonly spawners: (Spawner | undefined)[];
  private nextId = 1;

  /** script: the built spawner-child.js; size: helpers (DEFAULT_SPAWNERS). */
  constructor(
    private readonly script = path.join(__dirname, 'spawner-child.js'),
    size = DEFAULT_SPAWNERS,
  ) {
    this.spawners = Array.from({ length: Math.max(1, size) }, () => undefined);
  }

  /**
   * run executes cmd (no shell) in the least busy helper and resolves with its output, like
   * shared `run` (timeoutMs: default DEFAULT_COMMAND_TIMEOUT_MS; signal kills the command and
   * rejects with an AbortError).
   */
  run(cmd: string, args: string[], opts: { timeoutMs?: number; input?: string; signal?: AbortSignal } = {}): Promise<RunResult> {
    opts.signal?.throwIfAborted();
    const s = this.pick();
    const id = this.nextId++;
    const what = `${cmd} ${args.join(' ')}`;
    return new Promise<RunResult>((resolve, reject) => {
      const onAbort = () => {
        s.send({ cancel: id });
        s.pending.delete(id);
        reject(opts.signal?.reason instanceof Error ? opts.signal.reason : new DOMException('aborted', 'AbortError'));
      };
      opts.signal?.addEventListener('abort', onAbort, { once: true });
      const done = () => opts.signal?.removeEventListener('abort', onAbort);
      s.pending.set(id, {
        what,
        resolve: (r) => (done(), resolve(r)),
        reject: (e) => (done(), reject(e)),
      });
      s.send({ id, cmd, args, timeoutMs: opts.timeoutMs ?? DEFAULT_COMMAND_TIMEOUT_MS, input: opts.input });
    });
  }

  /** close ends the helpers (each exits when its stdin ends; commands in flight finish). */
  close(): void {
    for (const s of this.spawners) s?.close();
    this.spawners.fill(undefined);
  }

  private pick(): Spawner {
    let best = -1;
    for (let i = 0; i < this.spawners.length; i++) {
      const s = this.spawners[i];
      if (!s || s.dead) this.spawners[i] = new Spawner(this.script);
      if (best < 0 || this.spawners[i]!.pending.size < this.spawners[best]!.pending.size) best = i;
    }
    return this.spawners[best]!;
  }
}

let shared: CommandRunner | undefined;

/**
 * runCommand runs a host command through the process's CommandRunner (made on first use), or
 * in this process when SANDNODE_VMM_SUPERVISOR_COMMAND_HELPERS is "0"; counted in the metric
 * sandnode_vmm_host_commands_total.
 */
export function runCommand(cmd: string, args: string[], opts: { timeoutMs?: number; input?: string; signal?: AbortSignal } = {}): Promise<RunResult> {
  hostCommands.inc({ command: commandLabel(cmd, args) });
  if (process.env.SANDNODE_VMM_SUPERVISOR_COMMAND_HELPERS === '0') return runHere(cmd, args, opts);
  shared ??= new CommandRunner();
  return shared.run(cmd, args, opts);
}

/** closeCommands ends the process's helpers (supervisor shutdown). */
export function closeCommands(): void {
  shared?.close();
  shared = undefined;
}
