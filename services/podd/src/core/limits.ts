/** Limits promised by the podd contract (proto/sandnode/podd/v1/podd.proto). */
import { readFileSync } from 'node:fs';

/** Largest ReadFile length, WriteFile data and Exec stdin, in bytes (3 MiB). */
export const MAX_FILE_BYTES = 3 * 1024 * 1024;
/** Largest Exec stdin, in bytes (3 MiB). */
export const MAX_STDIN_BYTES = MAX_FILE_BYTES;
/** Longest single Exec argv entry, and env entry as "KEY=VALUE", in bytes (MAX_ARG_STRLEN 128 KiB less the NUL). */
export const MAX_EXEC_STRING_BYTES = 128 * 1024 - 1;
/** Most bytes an Exec's argv and env carry together, each entry with its NUL (1 MiB, half the usual ARG_MAX). */
export const MAX_EXEC_ARGS_BYTES = 1024 * 1024;
/** Longest path the kernel takes, in bytes (PATH_MAX 4096 less the NUL); a longer one fails ENAMETOOLONG. */
export const MAX_PATH_BYTES = 4095;
/** Longest file name (one path component), in bytes (NAME_MAX); a longer one fails ENAMETOOLONG. */
export const MAX_NAME_BYTES = 255;
/** Most characters of a bad value quoted back in an error message (the value may be megabytes). */
export const MAX_QUOTED_CHARS = 80;

/** Default of podd key `maxExecs`: commands podd runs at once; one more Exec is RESOURCE_EXHAUSTED. */
export const DEFAULT_MAX_EXECS = 256;
/** File descriptors one running command costs podd (its stdin, stdout and stderr pipes, one spare). */
export const FDS_PER_EXEC = 4;
/** File descriptors podd keeps for itself beside its commands (node, its sockets and connections, files). */
export const FDS_RESERVED = 128;

/** openFileLimit reads this process's soft RLIMIT_NOFILE from /proc/self/limits; undefined when it cannot ("unlimited" is Infinity). */
export function openFileLimit(limitsText?: string): number | undefined {
  let text = limitsText;
  if (text === undefined) {
    try {
      text = readFileSync('/proc/self/limits', 'utf8');
    } catch {
      return undefined;
    }
  }
  const m = /^Max open files\s+(\S+)/m.exec(text);
  if (!m) return undefined;
  return m[1] === 'unlimited' ? Infinity : Number(m[1]);
}

/**
 * execCap is how many commands podd may run at once: maxExecs, fewer when its open-file limit
 * (nofile, soft RLIMIT_NOFILE) leaves room for fewer (FDS_PER_EXEC each after FDS_RESERVED), at least 1.
 */
export function execCap(maxExecs: number, nofile: number | undefined): number {
  if (nofile === undefined || !Number.isFinite(nofile)) return maxExecs;
  return Math.max(1, Math.min(maxExecs, Math.floor((nofile - FDS_RESERVED) / FDS_PER_EXEC)));
}
