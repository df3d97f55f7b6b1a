/**
 * The ublk-manager slots: after the first device handover the devices belong to the daemon of
 * slot "a" or "b", which listens on `<runDir>/ublk-manager-<slot>.sock`; the stable address
 * `<runDir>/ublk-manager.sock` (what the server dials) is a link to that socket, and the state
 * dir records the slot so that a restart of the node starts the right one.
 */
import { closeSync, fsyncSync, mkdirSync, openSync, readFileSync, renameSync, rmSync, symlinkSync, writeSync } from 'node:fs';
import path from 'node:path';
import { socketPath } from '@sandnode/shared';
import type { StackDirs } from './components';

/** A ublk-manager slot. */
export type UblkSlot = 'a' | 'b';

/** activeUblkSlotFile is `<stateDir>/ublk-manager/active-slot` ("a\n" or "b\n"). */
function activeUblkSlotFile(dirs: StackDirs): string {
  return path.join(path.resolve(dirs.stateDir), 'ublk-manager', 'active-slot');
}

/** activeUblkSlot is the slot that owns the devices; "" before the first device handover. */
export function activeUblkSlot(dirs: StackDirs): '' | UblkSlot {
  try {
    const v = readFileSync(activeUblkSlotFile(dirs), 'utf8').trim();
    return v === 'a' || v === 'b' ? v : '';
  } catch {
    return '';
  }
}

/** setActiveUblkSlot records the slot that owns the devices (written to a temp file, fsync'd, renamed). */
export function setActiveUblkSlot(dirs: StackDirs, slot: UblkSlot): void {
  const file = activeUblkSlotFile(dirs);
  mkdirSync(path.dirname(file), { recursive: true });
  const tmp = `${file}.tmp`;
  const fd = openSync(tmp, 'w');
  try {
    writeSync(fd, `${slot}\n`);
    fsyncSync(fd);
  } finally {
    closeSync(fd);
  }
  renameSync(tmp, file);
}

/** ublkSlotSocket is the slot's own socket, `<runDir>/ublk-manager-<slot>.sock` (absolute). */
export function ublkSlotSocket(dirs: StackDirs, slot: UblkSlot): string {
  return path.join(path.resolve(dirs.runDir), `ublk-manager-${slot}.sock`);
}

/** pointUblkAddress makes the stable `<runDir>/ublk-manager.sock` a (relative) link to the slot's own socket, atomically. */
export function pointUblkAddress(dirs: StackDirs, slot: UblkSlot): void {
  const stable = socketPath(dirs.runDir, 'ublk-manager');
  const tmp = `${stable}.${process.pid}.tmp`;
  rmSync(tmp, { force: true });
  symlinkSync(path.basename(ublkSlotSocket(dirs, slot)), tmp);
  renameSync(tmp, stable);
}
