/**
 * Integration: podd's Quiesce / Thaw / GetFreezeStatus inside real runc containers, end to end.
 * The template is made by the server's template builder (busybox + node + the podd bundle +
 * /sbin/sandnode-init), so podd runs as in production: started and restarted by the init,
 * serving the fd-3 socket the supervisor bound, talking to the VM's freeze port at
 * /run/sandnode-freeze/freeze.sock. Host writers block while the VM's filesystems are frozen;
 * their exit time bounds the freeze window, measured from the supervisor's record of when the
 * freeze began. Needs root, runc, busybox-static, e2fsprogs, fsfreeze, /dev/loop-control and
 * the built daemon and podd bundle (skips naming what is missing, fails under CI=true):
 *   npx tsc -b services/vmm-supervisor/tsconfig.build.json services/podd/tsconfig.build.json
 *   npm run bundle --workspace @sandnode/podd
 */
import { existsSync, mkdirSync, readdirSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { ClientError, Status } from 'nice-grpc-common';
import { createSandnodeChannel, createServiceClient, type ServiceClient } from '@sandnode/shared';
import { VersionServiceDefinition } from '@sandnode/shared/proto/common/v1/version';
import { PoddServiceDefinition, ThawEndedBy } from '@sandnode/shared/proto/podd/v1/podd';
import { DriveRole, type VmSpec } from '@sandnode/shared/proto/vmm/v1/vmm';
import { built, describeWith, waitFor } from '@sandnode/testkit';
// Test-only reach into the server package: the template builder is the one production uses.
import { buildTemplate } from '@sandnode/template-builder';
import { Fixture, FREEZE_PARTS } from './__tests__/fixture';
import { sleep, startWriter, WINDOW_SLACK_MS } from './__tests__/freeze-helpers';
import type { FreezeRecord } from './core/freeze';

const PODD_BUNDLE = path.join(path.dirname(require.resolve('@sandnode/podd/package.json')), 'dist', 'podd.bundle.js');
jest.setTimeout(180_000);

type PoddClient = ServiceClient<typeof PoddServiceDefinition>;

function poddClient(dir: string, timeoutMs = 10_000): PoddClient {
  return createServiceClient(PoddServiceDefinition, createSandnodeChannel(`unix://${path.join(dir, 'podd.sock')}`), { timeoutMs, retryAttempts: 1 });
}

/** waitPodd waits until podd answers Health and returns its uptime. */
async function waitPodd(c: PoddClient, ms = 20_000): Promise<number> {
  return (await waitFor('podd to answer Health', () => c.health({}), ms, 100)).uptimeMs;
}

/** poddPids lists live podd processes (node ... podd-boot.js, or podd.js in an older template) whose parent is initPid. */
function poddPids(initPid: number): number[] {
  const out: number[] = [];
  for (const n of readdirSync('/proc')) {
    if (!/^\d+$/.test(n)) continue;
    try {
      const stat = readFileSync(`/proc/${n}/stat`, 'utf8');
      const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
      if (Number(f[1]) !== initPid || f[0] === 'Z') continue;
      if (/podd(-boot)?\.js/.test(readFileSync(`/proc/${n}/cmdline`, 'utf8'))) out.push(Number(n));
    } catch {
      /* gone */
    }
  }
  return out;
}

describeWith('podd Quiesce/Thaw in a real runc VM (integration)', [...FREEZE_PARTS, built('@sandnode/podd', 'dist/podd.bundle.js')], () => {
  let fx: Fixture;
  let rootfs: string;
  const windows: Record<string, number> = {};
  const vms: Record<string, { dir: string; podd: PoddClient; poddDir: string; pid: number }> = {};

  async function makeVm(id: string, env: Record<string, string> = {}): Promise<void> {
    const poddDir = path.join(fx.runDir, 'sandboxes', id);
    mkdirSync(poddDir, { recursive: true });
    const spec: VmSpec = {
      templateRootfs: rootfs,
      drives: [
        { driveId: 'upper', path: fx.makeExt4Loop(`${id}-upper`), role: DriveRole.DRIVE_ROLE_ROOTFS_UPPER, readOnly: false },
        { driveId: 'ws', path: fx.makeExt4Loop(`${id}-ws`), role: DriveRole.DRIVE_ROLE_WORKSPACE, readOnly: false },
      ],
      resources: { vcpus: 1, memoryMib: 256, diskBytes: 0, pids: 0 },
      poddSocketDir: poddDir,
      hostname: '',
      env,
      machineId: '',
      network: undefined,
    };
    const vm = (await fx.client().createVm({ vmId: id, spec })).vm!;
    const podd = poddClient(poddDir);
    await waitPodd(podd);
    vms[id] = { dir: path.join(fx.runDir, 'vms', id), podd, poddDir, pid: vm.pid };
  }

  /** record reads the supervisor's freeze record of vm (host truth: when the freeze began). */
  const record = (id: string): FreezeRecord | undefined => {
    const f = path.join(vms[id]!.dir, 'freeze-state.json');
    return existsSync(f) ? (JSON.parse(readFileSync(f, 'utf8')) as FreezeRecord) : undefined;
  };

  /** waitNewFreeze waits until vm's record names a freeze other than `not` that still holds. */
  async function waitNewFreeze(id: string, not: string | undefined): Promise<FreezeRecord> {
    return waitFor(
      `a new freeze of ${id} recorded`,
      () => {
        const r = record(id);
        return r && r.token !== not && r.endedBy === undefined ? r : undefined;
      },
      30_000,
      5,
    );
  }

  /** expectWatchdogBound: writers on both filesystems end within max + slack of the freeze's start. */
  async function expectWatchdogBound(id: string, rec: FreezeRecord, label: string): Promise<void> {
    const w1 = startWriter(path.join(vms[id]!.dir, 'upper-dev', `${label}-probe`));
    const w2 = startWriter(path.join(vms[id]!.dir, 'workspace', `${label}-probe`));
    const end = Math.max(await w1.done, await w2.done);
    windows[label] = end - rec.startedAtMs;
    expect(end - rec.startedAtMs).toBeLessThanOrEqual(rec.maxFreezeMs + WINDOW_SLACK_MS);
    expect(end - rec.startedAtMs).toBeGreaterThanOrEqual(rec.maxFreezeMs - 20); // nobody thawed it earlier
  }

  async function expectEndedByWatchdog(c: PoddClient, token: string, maxMs: number): Promise<void> {
    const st = await c.getFreezeStatus({});
    expect(st).toMatchObject({ frozen: false, freezeToken: token, endedBy: ThawEndedBy.THAW_ENDED_BY_WATCHDOG, remainingMs: 0 });
    expect(st.frozenMs).toBeLessThanOrEqual(maxMs + WINDOW_SLACK_MS);
    expect(st.frozenMs).toBeGreaterThan(0);
    expect(await c.thaw({ freezeToken: token })).toMatchObject({ endedBy: ThawEndedBy.THAW_ENDED_BY_WATCHDOG, frozenMs: st.frozenMs });
  }

  beforeAll(async () => {
    fx = new Fixture();
    const tpl = await buildTemplate({ name: 'quiesce', templatesDir: path.join(fx.dir, 'templates'), poddBundlePath: PODD_BUNDLE, poddVersion: 'test' });
    rootfs = tpl.rootfsPath;
    await fx.start();
    await makeVm('vm-q');
    await makeVm('vm-s', { SANDNODE_PODD_FAILPOINTS: 'quiesce.hang-after-freeze' });
  });

  afterAll(async () => {
    console.log(`podd freeze windows measured by host writers (ms): ${JSON.stringify(windows)}`);
    await fx?.cleanup();
  });

  test('podd lists podd.quiesce (its freeze port exists)', async () => {
    const v = await createServiceClient(VersionServiceDefinition, createSandnodeChannel(`unix://${path.join(vms['vm-q']!.poddDir, 'podd.sock')}`)).getVersion({});
    expect(v.features).toContain('podd.quiesce');
  });

  test('Quiesce -> host writers block -> Thaw ends it (CALLER) with frozen_ms; GetFreezeStatus follows', async () => {
    const c = vms['vm-q']!.podd;
    const q = await c.quiesce({ maxFreezeMs: 3000 });
    expect(q).toMatchObject({ maxFreezeMs: 3000, filesystems: ['/', '/workspace'] });
    expect(q.freezeToken).toMatch(/^[0-9a-f]{32}$/);
    expect(q.deadlineUnixMs).toBeGreaterThan(Date.now());
    const st = await c.getFreezeStatus({});
    expect(st).toMatchObject({ frozen: true, freezeToken: q.freezeToken, maxFreezeMs: 3000, endedBy: ThawEndedBy.THAW_ENDED_BY_UNSPECIFIED });
    expect(st.remainingMs).toBeGreaterThan(0);
    await expect(c.quiesce({ maxFreezeMs: 100 })).rejects.toMatchObject({ code: Status.FAILED_PRECONDITION });
    const w = startWriter(path.join(vms['vm-q']!.dir, 'workspace', 'happy'));
    await sleep(300); // the freeze window under test: the writer must stay blocked through it
    expect(w.exited()).toBe(false);
    const t = await c.thaw({ freezeToken: q.freezeToken });
    expect(t.endedBy).toBe(ThawEndedBy.THAW_ENDED_BY_CALLER);
    expect(t.frozenMs).toBeGreaterThanOrEqual(300);
    expect(t.frozenMs).toBeLessThan(3000);
    await w.done;
    windows.happyThaw = t.frozenMs;
    expect(await c.getFreezeStatus({})).toMatchObject({ frozen: false, endedBy: ThawEndedBy.THAW_ENDED_BY_CALLER, frozenMs: t.frozenMs });
    await expect(c.thaw({ freezeToken: '' })).rejects.toMatchObject({ code: Status.INVALID_ARGUMENT });
    await expect(c.thaw({ freezeToken: '0'.repeat(32) })).rejects.toMatchObject({ code: Status.FAILED_PRECONDITION });
  });

  test('(a) the caller goes away and never calls Thaw: the watchdog thaws within max_freeze_ms + 100 ms', async () => {
    const c = vms['vm-q']!.podd;
    const before = record('vm-q')?.token;
    const ac = new AbortController();
    const call = c.quiesce({ maxFreezeMs: 1000 }, { signal: ac.signal }).then(
      () => 'answered',
      (err: unknown) => ((err as { name?: string }).name === 'AbortError' || (err instanceof ClientError && err.code === Status.CANCELLED) ? 'cancelled' : Promise.reject(err)),
    );
    const rec = await waitNewFreeze('vm-q', before);
    ac.abort(); // the caller is gone (it may have had the answer already; it never calls Thaw)

    console.log(`(a) the abandoned Quiesce call ended: ${await call}`);
    await expectWatchdogBound('vm-q', rec, 'callerGone');
    await expectEndedByWatchdog(c, rec.token, 1000);
  });

  test("(b) podd's Quiesce handler is stuck after the freeze: the watchdog thaws within max_freeze_ms + 100 ms", async () => {
    const c = vms['vm-s']!.podd;
    const before = record('vm-s')?.token;
    const call = poddClient(vms['vm-s']!.poddDir, 4000)
      .quiesce({ maxFreezeMs: 1000 })
      .then(
        () => 'answered',
        (err: unknown) => (err instanceof ClientError ? Status[err.code] : Promise.reject(err)),
      );
    const rec = await waitNewFreeze('vm-s', before);
    await expectWatchdogBound('vm-s', rec, 'handlerStuck');
    expect(await call).toBe('DEADLINE_EXCEEDED'); // the handler never answered
    await expectEndedByWatchdog(c, rec.token, 1000);
  });

  test('(c) podd is SIGKILLed mid-freeze: the watchdog thaws in time; the restarted podd reports WATCHDOG', async () => {
    const vm = vms['vm-q']!;
    const q = await vm.podd.quiesce({ maxFreezeMs: 1000 });
    const rec = record('vm-q')!;
    expect(rec.token).toBe(q.freezeToken);
    const pids = poddPids(vm.pid);
    expect(pids).toHaveLength(1);
    process.kill(pids[0]!, 'SIGKILL');
    await expectWatchdogBound('vm-q', rec, 'poddKilled');
    // sandnode-init restarts podd (same socket, fd 3); the new one asks the host.
    await waitFor('sandnode-init to restart podd', () => poddPids(vm.pid).some((p) => p !== pids[0]), 20_000, 50);
    const fresh = poddClient(vm.poddDir);
    expect(await waitPodd(fresh)).toBeLessThan(20_000);
    expect(poddPids(vm.pid)).not.toContain(pids[0]);
    await expectEndedByWatchdog(fresh, q.freezeToken, 1000);
  });
});
