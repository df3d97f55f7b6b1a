/**
 * Clients of the server's public API for the CLI, and the JSON shape the CLI prints.
 */
import { SandboxState, type Sandbox } from '@sandnode/shared/proto/server/v1/sandbox';

/** The server API the CLI uses (one piece of code in shared serves the CLI, bench and compat tests). */
export { connectServerApi as connectServer, type ServerApi } from '@sandnode/shared';

/** The CLI's JSON view of a sandbox (`sandbox get --json`). */
export interface SandboxJson {
  id: string;
  state: string;
  pid: number;
  template: string;
  podd_version: string;
  metadata: Record<string, string>;
  vcpus: number;
  memory_mib: number;
  disk_bytes: number;
  created_at: string;
  expires_at: string | null;
  error: string;
  /** rootfs uppers so far (1 at create, +1 per reset-rootfs) */
  rootfs_generation: number;
  /** the parent's id for a fork child, else "" */
  forked_from: string;
}

/** stateName gives "RUNNING" for SANDBOX_STATE_RUNNING. */
export function stateName(s: SandboxState | number): string {
  const n = SandboxState[s as SandboxState];
  return typeof n === 'string' ? n.replace(/^SANDBOX_STATE_/, '') : 'UNKNOWN';
}

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
  };
}

/** table renders rows as aligned columns for people. */
export function table(headers: string[], rows: (string | number)[][]): string {
  const cells = [headers, ...rows.map((r) => r.map(String))];
  const widths = headers.map((_, i) => Math.max(...cells.map((r) => (r[i] ?? '').length)));
  return cells.map((r) => r.map((c, i) => c.padEnd(widths[i] ?? 0)).join('  ').trimEnd()).join('\n');
}
