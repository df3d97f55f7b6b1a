/**
 * Integration tests of the device handover during sandbox churn with the loop driver: two
 * real daemon processes (slots a and b) on one state dir (see the suite's comment below).
 * Needs root, /dev/loop-control, util-linux, e2fsprogs and the build (DAEMON_PARTS): skips
 * naming what is missing, fails instead under CI=true (testkit describeWith).
 * Every loop device, image and process made here is removed in afterAll (a leftover loop
 * device fails the suite).
 */
import { existsSync, readFileSync } from 'node:fs';
import path from 'node:path';
import Database from 'better-sqlite3';
import { createSandnodeChannel, createServiceClient } from '@sandnode/shared';
import { DeviceServiceDefinition, Filesystem, HandoverResult } from '@sandnode/shared/proto/ublk/v1/ublk';
import { ClientError, Status } from 'nice-grpc-common';
import { describeWith, expectCode, writeLeaseRecord } from '@sandnode/testkit';
import { imageLoopsUnder, backingOf, buildDaemon, cleanUpUnder, DAEMON_PARTS, MIB, spawnDaemon, tempRoot, waitForLog, type Daemon, type Slot } from './__tests__/handover-harness';

jest.setTimeout(180_000);

/**
 * The device handover while the server keeps creating and deleting sandboxes (two devices
 * each, `<id>-upper` and `<id>-ws`): a device deleted on the old slot during HandoverAll is
 * skipped; the old slot is retiring (CreateDevice and calls on released devices answer
 * UNAVAILABLE, retryable); kill -9 of the new slot mid-move converges to the old slot, either
 * at once (the retiring old slot takes its devices back when called) or when only the old
 * slot is started again (takeover rule). Pauses are failpoints (`pause` waits for SIGUSR2).
 */
