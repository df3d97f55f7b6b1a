/**
 * @sandnode/node-stack: the local stack of one node as its operator drives it: start, find,
 * stop and purge the daemons; find the active server; upgrade the server and the ublk-manager
 * by handover; the server API client the CLI, the bench and the tests share.
 */
export { connectServer, type ServerApi } from './api';
export {
  COMPONENTS,
  DEFAULT_VERSION_TIMEOUT_MS,
  componentAddress,
  findRunning,
  getVersion,
  logFile,
  mainScript,
  networkEnv,
  NODE_MARKER,
  nodeFor,
  pidFile,
  versionAt,
  writePidFile,
  type Component,
  type NodeNetworkSettings,
  type RunningComponent,
  type StackDirs,
} from './components';
export { spawnDaemon, stopProcess, tail, waitForDaemon, type DaemonSpec, type SpawnedDaemon, type StopProcessOptions, type WaitForDaemonOptions } from './daemon-process';
export { ACTIVE_POLL_MS, DEFAULT_ACTIVE_WAIT_MS, DEFAULT_LEASE_STATUS_TIMEOUT_MS, adminSockets, findActiveServer, listServers, serverStatus, waitForActiveServer, type ServerStatus } from './lease';
export { NODE_LOCK_POLL_MS, nodeLockFile, withNodeLock } from './node-lock';
export { loopDevicesBelow, mountsBelow, purgeNode, sandnodeProcesses, type PurgeReport } from './purge';
export { missingComponents, startWhatResumeNeeds } from './resume-needs';
export { idleJson, isolationText, sandboxJson, stateName, type SandboxIdleJson, type SandboxJson } from './sandbox-json';
export {
  checkStackDirs,
  DEFAULT_START_TIMEOUT_MS,
  DEFAULT_STOP_TIMEOUT_MS,
  killComponent,
  prepareStackDirs,
  startComponent,
  startStack,
  stopComponent,
  type StackOps,
  type StartedComponent,
  type StartOptions,
} from './stack';
export { percentile } from './stats';
export { table } from './table';
export { METRICS_LISTEN_ENV, metricsOf, metricsText, type ComponentMetrics } from './metrics-urls';
export { activeUblkSlot, pointUblkAddress, setActiveUblkSlot, ublkSlotSocket, type UblkSlot } from './ublk-slot';
export { DEFAULT_STANDBY_PROBE_TIMEOUT_MS, DEFAULT_UPGRADE_TIMEOUT_MS, findStandbys, poolPart, upgradeServer, upgradeServerViaStandby, type StandbyServer } from './upgrade';
export { GIVE_UP_STOP_TIMEOUT_MS, upgradeUblkManager, type UblkUpgradeResult } from './upgrade-ublk';
export { buildServerFeatures, previewServerUpgrade, type UpgradePreview } from './upgrade-dry-run';
export {
  buildNodeImage,
  IMAGE_TOOLS,
  imagePaths,
  lackingCapabilities,
  makeMergedUsrRoot,
  nodeImageTag,
  privilegedRunArgs,
  RUNTIME_WORKSPACES,
  runtimeModules,
  stageImageRoot,
  type ImageModules,
  type NodeImageOptions,
  type NodeImageResult,
  type StagedRoot,
} from './image';
export { isNodeSetting, nodeSettings, nodeSettingsFile, NODE_SETTINGS_FILE, readNodeSettings, recordedNote, settingsOf, writeNodeSettings, type NodeSettings } from './node-settings';
