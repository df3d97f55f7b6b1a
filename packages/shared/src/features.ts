/**
 * The registry of feature strings: every string a sandnode component lists in
 * GetVersion.features, named once here, so that a provider and its callers spell it the same
 * way. Callers learn a peer's features once per connection and check one with
 * {@link requireFeature} / {@link hasFeature} (or `PeerFeatures.require`) before using an RPC
 * that needs it; they never infer features from version numbers and never probe by catching
 * UNIMPLEMENTED. (The idea follows the kata agent's details: version + handler lists + extra
 * features.)
 *
 * A feature string is `<component>.<capability>[.vN]`. Once released, a string never changes
 * meaning; a changed capability gets a new string.
 */
import { FailedPreconditionError } from './errors';

/** Features of the vmm-supervisor (`vmm.*`). */
export const VMM_FEATURES = {
  /** the runc driver serves the VMs */
  runc: 'vmm.runc',
  /** the firecracker driver serves the VMs */
  firecracker: 'vmm.firecracker',
  /** re-adopts its VMs after its own restart */
  adoption: 'vmm.adoption.v1',
  /** rejects mutating calls of a stale `sandnode-epoch` with ABORTED */
  epochFence: 'vmm.epoch-fence.v1',
  /** podd's socket is bound on the host and inherited by the sandbox as fd 3 */
  poddSocketFd: 'vmm.podd-socket-fd.v1',
  /** driver binaries kept in versioned dirs */
  versionedBinaries: 'vmm.versioned-binaries.v1',
  /** a per-VM FreezePortService (host side of podd's Quiesce) */
  freezePort: 'vmm.freeze-port.v1',
  /** VmService.GetVmFreeze */
  freezeStatus: 'vmm.freeze-status.v1',
  /** VmSpec.machine_id */
  machineId: 'vmm.machine-id.v1',
  /** VmService.FenceEpoch: an explicit epoch announcement (before it, a DeleteVm of an unknown id) */
  fenceEpoch: 'vmm.fence-epoch.v1',
  /** Resources.pids is enforced (cgroup pids.max, default 1024) */
  pidsLimit: 'vmm.pids-limit.v1',
  /** runc sandboxes run in their own cgroup namespace */
  cgroupNamespace: 'vmm.cgroup-ns.v1',
  /** runc sandboxes run under the supervisor's seccomp profile (absent when configured "unconfined") */
  seccomp: 'vmm.seccomp.v1',
  /** runc sandboxes get /run/sandnode on a size-limited tmpfs of their own (config guestRunDirBytes), never the host's disk */
  guestTmpfs: 'vmm.guest-tmpfs.v1',
  /** the stdout/stderr of a runc sandbox's init go to a console log the supervisor keeps bounded (config consoleLogBytes) */
  consoleCap: 'vmm.console-cap.v1',
  /** Vm.isolation names the isolation each VM got at its create (the feature strings above that applied) */
  vmIsolation: 'vmm.vm-isolation.v1',
  /**
   * runc sandboxes run in a user namespace: uid/gid 0 inside is an unprivileged host id of the
   * supervisor's node-wide range (config `usernsRange`; absent when configured "")
   */
  userns: 'vmm.userns.v1',
  /**
   * runc sandboxes' drives get the supervisor's I/O limits (config ioReadBps, ioWriteBps,
   * ioReadIops, ioWriteIops: blkio throttles per drive; ioWeight where the host offers a weight);
   * absent when none is configured
   */
  ioLimits: 'vmm.io-limits.v1',
  /** ListVmsResponse carries the quarantined rows of the VM table and the fence epoch (`sandnode status`) */
  quarantineReport: 'vmm.quarantine-report.v1',
  /**
   * VmService.ArmFreeze / DisarmFreeze and FenceEpochRequest.require_freeze_arm: a freeze port
   * accepts a freeze only while armed (once the lease holder arms), with per-connection and
   * per-VM limits
   */
  freezeArm: 'vmm.freeze-arm.v1',
  /** VmService.ThawVmFreeze: the host thaws a VM's freeze by its token (no round trip through podd) */
  hostThaw: 'vmm.host-thaw.v1',
  /**
   * VmSpec.network (a netns, veth pair, pool address, NAT and the egress policy in the node's
   * nftables table), Vm.network, DeleteVm keep_network, UpdateVmNetwork, ListNetworkSlots,
   * ReleaseNetworkSlot (docs/network.md)
   */
  network: 'vmm.network.v1',
  /** ListNetworkSlotsResponse.quarantined: the network slot table's quarantined rows (`sandnode status`) */
  slotQuarantineReport: 'vmm.slot-quarantine-report.v1',
} as const;

