/**
 * The JSON view of a sandbox that the CLI prints (`sandbox get --json` and every command that
 * answers with a sandbox); scripts and the compat tests parse it, so fields are only added.
 */
import { SandboxNetwork, SandboxState, type IdleStatus, type Sandbox } from '@sandnode/shared/proto/server/v1/sandbox';

/**
 * A sandbox's network in the proto JSON mapping (SandboxNetwork.toJSON: lowerCamel names,
 * fields at their default omitted, so an empty policy is absent), with slot always there.
 */
export interface SandboxNetworkJson {
  slot: number;
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
  /** its idle settings and the next idle action (server feature "server.idle.v1"), null when it has none */
  idle: SandboxIdleJson | null;
  /** the names of the sandbox's environment variables (create --env), sorted; values are never shown */
  env_keys: string[];
}

/** The idle part of {@link SandboxJson}: seconds as given at create (0 never), times ISO 8601 UTC or null. */
export interface SandboxIdleJson {
  pause_after_s: number;
  hibernate_after_s: number;
  paused_ttl_s: number;
  auto_resume: boolean;
  last_activity_at: string | null;
  keep_alive_until: string | null;
  /** "pause", "hibernate", "delete" or "" (none) */
  next_action: string;
  next_action_at: string | null;
  paused_at: string | null;
  /** DRAINED by hibernate_after_s (a resume is a cold start on the same disks) */
  hibernated: boolean;
}

function isoOrNull(ms: number): string | null {
  return ms ? new Date(ms).toISOString() : null;
}

/** idleJson is the idle part of a sandbox for JSON output; null without idle settings. */
export function idleJson(i: IdleStatus | undefined): SandboxIdleJson | null {
  if (!i) return null;
  return {
    pause_after_s: i.settings?.pauseAfterS ?? 0,
    hibernate_after_s: i.settings?.hibernateAfterS ?? 0,
    paused_ttl_s: i.settings?.pausedTtlS ?? 0,
    auto_resume: i.settings?.autoResume ?? true,
    last_activity_at: isoOrNull(i.lastActivityMs),
    keep_alive_until: isoOrNull(i.keepAliveUntilMs),
    next_action: i.nextAction,
    next_action_at: isoOrNull(i.nextActionAtMs),
    paused_at: isoOrNull(i.pausedAtMs),
    hibernated: i.hibernated,
  };
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
    // slot always (the proto JSON mapping leaves out a 0, the first slot, and a script read undefined)
    network: s.network ? { ...(SandboxNetwork.toJSON(s.network) as Omit<SandboxNetworkJson, 'slot'>), slot: s.network.slot } : null,
    idle: idleJson(s.idle),
    env_keys: [...s.envKeys],
  };
}
