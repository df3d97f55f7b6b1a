/**
 * Integration tests of the ublk-manager daemon with the loop driver: the real process
 * (dist/main.js) on a unix socket in a temp dir, real loop devices, real mkfs/e2fsck/mount.
 * Needs root, /dev/loop-control, e2fsprogs, util-linux and the build (DAEMON_PARTS): skips
 * naming what is missing, fails instead under CI=true (testkit describeWith).
 * Every loop device, mount, image and process made here is removed in afterAll (a leftover
 * mount or loop device fails the suite).
 */
import { execFileSync, spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, readFileSync, statSync } from 'node:fs';
import path from 'node:path';
import Database from 'better-sqlite3';
import { Status } from 'nice-grpc-common';
import { createSandnodeChannel, createServiceClient } from '@sandnode/shared';
import { VersionServiceDefinition } from '@sandnode/shared/proto/common/v1/version';
import { Capability, DeviceServiceDefinition, DeviceState, Filesystem, type CreateDeviceRequest } from '@sandnode/shared/proto/ublk/v1/ublk';
import { describeWith, expectCode, writeLeaseRecord } from '@sandnode/testkit';
import {
  imageLoopsUnder,
  imageFiles,
  backingOf,
  buildDaemon,
  cleanUpUnder,
  DAEMON_PARTS,
  MIB,
  ROOT,
  spawnDaemon as spawnMain,
  tempRoot,
  waitForLog,
  type Daemon,
  type Exit,
} from './__tests__/handover-harness';

const MAX = 512 * MIB;

jest.setTimeout(120_000);

