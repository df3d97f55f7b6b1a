/**
 * Default directories and socket names shared by all components (ARCHITECTURE.md section 1).
 * Everything is configurable; these are the defaults for a local run.
 */
import path from 'node:path';

/** Default state dir: records DB, images, templates, the supervisor's VM table. */
export const DEFAULT_STATE_DIR = './.sandnode/state';
/** Default runtime dir: unix sockets and per-sandbox dirs. */
export const DEFAULT_RUN_DIR = './.sandnode/run';

/** socketPath gives the unix socket of a component in the runtime dir. */
export function socketPath(runDir: string, component: 'vmm-supervisor' | 'ublk-manager' | 'server'): string {
  return path.join(path.resolve(runDir), `${component}.sock`);
}

/** unixAddress turns a socket path into a gRPC address. */
export function unixAddress(p: string): string {
  return `unix://${path.resolve(p)}`;
}

/** sandboxDir is the per-sandbox runtime dir holding podd.sock. */
export function sandboxDir(runDir: string, sandboxId: string): string {
  return path.join(path.resolve(runDir), 'sandboxes', sandboxId);
}
