/**
 * The invariants a chaos run checks after every step, as one pure function of what the node
 * looks like ({@link NodeSnapshot}, gathered by snapshot.ts) and what the run's own calls
 * promise ({@link Expectation}): exactly one active server, every record in a resting state
 * with its parts present, every sandbox that ran still running with its pid, and nothing that
 * no record owns (process, VM, container, device, loop device, dir, socket).
 */

/** What the node looks like at one moment (names of states without their proto prefix). */
export interface NodeSnapshot {
  /** the servers whose admin socket answered GetLeaseStatus */
  servers: { admin: string; role: string; holderPid: number }[];
  /** every admin socket file in the run dir: absolute path and since when the run sees nobody answer on it (Unix epoch ms; 0: a server answers) */
  adminSockets: { path: string; staleSinceMs: number }[];
  /** when the active server's process started, Unix epoch ms (0: no active server) */
  activeStartMs: number;
  /** the server's records (ListSandboxes) */
  records: { id: string; state: string; pid: number; metadata: Record<string, string> }[];
  /** the supervisor's VMs (ListVms) */
  vms: { vmId: string; pid: number; state: string }[];
  /** runc container ids under <runDir>/runc */
  containers: string[];
  /** the device manager's devices (ListDevices) */
  devices: { deviceId: string; backingFile: string; state: string }[];
  /** backing files of the attached loop devices below the state dir (the image pool's own file excepted) */
  loopBackingFiles: string[];
  /** loop devices attached to the ublk-manager's image pool file (`<stateDir>/ublk-manager/pool/images.xfs`): 0 or 1 */
  poolLoops?: number;
  /** <runDir>/sandboxes/* */
  dirs: string[];
  /** live sandnode daemons of this run dir: pid and component */
  processes: { pid: number; component: string }[];
  /** pids (of sandbox inits) that are alive, among those asked */
  alivePids: number[];
  /** what could not be asked ("server: UNAVAILABLE ..."): a component that does not answer */
  unreachable: string[];
}

/** What the run's calls say about one sandbox. */
export interface Expectation {
  id: string;
  /** the states it may be in (a failed pause may have paused it or not) */
  states: string[];
  /** its init's host pid, which must not change; 0: not known yet */
  pid: number;
  /** true when a failed delete or create makes "no record" fine too */
  mayBeGone: boolean;
}

/** States a record may rest in. CREATING and DELETING are on their way (the reaper finishes an interrupted one). */
const RESTING = new Set(['RUNNING', 'PAUSED', 'ERROR', 'DRAINED']);
/** States whose sandbox has a VM, its container and its devices. */
const LIVE = new Set(['RUNNING', 'PAUSED']);
/** The VM state each live record state needs. */
const VM_STATE: Record<string, string> = { RUNNING: 'RUNNING', PAUSED: 'PAUSED' };
/** A sandbox's device ids: <id>-upper, <id>-ws, <id>-upper-g<N> after a ResetRootfs. */
const DEVICE_RE = /^(sb-[0-9a-f]{16})-(upper|ws|upper-g\d+)$/;
/** Each daemon runs once per node. */
const DAEMONS = ['vmm-supervisor', 'ublk-manager', 'server'];

/**
 * checkInvariants lists every invariant s violates against the expectations (empty: all
 * hold), one line each naming what is wrong. Pure.
 */
