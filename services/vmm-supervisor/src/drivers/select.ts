/**
 * createDriver picks the VM backend named by config. Only "runc" is built in this release;
 * "firecracker" fails at start with a message that says so.
 */
import { ConfigError } from '@sandnode/shared';
import type { Logger } from '@sandnode/shared';
import type { VmDriver } from '../core/driver';
import { RuncDriver } from './runc';

/** What createDriver needs from the config. */
export interface DriverConfig {
  driver: 'runc' | 'firecracker';
  runcBinary: string;
  runcRoot: string;
  runDir: string;
}

/** createDriver returns the configured driver; throws ConfigError for one not built here. */
export function createDriver(cfg: DriverConfig, log: Logger): VmDriver {
  switch (cfg.driver) {
    case 'runc':
      return new RuncDriver({ runcBinary: cfg.runcBinary, runcRoot: cfg.runcRoot, runDir: cfg.runDir, log: log.child({ driver: 'runc' }) });
    case 'firecracker':
      throw new ConfigError('key "driver": the "firecracker" driver is not built in this release of vmm-supervisor; use "runc"');
  }
}
