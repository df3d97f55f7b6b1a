/** @sandnode/ublk-manager: the device manager as a library (the daemon is main.ts). */
export * from './core/types';
export * from './core/driver';
export * from './core/store';
export * from './core/validate';
export {
  DeviceManager,
  explain,
  DEFAULT_QUIESCE_TIMEOUT_MS,
  DEFAULT_RELEASE_TIMEOUT_MS,
  MAX_QUIESCE_TIMEOUT_MS,
  type AdoptionReport,
  type CloneInput,
  type CloneOutcome,
  type ConvergeReport,
  type DeviceManagerOptions,
  type ManagerCapabilities,
  type RecoverInput,
  type TakeoverReport,
} from './core/device-manager';
export { handoverAll, handoverMode, DEFAULT_PER_DEVICE_TIMEOUT_MS, type OldSlot, type HandoverReport, type DeviceHandoverResult, type HandoverMode } from './core/handover';
export { failpoint, failpoints, setFailpoints, parseFailpoints, FAILPOINT_NAMES, FAILPOINTS_ENV, type FailpointName, type FailpointAction } from './core/failpoints';
export { FileSlotPeers } from './store/slot-peers';
export { SharedEpochFence, type SharedEpochFenceOptions } from './store/shared-epoch-fence';
export { lockSlot, FileMutex, type HeldLock } from './store/locks';
export * from './store/layout';
export { handoverStall, cloneCopy } from './metrics';
export { MemoryDeviceStore } from './core/memory-store';
export { SqliteDeviceStore, deviceDbPath, DEVICE_DB_SCHEMA } from './store/sqlite-device-store';
export { LoopDriver, FLAG_DIRECT_IO, type LoopDriverOptions } from './drivers/loop';
export { UblkDriver, UBLK_CONTROL, DEFAULT_UBLK_SERVER, parseUblkList, parseUblkFeatures, type UblkDriverOptions } from './drivers/ublk';
export { FileImages } from './drivers/images';
export { deviceService } from './rpc/device-service';
export { loadUblkConfig, configSchema, SERVICE, DEFAULT_SLOT_LOCK_WAIT_MS, type UblkConfig } from './config';