/** Features of the ublk-manager (`ublk.*`). */
export const UBLK_FEATURES = {
  /** the loop driver serves the devices */
  loop: 'ublk.loop',
  /** the ublk kernel driver serves the devices */
  ublk: 'ublk.ublk',
  /** re-adopts its devices after its own restart */
  adoption: 'ublk.adoption.v1',
  /** A/B slots on one state dir */
  slots: 'ublk.slots.v1',
  /** QuiesceDevice / ResumeDevice / ReleaseDevice / RecoverDevice / AbortHandover / HandoverAll */
  handover: 'ublk.handover.v1',
  /** rejects mutating calls of a stale `sandnode-epoch` with ABORTED */
  epochFence: 'ublk.epoch-fence.v1',
  /** recognises loop devices attached from another mount namespace by backing inode */
  foreignMountns: 'ublk.foreign-mountns.v1',
  /** DeviceService.CloneDevice */
  clone: 'ublk.clone',
  /** CloneDevice is FICLONE on a reflink file system (native or the image pool) and says clone_method / copy_reason; empty ext4 devices are template clones */
  reflinkClone: 'ublk.reflink-clone.v1',
  /**
   * DeviceService.SnapshotDevices: the clones of a fork made (FICLONE, fsync, rows) without
   * attaching them, so that a frozen parent waits for no device registration; CloneDevice
   * attaches a snapshot afterwards
   */
  cloneSnapshot: 'ublk.clone-snapshot.v1',
  /** DeviceService.FenceEpoch: an explicit epoch announcement (before it, a DeleteDevice of an unknown id) */
  fenceEpoch: 'ublk.fence-epoch.v1',
  /** ListDevicesResponse carries the quarantined rows of the slot's device table and the fence epoch (`sandnode status`) */
  quarantineReport: 'ublk.quarantine-report.v1',
  /** the driver quiesces a device in place (ublk QUIESCE) */
  quiesce: 'ublk.quiesce',
  /** the driver recovers a device served by another process (ublk USER_RECOVERY) */
  userRecovery: 'ublk.user-recovery',
  /** the driver may replay in-flight I/O after recovery (ublk USER_RECOVERY_REISSUE) */
  reissue: 'ublk.reissue',
} as const;

