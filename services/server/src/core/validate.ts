/**
 * Input rules of the public API. Every check throws InvalidArgumentError naming the field, so
 * bad input changes nothing.
 */
import path from 'node:path';
import { DEFAULT_FREEZE_MS, InvalidArgumentError, MAX_FREEZE_MS, requireMatch } from '@sandnode/shared';
import { TEMPLATE_NAME_RE } from '@sandnode/template-builder';
import type { Resources } from './types';

/** Longest sandbox lifetime a caller may set, in seconds (30 days). */
export const MAX_TIMEOUT_SECONDS = 30 * 24 * 3600;
/** Largest file payload of ReadFile/WriteFile and Exec stdin, in bytes (3 MiB). */
export const MAX_FILE_CHUNK_BYTES = 3 * 1024 * 1024;
/** Most metadata entries per sandbox. */
export const MAX_METADATA_ENTRIES = 64;
/** Most argv entries of an Exec. */
export const MAX_ARGV = 1024;
/**
 * Longest single argv entry, and env entry counted as "KEY=VALUE", of an Exec, in bytes: the
 * kernel's MAX_ARG_STRLEN (128 KiB) less the NUL; a longer one fails execve with E2BIG.
 */
export const MAX_EXEC_STRING_BYTES = 128 * 1024 - 1;
/**
 * Most bytes the argv and env of an Exec carry together, each entry counted with its NUL
 * (1 MiB: half the kernel's usual ARG_MAX of 2 MiB, which podd's own environment shares).
 */
export const MAX_EXEC_ARGS_BYTES = 1024 * 1024;
/** Longest path the kernel takes, in bytes (PATH_MAX 4096 less the NUL): argv[0] and an Exec's cwd. */
export const MAX_PATH_BYTES = 4095;
/** Longest file name (one path component), in bytes (NAME_MAX): of argv[0] and an Exec's cwd. */
export const MAX_NAME_BYTES = 255;
/** Most characters of a bad value quoted back in an error message (the value may be megabytes). */
const MAX_QUOTED_CHARS = 80;
const METADATA_KEY_RE = /^[A-Za-z0-9._/-]{1,63}$/;
const REQUEST_ID_RE = /^[A-Za-z0-9._-]{1,64}$/;
const MIB = 1024 * 1024;

/** Node defaults for resources a caller leaves at 0. */
export interface ResourceDefaults {
  vcpus: number;
  memoryMib: number;
  diskBytes: number;
}

export function validateTemplateName(field: string, name: string): string {
  if (!name) throw new InvalidArgumentError(`${field}: must not be empty`);
  return requireMatch(field, name, TEMPLATE_NAME_RE, 'template name');
}

export function validateTimeoutSeconds(field: string, s: number): number {
  if (!Number.isInteger(s) || s < 0 || s > MAX_TIMEOUT_SECONDS) {
    throw new InvalidArgumentError(`${field}: ${s} is out of range 0..${MAX_TIMEOUT_SECONDS} seconds`);
  }
  return s;
}

export function validateMetadata(field: string, md: Record<string, string>): Record<string, string> {
  const entries = Object.entries(md);
  if (entries.length > MAX_METADATA_ENTRIES) throw new InvalidArgumentError(`${field}: ${entries.length} entries, at most ${MAX_METADATA_ENTRIES}`);
  for (const [k, v] of entries) {
    if (!METADATA_KEY_RE.test(k)) throw new InvalidArgumentError(`${field}: key ${JSON.stringify(k.slice(0, 80))} must match ${METADATA_KEY_RE.source}`);
    if (Buffer.byteLength(v) > 256) throw new InvalidArgumentError(`${field}[${k}]: value is longer than 256 bytes`);
  }
  return { ...md };
}

/** Most variables in a sandbox's environment (CreateSandboxRequest.env). */
export const MAX_SANDBOX_ENV_ENTRIES = 64;
/** Most bytes of a sandbox's environment, all "NAME=VALUE" with a NUL each. */
export const MAX_SANDBOX_ENV_BYTES = 65536;
/** An environment variable's name in a sandbox's environment. */
export const ENV_NAME_RE = /^[A-Za-z_][A-Za-z0-9_]{0,127}$/;

/**
 * validateSandboxEnv checks CreateSandboxRequest.env: at most MAX_SANDBOX_ENV_ENTRIES entries,
 * names matching ENV_NAME_RE, no NUL in a value, at most MAX_SANDBOX_ENV_BYTES together.
 * Throws InvalidArgumentError naming the entry (never echoing a value: it may be a secret).
 */
