#!/usr/bin/env node
/**
 * sandnode-server: the sandbox lifecycle API of a node.
 *
 * Start order: config -> records DB -> peers (vmm-supervisor, ublk-manager; waits for them) ->
 * adoption of every record -> serve (TCP + unix socket) -> timeout reaper.
 * Shutdown (SIGTERM): health NOT_SERVING -> stop taking calls -> drain -> close DB. Sandboxes
 * are never touched by a server stop.
 */
import { mkdirSync } from 'node:fs';
import path from 'node:path';
import { createLogger, createServiceServer, runDaemon, serveMetrics, SUITE_VERSION, buildCommit, unixAddress, ConfigError } from '@sandnode/shared';
import { SandboxServiceDefinition } from '@sandnode/shared/proto/server/v1/sandbox';
import { TemplateServiceDefinition } from '@sandnode/shared/proto/server/v1/template';
import { resolveServerConfig } from './config';
import { adoptAll } from './core/adoption';
import { SandboxManager } from './core/sandbox-manager';
import { LocalTemplateCatalog } from './core/template-catalog';
import { DevicePeer } from './peers/device-peer';
import { PoddPeers } from './peers/podd-peer';
import { VmPeer } from './peers/vm-peer';
import { sandboxService } from './rpc/sandbox-service';
import { templateService } from './rpc/template-service';
import { SqliteRecordStore } from './store/sqlite-record-store';

/** Features this server offers (GetVersion). */
export const SERVER_FEATURES = ['server.sandbox.v1', 'server.template.v1', 'server.adoption.v1'];

/** How long the server waits for vmm-supervisor and ublk-manager at start, ms. */
const PEER_WAIT_MS = 30_000;

function parseArgs(argv: string[]): { config?: string } {
  const i = argv.indexOf('--config');
  return i >= 0 ? { config: argv[i + 1] } : {};
}

async function waitFor<T>(what: string, fn: () => Promise<T>, ms: number): Promise<T> {
  const deadline = Date.now() + ms;
  for (;;) {
    try {
      return await fn();
    } catch (err) {
      if (Date.now() > deadline) throw new Error(`${what} did not answer within ${ms} ms: ${(err as Error).message}`);
      await new Promise((r) => setTimeout(r, 200));
    }
  }
}

async function main(): Promise<void> {
  let cfg;
  try {
    cfg = resolveServerConfig(parseArgs(process.argv.slice(2)).config);
  } catch (err) {
    if (err instanceof ConfigError) {
      process.stderr.write(`sandnode-server: ${err.message}\n`);
      process.exit(2);
    }
    throw err;
  }
  const log = createLogger('server', SUITE_VERSION, cfg.logLevel);
  mkdirSync(cfg.stateDir, { recursive: true });
  mkdirSync(path.join(cfg.runDir, 'sandboxes'), { recursive: true });

  const store = new SqliteRecordStore(path.join(cfg.stateDir, 'records.db'), log);
  const vms = new VmPeer(cfg.vmmAddress);
  const devices = new DevicePeer(cfg.ublkAddress);
  const podd = new PoddPeers();
  const templates = new LocalTemplateCatalog({ templatesDir: cfg.templatesDir, poddBundlePath: cfg.poddBundle, poddVersion: cfg.poddVersion, store });
  const manager = new SandboxManager({
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
  });

  const vmmVersion = await waitFor('vmm-supervisor', () => vms.features.get(), PEER_WAIT_MS);
  const ublkVersion = await waitFor('ublk-manager', () => devices.features.get(), PEER_WAIT_MS);
  log.info({ vmm: vmmVersion.version, ublk: ublkVersion.version }, 'peers answer');

  const report = await adoptAll({ store, vms, devices, podd, manager, log, concurrency: cfg.adoptConcurrency });

  const server = createServiceServer({ info: { component: 'server', version: SUITE_VERSION, commit: buildCommit(), features: SERVER_FEATURES }, log });
  server.add(SandboxServiceDefinition, sandboxService(manager));
  server.add(TemplateServiceDefinition, templateService(templates));
  const addrs = [unixAddress(cfg.socket)];
  if (cfg.listen) addrs.push(cfg.listen);
  const ports = await server.listen(addrs);
  const metrics = cfg.metricsListen ? await serveMetrics(cfg.metricsListen) : undefined;
  log.info({ socket: cfg.socket, listen: cfg.listen, port: ports[1], adopted: report.adopted.length, adoption_ms: report.durationMs }, 'serving');
  // A line on stdout that scripts and tests can wait for.
  process.stdout.write(`${JSON.stringify({ ready: true, port: ports[1] ?? 0, socket: cfg.socket, adopted: report.adopted.length, adoptionMs: report.durationMs })}\n`);

  let reaping = false;
  const reaper = setInterval(() => {
    if (reaping) return;
    reaping = true;
    (async () => {
      for (const id of manager.expired()) {
        log.info({ sandbox_id: id }, 'timeout reached: deleting sandbox');
        await manager.delete(id).catch((err: unknown) => log.error({ sandbox_id: id, err: (err as Error).message }, 'reaper delete failed'));
      }
    })().finally(() => (reaping = false));
  }, cfg.reaperIntervalMs);

  runDaemon({
    server,
    log,
    drainMs: cfg.drainMs,
    onStop: () => {
      clearInterval(reaper);
      metrics?.close();
      podd.closeAll();
      vms.close();
      devices.close();
      store.close();
    },
  });
}

main().catch((err: unknown) => {
  process.stderr.write(`sandnode-server: ${(err as Error).stack ?? String(err)}\n`);
  process.exit(1);
});
