/**
 * Integration tests of A/B slots and device handover with the loop driver: two real daemon
 * processes (dist/main.js, slots a and b) on one state dir, real loop devices, one of them
 * mounted and written to while it moves. Covers: the slot lock, HandoverAll a -> b (stall
 * p50/p95/p99 printed), kill -9 and restart, the abort path (failpoint ublk.recover=error),
 * kill -9 at each handover step (failpoints that SIGKILL the process) with convergence after
 * restarting both slots, the stall histogram on /metrics, and epoch fencing across restarts.
 * The handover during sandbox churn is handover-churn.it.test.ts.
 * Needs root, /dev/loop-control, util-linux, e2fsprogs and the build (DAEMON_PARTS): skips
 * naming what is missing, fails instead under CI=true (testkit describeWith).
 * Every loop device, mount, image and process made here is removed in afterAll (a leftover
 * mount or loop device fails the suite).
 */
import { execFileSync } from 'node:child_process';
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import fsp from 'node:fs/promises';
import path from 'node:path';
import Database from 'better-sqlite3';
import { createSandnodeChannel, createServiceClient } from '@sandnode/shared';
import { DeviceServiceDefinition, Filesystem, HandoverResult, type Device } from '@sandnode/shared/proto/ublk/v1/ublk';
import { ClientError, Status } from 'nice-grpc-common';
import { describeWith, expectCode, writeLeaseRecord } from '@sandnode/testkit';
import { backingOf, buildDaemon, cleanUpUnder, DAEMON_PARTS, httpGet, MIB, percentile, spawnDaemon, tempRoot, waitForLog, type Daemon, type Slot } from './__tests__/handover-harness';

const N_DEVICES = 20;
const IDS = Array.from({ length: N_DEVICES }, (_, i) => `dev-${String(i).padStart(2, '0')}`);

jest.setTimeout(180_000);

