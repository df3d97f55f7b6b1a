/**
 * createDriver picks the VM backend named by config: "runc" (embedded) or "firecracker"
 * (needs `kernelImage`; its binary and /dev/kvm are checked when the supervisor starts).
 */
import { existsSync } from 'node:fs';
import path from 'node:path';
import { ConfigError } from '@sandnode/shared';
import { DEFAULT_SECCOMP_PROFILE, loadSeccompProfile } from './seccomp';
import type { Logger } from '@sandnode/shared';
import type { VmDriver } from '../core/driver';
import { FirecrackerDriver } from './firecracker';
import { RuncDriver } from './runc';
import type { IoLimits } from './block-io';
import { USERNS_TEMPLATES_DIR, type UsernsRange } from './userns';
import type { FreezePortServe } from '../rpc/freeze-port-service';

/** What createDriver needs from the config. */
export interface DriverConfig {
  driver: 'runc' | 'firecracker';
  runcBinary: string;
  runcRoot: string;
  runDir: string;
  firecrackerBinary: string;
  kernelImage: string | undefined;
  kernelArgs: string;
  runcStartTimeoutMs: number;
  killWaitMs: number;
  /** seccomp profile file or "unconfined" (runc); default the shipped profile */
  seccompProfile?: string;
  /** size of a runc VM's guest run dir tmpfs, bytes (default 16 MiB) */
  guestRunDirBytes?: number;
  /** cap of a runc VM's console log, bytes (default 1 MiB) */
  consoleLogBytes?: number;
  /** user namespace range of runc sandboxes; undefined = none */
  usernsRange?: UsernsRange;
  /** state dir (runc: shifted template copies in `<stateDir>/vmm-supervisor/userns-templates`); default runDir */
  stateDir?: string;
  /** I/O limits of each runc VM's drives; undefined = none */
  io?: IoLimits;
}

/** createDriver returns the configured driver; throws ConfigError naming a missing or bad key. */
export function createDriver(cfg: DriverConfig, log: Logger, serveFreezePort?: FreezePortServe): VmDriver {
  switch (cfg.driver) {
    case 'runc':
      return new RuncDriver({
        runcBinary: cfg.runcBinary,
        runcRoot: cfg.runcRoot,
        runDir: cfg.runDir,
        log: log.child({ driver: 'runc' }),
        serveFreezePort,
        startTimeoutMs: cfg.runcStartTimeoutMs,
        killWaitMs: cfg.killWaitMs,
        seccomp: loadSeccompProfile(cfg.seccompProfile ?? DEFAULT_SECCOMP_PROFILE),
        guestRunDirBytes: cfg.guestRunDirBytes,
        consoleLogBytes: cfg.consoleLogBytes,
        io: cfg.io,
        userns: cfg.usernsRange ? { range: cfg.usernsRange, templatesDir: path.join(cfg.stateDir ?? cfg.runDir, 'vmm-supervisor', USERNS_TEMPLATES_DIR) } : undefined,
      });
    case 'firecracker': {
      if (!cfg.kernelImage) throw new ConfigError('key "kernelImage": required with driver "firecracker" (an uncompressed vmlinux)');
      if (!existsSync(cfg.kernelImage)) throw new ConfigError(`key "kernelImage": ${cfg.kernelImage} does not exist`);
      return new FirecrackerDriver({
        firecrackerBinary: cfg.firecrackerBinary,
        kernelImage: cfg.kernelImage,
        kernelArgs: cfg.kernelArgs,
        runDir: cfg.runDir,
        log: log.child({ driver: 'firecracker' }),
        killWaitMs: cfg.killWaitMs,
      });
    }
  }
}