describeWith('ublk-manager handover during sandbox churn (loop driver, real processes)', DAEMON_PARTS, () => {
  let tmp: string;
  let stateDir: string;
  let runDir: string;
  const epoch = 1;
  const daemons: Partial<Record<Slot, Daemon>> = {};
  const channels: Partial<Record<Slot, ReturnType<typeof createSandnodeChannel>>> = {};
  const clients: Partial<Record<Slot, ReturnType<typeof createServiceClient<typeof DeviceServiceDefinition>>>> = {};
  const addr = (s: Slot) => `unix://${path.join(runDir, `ublk-manager-${s}.sock`)}`;
  const logOf = (s: Slot) => path.join(tmp, `slot-${s}.log`);
  const client = (s: Slot) => clients[s]!;
  const other = (s: Slot): Slot => (s === 'a' ? 'b' : 'a');

  async function startSlot(s: Slot, failpoints = ''): Promise<void> {
    const env: NodeJS.ProcessEnv = {};
    for (const [k, v] of Object.entries(process.env)) if (!k.startsWith('SANDNODE_')) env[k] = v;
    Object.assign(env, {
      SANDNODE_UBLK_MANAGER_SLOT: s,
      SANDNODE_UBLK_MANAGER_STATE_DIR: stateDir,
      SANDNODE_UBLK_MANAGER_RUN_DIR: runDir,
      SANDNODE_UBLK_MANAGER_LOG_LEVEL: 'info',
      ...(failpoints ? { SANDNODE_UBLK_MANAGER_FAILPOINTS: failpoints } : {}),
    });
    const d = spawnDaemon(logOf(s), env);
    await waitLog(s, d, '"msg":"serving"');
    daemons[s] = d;
    channels[s]?.close();
    channels[s] = createSandnodeChannel(addr(s));
    // One attempt: these tests look at UNAVAILABLE itself (the server's client retries it).
    clients[s] = createServiceClient(DeviceServiceDefinition, channels[s]!, { timeoutMs: 60_000, epoch: () => epoch, retryAttempts: 1 });
  }

  /** waitLog waits for a log line of daemon d of slot s containing text (the daemon writes it; no sleeps in the daemon); throws if d exits first. */
  function waitLog(s: Slot, d: Daemon, text: string): Promise<void> {
    return waitForLog(logOf(s), d, text);
  }

  /** stopSlot: SIGTERM (as the CLI stops the old slot) or SIGKILL. */
  async function stopSlot(s: Slot, sig: NodeJS.Signals): Promise<void> {
    const d = daemons[s];
    if (!d) return;
    d.proc.kill(sig);
    const r = await d.done;
    if (sig === 'SIGTERM') expect(r.code).toBe(0);
    delete daemons[s];
  }

  function rows(s: Slot): { device_id: string; state: string }[] {
    const file = path.join(stateDir, 'ublk-manager', s, 'devices.db');
    if (!existsSync(file)) return [];
    const db = new Database(file, { readonly: true, fileMustExist: true });
    try {
      return db.prepare('SELECT device_id, state FROM devices ORDER BY device_id').all() as { device_id: string; state: string }[];
    } finally {
      db.close();
    }
  }

  const create = (s: Slot, id: string) => client(s).createDevice({ deviceId: id, sizeBytes: 4 * MIB, sourceImage: '', filesystem: Filesystem.FILESYSTEM_NONE, readOnly: false });

  /** expectOwnedBy: s lists exactly ids (each attached to its image, ready rows), the other slot's table names none of them. */
  async function expectOwnedBy(s: Slot, ids: string[]): Promise<void> {
    const listed = (await client(s).listDevices({})).devices;
    expect(listed.map((d) => d.deviceId)).toEqual([...ids].sort());
    for (const d of listed) expect(backingOf(d.path)).toBe(d.backingFile);
    expect(rows(s).map((r) => [r.device_id, r.state])).toEqual([...ids].sort().map((id) => [id, 'ready']));
    expect(rows(other(s))).toEqual([]);
  }

  beforeAll(async () => {
    buildDaemon();
    tmp = tempRoot('ublk-churn');
    stateDir = path.join(tmp, 'state');
    runDir = path.join(tmp, 'run');
    writeLeaseRecord(stateDir, epoch); // no server: its lease record names the epoch this suite uses
    await startSlot('a');
  }, 120_000);

  afterAll(async () => {
    if (!tmp) return;
    for (const s of ['a', 'b'] as const) await stopSlot(s, 'SIGKILL');
    for (const c of Object.values(channels)) c?.close();
    cleanUpUnder(tmp);
  });

  it('a device deleted on the old slot during HandoverAll is skipped (the move succeeds); the old slot is retiring: CreateDevice and calls on released devices answer UNAVAILABLE; after the move the create succeeds on the new slot', async () => {
    const ids = ['s1-upper', 's1-ws', 's2-upper', 's2-ws', 's3-upper', 's3-ws'];
    for (const id of ids) await create('a', id);
    await startSlot('b', 'ublk.handover-all.after-list=pause,ublk.handover-all.after-first-move=pause');
    const b = daemons.b!;
    const move = client('b').handoverAll({ fromAddress: addr('a'), deviceIds: [], perDeviceTimeoutMs: 0 });
    await waitLog('b', b, 'failpoint ublk.handover-all.after-list paused');
    // b listed a: a is retiring. The server deletes sandbox s3 (one device now, one later).
    expect((await client('a').deleteDevice({ deviceId: 's3-ws' })).existed).toBe(true);
    await expectCode(create('a', 's4-upper'), Status.UNAVAILABLE, 'is handing its devices to slot b');
    daemons.b!.proc.kill('SIGUSR2');
    await waitLog('b', b, 'failpoint ublk.handover-all.after-first-move paused');
    // s1-upper moved: a released it. Calls naming it on a are UNAVAILABLE (not NOT_FOUND / existed=false).
    await expectCode(client('a').getDevice({ deviceId: 's1-upper' }), Status.UNAVAILABLE, 'was released to it; retry');
    await expectCode(client('a').deleteDevice({ deviceId: 's1-upper' }), Status.UNAVAILABLE);
    await expectCode(client('a').quiesceDevice({ deviceId: 's1-upper', timeoutMs: 0 }), Status.UNAVAILABLE);
    await expectCode(create('a', 's1-upper'), Status.UNAVAILABLE);
    expect((await client('a').deleteDevice({ deviceId: 's3-upper' })).existed).toBe(true);
    daemons.b!.proc.kill('SIGUSR2');
    const r = await move;
    expect(r.devices.map((d) => [d.deviceId, HandoverResult[d.result], d.error])).toEqual(['s1-upper', 's1-ws', 's2-upper', 's2-ws'].map((id) => [id, 'HANDOVER_RESULT_MOVED', '']));
    const bLog = readFileSync(logOf('b'), 'utf8');
    expect(bLog).toContain('"device_id":"s3-upper"');
    expect(bLog).toContain('the old slot no longer has this device (deleted meanwhile); skipped');
    // Still retiring after the move (b runs): the create is refused on a, succeeds on b.
    await expectCode(create('a', 's4-upper'), Status.UNAVAILABLE);
    await create('b', 's4-upper');
    await create('b', 's4-ws');
    // As the CLI does: SIGTERM the old slot (clean exit), the move stays done.
    await expectCode(client('a').deleteDevice({ deviceId: 's2-ws' }), Status.UNAVAILABLE);
    expect((await client('a').listDevices({})).devices).toEqual([]); // released rows dropped: b owns them
    expect(rows('a')).toEqual([]);
    await stopSlot('a', 'SIGTERM');
    expect((await client('b').deleteDevice({ deviceId: 's2-ws' })).existed).toBe(true);
    await expectOwnedBy('b', ['s1-upper', 's1-ws', 's2-upper', 's4-upper', 's4-ws']);
    expect(existsSync(path.join(stateDir, 'images', 's3-ws.img'))).toBe(false);
    expect(existsSync(path.join(stateDir, 'images', 's2-ws.img'))).toBe(false);
  });

  it('kill -9 of the new slot mid-HandoverAll while the old slot runs: the retiring old slot takes its devices back when next called and is no longer retiring', async () => {
    const all = ['s1-upper', 's1-ws', 's2-upper', 's4-upper', 's4-ws'];
    await startSlot('a', 'ublk.handover-all.after-first-move=kill');
    const pidA = daemons.a!.pid;
    const call = client('a')
      .handoverAll({ fromAddress: addr('b'), deviceIds: [], perDeviceTimeoutMs: 0 })
      .then(
        () => undefined,
        (e: unknown) => e,
      );
    const r = await daemons.a!.done;
    expect(r.signal).toBe('SIGKILL');
    delete daemons.a;
    expect(await call).toBeInstanceOf(ClientError);
    expect(readFileSync(logOf('a'), 'utf8')).toContain(`"pid":${pidA},`);
    expect(rows('a')).toEqual([{ device_id: 's1-upper', state: 'ready' }]); // a recovered s1-upper, then died
    // b released s1-upper to a, which is gone: the next call naming it takes it back.
    const got = (await client('b').getDevice({ deviceId: 's1-upper' })).device!;
    expect(backingOf(got.path)).toBe(got.backingFile);
    await create('b', 's5-upper'); // no longer retiring
    await expectOwnedBy('b', [...all, 's5-upper']);
  });

  it('kill -9 of the new slot mid-HandoverAll, then of the old slot; starting only the old slot (sandnode up): it owns and serves every device, exactly one owner each', async () => {
    const all = ['s1-upper', 's1-ws', 's2-upper', 's4-upper', 's4-ws', 's5-upper'];
    await startSlot('a', 'ublk.handover-all.after-first-move=kill');
    const call = client('a')
      .handoverAll({ fromAddress: addr('b'), deviceIds: [], perDeviceTimeoutMs: 0 })
      .then(
        () => undefined,
        (e: unknown) => e,
      );
    expect((await daemons.a!.done).signal).toBe('SIGKILL');
    delete daemons.a;
    expect(await call).toBeInstanceOf(ClientError);
    await stopSlot('b', 'SIGKILL');
    expect(rows('a')).toEqual([{ device_id: 's1-upper', state: 'ready' }]);
    expect(rows('b').find((x) => x.device_id === 's1-upper')?.state).toBe('released');
    await startSlot('b');
    expect(readFileSync(logOf('b'), 'utf8')).toContain('takeover: the device of a stopped slot is owned by this slot now');
    await expectOwnedBy('b', all);
    // The dead slot's table has no ready rows; starting it now (b runs) takes nothing.
    await startSlot('a');
    expect((await client('a').listDevices({})).devices).toEqual([]);
    await expectOwnedBy('b', all);
    for (const id of all) expect((await client('b').deleteDevice({ deviceId: id })).existed).toBe(true);
    expect([...imageLoopsUnder(tmp).keys()]).toEqual([]);
  });
});