export function checkInvariants(s: NodeSnapshot, expected: readonly Expectation[]): string[] {
  const out: string[] = [...s.unreachable.map((u) => `component does not answer: ${u}`)];
  // one active server, and every admin socket belongs to a server that answers
  const active = s.servers.filter((x) => x.role === 'ACTIVE');
  if (active.length !== 1) out.push(`${active.length} active servers (${s.servers.map((x) => `${x.admin}: ${x.role}`).join(', ') || 'none answers'})`);
  const answering = new Set(s.servers.map((x) => x.admin.replace(/^unix:\/\//, '')));
  // a server removes the admin sockets of servers gone before it at its start (slot-lock.ts): one
  // that was dead already when the active server started is left over; one of a server that died
  // after that start waits for the next start
  for (const sock of s.adminSockets) {
    if (!answering.has(sock.path) && sock.staleSinceMs > 0 && sock.staleSinceMs < s.activeStartMs) out.push(`orphan socket ${sock.path} (nobody answers on it since before the active server started)`);
  }
  // one process per daemon
  for (const d of DAEMONS) {
    const ps = s.processes.filter((p) => p.component === d);
    if (ps.length !== 1) out.push(`${ps.length} ${d} processes (pids ${ps.map((p) => p.pid).join(', ') || 'none'})`);
  }
  // records: resting, with their parts
  const byId = new Map(s.records.map((r) => [r.id, r]));
  const vms = new Map(s.vms.map((v) => [v.vmId, v]));
  const devices = new Map(s.devices.map((d) => [d.deviceId, d]));
  const alive = new Set(s.alivePids);
  for (const r of s.records) {
    if (!RESTING.has(r.state)) out.push(`record ${r.id} is ${r.state} (not a resting state)`);
    if (!LIVE.has(r.state)) continue;
    const vm = vms.get(r.id);
    if (!vm) out.push(`record ${r.id} is ${r.state} but has no VM`);
    else {
      if (vm.state !== VM_STATE[r.state]) out.push(`record ${r.id} is ${r.state} but its VM is ${vm.state}`);
      if (vm.pid !== r.pid) out.push(`record ${r.id} has pid ${r.pid} but its VM pid ${vm.pid}`);
    }
    if (!s.containers.includes(r.id)) out.push(`record ${r.id} is ${r.state} but has no container`);
    if (!alive.has(r.pid)) out.push(`record ${r.id} is ${r.state} but its pid ${r.pid} is not alive`);
    for (const part of ['upper', 'ws']) {
      const d = devices.get(`${r.id}-${part}`);
      if (!d) out.push(`record ${r.id} is ${r.state} but has no device ${r.id}-${part}`);
      else if (d.state !== 'ATTACHED') out.push(`record ${r.id}: device ${d.deviceId} is ${d.state}`);
    }
  }
  // what the run's calls promise
  for (const e of expected) {
    const r = byId.get(e.id);
    if (!r) {
      if (!e.mayBeGone) out.push(`sandbox ${e.id} (${e.states.join('|')}) is gone`);
      continue;
    }
    if (!e.states.includes(r.state)) out.push(`sandbox ${e.id} is ${r.state}, expected ${e.states.join('|')}${e.mayBeGone ? ' or gone' : ''}`);
    if (e.pid && LIVE.has(r.state) && r.pid !== e.pid) out.push(`sandbox ${e.id} runs with pid ${r.pid}, expected ${e.pid} (restarted?)`);
  }
  // orphans: what no record owns
  for (const v of s.vms) if (!byId.has(v.vmId)) out.push(`orphan VM ${v.vmId}`);
  for (const c of s.containers) if (!byId.has(c)) out.push(`orphan container ${c}`);
  const owned = (id: string) => {
    const m = DEVICE_RE.exec(id);
    return m !== null && byId.has(m[1]!);
  };
  for (const d of s.devices) if (!owned(d.deviceId)) out.push(`orphan device ${d.deviceId}`);
  const backing = new Set(s.devices.map((d) => d.backingFile));
  for (const b of s.loopBackingFiles) if (!backing.has(b)) out.push(`orphan loop device on ${b}`);
  if ((s.poolLoops ?? 0) > 1) out.push(`${s.poolLoops} loop devices on the image pool file (one is the pool's, the rest leaked)`);
  for (const d of s.dirs) if (!byId.has(d)) out.push(`orphan dir sandboxes/${d}`);
  return out;
}
