/**
 * Integration: the freeze port of a real runc VM (FreezePortService on
 * <runDir>/vms/<id>/freeze-port/freeze.sock, served by the real daemon) freezing real ext4 loop
 * filesystems, and VmSpec.machine_id. Writers on the host block while the filesystems are
 * frozen; their exit time is when the thaw happened. Needs root, runc, busybox, e2fsprogs,
 * fsfreeze and /dev/loop-control (FREEZE_PARTS: skips naming what is missing, fails under
 * CI=true). Build first: `npx tsc -b services/vmm-supervisor/tsconfig.build.json`.
 */
import { existsSync, readdirSync, mkdirSync, readFileSync, statSync } from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { Status } from 'nice-grpc-common';
import { createSandnodeChannel, createServiceClient } from '@sandnode/shared';
import { VersionServiceDefinition } from '@sandnode/shared/proto/common/v1/version';
import { DriveRole, FreezeEndedBy, type VmSpec } from '@sandnode/shared/proto/vmm/v1/vmm';
import { describeWith, expectCode, waitFor } from '@sandnode/testkit';
import { Fixture, FREEZE_PARTS } from './__tests__/fixture';
import type { Daemon } from './__tests__/fixture';
import { freezePortClient, sleep, startWriter, WINDOW_SLACK_MS } from './__tests__/freeze-helpers';
import { FREEZE_PORT_MAX_CONNECTIONS } from './rpc/freeze-port-service';
import { WATCHDOG_NICE } from './drivers/freeze-watchdog-files';

jest.setTimeout(120_000);

const MACHINE_ID = '0123456789abcdef0123456789abcdef';

