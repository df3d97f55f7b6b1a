/**
 * The seccomp profile of runc sandboxes: a data file (services/vmm-supervisor/seccomp/
 * sandbox.json, its "comment" names its source), loaded once at start and written into each
 * new VM's OCI spec as `linux.seccomp` (OCI runtime spec, config-linux.md#seccomp). Config key
 * `seccompProfile`: a file path, or "unconfined" for none (a warning at start).
 */
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { ConfigError } from '@sandnode/shared';

/** The profile shipped with the supervisor (the package's seccomp/sandbox.json). */
export const DEFAULT_SECCOMP_PROFILE = path.join(__dirname, '..', '..', 'seccomp', 'sandbox.json');
/** The `seccompProfile` value that turns seccomp off. */
export const SECCOMP_UNCONFINED = 'unconfined';

/** SeccompProfile is the OCI `linux.seccomp` object (the file without its comment). */
export type SeccompProfile = { defaultAction: string; syscalls: { names: string[]; action: string }[] } & Record<string, unknown>;

/**
 * loadSeccompProfile reads the profile at file ("unconfined": undefined). Throws ConfigError
 * naming the file when it cannot be read or is not an OCI seccomp object.
 */
export function loadSeccompProfile(file: string): SeccompProfile | undefined {
  if (file === SECCOMP_UNCONFINED) return undefined;
  let raw: unknown;
  try {
    raw = JSON.parse(readFileSync(file, 'utf8'));
  } catch (err) {
    throw new ConfigError(`key "seccompProfile": ${file}: ${(err as Error).message}`);
  }
  const p = raw as Partial<SeccompProfile> | null;
  const ok = !!p && typeof p === 'object' && typeof p.defaultAction === 'string' && Array.isArray(p.syscalls) && p.syscalls.every((s) => !!s && Array.isArray(s.names) && typeof s.action === 'string');
  if (!ok) throw new ConfigError(`key "seccompProfile": ${file} is not an OCI seccomp profile (defaultAction, syscalls[].names/action)`);
  const { comment: _comment, ...profile } = p as SeccompProfile;
  return profile as SeccompProfile;
}
