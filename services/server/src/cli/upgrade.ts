/**
 * `sandnode upgrade server --from-build DIR`: start a standby server from another build (a
 * checkout with its own node_modules and dist; "." is this one) in the other slot and let it
 * take the node over by handover (AdminService.Handover): same listening sockets, lifecycle
 * calls held for the hold window, sandboxes adopted in place.
 */
import { spawn } from 'node:child_process';
import { closeSync, existsSync, mkdirSync, openSync, readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { processStartTicks, processState } from '@sandnode/shared';
import type { TakeoverResult } from '../handover/server-node';
import { FlockLease } from '../store/flock-lease';
import { mainScript, pidFile, type StackDirs } from './stack';

/** Default time an upgrade may take, ms. */
export const DEFAULT_UPGRADE_TIMEOUT_MS = 120_000;

export async function upgradeServer(dirs: StackDirs, buildDir: string, timeoutMs = DEFAULT_UPGRADE_TIMEOUT_MS): Promise<TakeoverResult> {
  const script = mainScript('server', buildDir);
  if (!existsSync(script)) throw new Error(`${script} does not exist: build that checkout first (npm run build in ${path.resolve(buildDir)})`);
  const leaseFile = path.join(path.resolve(dirs.stateDir), 'server.lease');
  // The lease file is rewritten when a server becomes active: read it again for a moment
  // before concluding that no server is active.
  let holder = FlockLease.readHolder(leaseFile);
  for (let i = 0; i < 40 && (!holder || !FlockLease.isHeld(leaseFile)); i++) {
    await new Promise((r) => setTimeout(r, 50));
    holder = FlockLease.readHolder(leaseFile);
  }
  if (!holder || !FlockLease.isHeld(leaseFile)) throw new Error('no active server: start one with `sandnode up`');
  const slot = holder.slot === 'b' ? 'a' : 'b';
  const logDir = path.join(path.resolve(dirs.runDir), 'logs');
  mkdirSync(logDir, { recursive: true });
  const logPath = path.join(logDir, `server-${slot}.log`);
  const out = openSync(logPath, 'a');
  const start = readFileSync(logPath).length;
  const child = spawn(process.execPath, [script], {
    detached: true,
    stdio: ['ignore', out, out],
    env: {
      ...process.env,
      SANDNODE_SERVER_STATE_DIR: path.resolve(dirs.stateDir),
      SANDNODE_SERVER_RUN_DIR: path.resolve(dirs.runDir),
      SANDNODE_SERVER_LISTEN: dirs.listen,
      SANDNODE_SERVER_SLOT: slot,
      SANDNODE_SERVER_TAKEOVER: 'true',
    },
  });
  closeSync(out);
  child.unref();
  let exited: number | string | undefined;
  child.once('exit', (c, sig) => (exited = c ?? `null (signal ${sig})`));
  const deadline = Date.now() + timeoutMs;
  // What became of the old server, for the error: it stays active (or takes the lease back)
  // unless it died too (kill -9 during the handover): then no server is active.
  const holderTicks = processStartTicks(holder.pid);
  const oldFate = () =>
    holderTicks !== undefined && processStartTicks(holder.pid) === holderTicks && processState(holder.pid) !== 'Z'
      ? `the old one (pid ${holder.pid}) stays active`
      : `the old one (pid ${holder.pid}) is gone too, so no server is active: start one (sandnode up)`;
  for (;;) {
    const text = readFileSync(logPath).subarray(start).toString();
    for (const line of text.split('\n')) {
      if (!line.startsWith('{"takeover"')) continue;
      const r = JSON.parse(line) as TakeoverResult | { takeover: false; error: string };
      if (r.takeover === false) throw new Error(`the new server failed before it took the lease; ${oldFate()}: ${r.error}`);
      writeFileSync(pidFile(dirs, 'server'), `${r.newPid} ${processStartTicks(r.newPid) ?? ''}\n`);
      return r;
    }
    if (exited !== undefined) throw new Error(`the new server exited with code ${exited}; ${oldFate()}; see ${logPath}`);
    if (Date.now() > deadline) {
      // a new server that hangs must not linger: stop it (the old one keeps or retakes the lease)
      try {
        process.kill(child.pid ?? 0, 'SIGKILL');
      } catch {
        /* gone */
      }
      await new Promise((r) => setTimeout(r, 300));
      throw new Error(`the upgrade did not finish within ${timeoutMs} ms and the new server was stopped; ${oldFate()}; see ${logPath}`);
    }
    await new Promise((r) => setTimeout(r, 20));
  }
}
