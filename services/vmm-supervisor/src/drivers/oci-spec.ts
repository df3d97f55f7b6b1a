/**
 * OCI runtime spec (config.json) of a runc VM: the sandbox's init in its own pid, ipc, uts,
 * mount and network namespaces (loopback only), the defaults of `runc spec` for capabilities,
 * mounts and masked paths, podd's guest dir at /run/sandnode and the workspace at /workspace.
 * podd's listening socket is not mounted: it arrives as an inherited fd (see podd-socket.ts).
 * With a user namespace range (userns.ts) the init also gets a user namespace whose 0..size-1
 * are the range's host ids, and Docker's default capabilities, which then act only on the
 * range's files.
 */
import type { EffectiveResources } from '../core/types';
import type { BlockIo } from './block-io';
import { PODD_LISTEN_FD_ENV } from './podd-socket';
import type { UsernsRange } from './userns';

/** The init every template ships at this path; it starts and respawns podd. */
export const SANDBOX_INIT = '/sbin/sandnode-init';
/** Where `<podd_socket_dir>/guest` appears inside the VM. */
export const PODD_SOCKET_MOUNT = '/run/sandnode';
/** Where the VM's freeze-port dir (its FreezePortService socket) appears inside the VM, read-only. */
export const FREEZE_PORT_MOUNT = '/run/sandnode-freeze';
/** Where the workspace drive appears inside the VM. */
export const WORKSPACE_MOUNT = '/workspace';
/** CFS period used for the CPU quota, in microseconds (100 ms). */
export const CPU_PERIOD_US = 100_000;
/** The capability set `runc spec` gives a container (the set of a sandbox without a user namespace). */
export const DEFAULT_CAPABILITIES = ['CAP_AUDIT_WRITE', 'CAP_KILL', 'CAP_NET_BIND_SERVICE'];
/**
 * The capability set of a sandbox in a user namespace: Docker's documented default set less
 * CAP_MKNOD and CAP_NET_RAW, so root inside can do to its own files what root in a container
 * does (chown, override modes, setuid to another user, chroot). In a user namespace each of
 * these acts only on ids mapped into it: a host file (its owner outside the range) stays out of
 * reach.
 */
export const USERNS_CAPABILITIES = [
  'CAP_AUDIT_WRITE',
  'CAP_CHOWN',
  'CAP_DAC_OVERRIDE',
  'CAP_FOWNER',
  'CAP_FSETID',
  'CAP_KILL',
  'CAP_NET_BIND_SERVICE',
  'CAP_SETFCAP',
  'CAP_SETGID',
  'CAP_SETPCAP',
  'CAP_SETUID',
  'CAP_SYS_CHROOT',
];

/** What a networked sandbox in a user namespace does not see of the host's sysfs (its interfaces, debug and tracing dirs). */
export const HOST_SYSFS_MASKED = ['/sys/class/net', '/sys/devices/virtual/net', '/sys/kernel/debug', '/sys/kernel/tracing', '/sys/fs/bpf', '/sys/kernel/security'];

const BASE_PATH = '/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin';

/** Inputs of {@link buildOciSpec}; every path is an absolute host path. */
export interface OciSpecInput {
  vmId: string;
  /** The overlay mount that becomes the container's root. */
  rootfsPath: string;
  /** Host dir bind-mounted rw at /run/sandnode: `<podd_socket_dir>/guest`, never the socket's dir. */
  poddGuestDir: string;
  /** fd of podd's inherited listening socket in the init, announced as SANDNODE_PODD_LISTEN_FD; undefined = none. */
  poddListenFd?: number;
  /** Host dir `<vmDir>/freeze-port`, bind-mounted read-only at /run/sandnode-freeze; undefined = none. */
  freezePortDir?: string;
  /** Host mount of the workspace drive, bind-mounted at /workspace; undefined = no workspace. */
  workspacePath?: string;
  /** Bind the workspace read-only. */
  workspaceReadOnly?: boolean;
  /** Hostname; empty means vmId. */
  hostname: string;
  /** Extra environment; may override PATH and HOME, never SANDNODE_SANDBOX_ID. */
  env: Record<string, string>;
  resources: EffectiveResources;
  /** cgroupsPath; default `/sandnode/<vmId>`. */
  cgroupsPath?: string;
  /** `linux.seccomp` (seccomp.ts); undefined = none. */
  seccomp?: Record<string, unknown>;
  /** A user namespace mapping 0..size-1 inside to the range's host ids (uid and gid); undefined = none. */
  userns?: UsernsRange;
  /** `linux.resources.blockIO`: throttles of the VM's drives, a weight (block-io.ts); undefined = none. */
  blockIO?: BlockIo;
  /**
   * No swap: `memory.swap` = `memory.limit` (the OCI swap is memory + swap), which runc writes
   * on cgroup v2 as memory.swap.max 0; without it a v2 cgroup swaps without a limit on top of
   * memory.max. Only for a cgroup v2 host with swap accounting: on v1 runc writes
   * memory.memsw.limit_in_bytes, and fails the start where the kernel has none. Default false.
   */
  noSwap?: boolean;
  /**
   * The VM's network slot: the init joins the namespace bind-mounted at netnsPath (instead of a
   * new loopback-only one) and gets resolvConf / hosts (host files in the VM dir) read-only at
   * /etc/resolv.conf and /etc/hosts. undefined = loopback only.
   */
  network?: { netnsPath: string; resolvConf: string; hosts: string };
}

