#!/usr/bin/env node
/**
 * vmm-supervisor daemon: `sandnode-vmm-supervisor [--config FILE]`.
 *
 * Start order: config -> driver -> state-dir lock (flock; a second supervisor on the same state
 * dir exits 3 here, before it could touch the first one's socket) -> VM table (unreadable rows
 * are moved to its quarantine table and logged at warn, the rest served) -> versioned
 * driver binary -> adopt every VM in the table (no restarts) -> the network: host check, Docker's
 * DOCKER-USER accept rules, adoption and repair of the slots, the nftables table rendered from
 * the slot rows (docs/network.md; off with a reason when the check fails) -> serve VmService (+
 * VersionService, health, reflection) behind the epoch fence, and /metrics when configured. SIGTERM/SIGINT run the shared
 * shutdown order and close the table; running VMs are never touched.
 */
import { existsSync, mkdirSync } from 'node:fs';
import path from 'node:path';
import {
  buildCommit,
  createLogger,
  logConfigNotes,
  type ConfigNote,
  gateWritesWhileBusy,
  parseDaemonArgs,
  createServiceServer,
  readEpochFile,
  runDaemon,
  MetricsEndpoint,
  SUITE_VERSION,
  VMM_FEATURES,
  waitWhileBusy,
  prepareTrustedDirs,
  type EpochFence,
  resolveNodeId,
} from '@sandnode/shared';
import { VmServiceDefinition } from '@sandnode/shared/proto/vmm/v1/vmm';
import { loadVmmConfig, SERVICE } from './config';
import { vmmEpochFence } from './core/epoch';
import { failpoints } from './core/failpoints';
import { FreezeGate } from './core/freeze-gate';
import { Supervisor } from './core/supervisor';
import { createDriver } from './drivers/select';
import { createVmService } from './rpc/vm-service';
import { freezePortServer } from './rpc/freeze-port-service';
import { quarantinedRows } from './metrics';
import { acquireStateLock, StateLockHeldError } from './state-lock';
import { DriverBinaries } from './store/driver-binaries';
import { SqliteVmStore } from './store/sqlite-vm-store';
import { SECCOMP_UNCONFINED } from './drivers/seccomp';
import { closeCommands } from './drivers/command-runner';
import { makeNetworkManager } from './network/wire';

/** Exit code when another supervisor holds the state dir. */
export const EXIT_LOCKED = 3;

/** Exit code of a usage or config error (the message names the argument or key). */
export const EXIT_USAGE = 2;
/**
 * VM_WRITES: the VmService methods that write the VM table. Each waits (asynchronously, inside
 * its deadline) while another process holds the table locked, then answers UNAVAILABLE with
 * retry-after-ms without running; reads, GetVmFreeze and FenceEpoch never wait for it.
 */
export const VM_WRITES = ['createVm', 'pauseVm', 'resumeVm', 'stopVm', 'deleteVm', 'updateVmNetwork', 'releaseNetworkSlot'] as const;
/** Longest the start waits for a VM table another process holds locked, in ms. */
const VM_TABLE_OPEN_WAIT_MS = 10_000;

/** The command line. */
export const USAGE = 'usage: sandnode-vmm-supervisor [--config FILE]';

/**
 * parseArgs reads `--config FILE` (or `--config=FILE`). Throws Error naming the problem for
 * `--config` without a value (none, empty, or the next flag in its place) and for any other
 * argument; main exits {@link EXIT_USAGE} with it.
 */
export function parseArgs(argv: string[]): { configFile?: string; help: boolean } {
  const a = parseDaemonArgs(argv, USAGE);
  return { configFile: a.config, help: a.help };
}

