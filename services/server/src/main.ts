#!/usr/bin/env node
/**
 * sandnode-server: the sandbox lifecycle API of a node. This file is the wiring: config,
 * construction, shutdown order.
 *
 * Start: command line (`--config FILE`; anything else is a usage error, exit 2) -> config
 * (loadServerConfig: a bad key is exit 2 naming it) -> failpoints (env
 * SANDNODE_SERVER_FAILPOINTS: an unknown name is exit 2 naming it) -> logger -> ServerNode with
 * the wiring below -> AdminService on the admin socket -> either `start` (take the lease if
 * free: ACTIVE, else STANDBY that takes over if the active dies) or, with `takeover` set (what
 * `sandnode upgrade server` does), the handover from the active server (exit 3 when it fails;
 * the old server stays active). A server whose slot another live server holds exits 4
 * (EXIT_SLOT_BUSY) before it binds anything (handover/slot-lock.ts).
 *
 * What an active server runs, built at each activation (wiring.activate): the vmm-supervisor
 * and ublk-manager peers (deadline peerCallTimeoutMs, peerRetryAttempts retries, the node's
 * epoch on every call), the template catalog, the SandboxManager, and the public
 * SandboxService + TemplateService. The podd peers live across activations.
 *
 * Shutdown (SIGTERM/SIGINT; a second signal exits at once): ServerNode.stop = drain the node
 * when drainOnSigterm is set -> public server GOAWAY, calls get drainMs -> admin server ->
 * peers, records, lease, admin socket path; then exit 0. Sandboxes are never touched by a
 * server stop. A stop that outlives drainDeadlineMs + drainMs + 5 s exits 1.
 */
import {
  prepareTrustedDirs,
  ConfigError,
  createLogger,
  logConfigNotes,
  type ConfigNote,
  gateWritesWhileBusy,
  loadConfig,
  parseDaemonArgs,
  UsageError,
  SUITE_VERSION,
  type Logger,
} from '@sandnode/shared';
import { SandboxServiceDefinition } from '@sandnode/shared/proto/server/v1/sandbox';
import { TemplateServiceDefinition } from '@sandnode/shared/proto/server/v1/template';
import { configSchema, loadServerConfig, SERVICE, type ServerConfig } from './config';
import { checkApiAccess } from './handover/api-access';
import { loadAccessTokenKey } from './core/network';
import { MapNetworkDirectory } from './core/network-directory';
import type { IdleController } from './core/idle';
import { SandboxManager } from './core/sandbox-manager';
import { setPoolMetricsSource } from './core/pool-metrics';
import { ingressLimitsFromConfig, NetworkServices, parseDnsUpstreams } from './network';
import { LocalTemplateCatalog } from './core/template-catalog';
import { setServerFailpoints } from './handover/failpoints';
import { ServerNode, type NodeWiring } from './handover/server-node';
import { writeSettingsFile } from './handover/settings-file';
import { SlotBusyError } from './handover/slot-lock';
import { DEFAULT_HOLD_MS } from './handover/takeover';
import { DevicePeer } from './peers/device-peer';
import { PoddPeers } from './peers/podd-peer';
import { BulkChannel } from './rpc/bulk-transfer';
import { VmPeer } from './peers/vm-peer';
import { adminService } from './rpc/admin-service';
import { sandboxService } from './rpc/sandbox-service';
import { templateService } from './rpc/template-service';

/** Exit code of a bad command line, config or failpoint list. */
export const EXIT_USAGE = 2;
/** Exit code of a failed takeover (the old server stays active). */
export const EXIT_TAKEOVER_FAILED = 3;
/**
 * Exit code of a server whose slot (SANDNODE_SERVER_SLOT) another live server holds (two
 * standbys of one slot, e.g. two `sandnode upgrade server` at once): it exits before it binds
 * anything, the other one goes on. node-stack's upgrade.ts knows this code.
 */
export const EXIT_SLOT_BUSY = 4;
/** Margin of the stop watchdog over drainDeadlineMs + drainMs, ms. */
const STOP_MARGIN_MS = 5000;

const USAGE = 'usage: sandnode-server [--config FILE]';

/** A bad command line; the message names the argument. */
export { UsageError };

/** parseArgs accepts `--config FILE`, `--config=FILE` and `--help`; throws UsageError naming anything else. */
export function parseArgs(argv: string[]): { config?: string; help: boolean } {
  const { config, help } = parseDaemonArgs(argv, USAGE);
  return { config, help };
}

/**
 * SANDBOX_WRITES: the SandboxService methods that write records.db. Each waits (asynchronously,
 * inside its deadline) while another process holds the DB locked, then answers UNAVAILABLE with
 * retry-after-ms without running (gateWritesWhileBusy); the other methods never wait for the lock.
 */
