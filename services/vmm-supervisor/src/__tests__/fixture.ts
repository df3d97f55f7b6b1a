/**
 * Integration-test fixture: a busybox template rootfs, ext4 loop devices, and the real
 * vmm-supervisor daemon on a unix socket in a temp dir. Everything it creates is tracked and
 * removed by cleanup() (containers under its own runc root, mounts under its temp dir, its loop
 * devices, its daemon processes) and nothing else is touched.
 */
import { execFileSync } from 'node:child_process';
import { chmodSync, existsSync, mkdirSync, rmSync, symlinkSync, writeFileSync, copyFileSync } from 'node:fs';
import path from 'node:path';
import { createSandnodeChannel, createServiceClient } from '@sandnode/shared';
import type { ServiceClient } from '@sandnode/shared';
import { VmServiceDefinition } from '@sandnode/shared/proto/vmm/v1/vmm';
import { built, makeTempDir, PARTS, startDaemon, type Part, type RunningDaemon } from '@sandnode/testkit';
import { mountsUnder } from '../drivers/mounts';

/** The built daemon the integration tests start. */
export const MAIN_JS = path.resolve(__dirname, '..', '..', 'dist', 'main.js');

/** What the runc integration suites need (describeWith skips naming the missing ones, or fails under CI=true). */
export const VMM_PARTS: Part[] = [PARTS.root, PARTS.runc, PARTS.busybox, PARTS.loop, PARTS.e2fsprogs, built('@sandnode/vmm-supervisor')];

/** What the freeze suites need on top: util-linux fsfreeze. */
export const FREEZE_PARTS: Part[] = [...VMM_PARTS, PARTS.fsfreeze];

/**
 * The init of the test template: writes a marker and what its fd 3 is (podd's listening
 * socket, handed in by the supervisor) into /run/sandnode, exits 0 on SIGTERM.
 */
export const TEST_INIT = `#!/bin/busybox sh
trap 'exit 0' TERM
echo "started $SANDNODE_SANDBOX_ID" > /run/sandnode/init-marker
echo "fd=$SANDNODE_PODD_LISTEN_FD $(ls -l /proc/self/fd/3)" > /run/sandnode/fd3
while true; do sleep 1 & wait $!; done
`;

/** Daemon is one running vmm-supervisor process (testkit's daemon fixture). */
export type Daemon = RunningDaemon;

/** Fixture owns a temp dir with everything a test run creates. */
export class Fixture {
  readonly dir = makeTempDir('vmmsup-it');
  readonly stateDir = path.join(this.dir, 'state');
  readonly runDir = path.join(this.dir, 'run');
  readonly runcRoot = path.join(this.runDir, 'runc');
  readonly socket = path.join(this.runDir, 'vmm-supervisor.sock');
  readonly address = `unix://${this.socket}`;
  readonly rootfs = path.join(this.dir, 'template-rootfs');
  readonly logFile = path.join(this.dir, 'daemon.log');
  private readonly loops: string[] = [];
  private readonly daemons: Daemon[] = [];

  /** buildRootfs writes a busybox rootfs with /sbin/sandnode-init. */
  buildRootfs(): string {
    const r = this.rootfs;
    for (const d of ['bin', 'sbin', 'usr/bin', 'usr/sbin', 'proc', 'sys', 'dev', 'tmp', 'run/sandnode', 'etc', 'root', 'workspace']) {
      mkdirSync(path.join(r, d), { recursive: true });
    }
    copyFileSync('/bin/busybox', path.join(r, 'bin/busybox'));
    chmodSync(path.join(r, 'bin/busybox'), 0o755);
    const applets = execFileSync('/bin/busybox', ['--list']).toString().split('\n').filter(Boolean);
    for (const a of applets) {
      if (a === 'busybox') continue;
      symlinkSync('busybox', path.join(r, 'bin', a));
    }
    writeFileSync(path.join(r, 'sbin/sandnode-init'), TEST_INIT, { mode: 0o755 });
    return r;
  }

