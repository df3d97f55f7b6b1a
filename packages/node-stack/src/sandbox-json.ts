/**
 * The JSON view of a sandbox that the CLI prints (`sandbox get --json` and every command that
 * answers with a sandbox); scripts and the compat tests parse it, so fields are only added.
 */
import { SandboxNetwork, SandboxState, type Sandbox } from '@sandnode/shared/proto/server/v1/sandbox';

/**
 * A sandbox's network in the proto JSON mapping (SandboxNetwork.toJSON: lowerCamel names,
 * fields at their default omitted, so slot 0 and an empty policy are absent).
 */
export interface SandboxNetworkJson {
  slot?: number;
  address?: string;
  gateway?: string;
  egress?: { allowOut?: string[]; denyOut?: string[]; blockAll?: boolean };
  public?: boolean;
  /** with "{port}" for the port */
  ingressUrl?: string;
}

/** The CLI's JSON view of a sandbox. */
export interface SandboxJson {
  /** "sb-" + 16 hex digits */
  id: string;
  /** state name without prefix: RUNNING, PAUSED, DRAINED, ... */
  state: string;
  /** host pid of its init (0 when it has none) */
  pid: number;
  template: string;
  podd_version: string;
  metadata: Record<string, string>;
  /** virtual CPUs (0: the node's default) */
  vcpus: number;
  /** memory limit, MiB (0: the node's default) */
  memory_mib: number;
  /** /workspace size, bytes (0: the node's default) */
  disk_bytes: number;
  /** ISO 8601 UTC */
  created_at: string;
  /** ISO 8601 UTC; null when it has no timeout */
  expires_at: string | null;
  /** why it FAILED, else "" */
  error: string;
  /** rootfs uppers so far (1 at create, +1 per reset-rootfs) */
  rootfs_generation: number;
  /** the parent's id for a fork child, else "" */
  forked_from: string;
  /**
   * the isolation the vmm-supervisor applied at its VM's create (feature strings, sorted); []
   * when it named none (a 0.2.0 supervisor: no seccomp, cgroup namespace or pids limit) or the
   * sandbox has no VM (DRAINED)
   */
  isolation: string[];
  /** its network (address, slot, egress policy, ingress URL), null when it has none */
  network: SandboxNetworkJson | null;
}

/** isolationText is how the CLI shows a sandbox's isolation: "seccomp,cgroup-ns,..." or why there is none. */
export function isolationText(isolation: string[]): string {
  if (!isolation.length) return 'none named (no VM, or created by a vmm-supervisor without vmm.vm-isolation.v1, e.g. 0.2.0)';
  return isolation.map((f) => f.replace(/^vmm\./, '').replace(/\.v\d+$/, '')).join(',');
}

/** stateName gives "RUNNING" for SANDBOX_STATE_RUNNING; "UNKNOWN" for a number it does not know. */
export function stateName(s: SandboxState | number): string {
  const n = SandboxState[s as SandboxState];
  return typeof n === 'string' ? n.replace(/^SANDBOX_STATE_/, '') : 'UNKNOWN';
}

/** sandboxJson converts a proto Sandbox to {@link SandboxJson}. */
export function sandboxJson(s: Sandbox): SandboxJson {
  return {
    id: s.sandboxId,
    state: stateName(s.state),
    pid: s.pid,
    template: s.template,
    podd_version: s.poddVersion,
    metadata: s.metadata,
    vcpus: s.resources?.vcpus ?? 0,
    memory_mib: s.resources?.memoryMib ?? 0,
    disk_bytes: s.resources?.diskBytes ?? 0,
    created_at: new Date(s.createdAtMs).toISOString(),
    expires_at: s.expiresAtMs ? new Date(s.expiresAtMs).toISOString() : null,
    error: s.errorMessage,
    rootfs_generation: s.rootfsGeneration || 1,
    forked_from: s.forkedFrom,
    isolation: [...s.isolation],
    network: s.network ? (SandboxNetwork.toJSON(s.network) as SandboxNetworkJson) : null,
  };
}
