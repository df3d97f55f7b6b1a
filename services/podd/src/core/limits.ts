/** Limits promised by the podd contract (proto/sandnode/podd/v1/podd.proto). */

/** Largest ReadFile length, WriteFile data and Exec stdin, in bytes (3 MiB). */
export const MAX_FILE_BYTES = 3 * 1024 * 1024;
/** Largest Exec stdin, in bytes (3 MiB). */
export const MAX_STDIN_BYTES = MAX_FILE_BYTES;
/** Longest single Exec argv entry, and env entry as "KEY=VALUE", in bytes (MAX_ARG_STRLEN 128 KiB less the NUL). */
export const MAX_EXEC_STRING_BYTES = 128 * 1024 - 1;
/** Most bytes an Exec's argv and env carry together, each entry with its NUL (1 MiB, half the usual ARG_MAX). */
export const MAX_EXEC_ARGS_BYTES = 1024 * 1024;