/** OciSpec is the subset of the OCI runtime spec this driver writes (a plain JSON object). */
export type OciSpec = Record<string, unknown> & {
  process: Record<string, unknown> & { args: string[]; env: string[]; cwd: string; terminal: boolean; capabilities: Record<string, string[]> };
  root: { path: string; readonly: boolean };
  hostname: string;
  mounts: { destination: string; type: string; source: string; options?: string[] }[];
  linux: Record<string, unknown> & {
    cgroupsPath: string;
    namespaces: { type: string; path?: string }[];
    resources: { memory: { limit: number; swap?: number }; cpu: { quota: number; period: number }; pids: { limit: number }; devices: unknown[]; blockIO?: BlockIo };
    maskedPaths: string[];
    readonlyPaths: string[];
  };
};

/**
 * buildEnv returns the init's environment as KEY=VALUE strings, base keys first. extra may
 * override PATH and HOME, never SANDNODE_SANDBOX_ID or SANDNODE_PODD_LISTEN_FD.
 */
export function buildEnv(vmId: string, extra: Record<string, string>, poddListenFd?: number): string[] {
  const env = new Map<string, string>([
    ['PATH', BASE_PATH],
    ['HOME', '/root'],
  ]);
  for (const k of Object.keys(extra).sort()) env.set(k, extra[k]!);
  env.set('SANDNODE_SANDBOX_ID', vmId);
  if (poddListenFd !== undefined) env.set(PODD_LISTEN_FD_ENV, String(poddListenFd));
  else env.delete(PODD_LISTEN_FD_ENV);
  return [...env].map(([k, v]) => `${k}=${v}`);
}

