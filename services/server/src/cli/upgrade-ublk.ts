/**
 * `sandnode upgrade ublk-manager --from-build DIR`: start ublk-manager from another build in
 * the other slot, move every device to it with HandoverAll (one device at a time; the old slot
 * takes a device back if its move fails), stop the old slot, and point the stable address
 * `<runDir>/ublk-manager.sock` (what the server dials) at the new slot's socket.
 */
import { spawn } from 'node:child_process';
import { closeSync, existsSync, lstatSync, mkdirSync, openSync, readlinkSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { askVersion, createSandnodeChannel, createServiceClient, processStartTicks, socketPath, unixAddress } from '@sandnode/shared';
import { DeviceServiceDefinition, HandoverResult } from '@sandnode/shared/proto/ublk/v1/ublk';
import { mainScript, nodeFor, pidFile, tail, pointUblkAddress, setActiveUblkSlot, type StackDirs } from './stack';
import { FlockLease } from '../store/flock-lease';
import { percentile } from './stats';

export interface UblkUpgradeResult {
  oldSlot: string;
  newSlot: string;
  oldPid: number;
  newPid: number;
  oldVersion: string;
  newVersion: string;
  mode: string;
  devices: { deviceId: string; result: string; stallMs: number; error: string }[];
  stallP50Ms: number;
  stallP99Ms: number;
  totalMs: number;
}

/** upgradeUblkManager runs the device handover to a new slot built in buildDir. */
export async function upgradeUblkManager(dirs: StackDirs, buildDir: string | undefined, timeoutMs = 120_000): Promise<UblkUpgradeResult> {
  // buildDir undefined: use the other slot's daemon that already runs (k8s: the standby slot's
  // container after its image was updated) instead of starting one.
  const script = buildDir === undefined ? '' : mainScript('ublk-manager', buildDir);
  if (buildDir !== undefined && !existsSync(script)) throw new Error(`${script} does not exist: build that checkout first`);
  const runDir = path.resolve(dirs.runDir);
  const stable = socketPath(runDir, 'ublk-manager');
  // Which slot serves now: the stable address is a real socket (slot "") or a link to a slot's.
  let oldSock = stable;
  let oldSlot = '';
  if (existsSync(stable) && lstatSync(stable).isSymbolicLink()) {
    oldSock = path.resolve(runDir, readlinkSync(stable));
    oldSlot = /ublk-manager-([ab])\.sock$/.exec(oldSock)?.[1] ?? '';
  }
  const old = await askVersion(unixAddress(oldSock)).catch(() => undefined);
  if (!old) throw new Error(`no ublk-manager answers at ${oldSock}: start the node with \`sandnode up\``);
  const newSlot = oldSlot === 'b' ? 'a' : 'b';
  const newSock = path.join(runDir, `ublk-manager-${newSlot}.sock`);
  const logDir = path.join(runDir, 'logs');
  mkdirSync(logDir, { recursive: true });
  let child: { pid?: number } = {};
  let fresh;
  if (buildDir === undefined) {
    fresh = await askVersion(unixAddress(newSock)).catch(() => undefined);
    if (!fresh) throw new Error(`no ublk-manager runs in slot ${newSlot} (${newSock}): start the standby slot, or give --from-build DIR`);
    child = { pid: fresh.pid };
  } else {
    const out = openSync(path.join(logDir, `ublk-manager-${newSlot}.log`), 'a');
    const spawned = spawn(nodeFor(buildDir), [script], {
      detached: true,
      stdio: ['ignore', out, out],
      env: {
        ...process.env,
        SANDNODE_UBLK_MANAGER_STATE_DIR: path.resolve(dirs.stateDir),
        SANDNODE_UBLK_MANAGER_RUN_DIR: runDir,
        SANDNODE_UBLK_MANAGER_SLOT: newSlot,
        SANDNODE_UBLK_MANAGER_LISTEN: unixAddress(newSock),
      },
    });
    closeSync(out);
    spawned.unref();
    child = spawned;
    let exited: number | null | undefined;
    spawned.once('exit', (c) => (exited = c));
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      if (exited !== undefined) throw new Error(`the new ublk-manager exited with code ${exited}; the old slot keeps every device; see ${path.join(logDir, `ublk-manager-${newSlot}.log`)}:\n${tail(path.join(logDir, `ublk-manager-${newSlot}.log`), 5)}`);
      fresh = await askVersion(unixAddress(newSock)).catch(() => undefined);
      if (fresh && fresh.pid === spawned.pid) break;
      if (Date.now() > deadline) throw new Error('the new ublk-manager did not answer in time');
      await new Promise((r) => setTimeout(r, 50));
    }
  }
  // From here on a failure must not leave the new slot running (it would hold the slot's lock
  // and block the next attempt): stop it, the old slot keeps (or took back) every device.
  const giveUp = async (why: string): Promise<never> => {
    if (buildDir === undefined) throw new Error(`${why}; the old slot keeps its devices (the standby slot's daemon was left running)`);
    const t = processStartTicks(child.pid ?? 0);
    try {
      process.kill(child.pid ?? 0, 'SIGTERM');
    } catch {
      /* gone */
    }
    for (let i = 0; i < 200 && t !== undefined && processStartTicks(child.pid ?? 0) === t; i++) await new Promise((r) => setTimeout(r, 25));
    throw new Error(`${why}; the new slot ${newSlot} was stopped and the old slot keeps its devices`);
  };
  if (!fresh.features.includes('ublk.handover.v1')) await giveUp(`ublk-manager ${fresh.version} lacks feature "ublk.handover.v1"`);
  // The move is a mutating call on both slots: it carries the node's current epoch (the
  // active server's, from the lease file), like every call the server makes.
  const epoch = FlockLease.readHolder(path.join(path.resolve(dirs.stateDir), 'server.lease'))?.epoch ?? 0;
  const ch = createSandnodeChannel(unixAddress(newSock));
  let res;
  try {
    res = await createServiceClient(DeviceServiceDefinition, ch, { timeoutMs, epoch: () => epoch }).handoverAll({ fromAddress: unixAddress(oldSock), deviceIds: [], perDeviceTimeoutMs: 0 });
  } catch (err) {
    return giveUp(`HandoverAll failed: ${(err as Error).message}`);
  } finally {
    ch.close();
  }
  const devices = res.devices.map((d) => ({ deviceId: d.deviceId, result: HandoverResult[d.result].replace('HANDOVER_RESULT_', ''), stallMs: d.stallMs, error: d.error }));
  if (devices.some((d) => d.result !== 'MOVED')) {
    const failed = devices.filter((d) => d.result !== 'MOVED').map((d) => `${d.deviceId} ${d.result} ${d.error}`);
    // Roll back: the devices that did move go back to the old slot, so that one slot (the old,
    // still at the stable address) owns everything before the new one is stopped.
    const moved = devices.filter((d) => d.result === 'MOVED').map((d) => d.deviceId);
    if (moved.length) {
      const back = createSandnodeChannel(unixAddress(oldSock));
      try {
        const r = await createServiceClient(DeviceServiceDefinition, back, { timeoutMs, epoch: () => epoch }).handoverAll({ fromAddress: unixAddress(newSock), deviceIds: moved, perDeviceTimeoutMs: 0 });
        const stuck = r.devices.filter((d) => d.result !== HandoverResult.HANDOVER_RESULT_MOVED);
        if (stuck.length) {
          throw new Error(`device handover incomplete (${failed.join('; ')}) and ${stuck.length} moved devices could not be moved back (${stuck.map((d) => `${d.deviceId}: ${d.error}`).join('; ')}); both slots keep running; the new slot is ${newSlot} (pid ${child.pid})`);
        }
      } finally {
        back.close();
      }
    }
    return giveUp(`device handover incomplete: ${failed.join('; ')}; ${moved.length} moved devices were moved back`);
  }
  // Stop the old slot (its devices now belong to the new one), then move the stable address.
  const ticks = processStartTicks(old.pid);
  process.kill(old.pid, 'SIGTERM');
  while (ticks !== undefined && processStartTicks(old.pid) === ticks) await new Promise((r) => setTimeout(r, 20));
  setActiveUblkSlot(dirs, newSlot);
  pointUblkAddress(dirs, newSlot);
  writeFileSync(pidFile(dirs, 'ublk-manager'), `${child.pid} ${processStartTicks(child.pid ?? 0) ?? ''}\n`);
  const stalls = devices.map((d) => d.stallMs);
  return {
    oldSlot: oldSlot || 'default',
    newSlot,
    oldPid: old.pid,
    newPid: child.pid ?? 0,
    oldVersion: old.version,
    newVersion: fresh.version,
    mode: res.mode,
    devices,
    stallP50Ms: stalls.length ? percentile(stalls, 50) : 0,
    stallP99Ms: stalls.length ? percentile(stalls, 99) : 0,
    totalMs: res.totalMs,
  };
}
