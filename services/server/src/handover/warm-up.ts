/**
 * Warm-up of a server that is about to accept (handover step "adopt, handlers ready"): a few
 * read calls through its own public gRPC stack before the first client's call arrives.
 *
 * A fresh Node process runs every function of the call path for the first time on the first
 * call: lazy compilation, inline caches, grpc-js's HTTP/2 session setup, the codecs of the
 * sandbox messages, the middleware and a records.db read. Measured on this machine that first
 * call took 40–90 ms, and it fell inside the handover's switch: the clients the old server
 * had just sent GOAWAY waited for it (the bench's "gap"). The same calls made here, on a
 * private socket before the listeners open, take that cost out of the switch. The idea is the
 * warm-up requests of load balancers' slow start (Envoy's `slow_start_config`, HAProxy's
 * `slowstart`), done inside the process because the sockets move, not the traffic.
 *
 * The calls are reads (GetSandbox of known ids, ListSandboxes, and GetSandbox of an id no
 * sandbox has): they change nothing and are not activity for the idle actions
 * (rpc/idle-hooks.ts NOT_ACTIVITY). They are counted in grpc_server_handled_total like any call.
 */
import { lstatSync, mkdtempSync, readdirSync, rmSync } from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { createSandnodeChannel, createServiceClient, type Logger, type ServiceServer } from '@sandnode/shared';
import { SandboxServiceDefinition } from '@sandnode/shared/proto/server/v1/sandbox';

/** The longest the warm-up may take, ms: it runs while lifecycle calls are held. */
export const WARM_UP_BUDGET_MS = 50;
/** Rounds of calls (each round: GetSandbox of a known id, of an unknown id, ListSandboxes). */
const ROUNDS = 4;

/**
 * warmUp serves a private unix socket in a fresh 0700 dir under runDir with host's handlers,
 * sends ROUNDS rounds of reads through it (ids: sandboxes to read; may be empty), stops at
 * budgetMs and closes everything. Never throws: a failed warm-up only costs the first
 * client call its speed (logged at debug). Returns the calls answered, the ms it took and each call's ms.
 */
export async function warmUp(host: ServiceServer, runDir: string, ids: string[], log: Logger, budgetMs = WARM_UP_BUDGET_MS): Promise<{ calls: number; ms: number; callMs: number[] }> {
  const t0 = performance.now();
  sweepWarmUpDirs(runDir, log);
  const dir = mkdtempSync(path.join(runDir, `warm-${process.pid}-`));
  const sock = path.join(dir, 's.sock');
  const listener = net.createServer();
  host.serveListener(listener);
  let calls = 0;
  const took: number[] = [];
  const ch = createSandnodeChannel(`unix://${sock}`);
  try {
    await new Promise<void>((resolve, reject) => {
      listener.once('error', reject);
      listener.listen(sock, () => resolve());
    });
    const client = createServiceClient(SandboxServiceDefinition, ch, { timeoutMs: budgetMs, retryAttempts: 1 });
    const deadline = t0 + budgetMs;
    const read = async (call: () => Promise<unknown>) => {
      if (performance.now() > deadline) return;
      const c0 = performance.now();
      await call().catch(() => undefined); // NOT_FOUND for the unknown id is the point of that call
      took.push(Math.round(performance.now() - c0));
      calls++;
    };
    for (let r = 0; r < ROUNDS && performance.now() < deadline; r++) {
      await read(() => client.getSandbox({ sandboxId: ids[r % Math.max(1, ids.length)] ?? 'sb-0000000000000000' }, { retry: false }));
      await read(() => client.getSandbox({ sandboxId: 'sb-0000000000000000' }, { retry: false }));
      await read(() => client.listSandboxes({ pageSize: 1 }, { retry: false }));
    }
  } catch (err) {
    log.debug({ err }, 'warm-up failed: the first calls after the switch are slower');
  } finally {
    ch.close();
    listener.close();
    rmSync(dir, { recursive: true, force: true });
  }
  return { calls, ms: Math.round(performance.now() - t0), callMs: took };
}

/** A warm-up dir's name: `warm-<pid of the server that made it>-<random>`. */
const WARM_DIR = /^warm-(\d+)-[A-Za-z0-9]+$/;

/**
 * sweepWarmUpDirs removes the warm-up dirs under runDir that a server killed during its warm-up
 * left (orphan sweep): those whose maker's pid no longer runs, and those of the old unnamed
 * form `warm-XXXXXX`. A dir of a live process is kept (it may be warming up right now). Only
 * real directories directly under runDir are removed (lstat: a symlink is not followed).
 * Never throws. Returns the names removed.
 */
export function sweepWarmUpDirs(runDir: string, log?: Logger): string[] {
  const removed: string[] = [];
  let names: string[];
  try {
    names = readdirSync(runDir);
  } catch {
    return removed;
  }
  for (const name of names) {
    if (!name.startsWith('warm-')) continue;
    const m = WARM_DIR.exec(name);
    if (m && pidRuns(Number(m[1]))) continue;
    const p = path.join(runDir, name);
    try {
      if (!lstatSync(p).isDirectory()) continue;
      rmSync(p, { recursive: true, force: true });
      removed.push(name);
    } catch (err) {
      log?.debug({ err, dir: name }, 'could not remove a stale warm-up dir');
    }
  }
  if (removed.length > 0) log?.info({ dirs: removed }, 'removed warm-up dirs of servers that no longer run');
  return removed;
}

function pidRuns(pid: number): boolean {
  if (!Number.isSafeInteger(pid) || pid <= 0) return false;
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'EPERM';
  }
}
