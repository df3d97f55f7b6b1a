/** @sandnode/podd: the guest agent's core, for embedding and tests. The daemon is main.ts. */
export { ExecRunner, validateExecSpec, exitCodeOf, defaultBaseEnv, ExecAbortError } from './core/exec';
export type { ExecSpec, ExecEvent, ExecRunnerOptions } from './core/exec';
export { readFile, writeFile, statPath, checkPath, fsyncDir } from './core/files';
export type { FileInfo, FileKind, ReadResult, WriteOptions } from './core/files';
export { MAX_FILE_BYTES, MAX_STDIN_BYTES } from './core/limits';
export { loadPoddConfig, poddConfigSchema, DEFAULT_SOCKET, DEFAULT_CWD, MAX_CHUNK_BYTES } from './config';
export type { PoddConfig } from './config';
export { PODD_COMPONENT, PODD_BASE_FEATURES, poddFeatures } from './features';
export { poddService } from './rpc/podd-service';
export { Quiescer, clampFreezeMs, syncFilesystems, MIN_FREEZE_MS, MAX_FREEZE_MS, DEFAULT_FREEZE_MS } from './core/quiesce';
export type { FreezePort, FreezeEnd, PortFreeze, PortStatus, QuiesceResult } from './core/quiesce';
export { FAILPOINTS, FAILPOINTS_ENV, poddFailpoints } from './core/failpoints';
export { createFreezePortClient } from './rpc/freeze-port-client';