describeWith('ublk-manager daemon (loop driver)', DAEMON_PARTS, () => {
  let tmp: string;
  let stateDir: string;
  let runDir: string;
  let imagesDir: string;
  let addr: string;
  let logFile: string;
  let daemon: Daemon | undefined;
  let channel: ReturnType<typeof createSandnodeChannel>;
  let client: ReturnType<typeof createServiceClient<typeof DeviceServiceDefinition>>;
  let version: ReturnType<typeof createServiceClient<typeof VersionServiceDefinition>>;
  let srcImage: string;
  let mnt: string;

  function env(extra: Record<string, string> = {}): NodeJS.ProcessEnv {
    const e: NodeJS.ProcessEnv = {};
    for (const [k, v] of Object.entries(process.env)) if (!k.startsWith('SANDNODE_UBLK_MANAGER_')) e[k] = v;
    return {
      ...e,
      SANDNODE_UBLK_MANAGER_STATE_DIR: stateDir,
      SANDNODE_UBLK_MANAGER_RUN_DIR: runDir,
      SANDNODE_UBLK_MANAGER_MAX_DEVICE_SIZE_BYTES: String(MAX),
      SANDNODE_UBLK_MANAGER_LOG_LEVEL: 'debug',
      ...extra,
    };
  }

  /** spawnDaemon starts dist/main.js with its log appended to logFile. */
  function spawnDaemon(extra: Record<string, string> = {}, args: string[] = []): Daemon {
    return spawnMain(logFile, env(extra), args);
  }

  /** connect opens a fresh channel (a channel to a dead socket sits in reconnect backoff). */
  function connect(): void {
    channel?.close();
    channel = createSandnodeChannel(addr);
    client = createServiceClient(DeviceServiceDefinition, channel, { timeoutMs: 60_000 });
    version = createServiceClient(VersionServiceDefinition, channel, { timeoutMs: 5000 });
  }

  /** startDaemon spawns the daemon, waits for its "serving" log line, connects; returns its pid. */
  async function startDaemon(extra: Record<string, string> = {}): Promise<number> {
    daemon = spawnDaemon(extra);
    await waitForLog(logFile, daemon, '"msg":"serving"');
    connect();
    const v = await version.getVersion({});
    expect(v.pid).toBe(daemon.pid);
    return v.pid;
  }

  async function stopDaemon(signal: NodeJS.Signals): Promise<Exit> {
    if (!daemon) throw new Error('no daemon');
    daemon.proc.kill(signal);
    const r = await daemon.done;
    daemon = undefined;
    return r;
  }

  beforeAll(async () => {
    buildDaemon();
    tmp = tempRoot('ublk-it');
    stateDir = path.join(tmp, 'state');
    runDir = path.join(tmp, 'run');
    imagesDir = path.join(stateDir, 'images');
    logFile = path.join(tmp, 'daemon.log');
    mnt = path.join(tmp, 'mnt');
    mkdirSync(mnt);
    mkdirSync(path.join(tmp, 'src'));
    srcImage = path.join(tmp, 'src', 'base.img');
    execFileSync('truncate', ['-s', '32M', srcImage]);
    execFileSync('mkfs.ext4', ['-q', '-F', srcImage]);
    execFileSync('debugfs', ['-w', '-R', `write ${path.join(ROOT, 'package.json')} hello`, srcImage], { stdio: 'ignore' });
    addr = `unix://${path.join(runDir, 'ublk-manager.sock')}`;
    writeLeaseRecord(stateDir, 7); // the highest epoch this suite fences with (no server: its lease record)
    await startDaemon();
  }, 120_000);

  afterAll(async () => {
    if (!tmp) return;
    if (daemon) {
      daemon.proc.kill('SIGKILL');
      await daemon.done;
    }
    channel?.close();
    cleanUpUnder(tmp);
  });

  const empty = (over: Partial<CreateDeviceRequest> = {}): CreateDeviceRequest => ({
    deviceId: 'dev-a',
    sizeBytes: 64 * MIB,
    sourceImage: '',
    filesystem: Filesystem.FILESYSTEM_UNSPECIFIED,
    readOnly: false,
    ...over,
  });

  it('reports version, features and capabilities', async () => {
    const v = await version.getVersion({});
    expect(v.component).toBe('ublk-manager');
    expect(v.features).toEqual(expect.arrayContaining(['ublk.loop', 'ublk.adoption.v1']));
    const c = await client.getCapabilities({});
    expect(c).toMatchObject({ driver: 'loop', maxDeviceSizeBytes: MAX });
    expect(c.capabilities.filter((x) => x !== Capability.CAPABILITY_UNSPECIFIED)).toEqual([]);
  });

  it('creates an empty ext4 device: sparse image, attached, e2fsck clean, row persisted', async () => {
    const { device } = await client.createDevice(empty());
    expect(device).toMatchObject({ deviceId: 'dev-a', sizeBytes: 64 * MIB, state: DeviceState.DEVICE_STATE_ATTACHED, driver: 'loop', filesystem: Filesystem.FILESYSTEM_EXT4 });
    const d = device!;
    expect(d.path).toMatch(/^\/dev\/loop\d+$/);
    expect(d.backingFile).toBe(path.join(imagesDir, 'dev-a.img'));
    expect(backingOf(d.path)).toBe(d.backingFile);
    const st = statSync(d.backingFile);
    expect(st.size).toBe(64 * MIB);
    expect(st.blocks * 512).toBeLessThan(st.size);
    const dio = readFileSync(`/sys/block/${path.basename(d.path)}/loop/dio`, 'utf8').trim() === '1';
    expect(d.flags.includes('direct-io')).toBe(dio);
    expect(spawnSync('e2fsck', ['-fn', d.path]).status).toBe(0);
    const db = new Database(path.join(stateDir, 'ublk-manager', 'default', 'devices.db'), { readonly: true });
    try {
      expect(db.prepare('SELECT state, path FROM devices WHERE device_id = ?').get('dev-a')).toEqual({ state: 'ready', path: d.path });
    } finally {
      db.close();
    }
  });

  it('is idempotent on device_id and refuses a different spec with ALREADY_EXISTS', async () => {
    const a = await client.getDevice({ deviceId: 'dev-a' });
    const again = await client.createDevice(empty());
    expect(again.device?.path).toBe(a.device?.path);
    await expectCode(client.createDevice(empty({ sizeBytes: 32 * MIB })), Status.ALREADY_EXISTS, 'dev-a');
  });

  it('creates a raw read-only device', async () => {
    const { device } = await client.createDevice(empty({ deviceId: 'dev-raw', sizeBytes: 4 * MIB, filesystem: Filesystem.FILESYSTEM_NONE, readOnly: true }));
    expect(device).toMatchObject({ readOnly: true, filesystem: Filesystem.FILESYSTEM_NONE, state: DeviceState.DEVICE_STATE_ATTACHED });
    expect(readFileSync(`/sys/block/${path.basename(device!.path)}/ro`, 'utf8').trim()).toBe('1');
  });

  it('clones a source image: same size and content, e2fsck clean', async () => {
    const { device } = await client.createDevice({ deviceId: 'dev-clone', sizeBytes: 0, sourceImage: srcImage, filesystem: Filesystem.FILESYSTEM_UNSPECIFIED, readOnly: false });
    expect(device).toMatchObject({ sizeBytes: 32 * MIB, sourceImage: srcImage, state: DeviceState.DEVICE_STATE_ATTACHED });
    expect(spawnSync('e2fsck', ['-fn', device!.path]).status).toBe(0);
    const cat = spawnSync('debugfs', ['-R', 'cat hello', device!.path], { encoding: 'utf8' });
    expect(cat.stdout).toBe(readFileSync(path.join(ROOT, 'package.json'), 'utf8'));
  });

  it('gets and lists devices ordered by id with live state', async () => {
    const { devices } = await client.listDevices({});
    expect(devices.map((d) => d.deviceId)).toEqual(['dev-a', 'dev-clone', 'dev-raw']);
    for (const d of devices) {
      expect(d.state).toBe(DeviceState.DEVICE_STATE_ATTACHED);
      expect(backingOf(d.path)).toBe(d.backingFile);
    }
    const { device } = await client.getDevice({ deviceId: 'dev-clone' });
    expect(device).toEqual(devices[1]);
  });

  it('rejects bad input with the promised codes and changes nothing', async () => {
    const before = await client.listDevices({});
    const IA = Status.INVALID_ARGUMENT;
    await expectCode(client.createDevice(empty({ deviceId: 'Bad_Id' })), IA, 'device_id');
    await expectCode(client.createDevice(empty({ deviceId: '' })), IA, 'device_id');
    await expectCode(client.createDevice(empty({ deviceId: 'x1', sizeBytes: 0 })), IA, 'size_bytes');
    await expectCode(client.createDevice(empty({ deviceId: 'x1', sizeBytes: 64 * MIB + 1 })), IA, 'size_bytes');
    await expectCode(client.createDevice(empty({ deviceId: 'x1', sizeBytes: 512 * 1024 })), IA, 'size_bytes');
    await expectCode(client.createDevice(empty({ deviceId: 'x1', sizeBytes: MAX + 512 })), IA, 'size_bytes');
    await expectCode(client.createDevice(empty({ deviceId: 'x1', sourceImage: srcImage })), IA, 'size_bytes');
    await expectCode(client.createDevice(empty({ deviceId: 'x1', sizeBytes: 0, sourceImage: 'src/base.img' })), IA, 'source_image');
    await expectCode(client.createDevice(empty({ deviceId: 'x1', sizeBytes: 0, sourceImage: tmp })), IA, 'source_image');
    await expectCode(client.createDevice(empty({ deviceId: 'x1', filesystem: 9 as Filesystem })), IA, 'filesystem');
    await expectCode(client.createDevice(empty({ deviceId: 'x1', sizeBytes: 0, sourceImage: path.join(tmp, 'nope.img') })), Status.NOT_FOUND, 'source_image');
    await expectCode(client.getDevice({ deviceId: 'nope' }), Status.NOT_FOUND, 'nope');
    await expectCode(client.getDevice({ deviceId: '../x' }), IA, 'device_id');
    await expectCode(client.deleteDevice({ deviceId: 'A' }), IA, 'device_id');
    expect(await client.listDevices({})).toEqual(before);
    expect(imageFiles(imagesDir)).toEqual(['dev-a.img', 'dev-clone.img', 'dev-raw.img']);
  });

  it('refuses to delete a mounted device (FAILED_PRECONDITION), nothing changed', async () => {
    const { device } = await client.getDevice({ deviceId: 'dev-a' });
    execFileSync('mount', [device!.path, mnt]);
    try {
      await expectCode(client.deleteDevice({ deviceId: 'dev-a' }), Status.FAILED_PRECONDITION, `mounted at ${mnt}`);
      expect(backingOf(device!.path)).toBe(device!.backingFile);
      expect(existsSync(device!.backingFile)).toBe(true);
      expect((await client.getDevice({ deviceId: 'dev-a' })).device).toEqual(device);
    } finally {
      execFileSync('umount', [mnt]);
    }
  });

  it('kill -9 then restart: devices stay attached and are adopted with the same paths', async () => {
    const before = (await client.listDevices({})).devices;
    const oldPid = daemon!.pid;
    expect((await stopDaemon('SIGKILL')).signal).toBe('SIGKILL');
    for (const d of before) expect(backingOf(d.path)).toBe(d.backingFile);
    const pid = await startDaemon();
    expect(pid).not.toBe(oldPid);
    expect((await client.listDevices({})).devices).toEqual(before);
  });

  it('restart after a crash: re-attaches a detached image and cleans up an interrupted create', async () => {
    const raw = (await client.getDevice({ deviceId: 'dev-raw' })).device!;
    await stopDaemon('SIGKILL');
    // The manager's own device, detached behind its back.
    execFileSync('losetup', ['-d', raw.path]);
    // A create that crashed after attach: row still "creating", image made and attached.
    const half = path.join(imagesDir, 'dev-half.img');
    execFileSync('truncate', ['-s', '2M', half]);
    const halfDev = execFileSync('losetup', ['--find', '--show', half], { encoding: 'utf8' }).trim();
    const db = new Database(path.join(stateDir, 'ublk-manager', 'default', 'devices.db'));
    db.prepare(
      `INSERT INTO devices (device_id, state, size_bytes, source_image, filesystem, read_only, backing_file, path, created_at_ms, updated_at_ms)
       VALUES ('dev-half', 'creating', ?, '', 'ext4', 0, ?, '', 1, 1)`,
    ).run(2 * MIB, half);
    db.close();

    await startDaemon();
    const { devices } = await client.listDevices({});
    expect(devices.map((d) => d.deviceId)).toEqual(['dev-a', 'dev-clone', 'dev-raw']);
    const again = devices[2]!;
    expect(again).toMatchObject({ state: DeviceState.DEVICE_STATE_ATTACHED, readOnly: true });
    expect(backingOf(again.path)).toBe(raw.backingFile);
    expect(backingOf(halfDev)).not.toBe(half);
    expect(existsSync(half)).toBe(false);
    await expectCode(client.getDevice({ deviceId: 'dev-half' }), Status.NOT_FOUND);
    expect(readFileSync(logFile, 'utf8')).toMatch(/re-attached at a new path/);
  });

  it('SIGTERM stops the daemon cleanly and leaves every device attached', async () => {
    const before = (await client.listDevices({})).devices;
    const r = await stopDaemon('SIGTERM');
    expect(r).toEqual({ code: 0, signal: null });
    expect(existsSync(path.join(runDir, 'ublk-manager.sock'))).toBe(false);
    for (const d of before) expect(backingOf(d.path)).toBe(d.backingFile);
    await startDaemon();
    expect((await client.listDevices({})).devices).toEqual(before);
  });

  it('deletes devices: detached, image removed; unknown id succeeds with existed=false', async () => {
    const before = (await client.listDevices({})).devices;
    for (const d of before) {
      expect((await client.deleteDevice({ deviceId: d.deviceId })).existed).toBe(true);
      expect(backingOf(d.path)).not.toBe(d.backingFile);
      expect(existsSync(d.backingFile)).toBe(false);
    }
    expect((await client.deleteDevice({ deviceId: 'dev-a' })).existed).toBe(false);
    expect((await client.deleteDevice({ deviceId: 'never-was' })).existed).toBe(false);
    expect((await client.listDevices({})).devices).toEqual([]);
    expect(imageLoopsUnder(tmp).size).toBe(0);
    expect(existsSync(srcImage)).toBe(true);
  });

  it('driver "ublk" fails at start with a message naming /dev/ublk-control', async () => {
    const s = spawnDaemon({ SANDNODE_UBLK_MANAGER_DRIVER: 'ublk', SANDNODE_UBLK_MANAGER_RUN_DIR: path.join(tmp, 'run-ublk') });
    const r = await s.done;
    expect(r.code).not.toBe(0);
    expect(readFileSync(logFile, 'utf8')).toContain('/dev/ublk-control');
  });

  it.each([
    [['--config'], '--config needs a value'],
    [['--config='], '--config needs a value'],
    [['--bogus'], 'unknown argument \\"--bogus\\"'],
  ])('%j is a usage error: exit 2 with a message naming it', async (args, text) => {
    const before = readFileSync(logFile, 'utf8').length;
    const r = await spawnDaemon({}, args).done;
    expect(r).toEqual({ code: 2, signal: null });
    expect(readFileSync(logFile, 'utf8').slice(before)).toContain(text);
  });

  // Last: once the fence is raised, this suite's calls without an epoch would be ABORTED.
  it('FenceEpoch raises the shared fence (persisted across a restart); a server failpoint in the environment is not read', async () => {
    await stopDaemon('SIGTERM');
    // SANDNODE_FAILPOINTS is the server's old variable: the ublk-manager must start anyway.
    await startDaemon({ SANDNODE_FAILPOINTS: 'handover.after-lease=kill' });
    expect((await version.getVersion({})).features).toEqual(expect.arrayContaining(['ublk.fence-epoch.v1', 'ublk.epoch-fence.v1']));
    const at = (epoch: number) => createServiceClient(DeviceServiceDefinition, channel, { timeoutMs: 10_000, retryAttempts: 1, epoch: () => epoch });
    await expectCode(at(5).fenceEpoch({ epoch: 0 }), Status.INVALID_ARGUMENT, 'epoch: 0 is not an epoch');
    await expectCode(at(5).fenceEpoch({ epoch: 6 }), Status.INVALID_ARGUMENT, 'differs from the call');
    expect((await at(5).fenceEpoch({ epoch: 5 })).epoch).toBe(5);
    expect(JSON.parse(readFileSync(path.join(stateDir, 'ublk-manager', 'epoch'), 'utf8')).epoch).toBe(5);
    await expectCode(at(4).fenceEpoch({ epoch: 4 }), Status.ABORTED, 'stale epoch 4; this node is at epoch 5');
    await expectCode(client.deleteDevice({ deviceId: 'never-was' }), Status.ABORTED, 'stale epoch 0');
    await stopDaemon('SIGKILL');
    await startDaemon();
    await expectCode(at(4).deleteDevice({ deviceId: 'never-was' }), Status.ABORTED, 'this node is at epoch 5');
    expect((await at(7).fenceEpoch({ epoch: 7 })).epoch).toBe(7);
    expect((await at(7).deleteDevice({ deviceId: 'never-was' })).existed).toBe(false);
  });
});