export function validateSandboxEnv(field: string, env: Record<string, string> | undefined): Record<string, string> {
  const entries = Object.entries(env ?? {});
  if (entries.length > MAX_SANDBOX_ENV_ENTRIES) throw new InvalidArgumentError(`${field}: ${entries.length} variables, at most ${MAX_SANDBOX_ENV_ENTRIES}`);
  let total = 0;
  for (const [k, v] of entries) {
    if (!ENV_NAME_RE.test(k)) throw new InvalidArgumentError(`${field}: name ${JSON.stringify(k.slice(0, 80))} must match ${ENV_NAME_RE.source}`);
    if (v.includes('\0')) throw new InvalidArgumentError(`${field}[${k}]: the value contains a NUL byte`);
    total += Buffer.byteLength(k) + Buffer.byteLength(v) + 2;
  }
  if (total > MAX_SANDBOX_ENV_BYTES) throw new InvalidArgumentError(`${field}: ${total} bytes as NAME=VALUE, at most ${MAX_SANDBOX_ENV_BYTES} together`);
  return Object.fromEntries(entries);
}

/** validateMaxFreezeMs checks a fork's max_freeze_ms (0 = default 1500; at most 5000). */
export function validateMaxFreezeMs(field: string, ms: number): number {
  if (!Number.isInteger(ms) || ms < 0 || ms > MAX_FREEZE_MS) throw new InvalidArgumentError(`${field}: ${ms} is out of range 0..${MAX_FREEZE_MS} ms`);
  return ms || DEFAULT_FREEZE_MS;
}

export function validateRequestId(field: string, id: string): string {
  if (id === '') return id;
  return requireMatch(field, id, REQUEST_ID_RE, 'request id');
}

/** validateResources fills defaults and checks ranges (see common.v1.Resources). */
export function validateResources(field: string, r: Partial<Resources> | undefined, d: ResourceDefaults): Resources {
  const vcpus = r?.vcpus ?? 0;
  const memoryMib = r?.memoryMib ?? 0;
  const diskBytes = r?.diskBytes ?? 0;
  const pids = r?.pids ?? 0;
  if (!Number.isInteger(vcpus) || vcpus < 0 || vcpus > 64) throw new InvalidArgumentError(`${field}.vcpus: ${vcpus} is out of range 0..64`);
  if (!Number.isInteger(memoryMib) || (memoryMib !== 0 && (memoryMib < 32 || memoryMib > 65536))) {
    throw new InvalidArgumentError(`${field}.memory_mib: ${memoryMib} must be 0 or 32..65536`);
  }
  if (!Number.isSafeInteger(diskBytes) || (diskBytes !== 0 && (diskBytes < 16 * MIB || diskBytes > 1024 * 1024 * MIB))) {
    throw new InvalidArgumentError(`${field}.disk_bytes: ${diskBytes} must be 0 or 16 MiB..1 TiB`);
  }
  if (diskBytes % 512 !== 0) throw new InvalidArgumentError(`${field}.disk_bytes: ${diskBytes} is not a multiple of 512`);
  if (!Number.isInteger(pids) || (pids !== 0 && (pids < 16 || pids > 1_000_000))) throw new InvalidArgumentError(`${field}.pids: ${pids} must be 0 or 16..1000000`);
  // pids 0 stays 0: the supervisor applies its node default (key defaultPids)
  return { vcpus: vcpus || d.vcpus, memoryMib: memoryMib || d.memoryMib, diskBytes: diskBytes || d.diskBytes, pids };
}

/**
 * workspacePath turns an API path (relative to /workspace, or absolute below it) into the
 * absolute path inside the sandbox. Refuses "..", NUL bytes, empty paths and absolute paths
 * outside /workspace.
 */
export function workspacePath(field: string, p: string): string {
  if (!p) throw new InvalidArgumentError(`${field}: must not be empty`);
  if (p.includes('\0')) throw new InvalidArgumentError(`${field}: contains a NUL byte`);
  if (Buffer.byteLength(p) > 4096) throw new InvalidArgumentError(`${field}: longer than 4096 bytes`);
  if (p.split('/').includes('..')) throw new InvalidArgumentError(`${field}: ${JSON.stringify(p)} contains ".."`);
  const abs = path.posix.isAbsolute(p) ? path.posix.normalize(p) : path.posix.join('/workspace', p);
  if (abs !== '/workspace' && !abs.startsWith('/workspace/')) {
    throw new InvalidArgumentError(`${field}: ${JSON.stringify(p)} is outside /workspace`);
  }
  if (abs === '/workspace' || abs === '/workspace/') throw new InvalidArgumentError(`${field}: names /workspace itself, not a file`);
  return abs;
}

