/**
 * UblkDriver: placeholder for the production ublk driver (kernel ublk devices served by an
 * external ublk server, USER_RECOVERY/REISSUE/QUIESCE). It is not built in this release:
 * {@link UblkDriver.checkAvailable} always rejects, naming `/dev/ublk-control` when the
 * kernel lacks ublk, so `driver: "ublk"` fails at start with a clear message.
 */
import { existsSync } from 'node:fs';
import { FailedPreconditionError, UnimplementedError } from '@sandnode/shared';
import type { BlockDriver } from '../core/driver';
import type { AttachedDevice, DriverCapability } from '../core/types';

/** The ublk control device node. */
export const UBLK_CONTROL = '/dev/ublk-control';

/** UblkDriver reports that the ublk driver cannot run here; every device call is UNIMPLEMENTED. */
export class UblkDriver implements BlockDriver {
  readonly name = 'ublk' as const;

  constructor(private readonly controlPath: string = UBLK_CONTROL) {}

  /** capabilities: none until the driver exists. */
  capabilities(): DriverCapability[] {
    return [];
  }

  /** checkAvailable always rejects: the control node is missing, or the driver is not built yet. */
  async checkAvailable(): Promise<void> {
    if (!existsSync(this.controlPath)) {
      throw new FailedPreconditionError(
        `driver "ublk": ${this.controlPath} is missing (the kernel has no ublk: load it with "modprobe ublk_drv", kernel >= 6.0); use driver "loop" on this host`,
      );
    }
    throw new FailedPreconditionError(`driver "ublk": ${this.controlPath} exists, but the ublk driver is not part of this release; use driver "loop"`);
  }

  /** attach is not implemented. */
  async attach(): Promise<AttachedDevice> {
    throw new UnimplementedError('driver "ublk" is not implemented in this release');
  }

  /** detach is not implemented. */
  async detach(): Promise<void> {
    throw new UnimplementedError('driver "ublk" is not implemented in this release');
  }

  /** listAttached reports nothing. */
  async listAttached(): Promise<AttachedDevice[]> {
    return [];
  }

  /** busyReason reports nothing. */
  async busyReason(): Promise<string | undefined> {
    return undefined;
  }
}