async function main(): Promise<void> {
  const boot = createLogger(SERVICE, SUITE_VERSION);
  let cfg;
  const notes: ConfigNote[] = [];
  try {
    const args = parseArgs(process.argv.slice(2));
    if (args.help) {
      process.stdout.write(`${USAGE}\n`);
      return;
    }
    cfg = loadVmmConfig({ file: args.configFile, notes });
    failpoints.set();
  } catch (err) {
    boot.fatal({ err }, `cannot start: ${(err as Error).message}`);
    process.exit(EXIT_USAGE);
  }
  const log = createLogger(SERVICE, SUITE_VERSION, cfg.logLevel);
  logConfigNotes(log, notes);
  if (failpoints.list().length) log.warn({ failpoints: failpoints.list() }, 'failpoints are active (tests only)');
  try {
    // nothing goes into the dirs before they are known to be root's alone (trusted-dir.ts)
    prepareTrustedDirs(cfg);
  } catch (err) {
    log.fatal({ err }, `cannot start: ${(err as Error).message}`);
    process.exit(EXIT_USAGE);
  }
  // the fence is made once the state dir is locked; freezes asked before (adoption serves the
  // ports) see the persisted epoch
  const made: { fence?: EpochFence } = {};
  const supervisorDir = path.join(cfg.stateDir, SERVICE);
  const gate = new FreezeGate({
    dir: supervisorDir,
    currentEpoch: () => made.fence?.current ?? readEpochFile(path.join(supervisorDir, 'epoch')),
    rateBurst: cfg.freezeRateBurst,
    ratePerSecond: cfg.freezeRatePerSecond,
  });
  let driver;
  try {
    driver = createDriver(
      cfg,
      log,
      freezePortServer(log, gate, {
        maxConnections: cfg.freezePortMaxConnections,
        maxMessageBytes: cfg.freezePortMaxMessageBytes,
        idleMs: cfg.freezePortIdleMs,
        handshakeMs: cfg.freezePortHandshakeMs,
      }),
    );
  } catch (err) {
    log.fatal({ err }, `cannot start: ${(err as Error).message}`);
    process.exit(EXIT_USAGE);
  }
  mkdirSync(cfg.stateDir, { recursive: true, mode: 0o700 });
  try {
    // Held until the process exits; the kernel releases it even on kill -9.
    acquireStateLock(supervisorDir);
  } catch (err) {
    if (err instanceof StateLockHeldError) {
      log.fatal({ lock: err.file, holder_pid: err.holder }, `cannot start: ${err.message}`);
      process.exit(EXIT_LOCKED);
    }
    throw err;
  }
  mkdirSync(cfg.runDir, { recursive: true, mode: 0o755 });
  if (cfg.listen.startsWith('unix://')) mkdirSync(path.dirname(cfg.listen.slice('unix://'.length)), { recursive: true });
  try {
    driver.configuredBinary();
  } catch (err) {
    log.fatal({ err }, `cannot start: ${(err as Error).message}`);
    process.exit(EXIT_USAGE);
  }
  if (driver.name === 'firecracker' && !existsSync('/dev/kvm')) log.warn('/dev/kvm is missing: firecracker VMs cannot start on this host');
  if (driver.name === 'runc' && cfg.seccompProfile === SECCOMP_UNCONFINED) log.warn('seccompProfile is "unconfined": new sandboxes run without a seccomp filter');

  // another process holding the VM table locked is waited for asynchronously (never on the event loop)
  const store = await waitWhileBusy(
    () =>
      SqliteVmStore.forStateDir(cfg.stateDir, {
        onQuarantine: (q) => {
          quarantinedRows.inc();
          log.warn(
            { vm_id: q.vmId, rowid: q.rowid, reason: q.reason },
            `VM table: row ${q.vmId ? `of vm ${q.vmId}` : `rowid ${q.rowid}`} cannot be read (${q.reason}); moved to the quarantine table, not served`,
          );
        },
      }),
    { what: 'vm-table.db: open', maxWaitMs: VM_TABLE_OPEN_WAIT_MS },
  );
  // The gauge counts every row of the quarantine table (earlier starts' too).
  quarantinedRows.set(store.quarantined().length);
  if (store.quarantinedAtOpen.length) {
    const ids = store.quarantinedAtOpen.map((q) => q.vmId || `rowid ${q.rowid}`);
    log.warn({ quarantined: store.quarantinedAtOpen.length, quarantined_ids: ids }, `VM table: ${ids.length} bad row(s) quarantined at start: ${ids.join(', ')}`);
  }
  const network = makeNetworkManager(cfg, store.database, log);
  const supervisor = new Supervisor({
    network,
    store,
    driver,
    log,
    defaults: { vcpus: cfg.defaultVcpus, memoryMib: cfg.defaultMemoryMib, pids: cfg.defaultPids, stopTimeoutMs: cfg.stopTimeoutMs },
    binaries: DriverBinaries.forStateDir(cfg.stateDir),
  });
  const report = await supervisor.adopt();
  log.info(
    { ...report, quarantined: store.quarantinedAtOpen.map((q) => q.vmId || `rowid ${q.rowid}`), driver: driver.name, driver_version: await driver.version(), driver_binary: driver.currentBinary() },
    'adoption done',
  );

  const fence = vmmEpochFence(supervisorDir, cfg.stateDir);
  made.fence = fence;
  const server = createServiceServer({
    info: { component: SERVICE, version: SUITE_VERSION, commit: buildCommit(), features: supervisor.features(), nodeId: resolveNodeId(cfg.stateDir) },
    log,
    fence,
    // root only on its unix socket (peer credentials): the server is its only caller
    auth: {},
  });
  server.add(
    VmServiceDefinition,
    gateWritesWhileBusy(
      createVmService(supervisor, fence, () => store.quarantined(), driver.features.includes(VMM_FEATURES.freezePort) ? gate : undefined, {
        dnsPort: cfg.dnsPort,
        egressProxyPort: cfg.egressProxyPort,
        proxiedPorts: cfg.egressProxiedPorts,
        alwaysDenied: cfg.networkAlwaysDenied,
      }),
      VM_WRITES,
      store,
      { what: 'vm-table.db' },
    ),
  );
  // a port in use is logged, written to <runDir>/metrics/vmm-supervisor.json and retried: gRPC is served all the same
  const metrics = new MetricsEndpoint({ listen: cfg.metricsListen, component: SERVICE, runDir: cfg.runDir, log });
  await metrics.start();
  await server.listen([cfg.listen]);
  runDaemon({
    server,
    log,
    drainMs: cfg.drainMs,
    onStop: async () => {
      await metrics.close();
      await network.close();
      await driver.close?.();
      closeCommands();
      store.close();
    },
  });
  log.info({ listen: cfg.listen, state_dir: cfg.stateDir, run_dir: cfg.runDir, epoch: fence.current, metrics: metrics.url }, 'serving');
}

if (require.main === module) {
  main().catch((err: unknown) => {
    createLogger(SERVICE, SUITE_VERSION).fatal({ err }, 'vmm-supervisor failed to start');
    process.exit(1);
  });
}
