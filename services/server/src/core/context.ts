/**
 * CoreContext: what the parts of the sandbox lifecycle (sandbox-manager.ts and the files it
 * delegates to: fork.ts, parent-hold.ts, reset-rootfs.ts, reaper.ts, guest-io.ts) share. The
 * SandboxManager builds one and hands it to each; nothing outside core/ sees it. The boot and
 * teardown steps they share are in provision.ts.
 */
import type { KeyedMutex, Logger } from '@sandnode/shared';
import type { LifecycleGate } from './gate';
import type { AccessTokens } from './network';
import type { MapNetworkDirectory } from './network-directory';
import type { ExecStreams } from './guest-io';
import type { RequestTracker } from './request-tracker';
import type { Operation } from './transitions';
import type { DevicePort, PoddConnector, RecordStore, SandboxRecord, VmPort } from './types';

/** The parts of a record a new one copies from a template or a fork's parent. */
export type RecordOrigin = Pick<SandboxRecord, 'template' | 'templatePoddVersion' | 'templateRootfs' | 'resources' | 'rootfsGeneration' | 'forkedFrom' | 'idle' | 'env'>;

export interface CoreContext {
  readonly store: RecordStore;
  /** the vmm-supervisor, its host errors mapped (peer-errors.ts) */
  readonly vms: VmPort;
  /** the ublk-manager, its host errors mapped (peer-errors.ts) */
  readonly devices: DevicePort;
  readonly podd: PoddConnector;
  readonly log: Logger;
  readonly runDir: string;
  /** size of a new rootfs upper device, bytes */
  readonly upperBytes: number;
  /** time podd gets to answer after a VM starts, ms */
  readonly poddReadyTimeoutMs: number;
  /** Exec streams running per sandbox (guest-io.ts) */
  readonly execStreams: ExecStreams;
  /** per-sandbox lock: operations on one sandbox are serialized */
  readonly locks: KeyedMutex;
  /** the handover gate every lifecycle operation enters */
  readonly gate: LifecycleGate;
  /** creates and forks in flight by request_id */
  readonly requests: RequestTracker;
  /** the proxies' view of the networked sandboxes; touch keeps it in step, teardown removes */
  readonly directory: MapNetworkDirectory;
  /** ingress access tokens (network.ts) */
  readonly tokens: AccessTokens;
  /**
   * sandboxes whose last UpdateVmNetwork ended without a definite answer (the supervisor died or
   * timed out mid-call): the reaper applies their record's policy again until one succeeds
   * (network-update.ts reapplyPolicies)
   */
  readonly unsurePolicies: Set<string>;
  /** now in epoch ms (a test clock in unit tests) */
  now(): number;
  /** syncHost flushes the host's dirty pages to the devices (sync(2)); its errors are raw (parent-hold.ts maps them) */
  syncHost(): Promise<void>;
  /** get returns the record. INVALID_ARGUMENT (malformed id), NOT_FOUND. */
  get(id: string): SandboxRecord;
  /** requireState returns the record if it is in a state op accepts; else FAILED_PRECONDITION. */
  requireState(id: string, op: Operation): SandboxRecord;
  /** touch stamps updatedAtMs and persists (durable on return), then updates the directory. */
  touch(rec: SandboxRecord): void;
  /** gated runs fn through the handover gate (signal: stop waiting to enter) and the sandbox's lock. */
  gated<T>(id: string, fn: () => Promise<T>, signal?: AbortSignal): Promise<T>;
}