/** quote is JSON of s cut to MAX_QUOTED_CHARS characters, for an error message that names a bad value. */
function quote(s: string): string {
  return s.length > MAX_QUOTED_CHARS ? `${JSON.stringify(s.slice(0, MAX_QUOTED_CHARS))}... (${Buffer.byteLength(s)} bytes)` : JSON.stringify(s);
}

/**
 * pathTooLong says why the kernel would refuse p with ENAMETOOLONG (longer than MAX_PATH_BYTES,
 * or a component longer than MAX_NAME_BYTES), or undefined when it would not.
 */
function pathTooLong(p: string): string | undefined {
  const n = Buffer.byteLength(p);
  if (n > MAX_PATH_BYTES) return `${n} bytes, at most ${MAX_PATH_BYTES} (PATH_MAX)`;
  const long = p.split('/').find((part) => Buffer.byteLength(part) > MAX_NAME_BYTES);
  if (long !== undefined) return `has a ${Buffer.byteLength(long)}-byte name, at most ${MAX_NAME_BYTES} per name (NAME_MAX)`;
  return undefined;
}

/**
 * validateCwd checks an Exec's working directory (empty: the default): no NUL, at most
 * MAX_PATH_BYTES, names of at most MAX_NAME_BYTES. Throws InvalidArgumentError naming the
 * field and quoting at most MAX_QUOTED_CHARS characters of the value; returns cwd.
 */
export function validateCwd(field: string, cwd: string): string {
  if (cwd.includes('\0')) throw new InvalidArgumentError(`${field}: contains a NUL byte`);
  const long = pathTooLong(cwd);
  if (long) throw new InvalidArgumentError(`${field}: ${quote(cwd)} ${long}`);
  return cwd;
}

/**
 * validateArgv checks an Exec command line and its env: at most MAX_ARGV entries, no NUL,
 * argv[0] at most MAX_PATH_BYTES with names of at most MAX_NAME_BYTES (longer ones the kernel
 * refuses with ENAMETOOLONG), each argv entry and each "KEY=VALUE" at most
 * MAX_EXEC_STRING_BYTES, all of them (with a NUL each) at most MAX_EXEC_ARGS_BYTES. Throws
 * InvalidArgumentError naming the field and the limit.
 */
export function validateArgv(field: string, argv: string[], env: Record<string, string> = {}): string[] {
  if (argv.length === 0) throw new InvalidArgumentError(`${field}: must not be empty`);
  if (argv.length > MAX_ARGV) throw new InvalidArgumentError(`${field}: ${argv.length} arguments, at most ${MAX_ARGV}`);
  if (!argv[0]) throw new InvalidArgumentError(`${field}[0]: must not be empty`);
  const long = pathTooLong(argv[0]);
  if (long) throw new InvalidArgumentError(`${field}[0]: ${quote(argv[0])} ${long}`);
  if (argv.some((a) => a.includes('\0'))) throw new InvalidArgumentError(`${field}: an argument contains a NUL byte`);
  let total = 0;
  argv.forEach((a, i) => {
    const n = Buffer.byteLength(a);
    if (n > MAX_EXEC_STRING_BYTES) throw new InvalidArgumentError(`${field}[${i}]: ${n} bytes, at most ${MAX_EXEC_STRING_BYTES} per argument`);
    total += n + 1;
  });
  for (const [k, v] of Object.entries(env)) {
    const n = Buffer.byteLength(k) + 1 + Buffer.byteLength(v);
    if (n > MAX_EXEC_STRING_BYTES) throw new InvalidArgumentError(`env[${k.slice(0, 80)}]: ${n} bytes as KEY=VALUE, at most ${MAX_EXEC_STRING_BYTES} per variable`);
    total += n + 1;
  }
  if (total > MAX_EXEC_ARGS_BYTES) throw new InvalidArgumentError(`${field} + env: ${total} bytes, at most ${MAX_EXEC_ARGS_BYTES} together`);
  return argv;
}

/** validateChunk checks a payload size against MAX_FILE_CHUNK_BYTES. */
export function validateChunk(field: string, bytes: number): number {
  if (bytes > MAX_FILE_CHUNK_BYTES) throw new InvalidArgumentError(`${field}: ${bytes} bytes, at most ${MAX_FILE_CHUNK_BYTES}`);
  return bytes;
}