export const SANDBOX_WRITES = ['createSandbox', 'pauseSandbox', 'resumeSandbox', 'deleteSandbox', 'setTimeout', 'forkSandbox', 'resetRootfs', 'updateSandboxNetwork', 'keepAlive'] as const;

/**
 * wiring builds what an active server runs (see the file header). settings (the config as
 * loaded, before derived defaults) are written to the run dir's settings file whenever this
 * server becomes active (handover/settings-file.ts); without them nothing is written.
 */
export function wiring(
  cfg: ServerConfig,
  rootLog: Logger,
  settings?: Record<string, unknown>,
  net?: (directory: MapNetworkDirectory, vms: () => VmPeer | undefined, idle: () => IdleController | undefined) => NetworkServices,
): NodeWiring {
  const podd = new PoddPeers({ timeoutMs: cfg.poddCallTimeoutMs, retryAttempts: cfg.poddRetryAttempts, log: rootLog.child({ peer: 'podd' }) });
  const bulk = new BulkChannel(rootLog.child({ api: 'bulk' }));
  // one directory per process: the network services keep it across activations
  const directory = new MapNetworkDirectory();
  const ingress = { listen: cfg.ingressListen, domain: cfg.ingressDomain };
  let vmsOfActive: VmPeer | undefined;
  let idleOfActive: IdleController | undefined;
  const services = net?.(
    directory,
    () => vmsOfActive,
    () => idleOfActive,
  );
  return {
    podd,
    bulk,
    // the ingress, egress proxy and resolver listen on named listeners a handover passes on
    named: services && { wanted: () => services.wanted(), serve: (spec) => services.serve(spec), late: () => services.late() },
    onActive() {
      if (!settings) return;
      try {
        writeSettingsFile(cfg.runDir, settings);
      } catch (err) {
        rootLog.error({ err }, 'could not write the settings file: an upgrade would start the standby from its caller environment');
      }
    },
    activate({ store, epoch, log, streams }) {
      const peer = { epoch, timeoutMs: cfg.peerCallTimeoutMs, retryAttempts: cfg.peerRetryAttempts, connectWaitMs: cfg.peerConnectWaitMs };
      const vms = new VmPeer(cfg.vmmAddress, { ...peer, log: log.child({ peer: 'vmm-supervisor' }) });
      const devices = new DevicePeer(cfg.ublkAddress, { ...peer, log: log.child({ peer: 'ublk-manager' }) });
      const templates = new LocalTemplateCatalog({ templatesDir: cfg.templatesDir, poddBundlePath: cfg.poddBundle, poddVersion: cfg.poddVersion, nodePath: cfg.templateNode, store });
      vmsOfActive = vms;
      const manager = new SandboxManager({
        directory,
        accessTokenKey: loadAccessTokenKey(cfg.stateDir),
        store,
        vms,
        devices,
        podd,
        templates,
        log,
        runDir: cfg.runDir,
        resourceDefaults: { vcpus: cfg.defaultVcpus, memoryMib: cfg.defaultMemoryMib, diskBytes: cfg.defaultDiskBytes },
        upperBytes: cfg.upperBytes,
        poddReadyTimeoutMs: cfg.poddReadyTimeoutMs,
        maxExecStreamsPerSandbox: cfg.maxExecStreamsPerSandbox,
        autoResumeTimeoutMs: cfg.autoResumeTimeoutMs,
        idleActivityFlushMs: cfg.idleActivityFlushMs,
        pool: { configs: store.pools(), fillConcurrency: cfg.poolFillConcurrency, healthIntervalMs: cfg.poolHealthIntervalMs },
      });
      idleOfActive = manager.idle;
      bulk.manager = manager;
      manager.gate.holdMs = DEFAULT_HOLD_MS;
      templates.inUse = (name) => manager.templateInUse(name);
      templates.retire = (name) => manager.retireTemplate(name);
      setPoolMetricsSource(manager.pool ? () => manager.pool!.status() : undefined);
      const resourceDefaults = { vcpus: cfg.defaultVcpus, memoryMib: cfg.defaultMemoryMib, diskBytes: cfg.defaultDiskBytes };
      return {
        manager,
        vms,
        devices,
        poolAdmin: manager.pool ? { pool: manager.pool, configs: store.pools(), templates, resourceDefaults, now: Date.now } : undefined,
        register(server) {
          server.add(SandboxServiceDefinition, gateWritesWhileBusy(sandboxService(manager, streams, ingress, podd, bulk), SANDBOX_WRITES, store, { what: 'records.db' }));
          server.add(TemplateServiceDefinition, templateService(templates));
        },
      };
    },
  };
}

/**
 * nodeSettings: what a standby of this node starts from (the settings file): the keys given
 * (file + env) that differ from the defaults, and the dirs, absolute. Keys left at their
 * default are not written, so an older build (a downgrade) is not handed keys it does not know.
 */