/** buildOciSpec returns the config.json object of a VM. Pure: no host access. */
export function buildOciSpec(input: OciSpecInput): OciSpec {
  const caps = [...(input.userns ? USERNS_CAPABILITIES : DEFAULT_CAPABILITIES)];
  const namespaces: { type: string; path?: string }[] = [
    { type: 'pid' },
    input.network ? { type: 'network', path: input.network.netnsPath } : { type: 'network' },
    { type: 'ipc' },
    { type: 'uts' },
    { type: 'mount' },
    { type: 'cgroup' },
  ];
  if (input.userns) namespaces.push({ type: 'user' });
  const idMap = input.userns ? [{ containerID: 0, hostID: input.userns.hostId, size: input.userns.size }] : undefined;
  const mounts: OciSpec['mounts'] = [
    { destination: '/proc', type: 'proc', source: 'proc' },
    { destination: '/dev', type: 'tmpfs', source: 'tmpfs', options: ['nosuid', 'strictatime', 'mode=755', 'size=65536k'] },
    { destination: '/dev/pts', type: 'devpts', source: 'devpts', options: ['nosuid', 'noexec', 'newinstance', 'ptmxmode=0666', 'mode=0620', 'gid=5'] },
    { destination: '/dev/shm', type: 'tmpfs', source: 'shm', options: ['nosuid', 'noexec', 'nodev', 'mode=1777', 'size=65536k'] },
    { destination: '/dev/mqueue', type: 'mqueue', source: 'mqueue', options: ['nosuid', 'noexec', 'nodev'] },
    { destination: '/sys', type: 'sysfs', source: 'sysfs', options: ['nosuid', 'noexec', 'nodev', 'ro'] },
    { destination: '/sys/fs/cgroup', type: 'cgroup', source: 'cgroup', options: ['nosuid', 'noexec', 'nodev', 'relatime', 'ro'] },
    // noexec as its tmpfs is mounted (vm-tmpfs.ts): in a user namespace a bind may not drop a flag of its source
    { destination: PODD_SOCKET_MOUNT, type: 'bind', source: input.poddGuestDir, options: ['rbind', 'rw', 'nosuid', 'nodev', 'noexec'] },
  ];
  if (input.freezePortDir !== undefined) {
    // connect(2) to a socket on a read-only mount works; the VM cannot replace the socket.
    mounts.push({ destination: FREEZE_PORT_MOUNT, type: 'bind', source: input.freezePortDir, options: ['rbind', 'ro', 'nosuid', 'nodev', 'noexec'] });
  }
  const hostSysfs = input.network !== undefined && input.userns !== undefined;
  if (hostSysfs) {
    // The kernel refuses a new sysfs to a mounter whose user namespace does not own the network
    // namespace (the slot's is the host root's, made before the VM): the host's sysfs is bound
    // read-only instead, as rootless runtimes do, with its network part masked below.
    const i = mounts.findIndex((m) => m.destination === '/sys');
    mounts[i] = { destination: '/sys', type: 'bind', source: '/sys', options: ['rbind', 'ro', 'nosuid', 'noexec', 'nodev'] };
  }
  if (input.network) {
    // read-only: the sandbox cannot point its resolver elsewhere by editing them (it could by a
    // mount of its own only with CAP_SYS_ADMIN, which it has not; and the host rules redirect
    // every udp/tcp 53 to the node's resolver anyway)
    mounts.push({ destination: '/etc/resolv.conf', type: 'bind', source: input.network.resolvConf, options: ['bind', 'ro', 'nosuid', 'nodev', 'noexec'] });
    mounts.push({ destination: '/etc/hosts', type: 'bind', source: input.network.hosts, options: ['bind', 'ro', 'nosuid', 'nodev', 'noexec'] });
  }
  if (input.workspacePath !== undefined) {
    mounts.push({
      destination: WORKSPACE_MOUNT,
      type: 'bind',
      source: input.workspacePath,
      options: ['rbind', input.workspaceReadOnly ? 'ro' : 'rw', 'nosuid', 'nodev'],
    });
  }
  return {
    ociVersion: '1.0.2-dev',
    process: {
      terminal: false,
      user: { uid: 0, gid: 0 },
      args: [SANDBOX_INIT],
      env: buildEnv(input.vmId, input.env, input.poddListenFd),
      cwd: '/',
      capabilities: { bounding: caps, effective: caps, permitted: caps, ambient: caps },
      // soft 1024 for the sandbox; sandnode-init raises podd's soft limit to the hard one (issue 10 §5)
      rlimits: [{ type: 'RLIMIT_NOFILE', hard: 8192, soft: 1024 }],
      noNewPrivileges: true,
    },
    root: { path: input.rootfsPath, readonly: false },
    hostname: input.hostname || input.vmId,
    mounts,
    linux: {
      cgroupsPath: input.cgroupsPath ?? `/sandnode/${input.vmId}`,
      resources: {
        devices: [{ allow: false, access: 'rwm' }],
        memory: { limit: input.resources.memoryMib * 1024 * 1024, ...(input.noSwap ? { swap: input.resources.memoryMib * 1024 * 1024 } : {}) },
        cpu: { quota: input.resources.vcpus * CPU_PERIOD_US, period: CPU_PERIOD_US },
        pids: { limit: input.resources.pids },
        ...(input.blockIO ? { blockIO: input.blockIO } : {}),
      },
      // A new network namespace with nothing configured has only loopback; the cgroup
      // namespace makes /proc/self/cgroup and /sys/fs/cgroup show only the sandbox's own subtree.
      // with a user namespace runc sets its maps before the other namespaces are made, so they belong to it
      namespaces,
      ...(idMap ? { uidMappings: idMap, gidMappings: idMap } : {}),
      ...(input.seccomp ? { seccomp: input.seccomp } : {}),
      maskedPaths: [
        '/proc/acpi',
        '/proc/asound',
        '/proc/kcore',
        '/proc/keys',
        '/proc/latency_stats',
        '/proc/timer_list',
        '/proc/timer_stats',
        '/proc/sched_debug',
        '/sys/firmware',
        '/proc/scsi',
        ...(hostSysfs ? HOST_SYSFS_MASKED : []),
      ],
      readonlyPaths: ['/proc/bus', '/proc/fs', '/proc/irq', '/proc/sys', '/proc/sysrq-trigger'],
    },
  };
}
