/**
 * snapshot gathers a {@link NodeSnapshot}: the servers' lease status, the records, the VMs,
 * containers, devices, loop devices, dirs and daemon processes of one node, each asked the way
 * an operator's tool asks (the stable sockets, runc, /sys, /proc).
 */
import { spawnSync } from 'node:child_process';
import { existsSync, lstatSync, readdirSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { createServiceClient, processStartTicks, processState, socketPath, unixAddress } from '@sandnode/shared';
import { SandboxState } from '@sandnode/shared/proto/server/v1/sandbox';
import { DeviceServiceDefinition, DeviceState } from '@sandnode/shared/proto/ublk/v1/ublk';
import { VmServiceDefinition, VmState } from '@sandnode/shared/proto/vmm/v1/vmm';
import { adminSockets, listServers, sandnodeProcesses, type StackDirs } from '@sandnode/node-stack';
import { connectApi, localChannel } from './client';
import type { NodeSnapshot } from './invariants';

/** Time each question of a snapshot may take, ms. */
export const SNAPSHOT_CALL_TIMEOUT_MS = 5000;

/** name strips an enum value's prefix ("SANDBOX_STATE_RUNNING" -> "RUNNING"; unknown values "UNKNOWN_<n>"). */
function name(e: Record<number, string>, v: number, prefix: string): string {
  return (e[v] ?? `UNKNOWN_${v}`).replace(prefix, '');
}

/** why is a failed question's reason in one line. */
function why(err: unknown): string {
  return String((err as Error).message ?? err).split('\n')[0] ?? '';
}

/**
 * snapshot asks the node at dirs what it looks like now, each daemon on a channel of its own
 * (never the workload's: a stuck client must not pass for a server that does not answer). staleSince
 * keeps, from one snapshot to the next, since when nobody answers on each admin socket (by path
 * and inode, ms).
 */
export async function snapshot(dirs: StackDirs, staleSince: Map<string, number>): Promise<NodeSnapshot> {
  const runDir = path.resolve(dirs.runDir);
  const stateDir = path.resolve(dirs.stateDir);
  const s: NodeSnapshot = {
    servers: [],
    adminSockets: [],
    activeStartMs: 0,
    records: [],
    vms: [],
    containers: [],
    devices: [],
    loopBackingFiles: [],
    dirs: [],
    processes: [],
    alivePids: [],
    unreachable: [],
  };
  const t0 = Date.now();
  const socks = adminSockets(runDir);
  s.servers = (await listServers(runDir)).map((x) => ({ admin: x.admin, role: x.role, holderPid: x.holderPid }));
  const answering = new Set(s.servers.map((x) => x.admin.replace(/^unix:\/\//, '')));
  // keyed by path and inode: a socket bound again by a new server is another socket
  const keys = new Map(socks.map((p) => [p, `${p}#${lstatSync(p, { throwIfNoEntry: false })?.ino ?? 0}`]));
  const live = new Set(keys.values());
  for (const k of [...staleSince.keys()]) if (!live.has(k)) staleSince.delete(k);
  for (const [p, k] of keys) {
    if (answering.has(p)) staleSince.delete(k);
    else if (!staleSince.has(k)) staleSince.set(k, t0);
  }
  s.adminSockets = socks.map((p) => ({ path: p, staleSinceMs: answering.has(p) ? 0 : (staleSince.get(keys.get(p)!) ?? 0) }));
  const active = s.servers.filter((x) => x.role === 'ACTIVE');
  s.activeStartMs = active.length === 1 ? processStartMs(active[0]!.holderPid) : 0;
  const api = connectApi(unixAddress(socketPath(runDir, 'server')), { retryAttempts: 2 });
  try {
    const list = await api.sandboxes.listSandboxes({ pageSize: 1000 }, { deadline: new Date(Date.now() + SNAPSHOT_CALL_TIMEOUT_MS) });
    s.records = list.sandboxes.map((x) => ({ id: x.sandboxId, state: name(SandboxState, x.state, 'SANDBOX_STATE_'), pid: x.pid, metadata: x.metadata }));
  } catch (err) {
    s.unreachable.push(`server: ListSandboxes: ${why(err)}`);
  } finally {
    api.close();
  }
  const vch = localChannel(unixAddress(socketPath(runDir, 'vmm-supervisor')));
  const dch = localChannel(unixAddress(socketPath(runDir, 'ublk-manager')));
  try {
    try {
      const vms = await createServiceClient(VmServiceDefinition, vch, { timeoutMs: SNAPSHOT_CALL_TIMEOUT_MS, retryAttempts: 2 }).listVms({});
      s.vms = vms.vms.map((v) => ({ vmId: v.vmId, pid: v.pid, state: name(VmState, v.state, 'VM_STATE_') }));
    } catch (err) {
      s.unreachable.push(`vmm-supervisor: ListVms: ${why(err)}`);
    }
    try {
      const devs = await createServiceClient(DeviceServiceDefinition, dch, { timeoutMs: SNAPSHOT_CALL_TIMEOUT_MS, retryAttempts: 2 }).listDevices({});
      s.devices = devs.devices.map((d) => ({ deviceId: d.deviceId, backingFile: d.backingFile, state: name(DeviceState, d.state, 'DEVICE_STATE_') }));
    } catch (err) {
      s.unreachable.push(`ublk-manager: ListDevices: ${why(err)}`);
    }
  } finally {
    vch.close();
    dch.close();
  }
  const runc = spawnSync('runc', ['--root', path.join(runDir, 'runc'), 'list', '--format', 'json'], { encoding: 'utf8' });
  if (runc.status === 0) s.containers = ((JSON.parse(runc.stdout || '[]') as { id: string }[] | null) ?? []).map((c) => c.id).sort();
  // the ublk-manager's image pool (an XFS file on its own loop device) is no sandbox's device: at most one loop on it
  const poolFile = path.join(stateDir, 'ublk-manager', 'pool', 'images.xfs');
  const loops = loopBackingFilesBelow(stateDir);
  s.loopBackingFiles = loops.filter((b) => b !== poolFile);
  s.poolLoops = loops.length - s.loopBackingFiles.length;
  const sbDir = path.join(runDir, 'sandboxes');
  s.dirs = existsSync(sbDir) ? readdirSync(sbDir).sort() : [];
  s.processes = sandnodeProcesses(runDir).map((p) => ({ pid: p.pid, component: /services\/(vmm-supervisor|ublk-manager|server)\/dist/.exec(p.cmd)?.[1] ?? '?' }));
  s.alivePids = s.records.map((r) => r.pid).filter((pid) => pid > 0 && isAlive(pid));
  return s;
}

/** Clock ticks per second of /proc/<pid>/stat times (USER_HZ, 100 on Linux). */
const USER_HZ = 100;

/** processStartMs is when pid started, Unix epoch ms (boot time + its start ticks); 0 when it is gone. */
function processStartMs(pid: number): number {
  const ticks = processStartTicks(pid);
  const btime = /^btime (\d+)$/m.exec(readFileSync('/proc/stat', 'utf8'))?.[1];
  return ticks === undefined || !btime ? 0 : Number(btime) * 1000 + (ticks * 1000) / USER_HZ;
}

/** isAlive: pid is a live process (not a zombie). */
function isAlive(pid: number): boolean {
  return processStartTicks(pid) !== undefined && processState(pid) !== 'Z';
}

/** loopBackingFilesBelow lists the backing files of attached loop devices below root (from /sys/block). */
function loopBackingFilesBelow(root: string): string[] {
  const out: string[] = [];
  for (const n of readdirSync('/sys/block').filter((x) => x.startsWith('loop'))) {
    try {
      const b = readFileSync(`/sys/block/${n}/loop/backing_file`, 'utf8')
        .trim()
        .replace(/ \(deleted\)$/, '');
      if (b.startsWith(`${root}/`)) out.push(b);
    } catch {
      /* not attached */
    }
  }
  return out.sort();
}