export function nodeSettings(given: Record<string, unknown>, cfg: ServerConfig): Record<string, unknown> {
  const defaults = configSchema.parse({}) as Record<string, unknown>;
  const out: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(given)) if (JSON.stringify(v) !== JSON.stringify(defaults[k])) out[k] = v;
  return { ...out, stateDir: cfg.stateDir, runDir: cfg.runDir };
}

/** usage prints msg and exits EXIT_USAGE. */
function usage(msg: string): never {
  process.stderr.write(`sandnode-server: ${msg}\n`);
  process.exit(EXIT_USAGE);
}

async function main(argv: string[]): Promise<void> {
  let cfg: ServerConfig;
  let failpoints: string[];
  let settings: Record<string, unknown>;
  const notes: ConfigNote[] = [];
  try {
    const args = parseArgs(argv);
    if (args.help) {
      process.stdout.write(`${USAGE}\nconfig keys: see services/server/README.md\n`);
      return;
    }
    cfg = loadServerConfig({ file: args.config, notes });
    checkApiAccess(cfg);
    // nothing goes into the dirs before they are known to be root's alone (trusted-dir.ts)
    prepareTrustedDirs(cfg);
    settings = nodeSettings(loadConfig(configSchema, { service: SERVICE, file: args.config }), cfg);
    failpoints = setServerFailpoints();
  } catch (err) {
    if (err instanceof UsageError || err instanceof ConfigError) usage(err.message);
    throw err;
  }
  const log = createLogger(SERVICE, SUITE_VERSION, cfg.logLevel).child({ slot: cfg.slot || undefined });
  logConfigNotes(log, notes);
  if (failpoints.length > 0) log.warn({ failpoints }, 'failpoints set');
  let net: NetworkServices | undefined;
  const node = new ServerNode(
    cfg,
    log,
    wiring(cfg, log, settings, (directory, vms, idle) => {
      net = new NetworkServices({
        directory,
        ingress: { listen: cfg.ingressListen, domain: cfg.ingressDomain, limits: ingressLimitsFromConfig(cfg), engine: cfg.ingressEngine },
        dnsUpstreams: cfg.dnsUpstreams ? parseDnsUpstreams(cfg.dnsUpstreams.split(',').map((e) => e.trim())) : undefined,
        networkStatus: async () => {
          const v = vms();
          if (!v) throw new Error('no vmm-supervisor peer: the server is not active');
          return v.networkStatus();
        },
        logger: log,
        // ingress requests are activity and auto-resume a paused or hibernated sandbox (core/idle.ts)
        idle: {
          activity: (id) => idle()?.activity(id),
          wake: (id) => idle()?.wakeForIngress(id) ?? Promise.resolve({ ok: false, status: 503, reason: 'the server is not active', retryAfterS: 1 }),
        },
      });
      return net;
    }),
  );
  let stopping = false;
  const onSignal = (sig: NodeJS.Signals) => {
    if (stopping) process.exit(1);
    stopping = true;
    log.info({ sig }, 'signal received: stopping');
    // never hang on the way out: drain deadline + call drain + a margin
    setTimeout(
      () => {
        log.error('stop took too long: exiting');
        process.exit(1);
      },
      (cfg.drainOnSigterm ? cfg.drainDeadlineMs : 0) + cfg.drainMs + STOP_MARGIN_MS,
    ).unref();
    node
      .stop()
      .then(() => net?.close())
      .then(
        () => process.exit(0),
        (err: unknown) => {
          log.error({ err }, 'stop failed');
          process.exit(1);
        },
      );
  };
  process.on('SIGTERM', onSignal);
  process.on('SIGINT', onSignal);
  try {
    await node.startAdmin(adminService(node));
  } catch (err) {
    if (!(err instanceof SlotBusyError)) throw err;
    log.error({ slot: err.slot, holder_pid: err.holderPid }, err.message);
    if (cfg.takeover) process.stdout.write(`${JSON.stringify({ takeover: false, pid: process.pid, slotBusy: true, holderPid: err.holderPid, error: err.message })}\n`);
    process.exit(EXIT_SLOT_BUSY);
  }
  if (!cfg.takeover) return node.start();
  try {
    await node.takeover();
  } catch (err) {
    log.error({ err }, 'takeover failed; the old server stays active');
    process.stdout.write(`${JSON.stringify({ takeover: false, pid: process.pid, error: (err as Error).message })}\n`);
    process.exit(EXIT_TAKEOVER_FAILED);
  }
}

if (require.main === module) {
  main(process.argv.slice(2)).catch((err: unknown) => {
    process.stderr.write(`sandnode-server: ${(err as Error).stack ?? String(err)}\n`);
    process.exit(1);
  });
}
