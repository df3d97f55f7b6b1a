/** Limits promised by the podd contract (proto/sandnode/podd/v1/podd.proto). */

/** Largest ReadFile length, WriteFile data and Exec stdin, in bytes (3 MiB). */
export const MAX_FILE_BYTES = 3 * 1024 * 1024;
/** Largest Exec stdin, in bytes (3 MiB). */
export const MAX_STDIN_BYTES = MAX_FILE_BYTES;
