#!/usr/bin/env node
/**
 * podd: the guest agent inside a sandbox. Serves sandnode.podd.v1.PoddService (plus version,
 * health and reflection) on a unix socket. Logs JSON to stderr only.
 *
 * Usage: podd [--config FILE] [--socket PATH | --listen-fd N] [--log-level LEVEL]
 *
 * Shutdown (SIGTERM/SIGINT): running commands' process groups get SIGTERM at once, then the
 * shared order runs (health NOT_SERVING, drain calls, close); groups still alive get SIGKILL.
 */
import { existsSync, mkdirSync } from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { buildCommit, createLogger, logConfigNotes, type ConfigNote, createServiceServer, runDaemon, SUITE_VERSION, unixAddress } from '@sandnode/shared';
import { PoddServiceDefinition } from '@sandnode/shared/proto/podd/v1/podd';
import { loadPoddConfig } from './config';
import { parseFlags, USAGE } from './flags';
import { poddFailpoints } from './core/failpoints';
import { ExecRunner } from './core/exec';
import { ExecSessions } from './core/exec-session';
import { ptyAvailable } from './core/pty';
import { PortForwarder } from './core/forward';
import { PODD_COMPONENT, poddFeatures } from './features';
import { Quiescer } from './core/quiesce';
import { createFreezePortClient } from './rpc/freeze-port-client';
import { poddService } from './rpc/podd-service';
import { bulkProtocol } from './core/file-bulk';

/** Exit code of a usage or config error. */
const EXIT_USAGE = 2;

async function main(): Promise<void> {
  const startedAtMs = Date.now();
  let cfg;
  const failpoints = poddFailpoints();
  const notes: ConfigNote[] = [];
  try {
    const flags = parseFlags(process.argv.slice(2));
    if (flags.help) {
      process.stderr.write(`${USAGE}\n`);
      return;
    }
    cfg = loadPoddConfig({ notes, file: flags.config, overrides: { socket: flags.socket, listenFd: flags.listenFd, logLevel: flags.logLevel } });
    failpoints.set();
  } catch (err) {
    process.stderr.write(`podd: ${(err as Error).message}\n${USAGE}\n`);
    process.exit(EXIT_USAGE);
  }
  const log = createLogger(PODD_COMPONENT, SUITE_VERSION, cfg.logLevel);
  logConfigNotes(log, notes);
  if (failpoints.list().length) log.warn({ failpoints: failpoints.list() }, 'failpoints are active (tests only)');
  const runner = new ExecRunner({ defaultCwd: cfg.defaultCwd, maxChunkBytes: cfg.maxChunkBytes, maxRunning: cfg.maxExecs });
  const sessions = new ExecSessions({ runner, defaultCwd: cfg.defaultCwd, maxChunkBytes: cfg.maxChunkBytes });

  // The freeze port is bound by the host before the VM starts; no port -> no podd.quiesce.
  const hasFreezePort = existsSync(cfg.freezeSocket);
  const quiescer = new Quiescer({ port: createFreezePortClient(cfg.freezeSocket, cfg.freezePortTimeoutMs), failpoints, syncTimeoutMs: cfg.syncTimeoutMs, log });
  const server = createServiceServer({
    info: { component: PODD_COMPONENT, version: SUITE_VERSION, commit: buildCommit(), features: poddFeatures(hasFreezePort, ptyAvailable(), cfg.listenFd >= 0) },
    log,
  });
  server.add(PoddServiceDefinition, poddService({ runner, sessions, startedAtMs, quiescer, forwarder: new PortForwarder() }));

  // Registered before runDaemon's handler, so commands get SIGTERM before the drain starts.
  const termChildren = () => {
    const n = runner.signalAll('SIGTERM') + sessions.signalAll('SIGTERM');
    if (n > 0) log.info({ groups: n }, 'sent SIGTERM to running commands');
  };
  process.on('SIGTERM', termChildren);
  process.on('SIGINT', termChildren);
  runDaemon({
    server,
    log,
    drainMs: cfg.drainMs,
    onStop: () => {
      const n = runner.signalAll('SIGKILL') + sessions.signalAll('SIGKILL');
      if (n > 0) log.warn({ groups: n }, 'sent SIGKILL to commands that outlived the drain');
    },
  });

  if (cfg.listenFd >= 0) {
    // The host bound this socket outside the sandbox; serve the connections it accepts.
    const listener = net.createServer();
    await new Promise<void>((resolve, reject) => {
      listener.once('error', reject);
      listener.listen({ fd: cfg.listenFd }, () => resolve());
    });
    // a connection that begins with the bulk magic is one raw transfer (core/file-bulk.ts)
    server.serveListener(listener, undefined, bulkProtocol(log));
    log.info({ fd: cfg.listenFd, commit: buildCommit(), freeze_port: hasFreezePort }, 'podd serving on the inherited socket');
  } else {
    mkdirSync(path.dirname(cfg.socket), { recursive: true });
    await server.listen([unixAddress(cfg.socket)]);
    log.info({ socket: cfg.socket, commit: buildCommit() }, 'podd listening');
  }
}

main().catch((err: unknown) => {
  process.stderr.write(`podd: fatal: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}\n`);
  process.exit(1);
});
