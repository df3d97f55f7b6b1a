/**
 * ResetRootfs: a fresh empty rootfs upper over the sandbox's template, /workspace kept.
 * Order: make the new upper -> record it as reset_upper_device_id -> stop the VM -> record it
 * as the upper (generation + 1) and the sandbox DRAINED ("cold-start") -> delete the old
 * upper -> boot (RUNNING). A crash at any step leaves a record adoption finishes or undoes
 * (adoption.ts finishReset; see RuntimeRecord.reset_upper_device_id).
 */
import { FailedPreconditionError } from '@sandnode/shared';
import { failpoint } from '../handover/failpoints';
import type { CoreContext } from './context';
import { stopVmKeepingSlot } from './network';
import { bootVm } from './provision';
import { transition } from './transitions';
import { COLD_START, type DeviceInfo, type SandboxRecord } from './types';

/**
 * resetRootfs gives the sandbox a fresh empty upper over its template and generation + 1,
 * keeping /workspace; processes restart (new pid) and it comes back RUNNING. signal stops the
 * wait to enter the handover gate only: once started, a reset runs to the end. Errors:
 * INVALID_ARGUMENT, NOT_FOUND, FAILED_PRECONDITION (not RUNNING or PAUSED, or no upper in the
 * record), and the peers'.
 */
export function resetRootfs(c: CoreContext, id: string, signal?: AbortSignal): Promise<SandboxRecord> {
  c.get(id);
  return c.gated(
    id,
    async () => {
      const rec = c.requireState(id, 'ResetRootfs');
      const old = rec.devices.find((d) => d.role === 'rootfs-upper');
      if (!old) throw new FailedPreconditionError(`sandbox ${id}: its record lacks a rootfs-upper device`);
      const generation = (rec.rootfsGeneration || 1) + 1;
      const fresh = await c.devices.createEmpty(`${id}-upper-g${generation}`, c.upperBytes);
      rec.resetUpperDeviceId = fresh.deviceId;
      c.touch(rec);
      // the same address after the reset: the slot stays reserved for the sandbox
      await stopVmKeepingSlot(c.vms, rec);
      c.podd.forget(rec.poddAddress);
      failpoint('reset.after-stop');
      switchUpper(c, rec, fresh, generation);
      await c.devices.delete(old.deviceId);
      await bootVm(c, rec);
      c.log.info({ sandbox_id: id, generation, vm_pid: rec.vm?.pid }, 'rootfs reset');
      return rec;
    },
    signal,
  );
}

/**
 * switchUpper makes fresh the record's upper at generation and persists it DRAINED (VM
 * stopped, disks kept, resume method "cold-start"), so a crash before the boot leaves a
 * sandbox that ResumeSandbox starts on the new rootfs. The record must be RUNNING or PAUSED.
 */
export function switchUpper(c: Pick<CoreContext, 'touch'>, rec: SandboxRecord, fresh: DeviceInfo, generation: number): void {
  transition(rec, 'DRAINED');
  rec.devices = rec.devices.filter((d) => d.role !== 'rootfs-upper');
  rec.devices.unshift({ deviceId: fresh.deviceId, role: 'rootfs-upper', path: fresh.path, backingFile: fresh.backingFile, sizeBytes: fresh.sizeBytes });
  rec.rootfsGeneration = generation;
  rec.resetUpperDeviceId = '';
  rec.resumeMethod = COLD_START;
  c.touch(rec);
}
