/**
 * `sandnode upgrade ublk-manager --from-build DIR`: start ublk-manager from another build in
 * the other slot, move every device to it with HandoverAll (one device at a time; the old slot
 * takes a device back if its move fails), stop the old slot, and point the stable address
 * `<runDir>/ublk-manager.sock` (what the server dials) at the new slot's socket.
 */
import { existsSync, lstatSync, readFileSync, readlinkSync } from 'node:fs';
import path from 'node:path';
import { UBLK_FEATURES, createSandnodeChannel, readLeaseEpoch, serverLeasePath, createServiceClient, hasFeature, missingFeature, niceWhileBooting, socketPath, unixAddress } from '@sandnode/shared';
import type { GetVersionResponse } from '@sandnode/shared/proto/common/v1/version';
import { DeviceServiceDefinition, HandoverResult } from '@sandnode/shared/proto/ublk/v1/ublk';
import { mainScript, nodeFor, versionAt, writePidFile, type StackDirs } from './components';
import { spawnDaemon, stopProcess, tail, waitForDaemon } from './daemon-process';
import { findActiveServer } from './lease';
import { nodeSettings } from './node-settings';
import { percentile } from './stats';
import { pointUblkAddress, setActiveUblkSlot, ublkSlotSocket } from './ublk-slot';
import { DEFAULT_UPGRADE_TIMEOUT_MS } from './upgrade';

/** How long a new slot that is given up gets to exit after SIGTERM, ms. */
export const GIVE_UP_STOP_TIMEOUT_MS = 5000;
/** Time one GetVersion of a ublk-manager slot may take during the upgrade, ms. */
const SLOT_VERSION_TIMEOUT_MS = 2000;
/** Lines of the new slot's log quoted when it exits while starting. */
const LOG_LINES_ON_EXIT = 5;

/** What `upgrade ublk-manager` did (`--json` prints it as is). */
export interface UblkUpgradeResult {
  /** the slot that owned the devices: "a", "b" or "default" (before the first handover) */
  oldSlot: string;
  /** the slot that owns them now: "a" or "b" */
  newSlot: string;
  oldPid: number;
  newPid: number;
  oldVersion: string;
  newVersion: string;
  /** how the devices moved, as HandoverAll says it */
  mode: string;
  /** each device: MOVED or what went wrong; stallMs is its I/O stall in ms */
  devices: { deviceId: string; result: string; stallMs: number; error: string }[];
  /** median / 99th percentile of the devices' I/O stall, ms (0 without devices) */
  stallP50Ms: number;
  stallP99Ms: number;
  /** the whole HandoverAll, ms */
  totalMs: number;
}

/**
 * upgradeUblkManager runs the device handover to the other slot: a ublk-manager started here
 * from buildDir (a checkout with a build), or with buildDir undefined the other slot's daemon
 * that already runs (k8s: the standby slot's container after its image was updated). Each
 * call may take timeoutMs (ms). Throws Error saying which slot keeps the devices when anything
 * fails (a new slot started here is stopped again).
 */