describeWith('ublk-manager slots and device handover (loop driver, real processes)', DAEMON_PARTS, () => {
  let tmp: string;
  let stateDir: string;
  let runDir: string;
  let mnt: string;
  let epoch = 1;
  const metricsPort = 20000 + (process.pid % 20000);
  const daemons: Partial<Record<Slot, Daemon>> = {};
  const channels: Partial<Record<Slot, ReturnType<typeof createSandnodeChannel>>> = {};
  const clients: Partial<Record<Slot, ReturnType<typeof createServiceClient<typeof DeviceServiceDefinition>>>> = {};

  const addr = (s: Slot) => `unix://${path.join(runDir, `ublk-manager-${s}.sock`)}`;
  const logOf = (s: Slot) => path.join(tmp, `slot-${s}.log`);
  const client = (s: Slot) => clients[s]!;

  function spawnSlot(s: Slot, extra: Record<string, string> = {}): Daemon {
    const env: NodeJS.ProcessEnv = {};
    for (const [k, v] of Object.entries(process.env)) if (!k.startsWith('SANDNODE_')) env[k] = v;
    Object.assign(env, {
      SANDNODE_UBLK_MANAGER_SLOT: s,
      SANDNODE_UBLK_MANAGER_STATE_DIR: stateDir,
      SANDNODE_UBLK_MANAGER_RUN_DIR: runDir,
      SANDNODE_UBLK_MANAGER_LOG_LEVEL: 'info',
      ...(s === 'b' ? { SANDNODE_UBLK_MANAGER_METRICS_LISTEN: `127.0.0.1:${metricsPort}` } : {}),
      ...extra,
    });
    return spawnDaemon(logOf(s), env);
  }

  /** startSlot spawns slot s (with failpoints in extra), waits for "serving", connects. */
  async function startSlot(s: Slot, extra: Record<string, string> = {}): Promise<void> {
    const d = spawnSlot(s, extra);
    await waitForLog(logOf(s), d, '"msg":"serving"');
    daemons[s] = d;
    channels[s]?.close();
    channels[s] = createSandnodeChannel(addr(s));
    clients[s] = createServiceClient(DeviceServiceDefinition, channels[s]!, { timeoutMs: 120_000, epoch: () => epoch });
  }

  async function killSlot(s: Slot): Promise<void> {
    const d = daemons[s];
    if (!d) return;
    d.proc.kill('SIGKILL');
    await d.done;
    delete daemons[s];
  }

  /** waitDeath awaits a daemon that a failpoint kills. */
  async function waitDeath(s: Slot): Promise<void> {
    const r = await daemons[s]!.done;
    expect(r.signal).toBe('SIGKILL');
    delete daemons[s];
  }

  function tableRows(s: Slot): { device_id: string; state: string }[] {
    const file = path.join(stateDir, 'ublk-manager', s, 'devices.db');
    const db = new Database(file, { readonly: true, fileMustExist: true });
    try {
      return db.prepare('SELECT device_id, state FROM devices ORDER BY device_id').all() as { device_id: string; state: string }[];
    } finally {
      db.close();
    }
  }

  /** expectOneOwnerEach: every device listed by exactly one slot, attached to its image, no released rows. */
  async function expectOneOwnerEach(): Promise<Record<string, Slot>> {
    const la = (await client('a').listDevices({})).devices;
    const lb = (await client('b').listDevices({})).devices;
    const owner: Record<string, Slot> = {};
    for (const id of IDS) {
      const inA = la.find((d) => d.deviceId === id);
      const inB = lb.find((d) => d.deviceId === id);
      expect([id, Boolean(inA) !== Boolean(inB)]).toEqual([id, true]);
      const d = (inA ?? inB)!;
      expect(backingOf(d.path)).toBe(d.backingFile);
      owner[id] = inA ? 'a' : 'b';
    }
    for (const s of ['a', 'b'] as const) expect(tableRows(s).filter((r) => r.state !== 'ready')).toEqual([]);
    return owner;
  }

  beforeAll(async () => {
    buildDaemon();
    tmp = tempRoot('ublk-ho');
    stateDir = path.join(tmp, 'state');
    runDir = path.join(tmp, 'run');
    mnt = path.join(tmp, 'mnt');
    mkdirSync(mnt);
    writeLeaseRecord(stateDir, 5); // the highest epoch this suite fences with (no server: its lease record)
    await startSlot('a');
  }, 120_000);

  afterAll(async () => {
    if (!tmp) return;
    for (const s of ['a', 'b'] as const) await killSlot(s);
    for (const c of Object.values(channels)) c?.close();
    cleanUpUnder(tmp);
  });

  it('a second process of the same slot exits with a clear message (slot lock)', async () => {
    const d = spawnSlot('a');
    const r = await d.done;
    expect(r.code).toBe(3);
    const log = readFileSync(logOf('a'), 'utf8');
    expect(log).toContain(`slot \\"a\\" on state dir ${stateDir} is already running`);
    expect(log).toContain(path.join(stateDir, 'ublk-manager', 'a', 'lock'));
    expect((await client('a').listDevices({})).devices).toEqual([]); // the first one still serves
  });

  it(`creates ${N_DEVICES} devices in slot a and writes a file on a mounted one`, async () => {
    for (const id of IDS) {
      const { device } = await client('a').createDevice({
        deviceId: id,
        sizeBytes: 16 * MIB,
        sourceImage: '',
        filesystem: id === 'dev-00' ? Filesystem.FILESYSTEM_EXT4 : Filesystem.FILESYSTEM_NONE,
        readOnly: false,
      });
      expect(device?.backingFile).toBe(path.join(stateDir, 'images', `${id}.img`));
    }
    const d0 = (await client('a').getDevice({ deviceId: 'dev-00' })).device!;
    execFileSync('mount', [d0.path, mnt]);
    writeFileSync(path.join(mnt, 'before.txt'), 'written before the handover\n');
    expect(tableRows('a')).toHaveLength(N_DEVICES);
  });

  it('HandoverAll on b from a moves every device; the mounted one keeps working during and after', async () => {
    await startSlot('b');
    const before = (await client('a').listDevices({})).devices;
    // A writer on the mounted device for the whole handover.
    let stop = false;
    let writes = 0;
    const writer = (async () => {
      while (!stop) {
        const f = path.join(mnt, `during-${writes}.txt`);
        await fsp.writeFile(f, `write ${writes}\n`);
        const fh = await fsp.open(f, 'r+');
        await fh.sync();
        await fh.close();
        writes++;
      }
    })();
    const r = await client('b').handoverAll({ fromAddress: addr('a'), deviceIds: [], perDeviceTimeoutMs: 0 });
    stop = true;
    await writer;
    expect(r.mode).toBe('ownership-only');
    expect(r.devices.map((d) => [d.deviceId, HandoverResult[d.result], d.error])).toEqual(IDS.map((id) => [id, 'HANDOVER_RESULT_MOVED', '']));
    const stalls = r.devices.map((d) => d.stallMs).sort((x, y) => x - y);
    console.log(
      `ublk handover a->b (loop, ownership-only), ${N_DEVICES} devices, ${writes} fsynced writes on the mounted one during the move: ` +
        `stall p50=${percentile(stalls, 50).toFixed(2)} ms p95=${percentile(stalls, 95).toFixed(2)} ms p99=${percentile(stalls, 99).toFixed(2)} ms ` +
        `max=${stalls[stalls.length - 1]?.toFixed(2)} ms total=${r.totalMs} ms`,
    );
    expect(writes).toBeGreaterThan(0);
    expect((await client('a').listDevices({})).devices).toEqual([]);
    expect(tableRows('a')).toEqual([]); // released rows dropped once b owns the devices
    const after = (await client('b').listDevices({})).devices;
    expect(after.map((d: Device) => [d.deviceId, d.path, d.backingFile])).toEqual(before.map((d) => [d.deviceId, d.path, d.backingFile]));
    expect(tableRows('b').map((x) => [x.device_id, x.state])).toEqual(IDS.map((id) => [id, 'ready']));
    // The mounted device still works after the move.
    writeFileSync(path.join(mnt, 'after.txt'), 'written after the handover\n');
    expect(readFileSync(path.join(mnt, 'before.txt'), 'utf8')).toBe('written before the handover\n');
    expect(readFileSync(path.join(mnt, `during-${writes - 1}.txt`), 'utf8')).toBe(`write ${writes - 1}\n`);
    expect(readFileSync(path.join(mnt, 'after.txt'), 'utf8')).toBe('written after the handover\n');
  });

  it('exports sandnode_ublk_handover_stall_seconds on /metrics of b', async () => {
    const body = await httpGet(`http://127.0.0.1:${metricsPort}/metrics`);
    expect(body).toContain('# TYPE sandnode_ublk_handover_stall_seconds histogram');
    expect(body).toContain(`sandnode_ublk_handover_stall_seconds_count{mode="ownership-only"} ${N_DEVICES}`);
  });

  it('kill -9 of a, restart a: a reclaims nothing, b keeps every device', async () => {
    await killSlot('a');
    await startSlot('a');
    expect((await client('a').listDevices({})).devices).toEqual([]);
    expect((await client('b').listDevices({})).devices.map((d) => d.deviceId)).toEqual(IDS);
    await expectOneOwnerEach();
  });

  it('abort path: Recover fails on the new slot (failpoint) -> ABORTED, the old slot still owns and serves the device', async () => {
    await killSlot('a');
    await startSlot('a', { SANDNODE_UBLK_MANAGER_FAILPOINTS: 'ublk.recover=error' });
    const r = await client('a').handoverAll({ fromAddress: addr('b'), deviceIds: ['dev-00', 'dev-01'], perDeviceTimeoutMs: 0 });
    expect(r.devices.map((d) => [d.deviceId, HandoverResult[d.result]])).toEqual([
      ['dev-00', 'HANDOVER_RESULT_ABORTED'],
      ['dev-01', 'HANDOVER_RESULT_ABORTED'],
    ]);
    expect(r.devices[0]?.error).toContain('failpoint ublk.recover');
    const owner = await expectOneOwnerEach();
    expect([owner['dev-00'], owner['dev-01']]).toEqual(['b', 'b']);
    writeFileSync(path.join(mnt, 'after-abort.txt'), 'still served\n');
    expect(readFileSync(path.join(mnt, 'after-abort.txt'), 'utf8')).toBe('still served\n');
    // b can still hand it over later (the abort left it fully owned, not quiesced).
    await client('b').quiesceDevice({ deviceId: 'dev-01', timeoutMs: 0 });
    await client('b').resumeDevice({ deviceId: 'dev-01' });
    await killSlot('a');
    await startSlot('a');
  });

  // kill -9 at each step of a move b -> a (a is the new slot); then restart both slots.
  const steps: { name: string; slot: Slot; failpoint: string; device: string }[] = [
    { name: 'old slot after quiesce', slot: 'b', failpoint: 'ublk.quiesce.after', device: 'dev-02' },
    { name: 'old slot after release (before answering)', slot: 'b', failpoint: 'ublk.release.after', device: 'dev-03' },
    { name: 'new slot after release, before recover', slot: 'a', failpoint: 'ublk.handover.after-release', device: 'dev-04' },
    { name: 'new slot after recover, before answering', slot: 'a', failpoint: 'ublk.recover.before-response', device: 'dev-05' },
  ];
  for (const step of steps) {
    it(`kill -9 of the ${step.name} (${step.failpoint}=kill) converges after restarting both: one owner per device, all attached`, async () => {
      await killSlot(step.slot);
      await startSlot(step.slot, { SANDNODE_UBLK_MANAGER_FAILPOINTS: `${step.failpoint}=kill` });
      const call = client('a')
        .handoverAll({ fromAddress: addr('b'), deviceIds: [step.device], perDeviceTimeoutMs: 0 })
        .then(
          (r) => r.devices.map((d) => HandoverResult[d.result]),
          (e: unknown) => e,
        );
      await waitDeath(step.slot);
      const res = await call;
      if (step.slot === 'a')
        expect(res).toBeInstanceOf(ClientError); // the new slot died inside the call
      else expect(res).not.toEqual(['HANDOVER_RESULT_MOVED']);
      // The killed slot first, while the other runs: a slot that starts while the other is
      // not running takes that slot's devices over (takeover rule), which is not this test.
      for (const s of [step.slot, step.slot === 'a' ? 'b' : 'a'] as const) {
        await killSlot(s);
        await startSlot(s);
      }
      const owner = await expectOneOwnerEach();
      const rowsA = tableRows('a').map((r) => r.device_id);
      const rowsB = tableRows('b').map((r) => r.device_id);
      expect(rowsA.includes(step.device) !== rowsB.includes(step.device)).toBe(true);
      // Where it ends up follows the rule: the new slot owns it only if it persisted the recover.
      expect(owner[step.device]).toBe(step.failpoint === 'ublk.recover.before-response' ? 'a' : 'b');
    });
  }

  it('epoch fencing: a lower epoch is ABORTED and changes nothing; the highest epoch survives a restart and is shared by both slots', async () => {
    epoch = 5;
    const { device } = await client('b').createDevice({ deviceId: 'ep-x', sizeBytes: 4 * MIB, sourceImage: '', filesystem: Filesystem.FILESYSTEM_NONE, readOnly: false });
    epoch = 4;
    await expectCode(client('b').deleteDevice({ deviceId: 'ep-x' }), Status.ABORTED, 'stale epoch 4');
    await expectCode(client('b').createDevice({ deviceId: 'ep-y', sizeBytes: 4 * MIB, sourceImage: '', filesystem: Filesystem.FILESYSTEM_NONE, readOnly: false }), Status.ABORTED);
    await expectCode(client('a').createDevice({ deviceId: 'ep-y', sizeBytes: 4 * MIB, sourceImage: '', filesystem: Filesystem.FILESYSTEM_NONE, readOnly: false }), Status.ABORTED);
    await expectCode(client('a').handoverAll({ fromAddress: addr('b'), deviceIds: [], perDeviceTimeoutMs: 0 }), Status.ABORTED);
    expect(backingOf(device!.path)).toBe(device!.backingFile);
    expect(existsSync(path.join(stateDir, 'images', 'ep-y.img'))).toBe(false);
    expect((await client('b').getDevice({ deviceId: 'ep-x' })).device).toEqual(device);
    await killSlot('b');
    await startSlot('b');
    await expectCode(client('b').deleteDevice({ deviceId: 'ep-x' }), Status.ABORTED, 'this node is at epoch 5');
    expect(backingOf(device!.path)).toBe(device!.backingFile);
    epoch = 5;
    expect((await client('b').deleteDevice({ deviceId: 'ep-x' })).existed).toBe(true);
    await expectOneOwnerEach();
  });
});
