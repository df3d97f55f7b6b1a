/** @sandnode/ublk-manager: the device manager as a library (the daemon is main.ts). */
export * from './core/types';
export * from './core/driver';
export * from './core/store';
export * from './core/validate';
export { DeviceManager, explain, type AdoptionReport, type DeviceManagerOptions, type ManagerCapabilities } from './core/device-manager';
export { MemoryDeviceStore } from './core/memory-store';
export { SqliteDeviceStore, deviceDbPath, DEVICE_DB_SCHEMA } from './store/sqlite-device-store';
export { LoopDriver, FLAG_DIRECT_IO, type LoopDriverOptions } from './drivers/loop';
export { UblkDriver, UBLK_CONTROL } from './drivers/ublk';
export { FileImages } from './drivers/images';
export { deviceService } from './rpc/device-service';
export { loadUblkConfig, configSchema, SERVICE_NAME, type UblkManagerConfig } from './config';
