/** @sandnode/vmm-supervisor: the node's VM owner (runc and firecracker drivers). */
export { configSchema, loadVmmConfig, SERVICE } from './config';
export type { VmmConfig } from './config';
export { Supervisor } from './core/supervisor';
export type { AdoptionReport, DriverBinaryStore, SupervisorDefaults, SupervisorOptions } from './core/supervisor';
export type { LiveStatus, StartedVm, VmDriver, VmRef } from './core/driver';
export type { VmStore } from './core/vm-store';
export { MemoryVmStore } from './core/vm-store';
export type { DriveRole, DriveSpec, EffectiveResources, VmProcess, VmRecord, VmResources, VmSpec, VmState } from './core/types';
export { RuncDriver } from './drivers/runc';
export { buildOciSpec } from './drivers/oci-spec';
export { createDriver } from './drivers/select';
export { FirecrackerDriver } from './drivers/firecracker';
export { FirecrackerApi, bootRequests } from './drivers/firecracker-api';
export { DriverBinaries } from './store/driver-binaries';
export { acquireStateLock, StateLockHeldError } from './state-lock';
export { createVmService } from './rpc/vm-service';
export { SqliteVmStore } from './store/sqlite-vm-store';
