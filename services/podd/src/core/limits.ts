/** Limits promised by the podd contract (proto/sandnode/podd/v1/podd.proto). */

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