/** Features of the server (`server.*`). */
export const SERVER_FEATURES = {
  sandbox: 'server.sandbox.v1',
  template: 'server.template.v1',
  adoption: 'server.adoption.v1',
  handover: 'server.handover.v1',
  drain: 'server.drain.v1',
  epoch: 'server.epoch.v1',
  /** GetLeaseStatusResponse carries the quarantined rows of records.db (`sandnode status`) */
  quarantineReport: 'server.quarantine-report.v1',
  /** AdminService.Takeover: a running standby takes the node over */
  takeover: 'server.takeover.v1',
  /** SandboxService.ForkSandbox */
  fork: 'server.fork.v1',
  /** SandboxService.ResetRootfs */
  resetRootfs: 'server.reset-rootfs.v1',
  /** CreateSandbox/ForkSandbox network, Sandbox.network, access tokens, UpdateSandboxNetwork */
  network: 'server.network.v1',
  /** the ingress listener (config ingressListen) */
  ingress: 'server.ingress.v1',
  /** the egress proxy: TCP to the proxied ports is decided by HTTP Host / TLS SNI (docs/network.md) */
  egressProxy: 'server.egress-proxy.v1',
  /** the sandboxes' DNS resolver: answers only names the policy allows, forwards to the node's upstreams */
  dns: 'server.dns.v1',
  /** CreateSandbox idle (pause/hibernate after idle time, paused TTL, auto-resume), KeepAlive, Sandbox.idle (core/idle.ts) */
  idle: 'server.idle.v1',
  /** SandboxService.ExecStream (streamed stdin, pty, signals, attach), ListProcesses, SignalProcess */
  execStream: 'server.exec-stream.v1',
  /** SandboxService.DownloadFile / UploadFile (streamed, any size, offsets) / ListDirectory / StatFile */
  filesStream: 'server.files.stream.v1',
  /** SandboxService.CreateDirectory / CreateSymlink and FileInfo.link_target: recursive `sandbox cp` with modes and symlinks */
  filesTree: 'server.files.tree.v1',
  /** warm pools: AdminService.SetPool/GetPoolStatus, CreateSandboxResponse.from_pool/create_ms/pool_miss */
  pool: 'server.pool.v1',
  /** ForkSandboxRequest.idle; a child without it takes the parent's idle settings (core/fork.ts) */
  forkIdle: 'server.fork-idle.v1',
  /** CreateSandboxRequest.env: a sandbox's environment, applied to every Exec/ExecStream; Sandbox.env_keys */
  sandboxEnv: 'server.sandbox-env.v1',
  /** TemplateService.DeleteTemplate (refused while a sandbox uses the template) */
  templateDelete: 'server.template-delete.v1',
  /** AdminService.DrainStream: Drain with a progress event per sandbox (the CLI's drain progress) */
  drainStream: 'server.drain-stream.v1',
  /** SandboxService.PrepareBulkTransfer and the bulk channel on the unix socket (`sandbox cp` without the server in the data path; bulk-channel.ts) */
  filesBulk: 'server.files.bulk.v1',
} as const;

/** Features of podd (`podd.*`). */
export const PODD_FEATURES = {
  exec: 'podd.exec.v1',
  files: 'podd.files.v1',
  /** file RPCs resolve beneath /workspace without following symlinks out of it */
  filesBeneath: 'podd.files.beneath.v1',
  /** Quiesce / Thaw / GetFreezeStatus (listed only when the host's freeze port exists) */
  quiesce: 'podd.quiesce',
  /** ForwardPort: relays a TCP connection to 127.0.0.1:<port> inside the sandbox (ingress to loopback services) */
  forwardPort: 'podd.forward-port.v1',
  /** ExecStream (streamed stdin, signals, resize, attach by exec_id), ListProcesses, SignalProcess */
  execStream: 'podd.exec-stream.v1',
  /** ExecStream with pty=true: podd can allocate a pseudo-terminal (koffi is in the template) */
  execPty: 'podd.exec-pty.v1',
  /** DownloadFile / UploadFile (streamed, any size, offsets) / ListDirectory, and Stat's beneath: walks without following symlinks */
  filesStream: 'podd.files.stream.v1',
  /** CreateDirectory / CreateSymlink (confined, no symlink followed) and DirectoryEntry.link_target */
  filesTree: 'podd.files.tree.v1',
  /** the bulk channel on podd's socket: a connection that starts with BULK_MAGIC carries one raw upload or download (bulk-channel.ts) */
  filesBulk: 'podd.files.bulk.v1',
} as const;

/** The answer of a peer's GetVersion, as far as feature checks need it. */
export interface PeerVersion {
  component: string;
  version: string;
  features: readonly string[];
}

/** hasFeature says whether the peer lists feature. */
export function hasFeature(peer: PeerVersion, feature: string): boolean {
  return peer.features.includes(feature);
}

/**
 * missingFeature is the sentence that says the peer lacks feature ("ublk-manager 0.1.0 lacks
 * feature \"ublk.clone\""), for messages and fallback reasons.
 */
export function missingFeature(peer: PeerVersion, feature: string): string {
  return `${peer.component || 'peer'} ${peer.version || '(unknown version)'} lacks feature "${feature}"`;
}

/**
 * requireFeature throws FailedPreconditionError (FAILED_PRECONDITION) naming the peer, its
 * version and the missing feature unless the peer lists feature; `what` says what needed it
 * ("ForkSandbox needs ...").
 */
export function requireFeature(peer: PeerVersion, feature: string, what?: string): void {
  if (hasFeature(peer, feature)) return;
  throw new FailedPreconditionError(what ? `${what}: ${missingFeature(peer, feature)}` : missingFeature(peer, feature));
}