describeWith('vmm-supervisor freeze port and machine_id (integration)', FREEZE_PARTS, () => {
  let fx: Fixture;
  let daemon: Daemon;
  let spec: VmSpec;
  let vmDir: string;
  let port: ReturnType<typeof freezePortClient>;
  const windows: Record<string, number> = {};

  beforeAll(async () => {
    fx = new Fixture();
    fx.buildRootfs();
    const upper = fx.makeExt4Loop('upper-f');
    const ws = fx.makeExt4Loop('ws-f');
    const podd = path.join(fx.runDir, 'sandboxes', 'vm-f');
    mkdirSync(podd, { recursive: true });
    spec = {
      templateRootfs: fx.rootfs,
      drives: [
        { driveId: 'upper', path: upper, role: DriveRole.DRIVE_ROLE_ROOTFS_UPPER, readOnly: false },
        { driveId: 'ws', path: ws, role: DriveRole.DRIVE_ROLE_WORKSPACE, readOnly: false },
      ],
      resources: { vcpus: 1, memoryMib: 128, diskBytes: 0, pids: 0 },
      poddSocketDir: podd,
      hostname: '',
      env: {},
      machineId: MACHINE_ID,
      network: undefined,
    };
    daemon = await fx.start();
    await fx.client().createVm({ vmId: 'vm-f', spec });
    vmDir = path.join(fx.runDir, 'vms', 'vm-f');
    port = freezePortClient(path.join(vmDir, 'freeze-port', 'freeze.sock'));
  });

  afterAll(async () => {
    console.log(`freeze windows measured by host writers (ms): ${JSON.stringify(windows)}`);
    await fx?.cleanup();
  });

  /**
   * armed(p) is p after VmService.ArmFreeze of vm-f, as the server arms a fork's parent: its
   * first FreezeFilesystems is let in (the rate limit and the arming rule are
   * freeze-port-abuse.it.test.ts's).
   */
  const armed = (p: typeof port) => ({
    freezeFilesystems: async (req: { maxFreezeMs: number }) => {
      await fx.client().armFreeze({ vmId: 'vm-f', windowMs: 0 });
      return p.freezeFilesystems(req);
    },
  });

  const upperFile = (n: string) => path.join(vmDir, 'upper-dev', n);
  const wsFile = (n: string) => path.join(vmDir, 'workspace', n);

  test('GetVersion lists vmm.freeze-port.v1 and vmm.machine-id.v1', async () => {
    const v = await createServiceClient(VersionServiceDefinition, createSandnodeChannel(fx.address)).getVersion({});
    expect(v.features).toEqual(expect.arrayContaining(['vmm.freeze-port.v1', 'vmm.machine-id.v1']));
  });

  test('machine_id becomes /etc/machine-id (0444) in the VM and is echoed by GetVm', async () => {
    const f = path.join(vmDir, 'upper-dev', 'upper', 'etc', 'machine-id');
    expect(readFileSync(f, 'utf8')).toBe(`${MACHINE_ID}\n`);
    expect(statSync(f).mode & 0o777).toBe(0o444);
    expect(fx.runc(['exec', 'vm-f', '/bin/cat', '/etc/machine-id'])).toBe(`${MACHINE_ID}\n`);
    const vm = (await fx.client().getVm({ vmId: 'vm-f' })).vm!;
    expect(vm.spec?.machineId).toBe(MACHINE_ID);
  });

  test('a malformed machine_id is INVALID_ARGUMENT and creates nothing', async () => {
    const err = await expectCode(fx.client().createVm({ vmId: 'vm-bad', spec: { ...spec, machineId: 'NOT-HEX' } }), Status.INVALID_ARGUMENT);
    expect(err.details).toContain('spec.machine_id');
    await expectCode(fx.client().getVm({ vmId: 'vm-bad' }), Status.NOT_FOUND);
    expect(existsSync(path.join(fx.runDir, 'vms', 'vm-bad'))).toBe(false);
  });

  test('the VM sees the socket on a read-only mount at /run/sandnode-freeze', () => {
    expect(fx.runc(['exec', 'vm-f', '/bin/ls', '/run/sandnode-freeze'])).toContain('freeze.sock');
    expect(() => fx.runc(['exec', 'vm-f', '/bin/touch', '/run/sandnode-freeze/x'])).toThrow();
  });

  test("the port holds at most FREEZE_PORT_MAX_CONNECTIONS connections: a flood from the VM cannot spend the supervisor's fds", async () => {
    const fds = () => readdirSync(`/proc/${daemon.pid}/fd`).length;
    const before = fds();
    const socks = await Promise.all(
      Array.from(
        { length: 64 },
        () =>
          new Promise<net.Socket>((resolve) => {
            const s = net.createConnection(path.join(vmDir, 'freeze-port', 'freeze.sock'), () => resolve(s));
            s.on('error', () => resolve(s));
          }),
      ),
    );
    // Time the supervisor gets to accept as much of the flood as it would (what is measured is
    // that it never holds more than the cap): a bound on something not happening, so a sleep.
    await sleep(300);
    const during = fds();
    for (const s of socks) s.destroy();
    expect(during - before).toBeLessThanOrEqual(FREEZE_PORT_MAX_CONNECTIONS + 2);
    // and the port serves again once the flood is gone
    const again = await waitFor('the freeze port to serve again after the flood', () => port.getFilesystemFreeze({}));
    expect(again.frozen).toBe(false);
    // the supervisor's own API never stopped working
    expect((await fx.client().getVm({ vmId: 'vm-f' })).vm?.vmId).toBe('vm-f');
  });

  test('GetVmFreeze reports the freeze as the supervisor saw it (token, times, who ended it)', async () => {
    const f = await armed(port).freezeFilesystems({ maxFreezeMs: 3000 });
    const held = await fx.client().getVmFreeze({ vmId: 'vm-f' });
    expect(held).toMatchObject({ freezeToken: f.freezeToken, frozen: true, endedAtUnixMs: 0, maxFreezeMs: 3000 });
    const t = await port.thawFilesystems({ freezeToken: f.freezeToken });
    const ended = await fx.client().getVmFreeze({ vmId: 'vm-f' });
    expect(ended).toMatchObject({ freezeToken: f.freezeToken, frozen: false, endedBy: FreezeEndedBy.FREEZE_ENDED_BY_CALLER });
    expect(ended.endedAtUnixMs - ended.frozenAtUnixMs).toBe(t.frozenMs);
    await expectCode(fx.client().getVmFreeze({ vmId: 'vm-none' }), Status.NOT_FOUND);
  });

  test('frozen: host writers block until Thaw; Thaw ends it early (CALLER) with frozen_ms', async () => {
    const f = await armed(port).freezeFilesystems({ maxFreezeMs: 5000 });
    expect(f.maxFreezeMs).toBe(5000);
    expect(f.filesystems).toEqual(['/', '/workspace']);
    expect(f.freezeToken).toMatch(/^[0-9a-f]{32}$/);
    const st = await port.getFilesystemFreeze({});
    expect(st).toMatchObject({ frozen: true, freezeToken: f.freezeToken, maxFreezeMs: 5000, endedBy: FreezeEndedBy.FREEZE_ENDED_BY_UNSPECIFIED });
    expect(st.remainingMs).toBeGreaterThan(0);
    const w1 = startWriter(upperFile('a'));
    const w2 = startWriter(wsFile('a'));
    await sleep(400); // the freeze window under test: the writers must stay blocked through it
    expect(w1.exited()).toBe(false);
    expect(w2.exited()).toBe(false);
    const t = await port.thawFilesystems({ freezeToken: f.freezeToken });
    expect(t.endedBy).toBe(FreezeEndedBy.FREEZE_ENDED_BY_CALLER);
    expect(t.frozenMs).toBeGreaterThanOrEqual(400);
    expect(t.frozenMs).toBeLessThan(5000);
    const [e1, e2] = await Promise.all([w1.done, w2.done]);
    expect(Math.max(e1, e2)).toBeLessThan(f.deadlineUnixMs); // thawed before the watchdog would have
    windows.callerThaw = Math.max(e1, e2) - (f.deadlineUnixMs - f.maxFreezeMs);
    // A repeated Thaw says how it ended.
    expect(await port.thawFilesystems({ freezeToken: f.freezeToken })).toEqual(t);
    expect(await port.getFilesystemFreeze({})).toMatchObject({ frozen: false, endedBy: FreezeEndedBy.FREEZE_ENDED_BY_CALLER, remainingMs: 0, frozenMs: t.frozenMs });
  });

  test('bad tokens: empty is INVALID_ARGUMENT; a stale token is FAILED_PRECONDITION and the later freeze stays frozen', async () => {
    const a = await armed(port).freezeFilesystems({ maxFreezeMs: 3000 });
    await port.thawFilesystems({ freezeToken: a.freezeToken });
    const b = await armed(port).freezeFilesystems({ maxFreezeMs: 3000 });
    try {
      await expectCode(port.thawFilesystems({ freezeToken: '' }), Status.INVALID_ARGUMENT);
      await expectCode(port.thawFilesystems({ freezeToken: a.freezeToken }), Status.FAILED_PRECONDITION);
      await expectCode(port.thawFilesystems({ freezeToken: 'f'.repeat(32) }), Status.FAILED_PRECONDITION);
      const w = startWriter(wsFile('b'));
      await sleep(300); // time the writer would need to finish were the later freeze not holding
      expect(w.exited()).toBe(false);
      expect(await port.getFilesystemFreeze({})).toMatchObject({ frozen: true, freezeToken: b.freezeToken });
      // One freeze at a time.
      await expectCode(armed(port).freezeFilesystems({ maxFreezeMs: 100 }), Status.FAILED_PRECONDITION);
      expect((await port.thawFilesystems({ freezeToken: b.freezeToken })).endedBy).toBe(FreezeEndedBy.FREEZE_ENDED_BY_CALLER);
      await w.done;
    } finally {
      await port.thawFilesystems({ freezeToken: b.freezeToken }).catch(() => undefined);
    }
  });

  test('max_freeze_ms is clamped: 0 -> 1500, 1 -> 100, 60000 -> 5000', async () => {
    for (const [req, want] of [
      [0, 1500],
      [1, 100],
      [60_000, 5000],
    ] as const) {
      const f = await armed(port).freezeFilesystems({ maxFreezeMs: req });
      expect(f.maxFreezeMs).toBe(want);
      const t = await port.thawFilesystems({ freezeToken: f.freezeToken });
      expect(t.endedBy).not.toBe(FreezeEndedBy.FREEZE_ENDED_BY_UNSPECIFIED);
    }
  });

  test('nobody calls Thaw: the watchdog thaws within max_freeze_ms + 100 ms', async () => {
    const f = await armed(port).freezeFilesystems({ maxFreezeMs: 400 });
    const begin = f.deadlineUnixMs - f.maxFreezeMs; // wall clock just before the watchdog and the first FIFREEZE
    const w1 = startWriter(upperFile('c'));
    const w2 = startWriter(wsFile('c'));
    const end = Math.max(await w1.done, await w2.done);
    windows.watchdog = end - begin;
    expect(end - begin).toBeLessThanOrEqual(400 + WINDOW_SLACK_MS);
    expect(end - begin).toBeGreaterThanOrEqual(400 - 20); // it held until the watchdog
    const st = await port.getFilesystemFreeze({});
    expect(st).toMatchObject({ frozen: false, freezeToken: f.freezeToken, endedBy: FreezeEndedBy.FREEZE_ENDED_BY_WATCHDOG });
    expect(st.frozenMs).toBeLessThanOrEqual(400 + WINDOW_SLACK_MS);
    expect(await port.thawFilesystems({ freezeToken: f.freezeToken })).toMatchObject({ endedBy: FreezeEndedBy.FREEZE_ENDED_BY_WATCHDOG, frozenMs: st.frozenMs });
  });

  test('the supervisor is SIGKILLed mid-freeze: the watchdog still thaws in time; the restarted supervisor serves the port again and reports WATCHDOG', async () => {
    const f = await armed(port).freezeFilesystems({ maxFreezeMs: 1000 });
    const begin = f.deadlineUnixMs - f.maxFreezeMs;
    const watchdogPid = () => (JSON.parse(readFileSync(path.join(fx.runDir, 'freeze-watchdog', 'watchdog.json'), 'utf8')) as { pid: number }).pid;
    const wd = watchdogPid();
    // it runs ahead of the node's other work (field 19 of /proc/PID/stat: nice)
    const stat = readFileSync(`/proc/${wd}/stat`, 'utf8');
    expect(Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[16])).toBe(WATCHDOG_NICE);
    await daemon.kill('SIGKILL');
    const w = startWriter(wsFile('d'));
    const end = await w.done;
    windows.supervisorKilled = end - begin;
    expect(end - begin).toBeLessThanOrEqual(1000 + WINDOW_SLACK_MS);
    daemon = await fx.start();
    const again = freezePortClient(path.join(vmDir, 'freeze-port', 'freeze.sock'));
    const st = await again.getFilesystemFreeze({});
    expect(st).toMatchObject({ frozen: false, freezeToken: f.freezeToken, endedBy: FreezeEndedBy.FREEZE_ENDED_BY_WATCHDOG });
    expect(st.frozenMs).toBeLessThanOrEqual(1000 + WINDOW_SLACK_MS);
    // The re-served port works.
    const g = await armed(again).freezeFilesystems({ maxFreezeMs: 2000 });
    expect((await again.thawFilesystems({ freezeToken: g.freezeToken })).endedBy).toBe(FreezeEndedBy.FREEZE_ENDED_BY_CALLER);
    // the restarted supervisor found the node's watchdog again: no second one was started
    expect(watchdogPid()).toBe(wd);
    port = again;
  });

  test('StopVm of a VM with an active freeze thaws first (ended by CALLER); blocked writers complete', async () => {
    const f = await armed(port).freezeFilesystems({ maxFreezeMs: 5000 });
    const w = startWriter(wsFile('stop'));
    await sleep(100); // time the writer would need to finish were the freeze not holding
    expect(w.exited()).toBe(false);
    await fx.client().stopVm({ vmId: 'vm-f', timeoutMs: 500 });
    expect(await w.done).toBeLessThan(f.deadlineUnixMs);
    expect(await port.getFilesystemFreeze({})).toMatchObject({ frozen: false, freezeToken: f.freezeToken, endedBy: FreezeEndedBy.FREEZE_ENDED_BY_CALLER });
    // A stopped VM cannot be frozen.
    await expectCode(port.freezeFilesystems({ maxFreezeMs: 100 }), Status.FAILED_PRECONDITION);
  });

  test('DeleteVm of a VM with an active freeze thaws first and removes everything', async () => {
    await fx.client().deleteVm({ vmId: 'vm-f' });
    await fx.client().createVm({ vmId: 'vm-f', spec });
    await armed(port).freezeFilesystems({ maxFreezeMs: 5000 });
    const w = startWriter(wsFile('e'));
    const t0 = Date.now();
    expect((await fx.client().deleteVm({ vmId: 'vm-f' })).existed).toBe(true);
    await w.done.catch(() => undefined); // the fs may be gone under it; it must not stay blocked
    expect(Date.now() - t0).toBeLessThan(5000);
    expect(existsSync(vmDir)).toBe(false);
  });
});