export async function upgradeUblkManager(dirs: StackDirs, buildDir: string | undefined, timeoutMs = DEFAULT_UPGRADE_TIMEOUT_MS): Promise<UblkUpgradeResult> {
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
  const old = await versionAt(unixAddress(oldSock), SLOT_VERSION_TIMEOUT_MS);
  if (!old) throw new Error(`no ublk-manager answers at ${oldSock}: start the node with \`sandnode up\``);
  const newSlot = oldSlot === 'b' ? 'a' : 'b';
  const newSock = ublkSlotSocket(dirs, newSlot);
  let fresh: GetVersionResponse;
  if (buildDir === undefined) {
    const standby = await versionAt(unixAddress(newSock), SLOT_VERSION_TIMEOUT_MS);
    if (!standby) throw new Error(`no ublk-manager runs in slot ${newSlot} (${newSock}): start the standby slot, or give --from-build DIR`);
    fresh = standby;
  } else {
    const logPath = path.join(runDir, 'logs', `ublk-manager-${newSlot}.log`);
    const spawned = spawnDaemon({
      script,
      node: nodeFor(buildDir),
      logPath,
      env: {
        ...ublkSettings(dirs.stateDir, buildDir),
        ...process.env,
        SANDNODE_UBLK_MANAGER_STATE_DIR: path.resolve(dirs.stateDir),
        SANDNODE_UBLK_MANAGER_RUN_DIR: runDir,
        SANDNODE_UBLK_MANAGER_SLOT: newSlot,
        SANDNODE_UBLK_MANAGER_LISTEN: unixAddress(newSock),
      },
    });
    // it boots niced, so the old slot keeps its CPU for the I/O it serves; HandoverAll raises it back
    niceWhileBooting(spawned.pid);
    fresh = await waitForDaemon(
      spawned,
      async () => {
        const v = await versionAt(unixAddress(newSock), SLOT_VERSION_TIMEOUT_MS);
        return v && v.pid === spawned.pid ? v : undefined;
      },
      {
        timeoutMs,
        onExit: (code) => new Error(`the new ublk-manager exited with code ${code}; the old slot keeps every device; see ${logPath}:\n${tail(logPath, LOG_LINES_ON_EXIT)}`),
        // a new slot that hangs must not linger: it would hold the slot's lock and block the next attempt
        killOnTimeout: true,
        onTimeout: () => new Error(`the new ublk-manager did not answer within ${timeoutMs} ms and was stopped; the old slot keeps every device; see ${logPath}`),
      },
    );
  }
  const newPid = fresh.pid;
  // From here on a failure must not leave the new slot running (it would hold the slot's lock
  // and block the next attempt): stop it, the old slot keeps (or took back) every device.
  const giveUp = async (why: string): Promise<never> => {
    if (buildDir === undefined) throw new Error(`${why}; the old slot keeps its devices (the standby slot's daemon was left running)`);
    await stopProcess(newPid, { timeoutMs: GIVE_UP_STOP_TIMEOUT_MS });
    throw new Error(`${why}; the new slot ${newSlot} was stopped and the old slot keeps its devices`);
  };
  if (!hasFeature(fresh, UBLK_FEATURES.handover)) await giveUp(missingFeature(fresh, UBLK_FEATURES.handover));
  // The move is a mutating call on both slots: it carries the node's current epoch, like every
  // call the server makes: the active server's (its GetLeaseStatus), or with no server running
  // the last one's, from the lease record (0 made it ABORTED "stale epoch 0" on a node that had
  // one: the chaos run, seed 1).
  const epoch = (await findActiveServer(dirs.runDir))?.epoch ?? readLeaseEpoch(serverLeasePath(dirs.stateDir));
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
        const r = await createServiceClient(DeviceServiceDefinition, back, { timeoutMs, epoch: () => epoch }).handoverAll({
          fromAddress: unixAddress(newSock),
          deviceIds: moved,
          perDeviceTimeoutMs: 0,
        });
        const stuck = r.devices.filter((d) => d.result !== HandoverResult.HANDOVER_RESULT_MOVED);
        if (stuck.length) {
          throw new Error(
            `device handover incomplete (${failed.join('; ')}) and ${stuck.length} moved devices could not be moved back (${stuck.map((d) => `${d.deviceId}: ${d.error}`).join('; ')}); both slots keep running; the new slot is ${newSlot} (pid ${newPid})`,
          );
        }
      } finally {
        back.close();
      }
    }
    return giveUp(`device handover incomplete: ${failed.join('; ')}; ${moved.length} moved devices were moved back`);
  }
  // Stop the old slot (its devices now belong to the new one), then move the stable address.
  await stopProcess(old.pid);
  setActiveUblkSlot(dirs, newSlot);
  pointUblkAddress(dirs, newSlot);
  writePidFile(dirs, 'ublk-manager', newPid);
  const stalls = devices.map((d) => d.stallMs);
  return {
    oldSlot: oldSlot || 'default',
    newSlot,
    oldPid: old.pid,
    newPid,
    oldVersion: old.version,
    newVersion: fresh.version,
    mode: res.mode,
    devices,
    stallP50Ms: stalls.length ? percentile(stalls, 50) : 0,
    stallP99Ms: stalls.length ? percentile(stalls, 99) : 0,
    totalMs: res.totalMs,
  };
}

/**
 * ublkSettings: the node's recorded settings for a ublk-manager started from buildDir when the
 * caller gives none (node-settings.ts), without its /metrics address for a build before 0.3.0:
 * those exit on EADDRINUSE, and the old slot holds that port until it hands over (0.3.0 on
 * retries the bind until it is free).
 */
function ublkSettings(stateDir: string, buildDir: string): Record<string, string> {
  const env = { ...nodeSettings(stateDir, process.env).env };
  if (!retriesMetricsBind(buildDir)) delete env.SANDNODE_UBLK_MANAGER_METRICS_LISTEN;
  return env;
}

/** retriesMetricsBind says whether buildDir's ublk-manager is 0.3.0 or newer (its package.json version; unreadable: no). */
function retriesMetricsBind(buildDir: string): boolean {
  try {
    const v = (JSON.parse(readFileSync(path.join(path.resolve(buildDir), 'services', 'ublk-manager', 'package.json'), 'utf8')) as { version?: unknown }).version;
    const m = typeof v === 'string' ? /^(\d+)\.(\d+)\./.exec(v) : null;
    return m !== null && (Number(m[1]) > 0 || Number(m[2]) >= 3);
  } catch {
    return false;
  }
}