  /** makeExt4Loop makes a sparse ext4 image of sizeMib and attaches it; returns /dev/loopN. */
  makeExt4Loop(name: string, sizeMib = 64): string {
    const img = path.join(this.dir, `${name}.img`);
    execFileSync('truncate', ['-s', `${sizeMib}M`, img]);
    execFileSync('mkfs.ext4', ['-q', '-F', img]);
    const dev = execFileSync('losetup', ['--find', '--show', img]).toString().trim();
    this.loops.push(dev);
    return dev;
  }

  /** env is the environment a daemon of this fixture runs with (plus extra). */
  env(extra: Record<string, string> = {}): NodeJS.ProcessEnv {
    return {
      ...process.env,
      SANDNODE_VMM_SUPERVISOR_STATE_DIR: this.stateDir,
      SANDNODE_VMM_SUPERVISOR_RUN_DIR: this.runDir,
      SANDNODE_VMM_SUPERVISOR_LOG_LEVEL: 'debug',
      SANDNODE_VMM_SUPERVISOR_STOP_TIMEOUT_MS: '1000',
      // off unless a suite asks (network.it.test.ts with its own tag and pool): no suite leaves a table or veths behind
      SANDNODE_VMM_SUPERVISOR_NETWORK: 'false',
      ...extra,
    };
  }

  /** start runs the daemon (log appended to logFile) and waits until it answers GetVersion. */
  async start(env: Record<string, string> = {}): Promise<Daemon> {
    const d = await startDaemon({ main: MAIN_JS, env: this.env(env), socket: this.socket, logFile: this.logFile });
    this.daemons.push(d);
    return d;
  }

  /** client returns a VmService client of this fixture's daemon; with epoch, every call carries it. */
  client(epoch?: number): ServiceClient<typeof VmServiceDefinition> {
    return createServiceClient(VmServiceDefinition, createSandnodeChannel(this.address), {
      timeoutMs: 30_000,
      retryAttempts: 1,
      ...(epoch === undefined ? {} : { epoch: () => epoch }),
    });
  }

  /** runc runs `runc --root <fixture root> args` and returns stdout. */
  runc(args: string[]): string {
    return execFileSync('runc', ['--root', this.runcRoot, ...args], { stdio: ['ignore', 'pipe', 'pipe'] }).toString();
  }

  /** cleanup removes everything this fixture created; best effort, never throws. */
  async cleanup(): Promise<void> {
    for (const d of this.daemons) await d.kill();
    const tryRun = (cmd: string, args: string[]) => {
      try {
        execFileSync(cmd, args, { stdio: 'ignore' });
      } catch {
        /* best effort */
      }
    };
    // A test that failed mid-freeze must not leave a frozen filesystem (or tasks blocked on it).
    for (const m of mountsUnder(this.dir)) tryRun('fsfreeze', ['-u', m]);
    if (existsSync(this.runcRoot)) {
      let ids: string[] = [];
      try {
        const listed = JSON.parse(this.runc(['list', '--format', 'json'])) as { id: string }[] | null;
        ids = (listed ?? []).map((c) => c.id);
      } catch {
        /* no containers */
      }
      for (const id of ids) {
        tryRun('runc', ['--root', this.runcRoot, 'kill', '--all', id, 'KILL']);
        tryRun('runc', ['--root', this.runcRoot, 'resume', id]);
        tryRun('runc', ['--root', this.runcRoot, 'delete', '--force', id]);
      }
    }
    // Deepest mounts first; only mounts under this fixture's dir.
    for (const m of mountsUnder(this.dir).sort((a, b) => b.length - a.length)) tryRun('umount', ['-l', m]);
    for (const dev of this.loops) tryRun('losetup', ['-d', dev]);
    if (mountsUnder(this.dir).length === 0) rmSync(this.dir, { recursive: true, force: true });
  }
}
