/**
 * `sandnode upgrade server --from-build DIR`: start a standby server from another build (a
 * checkout with its own node_modules and dist; "." is this one) in the other slot and let it
 * take the node over by handover (AdminService.Handover): same listening sockets, lifecycle
 * calls held for the hold window, sandboxes adopted in place.
 */
import { spawn } from 'node:child_process';
import { closeSync, existsSync, mkdirSync, openSync, readFileSync, readdirSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { createSandnodeChannel, createServiceClient, processStartTicks, processState } from '@sandnode/shared';
import { VersionServiceDefinition } from '@sandnode/shared/proto/common/v1/version';
import { AdminServiceDefinition, ServerRole } from '@sandnode/shared/proto/server/v1/admin';
import type { TakeoverResult } from '../handover/server-node';
import { FlockLease } from '../store/flock-lease';
import { mainScript, nodeFor, pidFile, type StackDirs } from './stack';

/** Default time an upgrade may take, ms. */
export const DEFAULT_UPGRADE_TIMEOUT_MS = 120_000;

export async function upgradeServer(dirs: StackDirs, buildDir: string, timeoutMs = DEFAULT_UPGRADE_TIMEOUT_MS): Promise<TakeoverResult> {
  // The new server gets the environment as it is at the call (taken before the first await).
  const callerEnv = { ...process.env };
  // A running standby would race the server started here for the lease: use it instead.
  const standbys = await findStandbys(dirs);
  if (standbys.length) throw new Error(`a standby server already runs (pid ${standbys[0]?.pid}, version ${standbys[0]?.version}): upgrade with --standby, or stop it first`);
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
  const child = spawn(nodeFor(buildDir), [script], {
    detached: true,
    stdio: ['ignore', out, out],
    env: {
      ...callerEnv,
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

/** findStandbys lists the admin addresses of running servers in STANDBY (k8s: the standby slot's container). */
export async function findStandbys(dirs: StackDirs): Promise<{ admin: string; pid: number; version: string; slot: string }[]> {
  const runDir = path.resolve(dirs.runDir);
  const out: { admin: string; pid: number; version: string; slot: string }[] = [];
  for (const name of readdirSync(runDir).filter((n) => /^server-.+-admin\.sock$/.test(n))) {
    const admin = `unix://${path.join(runDir, name)}`;
    const ch = createSandnodeChannel(admin);
    try {
      const st = await createServiceClient(AdminServiceDefinition, ch, { timeoutMs: 1500, retryAttempts: 1 }).getLeaseStatus({});
      const v = await createServiceClient(VersionServiceDefinition, ch, { timeoutMs: 1500, retryAttempts: 1 }).getVersion({});
      if (st.role === ServerRole.SERVER_ROLE_STANDBY) out.push({ admin, pid: v.pid, version: st.version, slot: st.slot });
    } catch {
      /* a stale socket */
    } finally {
      ch.close();
    }
  }
  return out;
}

/**
 * upgradeServerViaStandby asks the running standby server (e.g. the standby slot's container
 * after its image was updated) to take the node over (AdminService.Takeover).
 */
export async function upgradeServerViaStandby(dirs: StackDirs, timeoutMs = DEFAULT_UPGRADE_TIMEOUT_MS): Promise<TakeoverResult> {
  const standbys = await findStandbys(dirs);
  if (standbys.length === 0) throw new Error('no standby server runs (start one in the standby slot, or use --from-build DIR)');
  if (standbys.length > 1) throw new Error(`${standbys.length} standby servers run (${standbys.map((s) => `pid ${s.pid}`).join(', ')}): stop all but one`);
  const sb = standbys[0]!;
  const ch = createSandnodeChannel(sb.admin);
  try {
    const r = await createServiceClient(AdminServiceDefinition, ch, { timeoutMs, retryAttempts: 1 }).takeover({ holdTimeoutMs: 0, finishTimeoutMs: 0 });
    writeFileSync(pidFile(dirs, 'server'), `${r.newPid} ${processStartTicks(r.newPid) ?? ''}\n`);
    return {
      takeover: true,
      oldPid: r.oldPid,
      oldVersion: r.oldVersion,
      newPid: r.newPid,
      newVersion: r.newVersion,
      epoch: Number(r.epoch),
      holdWindowMs: r.holdWindowMs,
      adopted: r.adopted,
      adoptionMs: r.adoptionMs,
      listeners: r.listeners,
    };
  } finally {
    ch.close();
  }
}
